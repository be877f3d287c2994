r"""Data parallelism for lesson 09: a small model, its batches, DDP with a counting hook, FSDP's bytes per rank.

The functions that take no process group run anywhere (the single-process references); the ``*_on_rank``
ones run inside a :class:`course_utils.parallelism.Cluster` job. Byte formulas for sharded data
parallelism come from lesson 08's ZeRO equation, re-exported here as ``zero_bytes_per_gpu`` (it moves
from ``training_memory`` to ``training_memory_plan`` when lesson 08 is split; importing it from here
works before and after).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

try:  # lesson 08's ZeRO formula (eq. 5 of lesson 09), imported, never copied; its home once lesson 08 is split
    from .training_memory_plan import zero_bytes_per_gpu
except ImportError:  # pragma: no cover - before that split
    from .training_memory import zero_bytes_per_gpu

FEATURES, HIDDEN, BATCH = 16, 64, 32


def make_dp_mlp(seed: int = 0, features: int = FEATURES, hidden: int = HIDDEN, layers: int = 3) -> nn.Sequential:
    """``layers`` Linear layers with GELUs between them, initialised from ``seed`` (the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    mods: list[nn.Module] = []
    widths = [features] + [hidden] * (layers - 1) + [features]
    for i in range(layers):
        lin = nn.Linear(widths[i], widths[i + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / widths[i] ** 0.5)
            lin.bias.copy_(0.1 * torch.randn(lin.bias.shape, generator=g))
        mods += [lin, nn.GELU()] if i < layers - 1 else [lin]
    return nn.Sequential(*mods)


def make_dp_batch(seed: int = 0, batch: int = BATCH, features: int = FEATURES) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``(batch, features)`` and regression targets of the same shape."""
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(batch, features, generator=g)  # (B, F)
    return x, torch.sin(x.roll(1, dims=1))  # (B, F)


def dp_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the rows given: the mean of per-row losses, so shards average correctly."""
    return ((out - y) ** 2).mean()


def full_batch_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """The single-process reference: gradients of the mean loss over the whole batch."""
    model.zero_grad()
    dp_loss(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def batch_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous share of the batch rows (the batch size is a multiple of ``world``)."""
    per = x.shape[0] // world
    return x[rank * per:(rank + 1) * per]


def ddp_gradients_on_rank(seed: int = 0, bucket_cap_mb: float = 25.0) -> dict:
    """DistributedDataParallel on this rank's shard: gradients, and the buckets its all-reduces carried.

    Two backward passes on the same batch: DDP rebuilds its buckets after the first, in the order the
    gradients became ready, so the second shows the buckets of every later step.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_dp_batch(seed)
    model = DDP(make_dp_mlp(seed), bucket_cap_mb=bucket_cap_mb)
    buckets: list[int] = []

    def counting_hook(state, bucket):  # one call per bucket: count its bytes, then all-reduce the mean
        buf = bucket.buffer()
        buckets.append(buf.numel() * buf.element_size())
        fut = dist.all_reduce(buf.div_(world), async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    model.register_comm_hook(None, counting_hook)
    for _ in range(2):
        buckets.clear()
        model.zero_grad()
        dp_loss(model(batch_shard(x, rank, world)), batch_shard(y, rank, world)).backward()
    return {"grads": [p.grad.detach().clone() for p in model.parameters()], "bucket_bytes": buckets}


def state_bytes(tensors) -> int:
    """Bytes of the local storage of ``tensors`` (a DTensor counts only this rank's shard)."""
    total = 0
    for t in tensors:
        t = getattr(t, "_local_tensor", t)
        total += t.numel() * t.element_size()
    return total


def fsdp_step_on_rank(seed: int = 0, steps: int = 2, lr: float = 1e-2) -> dict:
    """``fully_shard`` each Linear and the root, train ``steps`` AdamW steps; bytes this rank holds, and the weights."""
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_dp_mlp(seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = make_dp_batch(seed + step)
        opt.zero_grad(set_to_none=False)
        dp_loss(model(batch_shard(x, rank, world)), batch_shard(y, rank, world)).backward()
        opt.step()
    moments = [t for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    return {"weights": state_bytes(model.parameters()), "gradients": state_bytes(p.grad for p in model.parameters()),
            "optimizer": state_bytes(moments), "full_weights": [p.full_tensor().detach() for p in model.parameters()]}


def adamw_reference(seed: int = 0, steps: int = 2, lr: float = 1e-2) -> list[torch.Tensor]:
    """One process, whole batches: the weights FSDP must reproduce."""
    model = make_dp_mlp(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = make_dp_batch(seed + step)
        opt.zero_grad()
        dp_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


__all__ = ["make_dp_mlp", "make_dp_batch", "dp_loss", "full_batch_gradients", "batch_shard", "ddp_gradients_on_rank",
           "state_bytes", "fsdp_step_on_rank", "adamw_reference", "zero_bytes_per_gpu"]
