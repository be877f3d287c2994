r"""ZeRO stage 1 on the CPU with two processes: each rank keeps the Adam state of half the parameters.

Launched by ``notebooks/08_training_memory.ipynb`` through ``torchrun`` (see
:func:`course_utils.training_memory_plan.zero1_command`)::

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m course_utils.zero1_demo --out r.json

Every rank holds the whole model (ZeRO-1 shards only the optimizer state). Per step: each rank
computes gradients on its half of the batch; an all-reduce averages them; each rank runs AdamW on
its own slice of the flat parameter vector (so it stores m and v only for that slice); an
all-gather puts the updated slices back together on every rank. Rank 0 also trains an unsharded
AdamW reference on the whole batch and writes one JSON file with what the lesson prints.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course_utils.checks import TOLERANCES
from course_utils.mixed_precision import tensor_bytes
from course_utils.training_memory_plan import shard_bounds

LR, WEIGHT_DECAY, BATCH, FEATURES = 1e-2, 1e-2, 64, 32


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))


def make_batch(seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g)  # (BATCH, FEATURES)
    return x, torch.sin(x.sum(1, keepdim=True))  # (BATCH, 1)


def optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    return tensor_bytes(t for s in opt.state.values() for t in s.values() if torch.is_tensor(t))


def zero1_train(seed: int, steps: int, rank: int, world: int) -> tuple[torch.Tensor, int, list[float], tuple]:
    model = make_model(seed)
    numel = sum(p.numel() for p in model.parameters())
    lo, hi, per = shard_bounds(numel, world, rank)
    shard = nn.Parameter(parameters_to_vector(model.parameters()).detach()[lo:hi].clone())  # (hi - lo,)
    opt = torch.optim.AdamW([shard], lr=LR, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(steps):
        x, y = make_batch(seed, step)
        rows = slice(rank * BATCH // world, (rank + 1) * BATCH // world)  # this rank's half of the batch
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        grad = parameters_to_vector(p.grad for p in model.parameters())  # (numel,)
        dist.all_reduce(grad)  # sum over ranks ...
        grad /= world  # ... then mean: the gradient of the whole batch's mean loss
        shard.grad = grad[lo:hi].clone()
        opt.step()  # AdamW on this rank's slice only: m and v have hi - lo entries
        padded = torch.zeros(per)
        padded[: hi - lo] = shard.detach()
        parts = [torch.empty(per) for _ in range(world)]
        dist.all_gather(parts, padded)
        vector_to_parameters(torch.cat(parts)[:numel], model.parameters())  # every rank: full new weights
        loss = loss.detach()
        dist.all_reduce(loss)
        losses.append(loss.item() / world)
    return parameters_to_vector(model.parameters()).detach(), optimizer_bytes(opt), losses, (lo, hi)


def reference_train(seed: int, steps: int, world: int) -> tuple[torch.Tensor, int]:
    """Unsharded AdamW in one process, fed the same gradient: the mean of the ``world`` part-batch gradients."""
    model = make_model(seed)
    flat = nn.Parameter(parameters_to_vector(model.parameters()).detach().clone())  # (numel,)
    opt = torch.optim.AdamW([flat], lr=LR, weight_decay=WEIGHT_DECAY)
    for step in range(steps):
        vector_to_parameters(flat.detach().clone(), model.parameters())
        x, y = make_batch(seed, step)
        grads = []
        for r in range(world):
            rows = slice(r * BATCH // world, (r + 1) * BATCH // world)
            model.zero_grad()
            nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
            grads.append(parameters_to_vector(p.grad for p in model.parameters()))
        flat.grad = torch.stack(grads).sum(0) / world  # (numel,)
        opt.step()
    return flat.detach(), optimizer_bytes(opt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    params, opt_bytes, losses, bounds = zero1_train(args.seed, args.steps, rank, world)
    per_rank = [None] * world
    dist.all_gather_object(per_rank, {"rank": rank, "optimizer_bytes": opt_bytes, "shard": bounds})
    dist.barrier()  # nobody tears down its connections while another rank still talks
    dist.destroy_process_group()
    if rank == 0:
        ref_params, ref_bytes = reference_train(args.seed, args.steps, world)
        rtol, atol = TOLERANCES["float32"]
        result = {
            "world": world, "numel": params.numel(), "steps": args.steps, "losses": losses, "ranks": per_rank,
            "reference_optimizer_bytes": ref_bytes,
            "max_abs_diff": (params - ref_params).abs().max().item(),
            "allclose": bool(torch.allclose(params, ref_params, rtol=rtol, atol=atol)),
            "tolerance": [rtol, atol],
        }
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
    # Leave without running C++ static destructors: with gloo on the CPU, a rank that exits while the
    # library's worker threads are still being torn down aborts now and then ("terminate called
    # without an active exception", SIGABRT) after all the work is done. Everything is written by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
