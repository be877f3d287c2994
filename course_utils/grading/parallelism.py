"""Checks of the parallelism problem set (``solutions/09_parallelism.ipynb``).

Every exercise is a pure function over *simulated* ranks (a leading ``world`` axis, or the formulas), so it
grades in one process on fresh random inputs (``seed=None``); the lesson (``notebooks/09_parallelism.ipynb``)
runs the same ideas on real torchrun processes. Each check names the usual mistakes.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function
from ..tolerances import tolerance_for


# For the operator-level by-hand watch: per exercise, the elementary aten ops it needs and the ones that would
# compute the whole result (none exists for the simulated collectives and the bubble formula).
_TENSOR_OPS = ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.slice", "aten.select", "aten.clone", "aten.copy_",
               "aten.cat", "aten.stack", "aten.zeros", "aten.new_zeros", "aten.index", "aten.index_put_", "aten.view",
               "aten.t", "aten.transpose", "aten.sum", "aten.cumsum", "aten.one_hot", "aten.gather", "aten.scatter")
_LESSON = ("course_utils.parallelism",)  # lesson modules refused by hand (course_utils.parallelism_* too)
BY_HAND_COLUMN_ROW_MLP_PARTIALS = {"modules": _LESSON,
                                   "allowed_ops": _TENSOR_OPS + ("aten.mm", "aten.addmm", "aten.gelu", "aten.split"),
                                   "whole_result_ops": ()}
BY_HAND_RING_ALL_REDUCE_SIM = {"modules": _LESSON, "allowed_ops": _TENSOR_OPS, "whole_result_ops": ()}
BY_HAND_INTERLEAVED_BUBBLE_FRACTION = {"modules": _LESSON, "allowed_ops": (), "whole_result_ops": ()}
BY_HAND_ROUTE_TOP_K = {"modules": _LESSON,
                       "allowed_ops": _TENSOR_OPS + ("aten.topk", "aten._softmax", "aten.lt"), "whole_result_ops": ()}
BY_HAND_DISPATCH_TO_EXPERTS = {"modules": _LESSON, "allowed_ops": _TENSOR_OPS, "whole_result_ops": ()}
BY_HAND_COMBINE_FROM_EXPERTS = {"modules": _LESSON, "allowed_ops": _TENSOR_OPS, "whole_result_ops": ()}


def _gen(rng) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng.integers(2**31)))


def _check(fn, reference, makers, *, name, trials, seed, quiet=False, **kw) -> None:
    """``check_function`` over several input generators: interior sizes first (where every named mistake shows),
    quietly, then sizes with the edges (one rank, one token, capacity 0), whose success line is printed."""
    for make in makers[:-1]:
        check_function(fn, reference, make, name=name, trials=max(2, trials // 3), seed=seed, quiet=True, **kw)
    check_function(fn, reference, makers[-1], name=name, trials=trials, seed=seed, quiet=quiet, **kw)


def _bounds(n: int, world: int) -> list[int]:
    return [i * n // world for i in range(world + 1)]


# ---------------------------------------------------------------- exercise 1: column- then row-parallel MLP
def _mlp_partials(x, w1, b1, w2, b2, world, *, gelu=True, bias="rank0", strided=False, approximate="none"):
    f = w1.shape[0]
    out = []
    for r in range(world):
        rows = torch.arange(r, f, world) if strided else torch.arange(r * f // world, (r + 1) * f // world)
        h = F.linear(x, w1[rows], b1[rows])  # (B, f/world)
        h = F.gelu(h, approximate=approximate) if gelu else h
        y = F.linear(h, w2[:, rows])  # (B, h_out)
        if bias == "all" or (bias == "rank0" and r == 0):
            y = y + b2
        elif bias == "split":
            y = y + b2 / world
        out.append(y)
    return torch.stack(out)  # (world, B, h_out)


def _reference_column_row_mlp_partials(x, w1, b1, w2, b2, world):
    return _mlp_partials(x, w1, b1, w2, b2, world)


def _mlp_inputs(rng, interior=False):
    g = _gen(rng)
    world = int(rng.choice([2, 3, 4] if interior else [1, 2, 3, 4]))
    batch, h, h_out = int(rng.choice([2, 5] if interior else [1, 2, 5])), int(rng.integers(2, 9)), int(rng.integers(1, 7))
    f = world * int(rng.integers(2 if interior else 1, 5))
    return (torch.randn(batch, h, generator=g), torch.randn(f, h, generator=g), torch.randn(f, generator=g),
            torch.randn(h_out, f, generator=g), torch.randn(h_out, generator=g), world)


def check_column_row_mlp_partials(fn: Callable, *, seed: int | None = None, trials: int = 6, quiet: bool = False) -> None:
    """Exercise 1: each rank's partial output of a column-parallel fc1 + GELU + row-parallel fc2, shape (world, B, out)."""
    variant = lambda **kw: lambda *a: _mlp_partials(*a, **kw)  # noqa: E731
    mistakes = [
        Mistake("bias everywhere", "b2 is added on every rank, so the all-reduce adds it world times: add it once, on rank 0.",
                variant(bias="all")),
        Mistake("bias split", "the convention here is b2 on rank 0 only, not b2/world on every rank.", variant(bias="split")),
        Mistake("no bias", "the partial outputs must include b2 once (on rank 0).", variant(bias="none")),
        Mistake("strided", "rank r holds a contiguous block of fc1's rows, [r·f/world, (r+1)·f/world), not every world-th row.",
                variant(strided=True)),
        Mistake("no gelu", "apply GELU to each rank's hidden slice before fc2: it is elementwise, so the split commutes with it.",
                variant(gelu=False)),
        Mistake("tanh gelu", "use the exact GELU (F.gelu's default), not the tanh approximation.", variant(approximate="tanh")),
    ]
    _check(fn, _reference_column_row_mlp_partials, [lambda rng: _mlp_inputs(rng, True), _mlp_inputs],
           name="column_row_mlp_partials", trials=trials, seed=seed, quiet=quiet, mistakes=mistakes, n=64,
                   by_hand=ByHand.of(BY_HAND_COLUMN_ROW_MLP_PARTIALS),
                   forbidden=("course_utils.grading.parallelism._reference_column_row_mlp_partials",
                              "course_utils.parallelism_tensor.tp_mlp_on_rank"))


