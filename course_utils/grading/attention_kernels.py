"""Checks of problem set 06's Triton exercises (7 and 8) and of its windowed tile count (exercise 3).

* ``blocks_visited_window(seqlen, block_m, block_n, window)``: the tiles a causal **sliding-window** kernel
  computes when it skips key blocks on both sides of each query block (the loop bounds of exercise 7).
* ``swa_alibi_attention(q, k, v, slopes, window, block_m, block_n)``: a Triton forward kernel (and its
  launcher) for causal sliding-window attention with ALiBi biases, ``(H, L, D)`` float32.
* ``flash_backward_atomic(q, k, v, o, lse, do, block_m, block_n, reverse=False)``: a Triton backward with one
  program per key block that adds its share of dQ with fp32 atomics; returns ``(dq, dk, dv)``.

The structures the prompts demand are measured, not trusted: exercise 7's kernel must skip the key blocks outside
the window (a probe with NaN in key block 0, whose far rows a masking kernel turns into NaN), exercise 8's must
write dQ only with atomic adds (the by-hand watch records where an interpreted kernel's stores and atomics land,
:mod:`course_utils.classroom.triton_writes`).

The checks only *call* the learner's launcher with fresh fp32 tensors (so they work on a grader's remote
proxies), compare with float64 references at fp32 tolerances, and name the usual slips. Under the CPU
interpreter the head dimension and blocks are GPU-legal (``tl.dot`` needs 16 or more).
"""
from __future__ import annotations

import inspect
import math
from typing import Callable

import torch

from ..classroom.checking import Mistake, call_learner, check_function
from ..errors import CheckFailed
from ..classroom.forbidden import ByHand
from .attention_inputs import FORBIDDEN_ATTENTION, _cycle

__all__ = ["check_blocks_visited_window", "check_swa_alibi_attention", "check_flash_backward_atomic"]

FORBIDDEN_KERNEL = FORBIDDEN_ATTENTION + (
    "torch.matmul", "torch.bmm", "torch.einsum", "torch.Tensor.__matmul__", "torch.Tensor.matmul",
    "torch.autograd.grad", "torch.autograd.backward", "torch.Tensor.backward",
    "course_utils.attention_triton.flash_attention_triton", "course_utils.attention_triton.flash_attention",
    "course_utils.attention_triton_backward.flash_attention_backward_triton",
)
# By hand (issue 23): torch operators that compute the whole result, whatever path reaches them (F.softmax,
# log_softmax().exp(), F.scaled_dot_product_attention, einsum/inner as the matmul), and the topic's lesson modules
# (course_utils.attention*, its Triton kernels included) are refused in the learner's code; the kernel is theirs.
BY_HAND_SWA_ALIBI = ByHand(ops=("@attention", "@softmax", "@matmul"), modules=("course_utils.attention",))
# Exercise 8's structure, measured under Triton's interpreter: dQ (the first returned tensor) is written only by the
# kernels' atomic adds, every element of it, never by a plain store (course_utils.classroom.triton_writes).
BY_HAND_FLASH_BACKWARD_ATOMIC = ByHand(ops=BY_HAND_SWA_ALIBI.ops + (
    "_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward"), modules=BY_HAND_SWA_ALIBI.modules,
    atomic_outputs=(0,), atomic_what="dQ")
BLOCKS = [(16, 16), (32, 16), (16, 32)]


def _own() -> tuple[str, ...]:
    """This module's private functions (the references and the helpers behind them): forbidden to the learner."""
    return tuple(f"{__name__}.{n}" for n, v in globals().items()
                 if n.startswith("_") and inspect.isfunction(v) and v.__module__ == __name__ and n != "_own")


