r"""Mixture of experts for lesson 09: a top-k router with capacity, the load-balancing loss, expert parallelism.

Routing (eq. 9-11 of the lesson): softmax over the experts' logits, the ``k`` largest probabilities per token;
with ``k = 1`` the gate is that probability (Switch Transformer, so the router gets a gradient), with ``k > 1``
the gates are renormalised over the chosen ``k`` (Mixtral). Capacity: an expert takes at most ``C`` assignments; assignments
are served first choices first (all tokens' first choice, then all second choices), each in token order,
as GShard and Switch do. :func:`expert_parallel_on_rank` places one expert per rank and moves tokens with
``all_to_all_single`` (gloo has it, with uneven splits).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DIM, TOKENS_PER_RANK = 16, 24


def expert_capacity(tokens: int, experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert (eq. 10): ``ceil(capacity_factor * k * tokens / experts)``."""
    return math.ceil(capacity_factor * k * tokens / experts)


def top_k_route(logits: torch.Tensor, k: int, cap: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(expert (T, k) int64, gate (T, k), keep (T, k) bool)`` for router logits ``(T, E)`` and capacity ``cap``."""
    probs = logits.softmax(-1)  # (T, E)
    top_p, expert = probs.topk(k, dim=-1)  # (T, k)
    gate = top_p if k == 1 else top_p / top_p.sum(-1, keepdim=True)  # eq. 9: Switch keeps p, top-k renormalises
    one_hot = F.one_hot(expert.t().reshape(-1), logits.shape[-1])  # (k*T, E), choice-major order
    position = (one_hot.cumsum(0) - 1)[one_hot.bool()]  # (k*T,): slot of each assignment in its expert
    keep = (position < cap).reshape(k, -1).t()  # (T, k)
    return expert, gate, keep


def slot_positions(expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``(T, k)``: each assignment's slot in its expert's queue, choice-major then token order."""
    one_hot = F.one_hot(expert.t().reshape(-1), num_experts)  # (k*T, E)
    return (one_hot.cumsum(0) - 1)[one_hot.bool()].reshape(expert.shape[1], -1).t()


def load_balancing_loss(probs: torch.Tensor, expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    r"""Switch Transformer's auxiliary loss (eq. 11): ``E * sum_e f_e P_e``; 1 when perfectly balanced.

    ``f_e``: share of the ``T k`` assignments that go to expert ``e``; ``P_e``: mean router probability of ``e``.
    """
    f = F.one_hot(expert.reshape(-1), num_experts).float().mean(0)  # (E,)
    return num_experts * (f * probs.mean(0)).sum()


def dropped_fraction(keep: torch.Tensor) -> float:
    return 1.0 - keep.float().mean().item()


def make_experts(num_experts: int, dim: int = DIM, seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)) for _ in range(num_experts))


def make_router(num_experts: int, dim: int = DIM, seed: int = 0) -> nn.Linear:
    torch.manual_seed(10_000 + seed)
    return nn.Linear(dim, num_experts, bias=False)


def make_moe_tokens(rank: int, tokens: int = TOKENS_PER_RANK, dim: int = DIM, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(4000 + 100 * seed + rank)
    return torch.randn(tokens, dim, generator=g)  # (T, d)


def moe_dense(x, router, experts, k: int, cap: int) -> torch.Tensor:
    """One process, every expert local: ``y_t = sum_j keep_tj gate_tj expert_{e_tj}(x_t)`` (eq. 12)."""
    expert, gate, keep = top_k_route(router(x), k, cap)
    y = torch.zeros_like(x)  # (T, d)
    for e, net in enumerate(experts):
        rows, cols = ((expert == e) & keep).nonzero(as_tuple=True)
        y = y.index_add(0, rows, gate[rows, cols, None] * net(x[rows]))
    return y


def expert_parallel_on_rank(k: int = 2, capacity_factor: float = 1.25, seed: int = 0) -> dict:
    """Expert ``rank`` lives on rank ``rank``; this rank's tokens travel there and back with all_to_all_single.

    The exchanges use the autograd-aware ``torch.distributed.nn.functional.all_to_all_single``, so the loss
    ``sum_r |y_r|^2`` back-propagates to every expert on its own rank; the replicated router's gradient is
    all-reduced, as in data parallelism. Returns the output, the dense layer's output on the same tokens,
    the token counts, and the gradients (this rank's expert, the router, the input).
    """
    from torch.distributed.nn.functional import all_to_all_single

    rank, world = dist.get_rank(), dist.get_world_size()
    experts, router = make_experts(world, seed=seed), make_router(world, seed=seed)
    x = make_moe_tokens(rank, seed=seed).requires_grad_()  # (T, d)
    cap = expert_capacity(x.shape[0], world, k, capacity_factor)  # capacity per rank's batch, as in moe_dense
    expert, gate, keep = top_k_route(router(x), k, cap)
    rows, cols = keep.nonzero(as_tuple=True)  # kept assignments
    order = torch.argsort(expert[rows, cols], stable=True)  # group them by destination expert
    rows, cols = rows[order], cols[order]
    send_counts = torch.bincount(expert[rows, cols], minlength=world)  # (world,)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)  # everyone learns how many tokens arrive
    send, recv = send_counts.tolist(), recv_counts.tolist()
    received = all_to_all_single(x.new_empty(sum(recv), x.shape[1]), x[rows], recv, send)  # tokens out
    processed = experts[rank](received)  # (received, d): this rank's expert on everyone's tokens
    back = all_to_all_single(x.new_empty(len(rows), x.shape[1]), processed, send, recv)  # results home
    y = torch.zeros_like(x).index_add(0, rows, gate[rows, cols, None] * back)  # (T, d), eq. 12
    y.pow(2).sum().backward()
    router_grad = router.weight.grad.clone()
    dist.all_reduce(router_grad)  # the router is replicated: sum its gradient over ranks
    return {"y": y.detach(), "dense": moe_dense(x.detach(), router, experts, k, cap).detach(), "sent": send,
            "received": recv, "x_grad": x.grad, "router_grad": router_grad,
            "expert_grads": [q.grad.clone() if q.grad is not None else torch.zeros_like(q) for q in experts[rank].parameters()]}


def moe_reference_grads(world: int, k: int = 2, capacity_factor: float = 1.25, seed: int = 0) -> dict:
    """One process, all experts and every rank's tokens: the gradients expert parallelism must reproduce."""
    experts, router = make_experts(world, seed=seed), make_router(world, seed=seed)
    xs = [make_moe_tokens(r, seed=seed).requires_grad_() for r in range(world)]
    cap = expert_capacity(xs[0].shape[0], world, k, capacity_factor)
    sum(moe_dense(x, router, experts, k, cap).pow(2).sum() for x in xs).backward()
    return {"x_grads": [x.grad for x in xs], "router_grad": router.weight.grad,
            "expert_grads": [[q.grad if q.grad is not None else torch.zeros_like(q) for q in e.parameters()] for e in experts]}


__all__ = ["expert_capacity", "top_k_route", "slot_positions", "load_balancing_loss", "dropped_fraction", "make_experts",
           "make_router", "make_moe_tokens", "moe_dense", "expert_parallel_on_rank", "moe_reference_grads"]
