"""Tests of course_utils.attention_io: FLOPs, bytes, the IO model and the causal tile count."""
from __future__ import annotations

import math

import numpy as np

from course_utils import attention_io as at


def test_io_accounting():
    assert at.naive_attention_io(1024, 64) == 4 * 1024 * 64 + 4 * 1024 ** 2
    b = at.sram_block_size(100_000 // 2, 64)  # 100 KB of bf16
    assert 4 * b * 64 + b * b <= 50_000 < 4 * (2 * b) * 64 + (2 * b) ** 2
    assert at.flash_attention_io(4096, 64, 50_000) == 2 * 4096 * 64 + 4096 + 2 * 4096 * 64 * math.ceil(4096 / b)
    assert at.flash_attention_io(4096, 64, 50_000) < at.naive_attention_io(4096, 64)
    assert at.score_matrix_bytes(2, 3, 10, 4) == 2 * 2 * 3 * 100 * 4
    assert at.attention_flops(1, 1, 8, 8, 4) == 4 * 64 * 4
    assert at.attention_flops(1, 1, 8, 8, 4, causal=True, backward=True) == 4 * 64 * 4 * 2.5 / 2


def test_causal_blocks_visited_counts_nonempty_tiles():
    for l, bm, bn in ((100, 16, 32), (64, 32, 16), (37, 16, 16)):
        mask = np.tril(np.ones((l, l), bool))
        count = sum(mask[i:i + bm, j:j + bn].any() for i in range(0, l, bm) for j in range(0, l, bn))
        assert at.causal_blocks_visited(l, bm, bn) == count