def _cd(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- exercise 3: tiles of a sliding-window kernel
def _reference_blocks_visited_window(seqlen, block_m, block_n, window):
    total = 0
    for i in range(_cd(seqlen, block_m)):
        first_row, last_row = i * block_m, min((i + 1) * block_m, seqlen) - 1
        first_key = max(0, first_row - window + 1)          # the oldest key the block's first row sees
        total += last_row // block_n - first_key // block_n + 1
    return total


def _window_count(seqlen, bm, bn, window, *, lo_row="first", reach=1, clamp=True, causal_only=False):
    total = 0
    for i in range(_cd(seqlen, bm)):
        first, last = i * bm, (min((i + 1) * bm, seqlen) if clamp else (i + 1) * bm) - 1
        row = first if lo_row == "first" else last
        lo = 0 if causal_only else max(0, row - window + reach) // bn
        total += last // bn - lo + 1
    return total


def check_blocks_visited_window(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: tiles computed when query block i loads only the key blocks its rows' windows touch."""
    kind = _cycle("long", "small_window", "window_one", "wide_window", "ragged", "tiny")

    def make_inputs(rng):
        which = kind()
        bm, bn = (int(b) for b in rng.choice([16, 32, 64, 128], size=2, replace=True))
        seqlen = {"long": int(rng.integers(3000, 5000)), "tiny": int(rng.integers(1, 3))}.get(
            which, int(rng.integers(3, 12)) * max(bm, bn) + int(rng.integers(0, 16)))
        window = {"small_window": int(rng.integers(2, max(bm, bn))), "window_one": 1,
                  "wide_window": seqlen + int(rng.integers(0, 40))}.get(which, int(rng.integers(2, 4 * max(bm, bn))))
        return seqlen, bm, bn, window

    mistakes = [
        Mistake("causal only", "you skipped only the blocks right of the diagonal: with a window, key blocks that end "
                "before the first row's oldest key (row - window + 1) are skipped too.",
                lambda L, bm, bn, w: _window_count(L, bm, bn, w, causal_only=True)),
        Mistake("window from the last row", "the block's *first* row reaches furthest back: start at key "
                "max(0, i*Bm - window + 1), not at the last row's window.",
                lambda L, bm, bn, w: _window_count(L, bm, bn, w, lo_row="last")),
        Mistake("window plus one", "off by one: query r sees keys r - window < j <= r, so the oldest is r - window + 1.",
                lambda L, bm, bn, w: _window_count(L, bm, bn, w, reach=0)),
        Mistake("no clamp", "clamp the ragged last query block at seqlen: its last row is min((i+1)*Bm, L) - 1.",
                lambda L, bm, bn, w: _window_count(L, bm, bn, w, clamp=False)),
        Mistake("swapped blocks", "block_m tiles the queries and block_n the keys; you swapped them.",
                lambda L, bm, bn, w: _reference_blocks_visited_window(L, bn, bm, w)),
    ]
    no_mask = ByHand(max_traced_bytes=2**20, large="a mask (count with arithmetic per query block; do not build a mask: "
                     "the check draws sequences of 3000 to 5000 tokens)")
    check_function(fn, _reference_blocks_visited_window, make_inputs, name="blocks_visited_window", trials=trials,
                   seed=seed, mistakes=mistakes, quiet=quiet, by_hand=no_mask,
                   forbidden=("course_utils.attention_io.causal_blocks_visited",) + _own())


# ---------------------------------------------------------------- exercise 7: sliding window + ALiBi in Triton
def _swa_alibi(q, k, v, slopes, window, *, sign=1.0, reach=1, causal=True, scale=True, head_slopes=True):
    q, k, v = q.double(), k.double(), v.double()
    h, n, d = q.shape
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(d) if scale else 1.0)                     # (H, L, L)
    sl = slopes.double() if head_slopes else slopes.double()[:1].expand(h)
    s = s - sign * sl[:, None, None] * (i - j).abs().double()                               # ALiBi: -slope * distance
    keep = (j > i - window - (1 - reach)) & ((j <= i) if causal else torch.ones_like(i == j))
    s = s.masked_fill(~keep, float("-inf"))
    return (torch.softmax(s, -1) @ v).float()


def _reference_swa_alibi_attention(q, k, v, slopes, window, block_m, block_n):
    return _swa_alibi(q, k, v, slopes, window)


def _alibi_slopes(h):
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)])                 # the ALiBi paper's geometric slopes


