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
from _grading_helpers import each_mistake_is_named, quiet_passes, right_answers_pass  # noqa: E402


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
def test_quiet_prints_nothing_on_a_right_answer(key):
    quiet_passes(CASES[key][0], CASES[key][1], seed=12345)


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
        g.check_interleaved_bubble_fraction(lambda p, m, v: 0.123456, trials=3)
    seed = int(str(first.value).split("seed=")[1].rstrip(").").split(")")[0])
    with pytest.raises(CheckFailed) as again:
        g.check_interleaved_bubble_fraction(lambda p, m, v: 0.123456, trials=3, seed=seed)
    assert str(again.value) == str(first.value)


# ---------------------------------------------------------------- exercise 7: ZeRO-2 Adam on a rank
from course_utils.checks import NotAttempted  # noqa: E402
from course_utils.grading import parallelism_zero as gz  # noqa: E402
from _grading_helpers import SEED, fails  # noqa: E402


def zero2_solution(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm):
    size = exp_avg.numel()
    pad = comm.world * size - param.numel()
    g_ = grad.new_empty(size)
    comm.reduce_scatter(g_, F.pad(grad, (0, pad)))
    g_ = g_ / comm.world
    lo = comm.rank * size
    p = F.pad(param, (0, pad))[lo:lo + size]
    b1, b2 = betas
    m = b1 * exp_avg + (1 - b1) * g_
    v = b2 * exp_avg_sq + (1 - b2) * g_ * g_
    p = p - lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)
    full = param.new_empty(comm.world * size)
    comm.all_gather(full, p)
    return full[:param.numel()], m, v


def zero2_other(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm):
    """Padding with torch.cat, lerp for the moments, torch's denominator form (sqrt(v)/sqrt(bc2) + eps)."""
    world, size = comm.world, exp_avg.shape[0]
    padded = torch.cat([grad, torch.zeros(world * size - grad.shape[0], dtype=grad.dtype)])
    mine = torch.zeros(size, dtype=grad.dtype)
    comm.reduce_scatter(mine, padded)
    mine /= world
    m = exp_avg.lerp(mine, 1 - betas[0])
    v = exp_avg_sq * betas[1] + (1 - betas[1]) * mine.square()
    bc1, bc2 = 1 - betas[0] ** step, 1 - betas[1] ** step
    shard = torch.cat([param, torch.zeros(world * size - param.shape[0], dtype=param.dtype)]).split(size)[comm.rank]
    new = torch.addcdiv(shard, m, v.sqrt() / bc2**0.5 + eps, value=-lr / bc1)
    gathered = torch.empty(world * size, dtype=param.dtype)
    comm.all_gather(gathered, new)
    return gathered.narrow(0, 0, param.shape[0]), m, v


def test_zero2_right_answers_pass_and_the_stub_is_not_attempted(capsys):
    right_answers_pass(g.check_zero2_adam_step, zero2_solution, zero2_other, capsys, trials=10)


def test_zero2_every_listed_mistake_is_named(monkeypatch):
    each_mistake_is_named(gz, g.check_zero2_adam_step, zero2_solution, monkeypatch, trials=6)


def test_zero2_without_the_collectives_fails():
    """Each rank sees only its own gradient: skipping the reduce-scatter (or the all-gather) cannot be right."""
    def local_only(param, grad, m, v, step, lr, betas, eps, comm):
        class NoPeers:
            rank, world = 0, 1
            def reduce_scatter(self, out, inp): out.copy_(inp[:out.numel()])  # noqa: E301,E704
            def all_gather(self, out, inp): out[:inp.numel()] = inp  # noqa: E301,E704
        size = m.numel()
        new_p, new_m, new_v = zero2_solution(param, grad, torch.zeros(param.numel()), torch.zeros(param.numel()),
                                             step, lr, betas, eps, NoPeers())
        return new_p, new_m[:size], new_v[:size]

    fails(g.check_zero2_adam_step, local_only, "zero2_adam_step")

    def no_gather(param, grad, m, v, step, lr, betas, eps, comm):
        size = m.numel()
        g_ = grad.new_empty(size)
        comm.reduce_scatter(g_, F.pad(grad, (0, comm.world * size - grad.numel())))
        return param.clone(), m * betas[0] + (1 - betas[0]) * g_ / comm.world, v
    fails(g.check_zero2_adam_step, no_gather, "zero2_adam_step")


