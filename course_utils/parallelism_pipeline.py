r"""Pipeline parallelism for lesson 09: stages, the naive, GPipe and 1F1B orders, a send/recv executor, timelines.

A schedule is, for each rank, a list of operations ``("F", i)`` (forward of micro-batch ``i``) and ``("B", i)``.
:func:`run_schedule_on_rank` executes such a list with point-to-point sends on gloo, on real stage modules,
and records when each operation ran. Compute time is set by ``time.sleep`` in proportion to the micro-batch
size (the stages are tiny; the sleep stands in for a big layer and leaves the CPU free, so that four ranks on a
two-core machine do not fight over cores and the timeline shows the schedule, not the OS scheduler).
:func:`pipelining_on_rank` runs the same stages with ``torch.distributed.pipelining``.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

WIDTH, BATCH = 32, 16
T_FORWARD, T_BACKWARD = 0.064, 0.128  # seconds for a whole batch through one stage (backward = 2 x forward)


def make_stages(p: int, seed: int = 0) -> list[nn.Module]:
    """``p`` stages of ``Linear(W, W) + tanh``, initialised from ``seed``."""
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(p)]


def make_pipeline_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3000 + seed)
    x = torch.randn(BATCH, WIDTH, generator=g)  # (B, W)
    return x, torch.cos(x)  # (B, W)


def pipeline_reference_grads(p: int, seed: int = 0) -> list[torch.Tensor]:
    """One process: gradients of the mean squared error over the whole batch, every stage's parameters in order."""
    stages = make_stages(p, seed)
    x, y = make_pipeline_batch(seed)
    ((nn.Sequential(*stages)(x) - y) ** 2).mean().backward()
    return [q.grad for s in stages for q in s.parameters()]


def gpipe_order(p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """GPipe: all ``m`` forwards, then all backwards (the naive schedule is ``m = 1``)."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b_order(p: int, m: int, rank: int) -> list[tuple[str, int]]:
    """1F1B: ``p - rank - 1`` warm-up forwards, then alternate one forward and one backward, then drain."""
    warm = min(p - rank - 1, m)
    ops = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        ops += [("F", warm + i), ("B", i)]
    return ops + [("B", i) for i in range(m - warm, m)]


def bubble_fraction_predicted(p: int, m: int) -> float:
    """Idle share of the pipeline's time with equal stages (eq. 7): ``(p - 1) / (m + p - 1)``."""
    return (p - 1) / (m + p - 1)


def run_schedule_on_rank(order_name: str, m: int, seed: int = 0, t_forward: float = T_FORWARD,
                         t_backward: float = T_BACKWARD) -> dict:
    """Execute a schedule on this rank with send/recv. Returns events, peak stored micro-batches and weight grads."""
    rank, p = dist.get_rank(), dist.get_world_size()
    ops = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order}[order_name](p, m, rank)
    stage = make_stages(p, seed)[rank]
    x, y = make_pipeline_batch(seed)
    xs, ys = x.chunk(m), y.chunk(m)  # m x (B/m, W)
    stored, peak, events, pending = {}, 0, [], []
    dist.barrier()
    t0 = time.perf_counter()
    for kind, i in ops:
        if kind == "F":
            inp = xs[i].clone() if rank == 0 else torch.empty_like(xs[i])
            if rank > 0:
                dist.recv(inp, rank - 1, tag=i)
            start = time.perf_counter()
            inp.requires_grad_(rank > 0)
            out = stage(inp)  # (B/m, W)
            time.sleep(t_forward / m)
            if rank == p - 1:
                out = ((out - ys[i]) ** 2).mean() / m  # this micro-batch's share of the mean loss
            else:
                pending.append(dist.isend(out.detach(), rank + 1, tag=i))
            stored[i] = (inp, out)
            peak = max(peak, len(stored))
        else:
            inp, out = stored.pop(i)
            grad = None
            if rank < p - 1:
                grad = torch.empty_like(out)
                dist.recv(grad, rank + 1, tag=10_000 + i)
            start = time.perf_counter()
            torch.autograd.backward(out, grad)
            time.sleep(t_backward / m)
            if rank > 0:
                pending.append(dist.isend(inp.grad, rank - 1, tag=10_000 + i))
        events.append((kind, i, start - t0, time.perf_counter() - t0))
    for request in pending:
        request.wait()
    dist.barrier()
    return {"events": events, "peak_stored": peak, "grads": [q.grad for q in stage.parameters()],
            "activation_bytes": peak * xs[0].numel() * xs[0].element_size()}


def measured_bubble(per_rank_events: list[list[tuple]]) -> float:
    """Idle share of the timeline: 1 - busy time / (ranks x span from the first start to the last end)."""
    starts = [e[2] for ev in per_rank_events for e in ev]
    ends = [e[3] for ev in per_rank_events for e in ev]
    busy = sum(e[3] - e[2] for ev in per_rank_events for e in ev)
    return 1 - busy / (len(per_rank_events) * (max(ends) - min(starts)))


def plot_timeline(ax, per_rank_events: list[list[tuple]], title: str) -> None:
    """One row per rank: forwards in blue, backwards in orange, labelled with the micro-batch."""
    for rank, events in enumerate(per_rank_events):
        for kind, i, start, end in events:
            ax.barh(rank, end - start, left=start, color="#4c72b0" if kind == "F" else "#dd8452", edgecolor="white")
            if end - start > 0.012:
                ax.text((start + end) / 2, rank, str(i), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(per_rank_events)), [f"rank {r}" for r in range(len(per_rank_events))])
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)


def pipelining_on_rank(schedule: str, m: int, seed: int = 0) -> list[torch.Tensor]:
    """The same stages through ``torch.distributed.pipelining`` (``ScheduleGPipe`` or ``Schedule1F1B``): weight grads."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, p = dist.get_rank(), dist.get_world_size()
    module = make_stages(p, seed)[rank]
    stage = PipelineStage(module, rank, p, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = cls(stage, n_microbatches=m, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x, y = make_pipeline_batch(seed)
    if rank == 0:
        sched.step(x)
    elif rank == p - 1:
        sched.step(target=y)
    else:
        sched.step()
    return [q.grad for q in module.parameters()]


__all__ = ["make_stages", "make_pipeline_batch", "pipeline_reference_grads", "gpipe_order", "one_f_one_b_order",
           "bubble_fraction_predicted", "run_schedule_on_rank", "measured_bubble", "plot_timeline", "pipelining_on_rank"]
