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

__all__ = ["check_micro_kernel_update"]

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