# ---------------------------------------------------------------- exercise 2: ring all-reduce on simulated ranks
def _ring(xs, *, shift=0, direction=1, gather_like_reduce=False, overwrite=False):
    p, n = xs.shape
    b = _bounds(n, p)
    buf = xs.clone()
    sends = torch.zeros(2 * (p - 1), p, dtype=torch.int64)
    after = None
    for step in range(2 * (p - 1)):
        reduce = step < p - 1
        s = step % max(p - 1, 1)
        pairs = []
        for r in range(p):
            if reduce or gather_like_reduce:
                send_c = (r - direction * s - shift) % p
            else:
                send_c = (r + direction * (1 - s)) % p
            sends[step, r] = send_c
            pairs.append((r, send_c))
        sent = [buf[r, b[c]:b[c + 1]].clone() for r, c in pairs]  # every rank sends at the same time
        for (r, c), data in zip(pairs, sent):
            dst = (r + direction) % p
            if reduce and not overwrite:
                buf[dst, b[c]:b[c + 1]] += data
            else:
                buf[dst, b[c]:b[c + 1]] = data
        if step == p - 2:
            after = buf.clone()
    return (xs.clone() if after is None else after), buf, sends


def _reference_ring_all_reduce_sim(xs):
    return _ring(xs)


def _ring_inputs(rng, interior=False):
    p = int(rng.choice([3, 4, 5, 6] if interior else [1, 2, 3, 4, 5, 6]))
    n = int(rng.choice([p, p * int(rng.integers(1, 4)), p * 2 + int(rng.integers(1, p + 1))]))
    return (torch.randn(p, n, dtype=torch.float64, generator=_gen(rng)),)


