r"""Topic 03 (convolution), rung 4: Goto and van de Geijn's blocked GEMM in NumPy, and the cache sizes it is tuned to.

Used by ``notebooks/03_convolution.ipynb`` (section 5 writes ``blocked_matmul_by_hand`` and asserts it
equals :func:`blocked_matmul`; it sweeps block sizes with this copy) and ``benchmarks/conv_cpu.py``.

Loop order (lesson 03, section 5): ``jc`` (``nc`` columns of B, L3) > ``pc`` (``kc``-deep slice, packs B)
> ``ic`` (``mc`` rows of A, L2, packs A) > ``jr`` (``nr`` columns, a B micro-panel in L1) > ``ir``
(``mr`` rows): the micro-kernel updates one ``mr x nr`` tile of C. Block sizes from cache sizes: eq. (6).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .convolution import conv2d_im2col

__all__ = ["FALLBACK_CACHES", "cache_sizes", "goto_block_sizes", "pack_a", "pack_b", "blocked_matmul", "conv2d_blocked"]


# Used when /sys does not say (a typical desktop core); the lesson prints which source it used.
FALLBACK_CACHES = {"L1d": 32 * 1024, "L2": 1024 * 1024, "L3": 8 * 1024 * 1024}


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def cache_sizes(root: str | os.PathLike = "/sys/devices/system/cpu/cpu0/cache") -> dict:
    """Data-cache sizes in bytes, ``{"L1d", "L2", "L3", "source"}``, read from Linux's sysfs.

    Missing levels (another OS, a container hiding /sys) fall back to :data:`FALLBACK_CACHES`, and
    ``source`` says which values were read and which were assumed.
    """
    found: dict[str, int] = {}
    for index in sorted(Path(root).glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        found["L1d" if level == 1 else f"L{level}"] = size
    out = {k: found.get(k, v) for k, v in FALLBACK_CACHES.items()}
    missing = [k for k in FALLBACK_CACHES if k not in found]
    out["source"] = "sysfs" if not missing else ("fallback" if len(missing) == 3 else f"sysfs, fallback for {', '.join(missing)}")
    return out


def goto_block_sizes(caches: dict, itemsize: int = 4, mr: int = 8, nr: int = 8) -> dict:
    r"""Block sizes from cache sizes (eq. 6): half of each cache holds the block that lives there.

    * ``kc``: an A micro-panel (mr x kc) and a B micro-panel (kc x nr) fit in half of L1;
    * ``mc``: the packed A block (mc x kc) fits in half of L2;
    * ``nc``: the packed B panel (kc x nc) fits in half of L3.

    Each is rounded down to a multiple of 16 (``kc``), ``mr`` (``mc``) or ``nr`` (``nc``).
    """
    kc = max(16, (caches["L1d"] // 2) // ((mr + nr) * itemsize) // 16 * 16)
    mc = max(mr, (caches["L2"] // 2) // (kc * itemsize) // mr * mr)
    nc = max(nr, (caches["L3"] // 2) // (kc * itemsize) // nr * nr)
    return {"mc": int(mc), "kc": int(kc), "nc": int(nc), "mr": mr, "nr": nr}


def pack_a(a_block: np.ndarray, mr: int) -> np.ndarray:
    """``(mc, kc) -> (ceil(mc/mr), kc, mr)``: row micro-panels, each stored k-major and contiguous, zero-padded."""
    mc, kc = a_block.shape
    panels = -(-mc // mr)
    buf = np.zeros((panels * mr, kc), dtype=a_block.dtype)
    buf[:mc] = a_block
    return np.ascontiguousarray(buf.reshape(panels, mr, kc).transpose(0, 2, 1))  # (panels, kc, mr)


def pack_b(b_block: np.ndarray, nr: int) -> np.ndarray:
    """``(kc, nc) -> (ceil(nc/nr), kc, nr)``: column micro-panels, each contiguous, zero-padded."""
    kc, nc = b_block.shape
    panels = -(-nc // nr)
    buf = np.zeros((kc, panels * nr), dtype=b_block.dtype)
    buf[:, :nc] = b_block
    return np.ascontiguousarray(buf.reshape(kc, panels, nr).transpose(1, 0, 2))  # (panels, kc, nr)


def blocked_matmul(a: np.ndarray, b: np.ndarray, mc: int = 64, kc: int = 256, nc: int = 1024,
                   mr: int = 8, nr: int = 8) -> np.ndarray:
    """Goto's five loops around a micro-kernel, in NumPy so the structure is visible (rung 4).

    Loop order: ``jc`` (nc columns of B, L3) > ``pc`` (kc-deep slice, packs B) > ``ic`` (mc rows of A,
    L2, packs A) > ``jr`` (nr columns, a B micro-panel in L1) > ``ir`` (mr rows): the micro-kernel
    updates one ``mr x nr`` tile of C, which a compiled kernel keeps in registers.
    """
    m, k = a.shape
    k2, n = b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    c = np.zeros((m, n), dtype=np.result_type(a, b))
    for jc in range(0, n, nc):
        ncur = min(nc, n - jc)
        for pc in range(0, k, kc):
            b_packed = pack_b(b[pc:pc + kc, jc:jc + ncur], nr)  # (nc/nr, kc, nr)
            for ic in range(0, m, mc):
                mcur = min(mc, m - ic)
                a_packed = pack_a(a[ic:ic + mcur, pc:pc + kc], mr)  # (mc/mr, kc, mr)
                c_block = np.zeros((a_packed.shape[0] * mr, b_packed.shape[0] * nr), dtype=c.dtype)
                for jr in range(b_packed.shape[0]):
                    b_panel = b_packed[jr]  # (kc, nr)
                    for ir in range(a_packed.shape[0]):
                        # micro-kernel: sum over p of outer(a_panel[p], b_panel[p]) into an mr x nr tile
                        c_block[ir * mr:(ir + 1) * mr, jr * nr:(jr + 1) * nr] += a_packed[ir].T @ b_panel
                c[ic:ic + mcur, jc:jc + ncur] += c_block[:mcur, :ncur]
    return c


def conv2d_blocked(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1,
                   **blocks: int) -> np.ndarray:
    """Rung 4: im2col, then :func:`blocked_matmul` with the given ``mc, kc, nc, mr, nr``."""
    return conv2d_im2col(x, w, stride, padding, dilation, matmul=lambda a, b: blocked_matmul(a, b, **blocks))