def test_zero2_forgetting_the_padding_is_told_to_pad():
    def unpadded(param, grad, m, v, step, lr, betas, eps, comm):
        out = grad.new_empty(m.numel())
        comm.reduce_scatter(out, grad)
        return param, m, v

    # a world size that divides N never needs padding; the check's sizes mostly do not divide
    message = fails(g.check_zero2_adam_step, unpadded, "zero-padded", trials=6)
    assert "reduce_scatter" in message


def test_zero2_shortcuts_are_forbidden():
    def with_torch_adam(param, grad, m, v, step, lr, betas, eps, comm):
        size = m.numel()
        g_ = grad.new_empty(size)
        comm.reduce_scatter(g_, F.pad(grad, (0, comm.world * size - grad.numel())))
        shard = F.pad(param, (0, comm.world * size - param.numel()))[comm.rank * size:(comm.rank + 1) * size].clone()
        shard.requires_grad_(True)
        opt = torch.optim.Adam([shard], lr=lr, betas=betas, eps=eps)
        opt.state[shard] = {"step": torch.tensor(float(step - 1)), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        shard.grad = g_ / comm.world
        opt.step()
        full = param.new_empty(comm.world * size)
        comm.all_gather(full, shard.detach())
        st = opt.state[shard]
        return full[:param.numel()], st["exp_avg"], st["exp_avg_sq"]

    with pytest.raises(ForbiddenCall) as info:
        g.check_zero2_adam_step(with_torch_adam, seed=SEED, trials=2)
    assert "Adam" in str(info.value) or "adam" in str(info.value)
    with pytest.raises(ForbiddenCall):
        g.check_zero2_adam_step(lambda *a: gz._reference_zero2_adam_step(*a), seed=SEED, trials=2)


def test_zero2_a_hard_coded_answer_fails():
    table = {}

    def hard_coded(*args):
        table.setdefault("out", zero2_solution(*args))
        return table["out"]

    with pytest.raises(CheckFailed) as info:
        g.check_zero2_adam_step(hard_coded, seed=SEED, trials=4)
    assert not isinstance(info.value, NotAttempted)


def test_zero2_gloo_run_of_a_stub_is_not_attempted_without_launching():
    from _grading_helpers import stub

    with pytest.raises(NotAttempted):
        g.run_zero2_on_gloo(stub)


@pytest.mark.slow
def test_zero2_on_two_real_gloo_ranks_matches_torch_adam():
    assert g.run_zero2_on_gloo(zero2_solution, world=2, n=101, steps=2) < 1e-12


# ---------------------------------------------------------------- BY_HAND_* wired: the lesson modules refused
def test_a_lesson_function_reached_by_lookup_is_refused_where_the_old_list_named_none():
    capacity = getattr(pmoe, "expert_" + "capacity")  # any course_utils.parallelism* function, however reached

    def with_lesson_helper(logits, k, cap):
        capacity(logits.shape[0], logits.shape[1], k, 1.0)
        return route_solution(logits, k, cap)

    with pytest.raises(ForbiddenCall) as info:
        g.check_route_top_k(with_lesson_helper, trials=2)
    assert "course_utils.parallelism_moe.expert_capacity" in str(info.value) and "\n" not in str(info.value)
    g.check_route_top_k(route_solution, trials=2)


def test_zero2_adam_foreach_kernels_are_refused_at_the_operator():
    """torch.optim's multi-tensor path (_foreach_add_, _foreach_lerp_, ...) computes the moment update for you."""
    def with_foreach(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm):
        size = exp_avg.numel()
        pad = comm.world * size - param.numel()
        g_ = grad.new_empty(size)
        comm.reduce_scatter(g_, F.pad(grad, (0, pad)))
        g_ = g_ / comm.world
        p = F.pad(param, (0, pad))[comm.rank * size:(comm.rank + 1) * size]
        b1, b2 = betas
        m, v = b1 * exp_avg, b2 * exp_avg_sq
        torch._foreach_add_([m, v], [(1 - b1) * g_, (1 - b2) * g_ * g_])
        p = p - lr * (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + eps)
        full = param.new_empty(comm.world * size)
        comm.all_gather(full, p)
        return full[:param.numel()], m, v

    with pytest.raises(ForbiddenCall) as info:
        gz.check_zero2_adam_step(with_foreach, trials=2)
    assert "aten::_foreach_add_" in str(info.value) and "\n" not in str(info.value)
