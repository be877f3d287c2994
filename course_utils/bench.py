r"""Timing, FLOP/byte counting, measured ceilings and the "ladder" plots of every lesson.

Every lesson times each rung of its ladder with :func:`time_it` (CPU: warm-up, repeats, median;
CUDA: CUDA events), records it in a :class:`Ladder` together with the rung's FLOPs and bytes
moved, and shows :meth:`Ladder.table` and :func:`plot_ladder` / :func:`plot_roofline`.
Timings differ from run to run, so print them only in cells tagged ``nbval-ignore-output``.

Formulas used for throughput (no unexplained constants):

* GFLOP/s = FLOPs / seconds / 1e9, GB/s = bytes / seconds / 1e9 (decimal units, as datasheets).
* A multiply-add counts as 2 FLOPs: an :math:`M\times N\times K` GEMM is :math:`2MNK` FLOPs.
* Arithmetic intensity = FLOPs / bytes; the roofline is min(peak FLOP/s, intensity x bandwidth).

Ceilings are *measured* on the current machine (:func:`measure_ceilings`), never typed in.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = ["Timing", "format_seconds", "single_thread", "time_cpu", "time_cuda", "time_it", "matmul_flops", "matmul_bytes",
           "conv1d_flops", "conv2d_flops", "gflops", "gbps", "Ceilings", "measure_ceilings", "Rung", "Ladder", "plot_ladder",
           "plot_roofline"]


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of repeated calls, in seconds."""

    times: tuple[float, ...]
    device: str = "cpu"

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def best(self) -> float:
        return min(self.times)

    def __str__(self) -> str:
        return f"{format_seconds(self.median)} (median of {len(self.times)})"


def format_seconds(seconds: float) -> str:
    """``1.23 ms`` style: the unit that gives 1 to 1000."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@contextlib.contextmanager
def single_thread(threads: int = 1):
    """Limit torch and NumPy's BLAS/OpenMP pools to ``threads`` inside the block, then restore them.

    On a small machine shared with other work, a multi-threaded kernel waits for its slowest thread
    and its time swings by 10x from run to run; single-threaded timings compare rungs fairly.
    """
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before)


def time_cpu(fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5, max_seconds: float = 2.0) -> Timing:
    """Median-friendly CPU timing: ``warmup`` untimed calls, then up to ``repeats`` timed calls.

    Stops early (keeping at least one timed call) once ``max_seconds`` have been spent timing,
    so a slow rung cannot blow a notebook's budget.
    """
    for _ in range(warmup):
        fn()
    times: list[float] = []
    spent = 0.0
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
        if spent > max_seconds:
            break
    return Timing(tuple(times), "cpu")


def time_cuda(fn: Callable[[], Any], *, warmup: int = 5, repeats: int = 20) -> Timing:
    """GPU timing with CUDA events around each call, after ``warmup`` calls; one sync at the end."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return Timing(tuple(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)), "cuda")


def time_it(fn: Callable[[], Any], *, device: Any = "cpu", **kwargs) -> Timing:
    """Time ``fn()`` on ``device`` (a string or ``torch.device``): CUDA events on a GPU, else the CPU timer."""
    if str(device).startswith("cuda"):
        return time_cuda(fn, **kwargs)
    return time_cpu(fn, **kwargs)


# ---------------------------------------------------------------- FLOP and byte counters
def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m x k) @ (k x n) product: one multiply and one add per term."""
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, itemsize: int) -> int:
    """Minimum bytes moved by a GEMM: read A and B once, write C once."""
    return (m * k + k * n + m * n) * itemsize


def conv1d_flops(batch: int, c_in: int, c_out: int, length_out: int, kernel: int) -> int:
    """FLOPs of a 1-D convolution: each output element is a dot product of length c_in*kernel."""
    return 2 * batch * c_out * length_out * c_in * kernel


def conv2d_flops(batch: int, c_in: int, c_out: int, h_out: int, w_out: int, kh: int, kw: int, groups: int = 1) -> int:
    """FLOPs of a 2-D convolution: each output element is a dot product of length (c_in/groups)*kh*kw."""
    return 2 * batch * c_out * h_out * w_out * (c_in // groups) * kh * kw


def gflops(flops: float, seconds: float) -> float:
    return flops / seconds / 1e9


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9


# ---------------------------------------------------------------- measured ceilings
@dataclass(frozen=True)
class Ceilings:
    """The machine's measured peak compute (GFLOP/s) and memory bandwidth (GB/s)."""

    device: str
    dtype: str
    peak_gflops: float
    bandwidth_gbps: float
    how: str  # how they were measured, for plot labels

    def ridge_intensity(self) -> float:
        """FLOP/byte at which the roofline turns from memory-bound to compute-bound."""
        return self.peak_gflops / self.bandwidth_gbps


