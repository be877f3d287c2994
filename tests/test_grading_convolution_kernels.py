"""Tests of course_utils.grading.convolution_kernels (exercise 8 of solutions/03_convolution.ipynb): the check passes
the solution and a right answer written differently, says "not attempted" for a stub, names each plausible mistake,
fails matrix products and the way out to NumPy as forbidden, and fails a hard-coded answer on fresh inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _grading_helpers import fails_with, stub  # noqa: E402
from course_utils.checks import CheckFailed, ForbiddenCall, NotAttempted
from course_utils.grading import convolution as grading

SEEDS = range(4)
check = grading.check_micro_kernel_update


def _solution(c, a_panel, b_panel, i0, j0):
    kc, mr = a_panel.shape
    nr = b_panel.shape[1]
    acc = torch.zeros(mr, nr)
    for p in range(kc):
        acc += a_panel[p, :, None] * b_panel[p, None, :]
    rows, cols = min(mr, c.shape[0] - i0), min(nr, c.shape[1] - j0)
    out = c.clone()
    out[i0:i0 + rows, j0:j0 + cols] += acc[:rows, :cols]
    return out


def _different(c, a_panel, b_panel, i0, j0):  # torch.outer per p, padding C instead of clipping the tile
    mr, nr = a_panel.shape[1], b_panel.shape[1]
    big = torch.zeros(c.shape[0] + mr, c.shape[1] + nr)
    big[:c.shape[0], :c.shape[1]] = c
    for p in range(a_panel.shape[0]):
        big[i0:i0 + mr, j0:j0 + nr] += torch.outer(a_panel[p], b_panel[p])
    return big[:c.shape[0], :c.shape[1]].clone()


def _with(fn):
    def wrapped(c, a_panel, b_panel, i0, j0):
        return fn(c, a_panel, b_panel, i0, j0)
    return wrapped


def _write(c, tile, i0, j0, corner="first", add=True):
    out = c.clone()
    rows, cols = min(tile.shape[0], c.shape[0] - i0), min(tile.shape[1], c.shape[1] - j0)
    part = tile[:rows, :cols] if corner == "first" else tile[tile.shape[0] - rows:, tile.shape[1] - cols:]
    if add:
        out[i0:i0 + rows, j0:j0 + cols] += part
    else:
        out[i0:i0 + rows, j0:j0 + cols] = part
    return out


def _outer_sum(a, b):
    return sum(torch.outer(a[p], b[p]) for p in range(a.shape[0]))


MISTAKES = {
    "transposed": (lambda c, a, b, i0, j0: _write(c, _outer_sum(b, a), i0, j0), "transposed"),
    "overwrite": (lambda c, a, b, i0, j0: _write(c, _outer_sum(a, b), i0, j0, add=False), "accumulates into C"),
    "last only": (lambda c, a, b, i0, j0: _write(c, torch.outer(a[-1], b[-1]), i0, j0), "only the last rank-1"),
    "corner": (lambda c, a, b, i0, j0: _write(c, _outer_sum(a, b), i0, j0, corner="last"), "first rows and columns"),
    "offsets": (lambda c, a, b, i0, j0: _write(c, _outer_sum(a, b), j0, i0), "i0 is the tile's first row"),
}


def test_solution_and_a_different_right_answer_pass():
    for fn in (_solution, _different):
        for seed in SEEDS:
            check(fn, seed=seed, quiet=True, trials=8)
        check(fn, quiet=True)


def test_stub_is_not_attempted():
    with pytest.raises(NotAttempted):
        check(stub, quiet=True)


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_each_mistake_is_named(mistake):
    fn, fragment = MISTAKES[mistake]
    for seed in SEEDS:
        fails_with(lambda f: check(f, seed=seed, quiet=True), fn, fragment)


@pytest.mark.parametrize("shortcut", ["matmul", "at", "einsum", "mm", "numpy", "asarray", "inner", "conv1d",
                                      "linear", "blocked"])
def test_matrix_products_and_numpy_are_forbidden(shortcut):
    def tile(a, b):
        if shortcut == "matmul":
            return torch.matmul(a.T, b)
        if shortcut == "at":
            return a.T @ b
        if shortcut == "einsum":
            return torch.einsum("pi,pj->ij", a, b)
        if shortcut == "mm":
            return torch.mm(a.T, b)
        if shortcut == "inner":  # the leak of issue 23: torch.inner reaches aten::mm whatever it is called
            return torch.inner(a.T.contiguous(), b.T.contiguous())
        if shortcut == "conv1d":  # a 1-D convolution with kc input channels and kernel width 1 is the GEMM too
            return torch.nn.functional.conv1d(b[None], a.T.contiguous()[:, :, None])[0]
        if shortcut == "linear":
            return torch.nn.functional.linear(a.T.contiguous(), b.T.contiguous())
        if shortcut == "blocked":  # the lesson's own blocked GEMM
            from course_utils import convolution_blocking as blk
            return torch.tensor(blk.blocked_matmul(np.array(a.T.tolist(), dtype=np.float32),
                                                   np.array(b.tolist(), dtype=np.float32)))
        if shortcut == "numpy":
            return torch.from_numpy(a.numpy().T @ b.numpy())
        return torch.from_numpy(np.asarray(a).T @ np.asarray(b))

    def fn(c, a, b, i0, j0):
        return _write(c, tile(a, b), i0, j0)

    with pytest.raises(ForbiddenCall):
        check(fn, seed=0, quiet=True)


def test_broadcast_rank1_updates_do_not_trip_the_watch():  # torch.outer is named as allowed in the prompt
    check(_different, seed=3, quiet=True)


def test_a_hard_coded_answer_fails_on_fresh_inputs():
    table = []
    check(lambda *args: table.append(_solution(*args)) or table[-1], seed=0, quiet=True)
    replay = iter(table)
    with pytest.raises(CheckFailed):
        check(lambda *args: next(replay), seed=1, quiet=True)


# ---------------------------------------------------------------- exercise 9: a register tile's share of the peak
from _grading_helpers import each_mistake_is_named, fails, forbidden, passes, pasted, rejects_recorded_answers  # noqa: E402
from course_utils import convolution_machine as cv_machine  # noqa: E402
from course_utils.grading import convolution_kernels as kernels  # noqa: E402

efficiency = grading.check_micro_kernel_efficiency


def _efficiency(mr, nr, lanes, fma_latency, fma_units, loads_per_cycle):
    fmas = mr * nr / lanes
    cycles = max(fmas / fma_units, (mr + nr / lanes) / loads_per_cycle, fma_latency)
    return float(fmas / fma_units / cycles)


def _efficiency_as_minimum(mr, nr, lanes, fma_latency, fma_units, loads_per_cycle):  # right, as three ratios
    accumulators, b_vectors = mr * nr // lanes, nr // lanes
    latency_share = accumulators / (fma_latency * fma_units)             # chains per FMA slot in flight
    load_share = accumulators * loads_per_cycle / (fma_units * (mr + b_vectors))
    return min(1.0, latency_share, load_share)


def test_efficiency_right_answers_pass(capsys):
    passes(efficiency, _efficiency, trials=12)
    passes(efficiency, _efficiency_as_minimum, trials=12)
    assert capsys.readouterr().out.count("✅") == 4
    with pytest.raises(NotAttempted):
        efficiency(stub)


def test_efficiency_agrees_with_the_lesson():  # section 6: 6 x 64 reaches the peak, 1 x 64 half of it on two units
    assert kernels._reference_micro_kernel_efficiency(6, 64, 16, 4, 2, 2) == 1.0
    assert kernels._reference_micro_kernel_efficiency(1, 64, 16, 4, 2, 2) == 0.5


def test_efficiency_mistakes_are_named(monkeypatch):
    each_mistake_is_named(kernels, efficiency, _efficiency, monkeypatch, trials=6)
    written = {  # the same mistakes as a learner would write them
        "dependent chain": lambda mr, nr, L, lat, u, p: min(1.0, (mr * nr / L) * p / (u * (mr + nr / L))),
        "loads bound it": lambda mr, nr, L, lat, u, p: min(1.0, mr * nr / L / (lat * u)),
        "not nr scalars": lambda mr, nr, L, lat, u, p: (mr * nr / L / u) / max(mr * nr / L / u, (mr + nr) / p, lat),
        "broadcast load": lambda mr, nr, L, lat, u, p: (mr * nr / L / u) / max(mr * nr / L / u, nr / L / p, lat),
        "fma_units vector FMAs": lambda mr, nr, L, lat, u, p: _efficiency(mr, nr, L, lat, 1, p),
        "percentage": lambda *a: 100 * _efficiency(*a),
    }
    for fragment, fn in written.items():
        fails(efficiency, fn, fragment, trials=6)


def test_efficiency_refuses_the_course_and_takes_pasted_code():
    forbidden(efficiency, kernels._reference_micro_kernel_efficiency, "_reference_micro_kernel_efficiency")
    forbidden(efficiency, lambda mr, nr, L, lat, u, p: _efficiency(mr, nr, L, lat, u, p) + 0 * cv_machine.register_tile_shape(
        32, L)[0], "course_utils.convolution_machine.register_tile_shape")
    passes(efficiency, pasted(kernels)._reference_micro_kernel_efficiency)   # pasted source is the learner's own


def test_efficiency_rejects_recorded_answers():
    rejects_recorded_answers(efficiency, _efficiency)


def test_efficiency_inputs_cover_each_bound():
    import numpy as np

    kinds = set()
    for trial in range(6):
        mr, nr, lanes, lat, units, loads = kernels._efficiency_inputs(np.random.default_rng([7, trial]), trial)
        bounds = {"fma": mr * nr / lanes / units, "load": (mr + nr / lanes) / loads, "latency": lat}
        kinds.add(max(bounds, key=bounds.get))
        assert mr * nr // lanes + nr // lanes + 1 <= 32
    assert {"load", "latency"} <= kinds
