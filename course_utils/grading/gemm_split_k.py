"""Topic 05's exercise 7: split-K for a linear layer's GEMM, with its partial products checked.

The learner writes ``linear_split_k(x, w, out, workspace, block_m=, block_n=, block_k=)``: ``split_k =
workspace.shape[0]`` programs share each output tile, split ``s`` computes the partial product over its own
range of K into ``workspace[s]`` (an ``(M, N)`` slice), and a reduction writes ``out = workspace.sum(0)``. The
ranges are fixed by the prompt (whole ``BLOCK_K`` steps): ``chunk = cdiv(cdiv(K, split_k), block_k) * block_k``,
split ``s`` covering ``[s * chunk, min((s + 1) * chunk, K))``. Because every partial lands in the workspace, the
split itself is checked, not only the sum. The same fp32 strided views into padded buffers as exercises 2 and 5.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..classroom.checking import CheckFailed, fresh_seed
from ..classroom.forbidden import ByHand
from ..gemm import TIER
from .gemm_kernels import (BLOCKS, C_FILL, FORBIDDEN_MATMUL, PAD, _call_kernel_launcher, _cdiv, _on_device, _padded,
                           _tolerance)

# Released to learners as it is (course_utils.classroom.release), because it holds no reference:
RELEASED_AS_SOURCE = ("its check compares each split's partial and their sum with torch's products on the host: the "
                      "answer, a split-K Triton kernel, is nowhere in it")

__all__ = ["check_linear_split_k", "split_ranges"]

# By hand (issue 23): any torch operator that computes the GEMM (``torch.inner``, an einsum, a conv1d used as a
# matmul all reach aten::mm/bmm/convolution) and the topic's lesson modules (course_utils.gemm, gemm_models) are
# refused in the learner's code; the kernel's own tl.dot and the reduction's sum are theirs.
BY_HAND_LINEAR_SPLIT_K = ByHand(ops=("@matmul", "@conv"), modules=("course_utils.gemm",))


def split_ranges(k: int, split_k: int, block_k: int) -> list[tuple[int, int]]:
    """The K range of each split: whole BLOCK_K steps, the last range shorter."""
    chunk = _cdiv(_cdiv(k, split_k), block_k) * block_k
    return [(s * chunk, min((s + 1) * chunk, k)) for s in range(split_k)]


def _draw(rng, trial):
    bm, bn, bk = BLOCKS[int(rng.integers(len(BLOCKS)))]
    split_k = int(rng.choice([2, 3, 4]))
    steps = int(rng.integers(1, 3))
    chunk = steps * bk
    k = chunk * (split_k - 1) + int(rng.integers(1, chunk + 1))            # every split has a non-empty range
    if trial % 3 == 1:
        k = chunk * split_k                                               # exact
    m, n = int(rng.integers(1, 70)), int(rng.integers(1, 70))
    return m, n, k, split_k, (bm, bn, bk)


def _partials(x, w, ranges):
    return [x[:, a:b] @ w[:, a:b].T for a, b in ranges]


def check_linear_split_k(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """``fn(x, w, out, workspace, block_m=, block_n=, block_k=)``: workspace[s] = split s's partial, out = their sum."""
    name = "split-K linear kernel"
    seed = fresh_seed(seed)
    device = "cpu" if TIER == "cpu" else "cuda"
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        m, n, k, split_k, blocks = _draw(rng, trial)
        x_buf, x = _padded(rng, m, k)
        w_buf, w = _padded(rng, n, k)
        out_buf = torch.full((m + PAD, n + PAD), C_FILL, dtype=torch.float32)
        out_buf, out = _on_device(out_buf, out_buf[:m, :n], device)
        work = torch.full((split_k, m, n), C_FILL, dtype=torch.float32, device=device)
        where = (f" (trial {trial + 1} of {trials}: M={m}, N={n}, K={k}, split_k={split_k}, block_m={blocks[0]}, "
                 f"block_n={blocks[1]}, block_k={blocks[2]}; reproduce with seed={seed})")
        args = [_on_device(x_buf, x, device)[1], _on_device(w_buf, w, device)[1], out, work]
        _call_kernel_launcher(name, fn, args, blocks, forbidden=FORBIDDEN_MATMUL, by_hand=BY_HAND_LINEAR_SPLIT_K)
        got_out, got_work = out_buf.cpu()[:m, :n], work.cpu()
        ranges = split_ranges(k, split_k, blocks[2])
        want_parts = _partials(x, w, ranges)
        rtol, atol = _tolerance("triton_interpreter", k)
        close = lambda a, b: torch.allclose(a, b, rtol=rtol, atol=atol)  # noqa: E731
        if (got_work == C_FILL).all():
            raise CheckFailed(f"{name}: the workspace was never written: split s stores its partial tile into "
                              f"workspace[s] (program_id(2) is the split){where}.")
        for s, part in enumerate(want_parts):
            if close(got_work[s], part):
                continue
            even = [(a, b) for a, b in zip(range(0, k, _cdiv(k, split_k)), range(_cdiv(k, split_k), k + _cdiv(k, split_k), _cdiv(k, split_k)))]
            if len(even) == split_k and s < len(even) and close(got_work[s], x[:, even[s][0]:min(even[s][1], k)] @ w[:, even[s][0]:min(even[s][1], k)].T):
                raise CheckFailed(f"{name}: split {s} covered K range {even[s][0]}..{min(even[s][1], k)}; each split covers whole "
                                  f"BLOCK_K steps: chunk = cdiv(cdiv(K, split_k), block_k) * block_k, split s from s * chunk{where}.")
            if close(got_work[s], x @ w.T):
                raise CheckFailed(f"{name}: workspace[{s}] holds the whole product: split s must loop over its own K range "
                                  f"[s * chunk, min((s + 1) * chunk, K)) only{where}.")
            if (got_work[s] == C_FILL).any():
                raise CheckFailed(f"{name}: parts of workspace[{s}] were never stored: the grid's third axis has split_k "
                                  f"programs and each stores a full (masked) tile{where}.")
            raise CheckFailed(f"{name}: workspace[{s}] differs from X[:, K_s] @ W[:, K_s].T over split {s}'s range "
                              f"{ranges[s][0]}..{ranges[s][1]}; mask the K axis with the running index and the range end{where}.")
        want = x @ w.T
        if close(got_out, want):
            continue
        if any(close(got_out, p) for p in want_parts):
            raise CheckFailed(f"{name}: out holds one split's partial: reduce the workspace, out = sum over s of workspace[s]{where}.")
        if close(got_out, want + C_FILL):
            raise CheckFailed(f"{name}: out was added to, not overwritten: it arrives holding garbage; store the reduced "
                              f"sum into it (or zero it first){where}.")
        raise CheckFailed(f"{name}: the workspace is right but out differs from its sum over the splits{where}.")
    if not quiet:
        print(f"✅ {name}: each split's partial and their sum match on {trials} strided inputs.")