_CEILINGS: dict[tuple[str, str, int, int], Ceilings] = {}


def measure_ceilings(device: Any = "cpu", dtype: Any = None, *, size: int | None = None) -> Ceilings:
    """Measure peak GFLOP/s with a large ``torch.matmul`` and bandwidth with a large copy.

    Cached per (device, dtype, size, torch thread count) for the process. On the CPU: fp32, 1024^3 GEMM, 64 MiB copy.
    On a GPU: the given dtype (default bf16), 8192^3 GEMM, 1 GiB copy.
    """
    import torch

    device = str(device)
    on_gpu = device.startswith("cuda")
    dtype = dtype or (torch.bfloat16 if on_gpu else torch.float32)
    n = size or (8192 if on_gpu else 1024)
    key = (device, str(dtype), n, torch.get_num_threads())
    if key in _CEILINGS:
        return _CEILINGS[key]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    gemm = time_it(lambda: torch.matmul(a, b), device=device, **({} if on_gpu else {"repeats": 5}))
    elements = (1 << 28 if on_gpu else 1 << 24)  # 1 GiB / 64 MiB of fp32
    src = torch.empty(elements, device=device, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    copy = time_it(lambda: dst.copy_(src), device=device)
    result = Ceilings(
        device=device,
        dtype=str(dtype).replace("torch.", ""),
        peak_gflops=gflops(matmul_flops(n, n, n), gemm.best),
        bandwidth_gbps=gbps(2 * src.numel() * src.element_size(), copy.best),
        how=f"torch.matmul {n}^3 and a {src.numel() * 4 >> 20} MiB copy",
    )
    _CEILINGS[key] = result
    return result


# ---------------------------------------------------------------- the ladder
@dataclass
class Rung:
    name: str
    seconds: float
    flops: float | None = None
    nbytes: float | None = None

    @property
    def gflops(self) -> float | None:
        return None if self.flops is None else gflops(self.flops, self.seconds)

    @property
    def gbps(self) -> float | None:
        return None if self.nbytes is None else gbps(self.nbytes, self.seconds)

    @property
    def intensity(self) -> float | None:
        if self.flops is None or not self.nbytes:
            return None
        return self.flops / self.nbytes


@dataclass
class Ladder:
    """The rungs of one notebook's ladder, in order, with their timings."""

    title: str
    rungs: list[Rung] = field(default_factory=list)

    def add(self, name: str, timing: Timing | float, *, flops: float | None = None, nbytes: float | None = None) -> Rung:
        seconds = timing.median if isinstance(timing, Timing) else float(timing)
        rung = Rung(name, seconds, flops, nbytes)
        self.rungs = [r for r in self.rungs if r.name != name] + [rung]
        return rung

    def table(self, reference: str | None = None) -> str:
        """A text table: time, GFLOP/s, GB/s (when any rung has them), speed-up over the first rung, ratio to ``reference``."""
        if not self.rungs:
            return f"{self.title}: no rungs timed yet"
        first = self.rungs[0].seconds
        ref = next((r.seconds for r in self.rungs if r.name == reference), None)
        show_flops = any(r.flops is not None for r in self.rungs)
        show_bytes = any(r.nbytes is not None for r in self.rungs)
        width = max(28, max(len(r.name) for r in self.rungs) + 2)
        head = f"{'rung':<{width}}{'time':>12}"
        head += f"{'GFLOP/s':>10}" if show_flops else ""
        head += f"{'GB/s':>9}" if show_bytes else ""
        head += f"{'speed-up':>10}"
        if ref is not None:
            head += f"  vs {reference}"
        lines = [self.title, head, "-" * len(head)]
        for r in self.rungs:
            row = f"{r.name:<{width}}{format_seconds(r.seconds):>12}"
            if show_flops:
                row += f"{r.gflops:>10.3g}" if r.gflops is not None else f"{'':>10}"
            if show_bytes:
                row += f"{r.gbps:>9.3g}" if r.gbps is not None else f"{'':>9}"
            row += f"{first / r.seconds:>9.3g}x"
            if ref is not None:
                row += f"  {ref / r.seconds:.3g}x"
            lines.append(row)
        return "\n".join(lines)


def plot_ladder(ladder: Ladder, *, metric: str = "time", ax=None, recorded_label: str | None = None, statistic: str = "median"):
    """Bar chart of the rungs: ``metric`` is ``time`` (log scale, lower is better) or ``gflops``.

    ``statistic`` names what the stored seconds are (``median`` when rungs were added from a
    :class:`Timing`; say ``best`` if you stored ``Timing.best``) for the axis label.
    """
    import matplotlib.pyplot as plt

    from .plotting import color_for

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.45 * len(ladder.rungs) + 1.5))
    names = [r.name for r in ladder.rungs]
    if metric == "time":
        values = [r.seconds for r in ladder.rungs]
        ax.set_xlabel(f"{statistic} time per call (s, log scale; shorter is faster)")
    elif metric == "gflops":
        values = [r.gflops or 0.0 for r in ladder.rungs]
        ax.set_xlabel("GFLOP/s (log scale; longer is faster)")
    else:
        raise ValueError(f"metric must be 'time' or 'gflops', not {metric!r}")
    ax.barh(names, values, color=[color_for(n) for n in names])
    ax.set_xscale("log")
    positive = [v for v in values if v > 0]
    if positive:  # whole decades at both ends (labelled major ticks), and the shortest bar still visible
        ax.set_xlim(10 ** np.floor(np.log10(min(positive)) - 0.5), 10 ** np.ceil(np.log10(max(positive)) + 1e-9))
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.invert_yaxis()
    title = ladder.title + (f" ({recorded_label})" if recorded_label else "")
    ax.set_title(title)
    return ax