def _swa_inputs_maker():
    kind = _cycle("ragged", "window_small", "exact", "window_wide", "one_past")

    def make(rng):
        which = kind()
        bm, bn = BLOCKS[int(rng.integers(len(BLOCKS)))]
        n = {"exact": 2 * max(bm, bn), "one_past": max(bm, bn) + 1}.get(which, int(rng.integers(17, 60)))
        h, d = int(rng.integers(1, 4)), int(rng.choice([16, 32]))
        window = {"window_small": int(rng.integers(1, 6)), "window_wide": n + 3}.get(which, int(rng.integers(bn // 2, n)))
        g = lambda: torch.from_numpy(rng.standard_normal((h, n, d))).float()  # noqa: E731
        slopes = _alibi_slopes(h) * float(rng.uniform(1, 4))
        return g(), g(), g(), slopes, window, bm, bn
    return make


def _skip_inputs(rng):
    """Inputs whose key block 0 (keys and values) is NaN, and the first query row checked: the rows of every query
    block whose first row's window starts a whole key block after block 0 (room for a kernel that skips one block
    late). A kernel that skips never loads block 0 for them; one that loads it and masks the scores gets
    ``0 * NaN = NaN`` from ``P @ V``."""
    bm, bn = BLOCKS[int(rng.integers(len(BLOCKS)))]
    h, window = 1, int(rng.integers(2, 20))
    first = _cd(2 * bn + window, bm) * bm                                # first query row compared
    n = first + 2 * bm + int(rng.integers(0, bm))
    g = lambda: torch.from_numpy(rng.standard_normal((h, n, 16))).float()  # noqa: E731
    q, k, v = g(), g(), g()
    k[:, :bn], v[:, :bn] = float("nan"), float("nan")
    return q, k, v, _alibi_slopes(h) * float(rng.uniform(1, 4)), window, bm, bn, first


def _skipped_rows_reference(q, k, v, slopes, window, block_m, block_n, first):
    k, v = k.nan_to_num(), v.nan_to_num()                                # the rows compared never see block 0
    return _swa_alibi(q, k, v, slopes, window)[:, first:]


def check_swa_alibi_attention(fn: Callable, *, trials: int = 5, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``fn(q, k, v, slopes, window, block_m, block_n) -> o`` (H, L, D) float32, by a Triton kernel."""
    def variant(**change):
        return lambda q, k, v, s, w, bm, bn: _swa_alibi(q, k, v, s, w, **change)

    mistakes = [
        Mistake("no ALiBi", "add the ALiBi bias -slope_h * (i - j) to every score of head h (slopes[h]).",
                lambda q, k, v, s, w, bm, bn: _swa_alibi(q, k, v, torch.zeros_like(s), w)),
        Mistake("ALiBi sign", "ALiBi penalises distance: the bias is -slope * (i - j), so older keys get lower scores.",
                variant(sign=-1.0)),
        Mistake("one slope", "each head has its own slope: read slopes[head] in the program of that head.",
                variant(head_slopes=False)),
        Mistake("window plus one", "off by one: query i sees keys i - window < j <= i (window keys, itself included).",
                variant(reach=0)),
        Mistake("no window", "that is causal ALiBi attention: also mask keys older than the window (j <= i - window).",
                lambda q, k, v, s, w, bm, bn: _swa_alibi(q, k, v, s, q.shape[1] + 1)),
        Mistake("not causal", "the window is causal: keys j > i stay masked.", variant(causal=False)),
        Mistake("no scale", "scale the scores by 1/sqrt(D) before adding the bias.", variant(scale=False)),
    ]
    check_function(fn, _reference_swa_alibi_attention, _swa_inputs_maker(), name="swa_alibi_attention", trials=trials,
                   seed=seed, n=64, mistakes=mistakes, forbidden=FORBIDDEN_KERNEL + _own(), by_hand=BY_HAND_SWA_ALIBI,
                   quiet=True)
    # The structure: the key loop skips the blocks outside the window, measured with NaN in key block 0 (see
    # _skip_inputs). Not watched: the trials above watched the same function; this one costs a single launch.
    name = "swa_alibi_attention"

    def skipped_rows(q, k, v, slopes, window, block_m, block_n, first):
        o = call_learner(name, fn, (q, k, v, slopes, window, block_m, block_n))
        if isinstance(o, torch.Tensor) and o.shape == q.shape and torch.isnan(o[:, first:]).any():
            raise CheckFailed(f"{name}: with NaN in key block 0, rows {first} and later came out NaN although their "
                              f"windows (window={window}) start a whole key block after it: your kernel loads key blocks outside the "
                              f"window and only masks them; skip them instead (start the key loop at the block the "
                              f"window of the query block's first row touches), as exercise 3 counted.")
        return o[:, first:] if isinstance(o, torch.Tensor) else o

    check_function(skipped_rows, _skipped_rows_reference, _skip_inputs, name=f"{name} (key blocks outside the window "
                   "skipped)", trials=1, seed=seed, n=64, check_inputs_unchanged=False, quiet=True)
    if not quiet:
        print(f"✅ {name}: matches the reference on {trials} random inputs, and its key loop skips the blocks outside "
              f"the window.")


# ---------------------------------------------------------------- exercise 8: the backward with atomic dQ
def _grads(q, k, v, do, *, delta=True, scale_grad=True, pt=True, dq_last_block=None):
    q, k, v, do = (t.double() for t in (q, k, v, do))
    tau = 1 / math.sqrt(q.shape[-1])
    p = torch.softmax(tau * q @ k.transpose(-1, -2), -1)                                    # (H, L, L)
    o = p @ v
    dv = (p.transpose(-1, -2) if pt else p) @ do
    dp = do @ v.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True)) if delta else p * dp
    g = tau if scale_grad else 1.0
    dq, dk = g * ds @ k, g * ds.transpose(-1, -2) @ q
    if dq_last_block is not None:                                                           # stored, not added
        n, bn = k.shape[1], dq_last_block
        last = (_cd(n, bn) - 1) * bn
        dq = g * ds[..., last:] @ k[:, last:]
    return dq.float(), dk.float(), dv.float()


def _reference_flash_backward_atomic(q, k, v, o, lse, do, block_m, block_n, reverse=False):
    return _grads(q, k, v, do)


def _backward_inputs_maker():
    kind = _cycle("ragged", "exact", "one_past", "ragged")

    def make(rng):
        which = kind()
        bm, bn = BLOCKS[int(rng.integers(len(BLOCKS)))]
        n = {"exact": 2 * max(bm, bn), "one_past": max(bm, bn) + 1}.get(which, int(rng.integers(bn + 2, 64)))
        h, d = int(rng.integers(1, 3)), int(rng.choice([16, 32]))
        g = lambda: torch.from_numpy(rng.standard_normal((h, n, d))).float()  # noqa: E731
        q, k, v, do = g(), g(), g(), g()
        s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(d)
        o = (torch.softmax(s, -1) @ v.double()).float()
        return q, k, v, o, torch.logsumexp(s, -1).float(), do, bm, bn
    return make


def check_flash_backward_atomic(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 8: ``fn(q, k, v, o, lse, do, block_m, block_n) -> (dq, dk, dv)``, non-causal, dQ by atomics."""
    def variant(**change):
        return lambda q, k, v, o, lse, do, bm, bn: _grads(q, k, v, do, **change)

    mistakes = [
        Mistake("dq stored", "dQ holds only the last key block's share: every key-block program must *add* its "
                "tau * dS @ K_j into dQ with tl.atomic_add (and dQ must start at zero).",
                lambda q, k, v, o, lse, do, bm, bn: _grads(q, k, v, do, dq_last_block=bn)),
        Mistake("no delta", "dS = P * (dP - delta) with delta = rowsum(dO * O) (the pre-pass): you dropped delta.",
                variant(delta=False)),
        Mistake("no scale", "dQ and dK carry the 1/sqrt(D) of the forward: dQ = tau dS K, dK = tau dS^T Q.",
                variant(scale_grad=False)),
        Mistake("P not transposed", "dV = P^T dO: each key collects from the queries that attended to it.", variant(pt=False)),
    ]
    check_function(fn, _reference_flash_backward_atomic, _backward_inputs_maker(), name="flash_backward_atomic",
                   trials=trials, seed=seed, n=64, mistakes=mistakes, forbidden=FORBIDDEN_KERNEL + _own(),
                   by_hand=BY_HAND_FLASH_BACKWARD_ATOMIC, quiet=True)
    if not quiet:
        print(f"✅ flash_backward_atomic: matches the reference on {trials} random inputs, and every element of dQ was "
              f"written by tl.atomic_add, none by tl.store (seen where Triton runs interpreted).")
