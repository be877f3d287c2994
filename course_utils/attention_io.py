"""Topic 06 (FlashAttention), the cost models: FLOPs, bytes of the score matrices, global-memory traffic of
naive and tiled attention, and the tiles a causal kernel computes.

Used by ``notebooks/06_flash_attention.ipynb`` (sections 1, 2, 6 and 8, which derive each formula),
``course_utils.grading.attention`` (the reference of exercise 3) and ``benchmarks/attention_gpu.py``
(throughput = :func:`attention_flops` / time).
"""
from __future__ import annotations

import math

__all__ = [
    "attention_flops",
    "score_matrix_bytes",
    "sram_block_size",
    "naive_attention_io",
    "flash_attention_io",
    "causal_blocks_visited",
]


def attention_flops(b: int, h: int, lq: int, lk: int, d: int, causal: bool = False, backward: bool = False) -> float:
    """Matmul FLOPs of attention: ``QK^T`` and ``PV`` are ``2 L_q L_k D`` each; the backward has 5 such
    products (2.5x the forward, without recomputation); causal halves the count (the usual convention)."""
    flops = 4.0 * b * h * lq * lk * d
    if backward:
        flops *= 2.5
    return flops / 2 if causal else flops


def score_matrix_bytes(b: int, h: int, l: int, itemsize: int = 4) -> int:
    """Bytes of S and P together in rung 1: two ``(B, H, L, L)`` arrays (lesson 06, eq. 3a)."""
    return 2 * b * h * l * l * itemsize


def sram_block_size(sram_elements: int, d: int) -> int:
    """Largest power-of-two tile ``B`` (query rows = key rows) whose working set fits on chip:
    Q tile, K tile, V tile and the accumulator (``4 B d`` elements) plus the score tile (``B^2``)."""
    b = 1
    while 4 * (2 * b) * d + (2 * b) ** 2 <= sram_elements:
        b *= 2
    return b


def naive_attention_io(l: int, d: int) -> int:
    """Global-memory element reads + writes of materialised attention, per head (lesson 06, eq. 15; eqs. 1-3
    as three kernels):
    read Q, K, write S; read S, write P; read P, V, write O: ``4 L d + 4 L^2``."""
    return (2 * l * d + l * l) + (2 * l * l) + (l * l + l * d + l * d)


def flash_attention_io(l: int, d: int, sram_elements: int) -> int:
    """Global-memory element reads + writes of the tiled forward, per head (lesson 06, eq. 16): Q read once, O and lse written
    once, K and V read once per query block: ``2 L d + L + 2 L d * ceil(L / B)`` with ``B`` from
    :func:`sram_block_size` (capped at L)."""
    b = min(sram_block_size(sram_elements, d), l)
    return 2 * l * d + l + 2 * l * d * math.ceil(l / b)


def causal_blocks_visited(seqlen: int, block_m: int, block_n: int) -> int:
    """Number of (query block, key block) tiles a causal kernel computes when it skips fully masked tiles."""
    total = 0
    for i in range(math.ceil(seqlen / block_m)):
        hi = min((i + 1) * block_m, seqlen)  # one past the last query row of this block
        total += math.ceil(hi / block_n)
    return total
