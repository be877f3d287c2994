"""Grading for topic 03's exercise 8 (``solutions/03_convolution.ipynb``): Goto's micro-kernel, one register tile.

Re-exported by :mod:`course_utils.grading.convolution`. The learner writes, in PyTorch, the update the lesson's
compiled ``micro_kernel_by_hand`` makes (lesson 03, section 6, eq. 8): ``C[i0:i0+mr, j0:j0+nr] += a_panel.T @
b_panel`` as ``kc`` rank-1 updates of an ``mr x nr`` accumulator, written back only where the tile overlaps C.
The check works on torch tensors so that it can see a shortcut: every matrix product (``@``, ``torch.matmul``,
``mm``, ``einsum``, ``tensordot``, ``linear``...) and the way out to NumPy's ``@`` (``Tensor.numpy``,
``np.asarray(tensor)``) are forbidden, as is the course's reference.
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, check_function
from ..classroom.forbidden import ByHand

__all__ = ["check_micro_kernel_update", "check_micro_kernel_efficiency"]

_HERE = "course_utils.grading.convolution_kernels."
MATMULS = (
    "torch.matmul", "torch.Tensor.__matmul__", "torch.Tensor.__rmatmul__", "torch.mm", "torch.bmm", "torch.einsum",
    "torch.tensordot", "torch.addmm", "torch.addbmm", "torch.baddbmm", "torch.mv", "torch.chain_matmul",
    "torch.linalg.multi_dot", "torch.nn.functional.linear", "torch.Tensor.matmul", "torch.Tensor.mm",
)
TO_NUMPY = ("torch.Tensor.numpy", "torch.Tensor.__array__")
# At the operator level: torch.inner, a conv1d or F.linear used as the GEMM all reach aten's mm/convolution.
# The rank-1 updates themselves (broadcasting, torch.outer) stay allowed.
BY_HAND_MICRO_KERNEL = {"ops": ("@matmul", "@conv"), "allow_ops": ("outer", "ger"),
                        "modules": ("course_utils.convolution", "course_utils.gemm")}


def _tile(a_panel, b_panel):
    return a_panel.T @ b_panel  # (mr, nr), the reference may use a product


def _write_back(c, tile, i0, j0, *, corner="first", add=True):
    out = c.clone()
    rows, cols = min(tile.shape[0], c.shape[0] - i0), min(tile.shape[1], c.shape[1] - j0)
    part = tile[:rows, :cols] if corner == "first" else tile[tile.shape[0] - rows:, tile.shape[1] - cols:]
    if add:
        out[i0:i0 + rows, j0:j0 + cols] += part
    else:
        out[i0:i0 + rows, j0:j0 + cols] = part
    return out


def _reference_micro_kernel_update(c, a_panel, b_panel, i0, j0):
    return _write_back(c, _tile(a_panel, b_panel), i0, j0)


def check_micro_kernel_update(fn: Callable, *, trials: int = 6, seed: int | None = None,
                              quiet: bool = False) -> None:
    """Exercise 8: ``(c (M, N), a_panel (kc, mr), b_panel (kc, nr), i0, j0)`` -> a new C with the tile added."""
    counter = itertools.count()
    forbidden = MATMULS + TO_NUMPY + (_HERE + "_reference_micro_kernel_update",
                                      "course_utils.convolution_blocking.blocked_matmul")

    def make_inputs(rng):
        t = next(counter)
        mr, nr = [(6, 16), (4, 8), (8, 16), (3, 8)][t % 4]           # never square, so a transposed tile shows
        kc = 1 if t == 3 else int(rng.integers(2, 40))
        m, n = int(rng.integers(mr + 1, 4 * mr)), int(rng.integers(nr + 1, 3 * nr))
        if t == 0:                                                    # inside C, offsets that differ when swapped
            m, n = int(rng.integers(3 * nr, 4 * nr)), int(rng.integers(3 * nr, 4 * nr))
            i0, j0 = mr, 2 * nr
        elif t % 2 == 1:                                              # the last tile: ragged at the bottom/right
            i0, j0 = (m - 1) // mr * mr, (n - 1) // nr * nr
        else:
            i0, j0 = int(rng.integers(0, m // mr)) * mr, int(rng.integers(0, n // nr)) * nr
        a_panel = rng.standard_normal((kc, mr)).astype(np.float32)   # (kc, mr): k-major, as packed
        b_panel = rng.standard_normal((kc, nr)).astype(np.float32)   # (kc, nr)
        a_panel[:, max(0, m - i0):] = 0.0                             # the packing's zero rows past C's edge
        b_panel[:, max(0, n - j0):] = 0.0
        c = rng.standard_normal((m, n)).astype(np.float32)
        return tuple(torch.from_numpy(v) for v in (c, a_panel, b_panel)) + (i0, j0)

    def last_update_only(c, a_panel, b_panel, i0, j0):
        return _write_back(c, torch.outer(a_panel[-1], b_panel[-1]), i0, j0)

    mistakes = [
        Mistake("transposed_tile", "your tile is transposed: row i of the tile is column i of a_panel (a_panel is "
                "(kc, mr), k-major), so the tile is (mr, nr) and lands at rows i0.., columns j0..",
                lambda c, a, b, i0, j0: _write_back(c, _tile(b, a), i0, j0)),
        Mistake("overwrote", "the micro-kernel accumulates into C (C += tile): the pc loop calls it once per kc-slice, "
                "and each call must add to what the earlier slices left", lambda c, a, b, i0, j0: _write_back(
                    c, _tile(a, b), i0, j0, add=False)),
        Mistake("last_update_only", "only the last rank-1 update survived: add every outer product into the "
                "accumulator (acc += ...), for p = 0..kc-1", last_update_only),
        Mistake("wrong_corner_at_edge", "at C's edge keep the tile's first rows and columns: the zero padding of a "
                "packed panel is at its end", lambda c, a, b, i0, j0: _write_back(c, _tile(a, b), i0, j0, corner="last")),
        Mistake("swapped_offsets", "i0 is the tile's first row and j0 its first column", lambda c, a, b, i0, j0:
                _write_back(c, _tile(a, b), j0, i0)),
    ]
    check_function(fn, _reference_micro_kernel_update, make_inputs, name="micro_kernel_update",
                   trials=trials, seed=seed, n=40, mistakes=mistakes, forbidden=forbidden, by_hand=ByHand(**BY_HAND_MICRO_KERNEL), quiet=quiet)


# ---------------------------------------------------------------- exercise 9: what a register tile can reach
def _efficiency(mr, nr, lanes, latency, units, loads_per_cycle, *, b_loads=None, a_loads=None, bounds=("fma", "load", "lat")):
    """Fraction of the FMA peak one k-step of an ``mr x nr`` micro-kernel sustains (the three bounds, in cycles)."""
    fmas = mr * nr / lanes                                           # vector FMAs per k = accumulator vectors
    loads = (mr if a_loads is None else a_loads) + (nr / lanes if b_loads is None else b_loads)
    cycles = {"fma": fmas / units, "load": loads / loads_per_cycle, "lat": float(latency)}
    return (fmas / units) / max(cycles[b] for b in bounds)


def _reference_micro_kernel_efficiency(mr, nr, lanes, fma_latency, fma_units, loads_per_cycle):
    return float(_efficiency(mr, nr, lanes, fma_latency, fma_units, loads_per_cycle))


_EFFICIENCY_MISTAKES = [
    Mistake("no_latency", "each accumulator vector is one dependent chain: its next FMA waits fma_latency cycles, so "
            "one k-step takes at least fma_latency cycles however few FMAs it has (too few accumulators idle the units).",
            lambda mr, nr, L, lat, u, p: _efficiency(mr, nr, L, lat, u, p, bounds=("fma", "load"))),
    Mistake("no_loads", "the loads bound it too: a k-step loads mr broadcasts of A and nr/lanes vectors of B, at "
            "loads_per_cycle per cycle.", lambda mr, nr, L, lat, u, p: _efficiency(mr, nr, L, lat, u, p, bounds=("fma", "lat"))),
    Mistake("b_elements", "B is loaded as nr/lanes full vectors, not nr scalars.", lambda mr, nr, L, lat, u, p:
            _efficiency(mr, nr, L, lat, u, p, b_loads=nr)),
    Mistake("free_broadcasts", "each of the mr elements of A is one broadcast load per k-step: count mr + nr/lanes loads.",
            lambda mr, nr, L, lat, u, p: _efficiency(mr, nr, L, lat, u, p, a_loads=0)),
    Mistake("percent", "return a fraction in (0, 1], not a percentage.",
            lambda mr, nr, L, lat, u, p: 100 * _efficiency(mr, nr, L, lat, u, p)),
    Mistake("one_unit", "the FMA units issue fma_units vector FMAs per cycle: the peak (and the time of a k-step at the "
            "peak) is mr*nr/lanes / fma_units cycles.", lambda mr, nr, L, lat, u, p: _efficiency(mr, nr, L, lat, 1, p)),
]


# A formula: nothing to refuse but the course's own code (the grading references, the lesson's CPU model).
BY_HAND_EFFICIENCY = ByHand(modules=("course_utils.convolution",))


def _efficiency_inputs(rng, trial):
    """Trial 0, 3, ...: latency-bound; 1, 4, ...: load-bound; 2, 5, ...: two FMA units, any bound. Every mistake that
    differs from the answer on these inputs differs from every other one, so the hint names the right one."""
    while True:
        lanes = int(rng.choice([4, 8, 16]))
        nv = int(rng.integers(1, 7))                                 # nr in vectors
        mr = int(rng.integers(1, 17))
        if mr * nv + nv + 1 > 32:                                    # the tile must fit 32 vector registers
            continue
        args = (mr, nv * lanes, lanes, int(rng.integers(2, 7)), int(rng.integers(1, 3)), int(rng.integers(1, 4)))
        fmas, loads = mr * nv / args[4], (mr + nv) / args[5]
        kind = trial % 3
        if (kind == 0 and not args[3] > max(fmas, loads) + 0.5) or (kind == 1 and not loads > max(fmas, args[3]) + 0.5) \
                or (kind == 2 and args[4] != 2):
            continue
        want = _reference_micro_kernel_efficiency(*args)
        wrong = [m.fn(*args) for m in _EFFICIENCY_MISTAKES]
        differ = [w for w in wrong if abs(w - want) > 1e-6 * want]
        if all(abs(a - b) > 1e-6 * want for i, a in enumerate(differ) for b in differ[i + 1:]) and len(differ) >= 2:
            return args


def check_micro_kernel_efficiency(fn: Callable, *, trials: int = 6, seed: int | None = None,
                                  quiet: bool = False) -> None:
    """Exercise 9: ``(mr, nr, lanes, fma_latency, fma_units, loads_per_cycle)`` -> the fraction of the FMA peak."""
    counter = itertools.count()
    check_function(fn, _reference_micro_kernel_efficiency, lambda rng: _efficiency_inputs(rng, next(counter)),
                   name="micro_kernel_efficiency", trials=trials, seed=seed, rtol=1e-9, atol=0.0,
                   mistakes=_EFFICIENCY_MISTAKES, by_hand=BY_HAND_EFFICIENCY, quiet=quiet)