def check_ring_all_reduce_sim(fn: Callable, *, seed: int | None = None, trials: int = 8, quiet: bool = False) -> None:
    """Exercise 2: (buffers after reduce-scatter, buffers after all-gather, chunk each rank sends at each step)."""
    variant = lambda **kw: lambda xs: _ring(xs, **kw)  # noqa: E731
    mistakes = [
        Mistake("off by one", "at reduce-scatter step s rank r sends chunk (r - s) mod p (eq. 1), not (r - s - 1).", variant(shift=1)),
        Mistake("left", "send to rank r+1 and receive from r-1 (eq. 1); the ring the other way round puts other chunks "
                "on each rank.", variant(direction=-1)),
        Mistake("gather like reduce", "in the all-gather rank r starts from the chunk it completed, (r + 1) mod p: "
                "it sends chunk (r + 1 - s) mod p (eq. 2).", variant(gather_like_reduce=True)),
        Mistake("overwrite", "reduce-scatter adds the received chunk to the local one; only the all-gather overwrites.",
                variant(overwrite=True)),
    ]
    _check(fn, _reference_ring_all_reduce_sim, [lambda rng: _ring_inputs(rng, True), _ring_inputs],
           name="ring_all_reduce_sim", by_hand=ByHand.of(BY_HAND_RING_ALL_REDUCE_SIM), trials=trials, seed=seed, quiet=quiet,
                   mistakes=mistakes, n=8,
                   forbidden=("course_utils.grading.parallelism._reference_ring_all_reduce_sim",
                              "course_utils.parallelism.ring_all_reduce", "torch.distributed.all_reduce"))


# ---------------------------------------------------------------- exercise 3: interleaved pipeline bubble
def _reference_interleaved_bubble_fraction(p, m, v):
    return (p - 1) / (v * m + p - 1)


def _bubble_inputs(rng, interior=False):
    if interior:
        return int(rng.integers(2, 17)), int(rng.integers(1, 65)), int(rng.integers(2, 5))
    return int(rng.choice([1, 2, 4, int(rng.integers(2, 17))])), int(rng.choice([1, 2, int(rng.integers(1, 65))])), \
        int(rng.choice([1, int(rng.integers(2, 5))]))


def check_interleaved_bubble_fraction(fn: Callable, *, seed: int | None = None, trials: int = 10, quiet: bool = False) -> None:
    """Exercise 3: the idle share of an interleaved 1F1B pipeline with p ranks, m micro-batches, v chunks per rank."""
    mistakes = [
        Mistake("no v", "with v chunks per rank the warm-up and drain shrink v times: the bubble is (p-1)/(v·m + p - 1).",
                lambda p, m, v: (p - 1) / (m + p - 1)),
        Mistake("ratio to ideal", "(p-1)/(v·m) is the bubble time over the *ideal* time; the question asks for the share "
                "of the *total* time.", lambda p, m, v: (p - 1) / (v * m)),
        Mistake("divide by v", "dividing eq. 7 by v undercounts: the total time shrinks too; write bubble / (work + bubble).",
                lambda p, m, v: (p - 1) / (m + p - 1) / v),
        Mistake("p not p-1", "the first stage waits for p - 1 others, not p: (p - 1) in both places.",
                lambda p, m, v: p / (v * m + p)),
    ]
    _check(fn, _reference_interleaved_bubble_fraction, [lambda rng: _bubble_inputs(rng, True), _bubble_inputs],
           name="interleaved_bubble_fraction", trials=trials, seed=seed, quiet=quiet, mistakes=mistakes,
                   by_hand=ByHand.of(BY_HAND_INTERLEAVED_BUBBLE_FRACTION),
                   forbidden=("course_utils.grading.parallelism._reference_interleaved_bubble_fraction",
                              "course_utils.parallelism_pipeline.bubble_fraction_predicted"))


