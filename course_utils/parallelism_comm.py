r"""Lesson 09's measurements of communication: bytes through every collective, the α–β time model, overlap, 2-D meshes.

Used by ``notebooks/09_parallelism.ipynb`` (sections 3, 4 and 5); the ``*_on_rank`` functions run inside a
:class:`course_utils.parallelism.Cluster` job. Equation numbers refer to that lesson.

* :class:`CollectiveBytes`: a ``TorchDispatchMode`` that sees every c10d collective the process launches (DDP's bucket
  all-reduces, FSDP's all-gathers and reduce-scatters) and adds up, per kind, the calls and the bytes a ring algorithm
  sends per rank for that call (eq. 3 and its halves);
* :func:`fsdp_and_ddp_bytes_on_rank`: one training step of the same model under DDP and under FSDP2, counted;
* :func:`time_collective_sizes_on_rank` and :func:`fit_alpha_beta`: time per call against message size, and the
  least-squares fit :math:`t = \alpha + \text{bytes}/\beta` (eq. 3b);
* :func:`overlap_on_rank`: the wall time of backward plus the gradient all-reduce, with and without overlap;
* :func:`dp_tp_2d_on_rank`: a 2 x 2 ``DeviceMesh``, data parallel along one axis and tensor parallel along the other.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveBytes", "fsdp_and_ddp_bytes_on_rank", "time_collective_sizes_on_rank", "fit_alpha_beta",
           "overlap_on_rank", "dp_tp_2d_on_rank", "make_wide_mlp"]

# c10d op name -> (kind, which argument holds the full-size tensor, ring bytes sent per rank as a fraction of it)
_RING = {"allreduce_": ("all_reduce", 2.0), "_allgather_base_": ("all_gather", 1.0),
         "allgather_into_tensor_coalesced_": ("all_gather", 1.0), "allgather_": ("all_gather", 1.0),
         "_reduce_scatter_base_": ("reduce_scatter", 1.0), "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1.0),
         "reduce_scatter_": ("reduce_scatter", 1.0), "broadcast_": ("broadcast", 1.0)}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)


class CollectiveBytes(TorchDispatchMode):
    """Count c10d collectives: ``counts[kind]`` calls and ``sent[kind]`` bytes a ring sends per rank for them.

    For a collective whose full-size tensor has ``N`` bytes on ``p`` ranks, a ring sends ``2(p-1)/p N``
    (all-reduce, eq. 3) or ``(p-1)/p N`` (all-gather, reduce-scatter: section 2). The full size is the largest
    tensor argument of the call (the all-gather's output, the reduce-scatter's input, the all-reduce's buffer).
    """

    def __init__(self, world: int):
        super().__init__()
        self.world, self.counts, self.sent = world, {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if func._schema.name.startswith("c10d::") and name in _RING:
            kind, factor = _RING[name]
            full = max((t.numel() * t.element_size() for t in _tensors(list(args) + list((kwargs or {}).values()))),
                       default=0)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.sent[kind] = self.sent.get(kind, 0) + factor * (self.world - 1) / self.world * full
        return func(*args, **(kwargs or {}))


def make_wide_mlp(width: int = 256, layers: int = 6, seed: int = 0) -> nn.Sequential:
    """``layers`` square Linear layers with GELUs: big enough that backward and the all-reduce both take time."""
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for i in range(layers):
        mods += [nn.Linear(width, width)] + ([nn.GELU()] if i < layers - 1 else [])
    return nn.Sequential(*mods)


def fsdp_and_ddp_bytes_on_rank(seed: int = 0) -> dict:
    """One forward-backward of lesson 09's MLP under DDP and under FSDP2 (each Linear and the root sharded), counted."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from .parallelism_data import batch_shard, dp_loss, make_dp_batch, make_dp_mlp

    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_dp_batch(seed)
    xs, ys = batch_shard(x, rank, world), batch_shard(y, rank, world)
    out = {}
    ddp = DDP(make_dp_mlp(seed))
    dp_loss(ddp(xs), ys).backward()  # the first step builds the buckets; count the second
    ddp.zero_grad()
    with CollectiveBytes(world) as counter:
        dp_loss(ddp(xs), ys).backward()
    out["ddp"] = {"counts": counter.counts, "sent": counter.sent}
    model = make_dp_mlp(seed)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    with CollectiveBytes(world) as counter:
        dp_loss(model(xs), ys).backward()
    out["fsdp"] = {"counts": counter.counts, "sent": counter.sent}
    out["params"] = sum(p.numel() for p in make_dp_mlp(seed).parameters())
    return out


def time_collective_sizes_on_rank(sizes, repeats: int = 7) -> dict:
    """Median seconds per call of all-reduce, all-gather and reduce-scatter for fp32 tensors of ``sizes`` elements
    (the full size), after a barrier each time: ``{kind: [seconds per size]}``."""
    world = dist.get_world_size()
    out = {"all_reduce": [], "all_gather": [], "reduce_scatter": []}
    for n in sizes:
        full, shard = torch.randn(n), torch.empty(n // world)
        calls = {"all_reduce": lambda: dist.all_reduce(full), "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
                 "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}
        for kind, fn in calls.items():
            times = []
            for _ in range(repeats + 1):
                dist.barrier()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            out[kind].append(statistics.median(times[1:]))
    return out


def fit_alpha_beta(bytes_sent, seconds) -> tuple[float, float]:
    r"""Eq. (3b), :math:`t = \alpha + \text{bytes}/\beta`, fitted by least squares on *relative* errors (each point
    weighted by :math:`1/t`, so the small messages that set :math:`\alpha` count as much as the large ones that set
    :math:`\beta`): returns ``(alpha_seconds, beta_bytes_per_second)``."""
    x = torch.as_tensor(bytes_sent, dtype=torch.float64)
    t = torch.as_tensor(seconds, dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], 1) / t[:, None]  # (n, 2), rows divided by t
    alpha, slope = torch.linalg.lstsq(design, torch.ones_like(t)[:, None]).solution[:, 0].tolist()
    return alpha, 1.0 / slope


def overlap_on_rank(rounds: int = 5, width: int = 256, layers: int = 6, batch: int = 256, bucket_cap_mb: float = 0.25) -> dict:
    """Per round, the wall time of: backward alone; the gradient all-reduce alone (one flat buffer); backward then
    that all-reduce (no overlap, by hand); DDP with one bucket (its all-reduce starts when backward ends); and DDP
    with ``bucket_cap_mb`` buckets (all-reduces launched during backward). Seconds per round, the five alternating
    within each round, every timing after a barrier."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    world = dist.get_world_size()
    model, ddp = make_wide_mlp(width, layers), DDP(make_wide_mlp(width, layers), bucket_cap_mb=bucket_cap_mb)
    ddp_one = DDP(make_wide_mlp(width, layers), bucket_cap_mb=1024.0)  # one bucket: its all-reduce starts after backward
    x = torch.randn(batch, width)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def backward_only():
        model.zero_grad()
        model(x).pow(2).mean().backward()

    def all_reduce_only():
        dist.all_reduce(flat)

    def sequential():
        backward_only()
        torch.cat([p.grad.reshape(-1) for p in model.parameters()], out=flat)
        dist.all_reduce(flat.div_(world))

    def overlapped():
        ddp.zero_grad()
        ddp(x).pow(2).mean().backward()

    def one_bucket():
        ddp_one.zero_grad()
        ddp_one(x).pow(2).mean().backward()

    steps = {"backward": backward_only, "all_reduce": all_reduce_only, "sequential": sequential,
             "ddp_one_bucket": one_bucket, "ddp_overlapped": overlapped}
    for fn in steps.values():  # warm up (and let DDP build its buckets)
        fn()
        fn()
    out = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    out["parameters"] = flat.numel()
    return out


def dp_tp_2d_on_rank(seed: int = 0) -> dict:
    """A 2 x 2 mesh ("dp", "tp"): the lesson's MLP block tensor-parallel over "tp" (ColwiseParallel fc1, RowwiseParallel
    fc2), its batch split over "dp", the gradients averaged over "dp" by hand. Returns the full gradients (gathered from
    the shards), this rank's coordinates and output rows."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from .parallelism_tensor import MLPBlock, make_tokens

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    block = parallelize_module(MLPBlock(seed=seed), mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = make_tokens(seed)  # (B, T, h): the global batch ...
    rows = slice(dp_rank * x.shape[0] // dp_size, (dp_rank + 1) * x.shape[0] // dp_size)  # ... this dp group's share
    out = block(x[rows])  # (B/2, T, h), replicated over tp
    out.pow(2).sum().backward()  # the global loss is the sum over both shares
    for p in block.parameters():  # each grad is a DTensor over "tp"; its local shard is summed over "dp" (eq. 4)
        dist.all_reduce(p.grad._local_tensor, group=mesh.get_group("dp"))
    grads = {n.replace(".", "_") + "_grad": p.grad.full_tensor() for n, p in block.named_parameters()}
    return {"coords": (dp_rank, mesh["tp"].get_local_rank()), "rows": (rows.start, rows.stop), "out": out.detach(), **grads}