def plot_roofline(ladder: Ladder, ceilings: Ceilings, *, ax=None):
    """Roofline: each rung with FLOPs and bytes as a point (intensity, GFLOP/s) under the measured roof."""
    import matplotlib.pyplot as plt

    from .plotting import COLORS, color_for

    if ax is None:
        _, ax = plt.subplots()
    points = [r for r in ladder.rungs if r.intensity is not None]
    lo = min([p.intensity for p in points] + [ceilings.ridge_intensity() / 10]) / 2
    hi = max([p.intensity for p in points] + [ceilings.ridge_intensity() * 10]) * 2
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    roof = np.minimum(ceilings.peak_gflops, x * ceilings.bandwidth_gbps)
    ax.plot(x, roof, color=COLORS["reference"], lw=2, label=f"measured roof ({ceilings.how})")
    placed: list[tuple[float, float]] = []  # label positions in log space, to stagger near-duplicates
    for r in sorted(points, key=lambda p: -p.gflops):
        ax.scatter([r.intensity], [r.gflops], color=color_for(r.name), s=40, zorder=3, alpha=0.85)
        here = (np.log10(r.intensity), np.log10(r.gflops))
        crowd = sum(1 for (x0, y0) in placed if abs(x0 - here[0]) < 0.3 and abs(y0 - here[1]) < 0.25)
        placed.append(here)
        ax.annotate(r.name, (r.intensity, r.gflops), textcoords="offset points", xytext=(6, 3 - 11 * crowd), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"Roofline on {ceilings.device} ({ceilings.dtype})")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), fontsize=8)
    return ax
