"""Exercise 7 of the training-memory problem set (``solutions/08_training_memory.ipynb``): predict the bytes a
LLaMA block's MLP half (RMSNorm, then a SwiGLU MLP, then the residual) keeps for backward, checked against a
*measurement*: the check builds :class:`LlamaMLPHalf` at the drawn sizes and counts the distinct storages autograd
saves with ``saved_tensors_hooks`` (exercise 6's method). Lesson 08 derived this table for GPT-2's LayerNorm/GELU
block only.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function

_LESSON = ("course_utils.training_memory",)  # lesson modules refused by hand (course_utils.training_memory_* too)
BY_HAND_LLAMA_MLP_SAVED_BYTES = {"modules": _LESSON,
                                 "allowed_ops": (), "whole_result_ops": ()}  # integer arithmetic; no tensor op


class LlamaMLPHalf(nn.Module):
    """x + W2(silu(W1 n) * W3 n) with n = RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * w; no biases."""

    def __init__(self, hidden: int, ffn: int, dtype: torch.dtype = torch.float32, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden, dtype=dtype))
        self.w1 = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.w3 = nn.Linear(hidden, ffn, bias=False, dtype=dtype)
        self.w2 = nn.Linear(ffn, hidden, bias=False, dtype=dtype)
        self.eps = eps

    def forward(self, x):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
        return x + self.w2(F.silu(self.w1(n)) * self.w3(n))


def _measure(tokens, hidden, ffn, dtype_bytes):
    """Bytes of distinct storages autograd saves in LlamaMLPHalf(x), beyond its parameters and x: measured."""
    dtype = {2: torch.bfloat16, 4: torch.float32}[dtype_bytes]
    gen = torch.Generator().manual_seed(tokens * 7919 + hidden * 31 + ffn)
    module = LlamaMLPHalf(hidden, ffn, dtype)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).requires_grad_(True)
    skip = {t.untyped_storage().data_ptr() for t in [*module.parameters(), x]}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def _reference_llama_mlp_saved_bytes(tokens, hidden, ffn, dtype_bytes):
    return _measure(tokens, hidden, ffn, dtype_bytes)


def _inputs(rng):
    return (int(rng.integers(3, 300)), int(rng.choice([8, 16, 24, 40, 64, 96])), int(rng.choice([32, 48, 88, 160, 256])),
            int(rng.choice([2, 4])))


def check_llama_mlp_saved_bytes(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``fn(tokens, hidden, ffn, dtype_bytes) -> int``, compared with a measurement at the same sizes."""

    def variant(d_t=0, d_th=0, d_tf=0, per_element=False):
        def wrong(t, h, f, b):
            count = t * (1 + d_t) + t * h * (2 + d_th) + t * f * (4 + d_tf)
            return count if per_element else count * b
        return wrong

    check_function(
        fn, _reference_llama_mlp_saved_bytes, _inputs, name="llama_mlp_saved_bytes", trials=trials, seed=seed,
        by_hand=ByHand.of(BY_HAND_LLAMA_MLP_SAVED_BYTES),
        rtol=0.0, atol=0.0,
        mistakes=[
            Mistake("extra_th", "one (tokens, hidden) tensor too many: the input x exists anyway, and W1 and W3 save "
                    "the same normalized n (one storage, counted once).", variant(d_th=1)),
            Mistake("missing_th", "one (tokens, hidden) tensor is missing: x·r (saved by the multiply by the weight w) "
                    "and n itself (saved by W1 and W3) are two storages.", variant(d_th=-1)),
            Mistake("no_rsqrt", "rsqrt saves its output r, one number per token (tokens elements), and the multiply "
                    "x·r needs it too (the same storage).", variant(d_t=-1)),
            Mistake("three_f", "the SwiGLU part keeps four (tokens, ffn) tensors: W1's output (for silu's backward), "
                    "silu's output and W3's output (for the product's), and their product (W2's input).",
                    variant(d_tf=-1)),
            Mistake("no_norm", "RMSNorm saves tensors too: its r (tokens) and x·r (tokens x hidden), besides the n "
                    "that W1 and W3 save.", variant(d_t=-1, d_th=-1)),
            Mistake("elements", "count bytes: multiply the element count by dtype_bytes.", variant(per_element=True)),
        ],
        forbidden=("course_utils.grading.training_memory_llama._reference_llama_mlp_saved_bytes",
                   "course_utils.grading.training_memory_llama.LlamaMLPHalf.forward",
                   "torch.autograd.graph.saved_tensors_hooks.__init__",
                   "course_utils.grading.training_memory_llama._measure",
                   "course_utils.grading.training_memory._reference_saved_bytes_beyond_input",
                   "course_utils.training_memory.saved_bytes", "course_utils.training_memory.activation_bytes_per_layer"),
                   quiet=quiet,
    )


__all__ = ["LlamaMLPHalf", "check_llama_mlp_saved_bytes"]
