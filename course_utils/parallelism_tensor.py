r"""Tensor parallelism for lesson 09: Megatron's column- then row-parallel MLP and head-parallel attention.

The two autograd functions are Megatron's ``f`` and ``g`` (Shoeybi et al., 2019): :class:`CopyToRanks` is the
identity forward and an all-reduce of the input gradient backward; :class:`SumOverRanks` is an all-reduce
forward and the identity backward. With them a block does exactly one all-reduce forward and one backward.
The ``*_on_rank`` functions run inside a :class:`course_utils.parallelism.Cluster` job; the blocks
themselves (:class:`MLPBlock`, :class:`AttentionBlock`) are the single-process references.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HIDDEN, HEADS, TOKENS, BATCH = 32, 8, 6, 2


class CopyToRanks(torch.autograd.Function):
    """Megatron's f: forward passes x through; backward sums the input gradients of all ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class SumOverRanks(torch.autograd.Function):
    """Megatron's g: forward sums the partial outputs of all ranks; backward passes the gradient through."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class MLPBlock(nn.Module):
    """``fc2(gelu(fc1(x)))`` with ``fc1: h -> 4h`` and ``fc2: 4h -> h``."""

    def __init__(self, hidden: int = HIDDEN, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):  # (B, T, h)
        return self.fc2(F.gelu(self.fc1(x)))


class AttentionBlock(nn.Module):
    """Causal multi-head self-attention: ``qkv: h -> 3h`` (q heads, then k heads, then v heads), ``proj: h -> h``."""

    def __init__(self, hidden: int = HIDDEN, heads: int = HEADS, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.heads, self.qkv, self.proj = heads, nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)

    def forward(self, x):  # (B, T, h)
        return self.proj(attention_heads(x, self.qkv.weight, self.qkv.bias, self.heads))


def attention_heads(x, w_qkv, b_qkv, heads: int):
    """Causal attention of ``heads`` heads whose q, k, v rows are stacked in ``w_qkv`` (3·heads·d, h)."""
    B, T, _ = x.shape
    q, k, v = F.linear(x, w_qkv, b_qkv).chunk(3, dim=-1)  # 3 x (B, T, heads*d)
    q, k, v = (t.reshape(B, T, heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, d)
    return out.transpose(1, 2).reshape(B, T, -1)  # (B, T, heads*d)


def make_tokens(seed: int = 0, hidden: int = HIDDEN) -> torch.Tensor:
    g = torch.Generator().manual_seed(2000 + seed)
    return torch.randn(BATCH, TOKENS, hidden, generator=g)  # (B, T, h)


def column_rows(n_out: int, rank: int, world: int) -> slice:
    """The contiguous block of output rows (of a column-parallel weight) that ``rank`` holds."""
    per = n_out // world
    return slice(rank * per, (rank + 1) * per)


def head_rows(hidden: int, heads: int, rank: int, world: int) -> torch.Tensor:
    """Rows of ``w_qkv`` for this rank's heads: its block of q rows, of k rows and of v rows."""
    rows = torch.arange(hidden)[column_rows(hidden, rank, world)]
    return torch.cat([rows, rows + hidden, rows + 2 * hidden])


def tp_mlp_on_rank(seed: int = 0) -> dict:
    """The MLP with fc1 split by output rows and fc2 by input columns: output, input grad, this rank's weight grads."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = MLPBlock(seed=seed)
    rows = column_rows(full.fc1.out_features, rank, world)
    w1 = full.fc1.weight[rows].detach().clone().requires_grad_()  # (4h/p, h)
    b1 = full.fc1.bias[rows].detach().clone().requires_grad_()  # (4h/p,)
    w2 = full.fc2.weight[:, rows].detach().clone().requires_grad_()  # (h, 4h/p)
    x = make_tokens(seed).requires_grad_()  # (B, T, h), the same on every rank
    partial = F.linear(F.gelu(F.linear(CopyToRanks.apply(x), w1, b1)), w2)  # (B, T, h), a partial sum
    out = SumOverRanks.apply(partial) + full.fc2.bias  # the bias once, after the sum
    out.pow(2).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "w1_grad": w1.grad, "b1_grad": b1.grad, "w2_grad": w2.grad}


def tp_attention_on_rank(seed: int = 0) -> dict:
    """Attention with this rank's heads only (qkv by head rows, proj by input columns); one all-reduce."""
    rank, world = dist.get_rank(), dist.get_world_size()
    full = AttentionBlock(seed=seed)
    hidden, heads = full.proj.in_features, full.heads
    rows = head_rows(hidden, heads, rank, world)
    w_qkv = full.qkv.weight[rows].detach().clone().requires_grad_()  # (3h/p, h)
    b_qkv = full.qkv.bias[rows].detach().clone()
    w_proj = full.proj.weight[:, column_rows(hidden, rank, world)].detach().clone().requires_grad_()  # (h, h/p)
    x = make_tokens(seed).requires_grad_()
    heads_out = attention_heads(CopyToRanks.apply(x), w_qkv, b_qkv, heads // world)  # (B, T, h/p)
    out = SumOverRanks.apply(F.linear(heads_out, w_proj)) + full.proj.bias  # (B, T, h)
    out.pow(2).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "w_qkv_grad": w_qkv.grad, "w_proj_grad": w_proj.grad}


def reference_grads(block: nn.Module, seed: int = 0) -> dict:
    """One process, the unsharded block: output, input gradient and every weight gradient."""
    x = make_tokens(seed).requires_grad_()
    out = block(x)
    out.pow(2).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, **{n.replace(".", "_") + "_grad": p.grad for n, p in block.named_parameters()}}


def dtensor_mlp_on_rank(seed: int = 0) -> dict:
    """The same MLP through DeviceMesh + parallelize_module (ColwiseParallel fc1, RowwiseParallel fc2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    block = parallelize_module(MLPBlock(seed=seed), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = make_tokens(seed).requires_grad_()
    out = block(x)
    out.pow(2).sum().backward()
    return {"out": out.detach(), "x_grad": x.grad, "local_fc1_shape": tuple(block.fc1.weight.to_local().shape),
            "placements": str(block.fc1.weight.placements) + " " + str(block.fc2.weight.placements),
            **{n.replace(".", "_") + "_grad": p.grad.full_tensor() for n, p in block.named_parameters()}}


__all__ = ["CopyToRanks", "SumOverRanks", "MLPBlock", "AttentionBlock", "attention_heads", "make_tokens",
           "column_rows", "head_rows", "tp_mlp_on_rank", "tp_attention_on_rank", "reference_grads", "dtensor_mlp_on_rank"]
