"""Tests of course_utils.grading.parallelism: every check of the lesson-09 problem set passes the solution and a
right answer written differently, raises NotAttempted on a stub, names each listed mistake with its own hint,
rejects the course's own shortcuts as forbidden and a hard-coded answer on fresh inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_utils import parallelism_moe as pmoe
from course_utils.checks import CheckFailed, ForbiddenCall
from course_utils.grading import parallelism as g
from _grading_helpers import each_mistake_is_named, right_answers_pass  # noqa: E402


# ---------------------------------------------------------------- the solutions, as in solutions/09, and other right answers
def mlp_solution(x, w1, b1, w2, b2, world):
    blocks = [F.gelu(x @ a.T + b) @ c.T for a, b, c in zip(w1.chunk(world, 0), b1.chunk(world, 0), w2.chunk(world, 1))]
    partials = torch.stack(blocks)
    partials[0] += b2
    return partials


def mlp_other(x, w1, b1, w2, b2, world):
    per = w1.shape[0] // world
    out = torch.zeros(world, x.shape[0], w2.shape[0])
    for r in range(world):
        block = slice(r * per, (r + 1) * per)
        hidden = torch.nn.functional.gelu(torch.addmm(b1[block], x, w1[block].t()))
        out[r] = hidden @ w2[:, block].t() + (b2 if r == 0 else 0)
    return out


def ring_solution(xs):
    p, n = xs.shape
    bounds = [i * n // p for i in range(p + 1)]
    buf, log, after = xs.clone(), [], xs.clone()
    for phase in ("reduce", "gather"):
        for s in range(p - 1):
            chunk = [(r - s) % p if phase == "reduce" else (r + 1 - s) % p for r in range(p)]
            outgoing = [buf[r, bounds[c]:bounds[c + 1]].clone() for r, c in enumerate(chunk)]
            for r, c in enumerate(chunk):
                target = buf[(r + 1) % p, bounds[c]:bounds[c + 1]]
                target.add_(outgoing[r]) if phase == "reduce" else target.copy_(outgoing[r])
            log.append(chunk)
        if phase == "reduce":
            after = buf.clone()
    return after, buf, torch.tensor(log, dtype=torch.int64).reshape(2 * (p - 1), p)


def ring_other(xs):
    """Vectorised over ranks: roll the sent chunks one rank to the right."""
    p, n = xs.shape
    bounds = [i * n // p for i in range(p + 1)]
    buf, sends = xs.clone(), torch.zeros(2 * (p - 1), p, dtype=torch.int64)
    ranks = torch.arange(p)
    after = buf.clone()
    for step in range(2 * (p - 1)):
        s = step % (p - 1)
        chunk = (ranks - s) % p if step < p - 1 else (ranks + 1 - s) % p
        sends[step] = chunk
        pieces = [buf[r, bounds[c]:bounds[c + 1]].clone() for r, c in zip(ranks.tolist(), chunk.tolist())]
        for r, c in zip(ranks.tolist(), chunk.tolist()):
            dst = (r + 1) % p
            buf[dst, bounds[c]:bounds[c + 1]] = pieces[r] + (buf[dst, bounds[c]:bounds[c + 1]] if step < p - 1 else 0)
        if step == p - 2:
            after = buf.clone()
    return after, buf, sends


def bubble_solution(p, m, v):
    bubble = (p - 1) / v
    return bubble / (m + bubble)


def bubble_other(p, m, v):
    return 1 - v * m / (v * m + p - 1)


def route_solution(logits, k, cap):
    top_logits, expert = logits.topk(k, dim=-1)
    gate = top_logits.softmax(-1) if k > 1 else logits.softmax(-1).gather(1, expert)
    taken = torch.zeros(logits.shape[1], dtype=torch.int64)
    keep = torch.zeros_like(expert, dtype=torch.bool)
    for j in range(k):
        for t in range(logits.shape[0]):
            e = expert[t, j]
            keep[t, j] = bool(taken[e] < cap)
            taken[e] += 1
    return expert, gate, keep


def route_other(logits, k, cap):
    probs = logits.softmax(-1)
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
    top = probs.gather(1, order)
    gate = top / top.sum(-1, keepdim=True) if k > 1 else top
    flat = order.t().reshape(-1)
    one_hot = F.one_hot(flat, logits.shape[1])
    slot = (one_hot.cumsum(0) - 1).gather(1, flat[:, None])[:, 0]
    return order, gate, (slot < cap).reshape(k, -1).t()


def dispatch_solution(x, expert, keep, num_experts, cap):
    buffer = torch.zeros(num_experts, cap, x.shape[1], dtype=x.dtype)
    filled = [0] * num_experts
    for j in range(expert.shape[1]):
        for t in range(expert.shape[0]):
            e = int(expert[t, j])
            if keep[t, j]:
                buffer[e, filled[e]] = x[t]
            filled[e] += 1
    return buffer


def dispatch_other(x, expert, keep, num_experts, cap):
    flat_e, flat_keep = expert.t().reshape(-1), keep.t().reshape(-1)
    tokens = torch.arange(expert.shape[0]).repeat(expert.shape[1])
    one_hot = F.one_hot(flat_e, num_experts)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1)
    out = x.new_zeros(num_experts * max(cap, 1), x.shape[1])
    idx = flat_e[flat_keep] * max(cap, 1) + slot[flat_keep]
    out[idx] = x[tokens[flat_keep]]
    return out.reshape(num_experts, max(cap, 1), -1)[:, :cap]


def combine_solution(expert_out, expert, gate, keep):
    num_experts = expert_out.shape[0]
    one_hot = F.one_hot(expert.T.reshape(-1), num_experts)
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1).reshape(expert.shape[1], -1).T
    if expert_out.shape[1] == 0:
        return expert_out.new_zeros(expert.shape[0], expert_out.shape[2])
    picked = expert_out[expert, slot.clamp(max=expert_out.shape[1] - 1)]
    return ((gate * keep).unsqueeze(-1) * picked).sum(1)


def combine_other(expert_out, expert, gate, keep):
    y = expert_out.new_zeros(expert.shape[0], expert_out.shape[2])
    count = [0] * expert_out.shape[0]
    for j in range(expert.shape[1]):
        for t in range(expert.shape[0]):
            e = int(expert[t, j])
            if keep[t, j]:
                y[t] += gate[t, j] * expert_out[e, count[e]]
            count[e] += 1
    return y


CASES = {
    "mlp": (g.check_column_row_mlp_partials, mlp_solution, mlp_other),
    "ring": (g.check_ring_all_reduce_sim, ring_solution, ring_other),
    "bubble": (g.check_interleaved_bubble_fraction, bubble_solution, bubble_other),
    "route": (g.check_route_top_k, route_solution, route_other),
    "dispatch": (g.check_dispatch_to_experts, dispatch_solution, dispatch_other),
    "combine": (g.check_combine_from_experts, combine_solution, combine_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_solution_and_a_different_right_answer_pass_stub_is_not_attempted(key, capsys):
    right_answers_pass(*CASES[key], capsys, trials=8)


@pytest.mark.parametrize("key", list(CASES))
def test_every_listed_mistake_is_named_with_its_own_hint(key, monkeypatch):
    each_mistake_is_named(g, CASES[key][0], CASES[key][1], monkeypatch, trials=6)


HARD_CODED = {
    "mlp": lambda x, w1, b1, w2, b2, world: torch.zeros(world, x.shape[0], w2.shape[0]),
    "ring": lambda xs: (xs, xs.sum(0).expand_as(xs).clone(), torch.zeros(2 * (xs.shape[0] - 1), xs.shape[0], dtype=torch.int64)),
    "bubble": lambda p, m, v: 0.2727272727272727,
    "route": lambda logits, k, cap: (logits.topk(k, -1)[1], logits.topk(k, -1)[0], torch.ones(logits.shape[0], k, dtype=torch.bool)),
    "dispatch": lambda x, e, keep, n, cap: torch.zeros(n, cap, x.shape[1]),
    "combine": lambda o, e, gt, keep: torch.zeros(e.shape[0], o.shape[2]),
}


@pytest.mark.parametrize("key", list(CASES))
def test_a_hard_coded_or_shortcut_answer_fails(key):
    with pytest.raises(CheckFailed):
        CASES[key][0](HARD_CODED[key], trials=6)


FORBIDDEN = {
    "mlp": lambda *a: g._reference_column_row_mlp_partials(*a),
    "ring": lambda xs: g._reference_ring_all_reduce_sim(xs),
    "bubble": lambda p, m, v: g._reference_interleaved_bubble_fraction(p, m, v),
    "route": lambda logits, k, cap: pmoe.top_k_route(logits, k, cap),
    "dispatch": lambda x, e, keep, n, cap: g._reference_dispatch_to_experts(x, e, keep, n, cap),
    "combine": lambda o, e, gt, keep: g._reference_combine_from_experts(o, e, gt, keep),
}


@pytest.mark.parametrize("key", list(CASES))
def test_the_course_reference_is_forbidden(key):
    with pytest.raises(ForbiddenCall):
        CASES[key][0](FORBIDDEN[key], trials=2)


def test_route_library_slot_positions_is_forbidden_too():
    def with_library_slots(logits, k, cap):
        expert, gate, _ = route_solution(logits, k, cap)
        return expert, gate, pmoe.slot_positions(expert, logits.shape[1]) < cap

    with pytest.raises(ForbiddenCall):
        g.check_route_top_k(with_library_slots, trials=2)


def test_failure_messages_name_a_seed_that_reproduces_them():
    with pytest.raises(CheckFailed) as first:
        g.check_interleaved_bubble_fraction(lambda p, m, v: 0.5, trials=3)
    seed = int(str(first.value).split("seed=")[1].rstrip(").").split(")")[0])
    with pytest.raises(CheckFailed) as again:
        g.check_interleaved_bubble_fraction(lambda p, m, v: 0.5, trials=3, seed=seed)
    assert str(again.value) == str(first.value)
