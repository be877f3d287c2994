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