# ---------------------------------------------------------------- exercise 4: top-k router with capacity
def _route(logits, k, cap, *, token_major=False, renormalize=None, slack=0):
    probs = logits.softmax(-1)  # (T, E)
    top_p, expert = probs.topk(k, dim=-1)  # (T, k)
    renorm = k > 1 if renormalize is None else renormalize
    gate = top_p / top_p.sum(-1, keepdim=True) if renorm else top_p
    order = expert.reshape(-1) if token_major else expert.t().reshape(-1)  # assignments in priority order
    one_hot = F.one_hot(order, logits.shape[-1])
    position = (one_hot.cumsum(0) - 1)[one_hot.bool()]
    keep = position < cap + slack
    keep = keep.reshape(expert.shape) if token_major else keep.reshape(k, -1).t()
    return expert, gate, keep


def _reference_route_top_k(logits, k, cap):
    return _route(logits, k, cap)


def _route_inputs(rng, k=None):
    """Logits, k, capacity. With ``k`` given (interior sizes): enough tokens, and a capacity below the mean
    load ``kT/E``, so that some expert overflows and every mistake about the queue order shows."""
    if k is not None:
        tokens, experts = int(rng.integers(6, 41)), int(rng.integers(3, 9))
        k = min(k, experts)
        cap = int(rng.integers(1, max(2, -(-k * tokens // experts))))
        return torch.randn(tokens, experts, generator=_gen(rng)) * float(rng.choice([1.0, 3.0])), k, cap
    tokens, experts = int(rng.choice([1, 2, int(rng.integers(3, 41))])), int(rng.integers(2, 9))
    k = int(rng.integers(1, min(3, experts) + 1))
    cap = int(rng.choice([0, 1, max(1, k * tokens // experts), int(rng.integers(0, k * tokens + 1))]))
    return torch.randn(tokens, experts, generator=_gen(rng)) * float(rng.choice([1.0, 3.0])), k, cap


def check_route_top_k(fn: Callable, *, seed: int | None = None, trials: int = 10, quiet: bool = False) -> None:
    """Exercise 4: (expert (T, k) int64, gate (T, k), keep (T, k) bool) for a top-k router with capacity."""
    variant = lambda **kw: lambda logits, k, cap: _route(logits, k, cap, **kw)  # noqa: E731
    mistakes = [
        Mistake("token major", "serve all first choices (in token order) before any second choice, not token by token.",
                variant(token_major=True)),
        Mistake("no renormalisation", "for k > 1 renormalise the k gates so that they sum to 1 (eq. 9).",
                variant(renormalize=False)),
        Mistake("renormalised k=1", "for k = 1 the gate is the probability itself (Switch), not 1.", variant(renormalize=True)),
        Mistake("capacity off by one", "an expert takes cap assignments: slots 0 .. cap-1 (keep = slot < cap).", variant(slack=1)),
    ]
    rtol, atol = tolerance_for(torch.float32)  # the gates; experts and keep are integers and compare exactly anyway
    _check(fn, _reference_route_top_k, [lambda rng: _route_inputs(rng, 1), lambda rng: _route_inputs(rng, 2),
                                        _route_inputs], name="route_top_k", trials=trials, seed=seed, quiet=quiet,
           by_hand=ByHand.of(BY_HAND_ROUTE_TOP_K),
           mistakes=mistakes, rtol=rtol, atol=atol,
                   forbidden=("course_utils.grading.parallelism._reference_route_top_k",
                              "course_utils.parallelism_moe.top_k_route", "course_utils.parallelism_moe.slot_positions"))


# ---------------------------------------------------------------- exercises 5 and 6: dispatch and combine
def _slots(expert, num_experts, token_major=False):
    order = expert.reshape(-1) if token_major else expert.t().reshape(-1)
    one_hot = F.one_hot(order, num_experts)
    position = (one_hot.cumsum(0) - 1)[one_hot.bool()]
    return position.reshape(expert.shape) if token_major else position.reshape(expert.shape[1], -1).t()


def _dispatch(x, expert, keep, num_experts, cap, *, token_major=False):
    buffer = x.new_zeros(num_experts, cap, x.shape[1])  # (E, C, d)
    slot = _slots(expert, num_experts, token_major)
    rows, cols = (keep & (slot < cap)).nonzero(as_tuple=True)
    buffer[expert[rows, cols], slot[rows, cols]] = x[rows]
    return buffer


def _reference_dispatch_to_experts(x, expert, keep, num_experts, cap):
    return _dispatch(x, expert, keep, num_experts, cap)


def _moe_inputs(rng, interior=False):
    logits, k, cap = _route_inputs(rng, int(rng.integers(2, 4)) if interior else None)
    expert, gate, keep = _route(logits, k, cap)
    x = torch.randn(logits.shape[0], int(rng.integers(1, 6)), generator=_gen(rng))  # (T, d)
    return x, expert, gate, keep, logits.shape[1], cap


def _dispatch_inputs(rng, interior=False):
    x, expert, _, keep, num_experts, cap = _moe_inputs(rng, interior)
    return x, expert, keep, num_experts, cap


def check_dispatch_to_experts(fn: Callable, *, seed: int | None = None, trials: int = 10, quiet: bool = False) -> None:
    """Exercise 5: the (E, C, d) buffer of tokens each expert processes, zeros in unused slots."""
    mistakes = [
        Mistake("token major", "slots follow the router's priority: all first choices in token order, then second choices.",
                lambda x, e, keep, n, cap: _dispatch(x, e, keep, n, cap, token_major=True)),
        Mistake("first choice only", "dispatch every kept assignment, all k choices of each token.",
                lambda x, e, keep, n, cap: _dispatch(x, e[:, :1], keep[:, :1], n, cap)),
    ]
    _check(fn, _reference_dispatch_to_experts, [lambda rng: _dispatch_inputs(rng, True), _dispatch_inputs],
           name="dispatch_to_experts", trials=trials, seed=seed, quiet=quiet, mistakes=mistakes,
                   by_hand=ByHand.of(BY_HAND_DISPATCH_TO_EXPERTS),
                   forbidden=("course_utils.grading.parallelism._reference_dispatch_to_experts",
                              "course_utils.parallelism_moe.slot_positions"))


def _combine(expert_out, expert, gate, keep, *, use_gate=True, use_keep=True, token_major=False):
    num_experts, cap, d = expert_out.shape
    y = expert_out.new_zeros(expert.shape[0], d)  # (T, d)
    slot = _slots(expert, num_experts, token_major)
    mask = slot < cap
    if use_keep:
        mask = mask & keep
    rows, cols = mask.nonzero(as_tuple=True)
    weight = gate[rows, cols, None] if use_gate else 1.0
    return y.index_add(0, rows, weight * expert_out[expert[rows, cols], slot[rows, cols]])


def _reference_combine_from_experts(expert_out, expert, gate, keep):
    return _combine(expert_out, expert, gate, keep)


def _combine_inputs(rng, interior=False):
    x, expert, gate, keep, num_experts, cap = _moe_inputs(rng, interior)
    return torch.randn(num_experts, cap, x.shape[1], generator=_gen(rng)), expert, gate, keep


def check_combine_from_experts(fn: Callable, *, seed: int | None = None, trials: int = 10, quiet: bool = False) -> None:
    """Exercise 6: y_t = sum_j keep_tj gate_tj out[e_tj, slot_tj] (eq. 12), zeros for fully dropped tokens."""
    mistakes = [
        Mistake("no gate", "multiply each expert's output by its gate before adding (eq. 12).",
                lambda o, e, g, k: _combine(o, e, g, k, use_gate=False)),
        Mistake("token major", "read the slots in the router's priority order: first choices of all tokens, then second.",
                lambda o, e, g, k: _combine(o, e, g, k, token_major=True)),
    ]
    _check(fn, _reference_combine_from_experts, [lambda rng: _combine_inputs(rng, True), _combine_inputs],
           name="combine_from_experts", trials=trials, seed=seed, quiet=quiet, mistakes=mistakes, n=4,
                   by_hand=ByHand.of(BY_HAND_COMBINE_FROM_EXPERTS),
                   forbidden=("course_utils.grading.parallelism._reference_combine_from_experts",
                              "course_utils.parallelism_moe.moe_dense"))


# ---------------------------------------------------------------- exercise 7: ZeRO-2 Adam on real ranks
from .parallelism_zero import GlooComm, check_zero2_adam_step, run_zero2_on_gloo  # noqa: E402,F401
