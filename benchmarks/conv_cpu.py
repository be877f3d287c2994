"""Convolution rungs side by side on the CPU (topic 03): GFLOP/s and the ratio to torch's conv2d.

    python benchmarks/conv_cpu.py                          # default layer shapes, one thread
    python benchmarks/conv_cpu.py --threads 2 --output benchmarks/results/conv_cpu.json
    python benchmarks/conv_cpu.py --shapes 1x64x56x56:64x3x1x1 --repeats 5

Rungs (as in notebooks/03_convolution.ipynb): 1 naive loops (timed on a reduced layer with the same
kernel and channel counts and extrapolated by FLOP ratio, as the full layer would take minutes), 2
vectorized inner loops, 3 im2col + one NumPy GEMM, 4 im2col + the NumPy Goto-blocked GEMM, 5
torch.nn.functional.conv2d (the reference). Times are the best of ``--repeats`` runs. The Triton rung
is left out here: on a CPU it runs in the interpreter, whose time is not a speed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from course_utils import bench
from course_utils import convolution as cv
from course_utils import convolution_blocking as blk

# name: (N, C_in, H, W), (C_out, KH, stride, padding)
DEFAULT_SHAPES = [
    "1x64x56x56:64x3x1x1",    # ResNet-50 stage 1, 3x3
    "1x128x28x28:128x3x1x1",  # ResNet-50 stage 2, 3x3
    "1x3x224x224:64x7x2x3",   # ResNet-50 stem, 7x7 stride 2
]
BLOCKS = dict(mc=64, kc=288, nc=4096, mr=32, nr=128)  # a good NumPy configuration from the lesson's sweep


def parse_shape(text: str):
    x_part, w_part = text.split(":")
    n, c, h, w = (int(v) for v in x_part.split("x"))
    c_out, k, stride, padding = (int(v) for v in w_part.split("x"))
    return (n, c, h, w), (c_out, c, k, k), stride, padding


def layer_flops(x_shape, w_shape, stride: int, padding: int) -> int:
    """FLOPs of the layer (lesson 03, eq. 2a), from :func:`course_utils.bench.conv2d_flops`."""
    oh, ow = (cv.conv_output_size(x_shape[2 + a], w_shape[2 + a], stride, padding) for a in range(2))
    return bench.conv2d_flops(x_shape[0], x_shape[1], w_shape[0], oh, ow, w_shape[2], w_shape[3])


def best_time(fn, repeats: int) -> float:
    return bench.time_cpu(fn, warmup=1, repeats=repeats, max_seconds=5.0).best


def naive_seconds_per_flop(c_in: int, c_out: int, k: int, stride: int, padding: int, rng) -> tuple[float, str]:
    """Time the loops on a reduced layer (at most 8 channels each way, an 8x8 output) and divide by its FLOPs."""
    ci, co = min(c_in, 8), min(c_out, 8)
    side = (8 - 1) * stride + k - 2 * padding  # input side giving an 8x8 output
    x = rng.standard_normal((1, ci, side, side)).astype(np.float32)
    w = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    t = bench.time_cpu(lambda: cv.conv2d_naive(x, w, stride, padding), warmup=0, repeats=2).best
    return t / layer_flops(x.shape, w.shape, stride, padding), f"1x{ci}x{side}x{side} * {co}x{ci}x{k}x{k}"


def run_shape(text: str, repeats: int, rng) -> dict:
    x_shape, w_shape, stride, padding = parse_shape(text)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    flops = layer_flops(x_shape, w_shape, stride, padding)
    want = F.conv2d(xt, wt, stride=stride, padding=padding).numpy()
    rungs = {
        "2 numpy vectorized": lambda: cv.conv2d_vectorized(x, w, stride, padding),
        "3 numpy im2col + GEMM": lambda: cv.conv2d_im2col(x, w, stride, padding),
        "4 numpy blocked GEMM": lambda: blk.conv2d_blocked(x, w, stride, padding, **BLOCKS),
        "5 torch F.conv2d": lambda: F.conv2d(xt, wt, stride=stride, padding=padding),
    }
    seconds = {}
    spf, reduced = naive_seconds_per_flop(x_shape[1], w_shape[0], w_shape[2], stride, padding, rng)
    seconds["1 loops (extrapolated)"] = spf * flops
    for name, fn in rungs.items():
        out = fn()
        out = out.numpy() if isinstance(out, torch.Tensor) else out
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-3)  # fp32 sums of up to 3k terms, another order
        seconds[name] = best_time(fn, repeats)
    ref = seconds["5 torch F.conv2d"]
    return {
        "shape": text,
        "x": list(x_shape), "w": list(w_shape), "stride": stride, "padding": padding,
        "gflop": flops / 1e9,
        "naive_timed_on": reduced,
        "rungs": [
            {"name": name, "seconds": s, "gflops": bench.gflops(flops, s), "ratio_to_conv2d": s / ref}
            for name, s in seconds.items()
        ],
    }


def machine_info(threads: int) -> dict:
    caches = blk.cache_sizes()
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "threads_used": threads,
        "caches": caches, "python": platform.python_version(), "numpy": np.__version__,
        "torch": torch.__version__, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES,
                        help="NxCxHxW:C_OUTxKxSTRIDExPADDING (default: three ResNet-50 layers)")
    parser.add_argument("--threads", type=int, default=1, help="threads for torch and NumPy's BLAS (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per rung; the best is kept")
    parser.add_argument("--output", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    try:
        from threadpoolctl import threadpool_limits  # installed with scikit-learn
        threadpool_limits(args.threads)
    except ImportError:  # pragma: no cover
        print("threadpoolctl missing: NumPy's BLAS uses its default thread count", file=sys.stderr)
    rng = np.random.default_rng(0)
    info = machine_info(args.threads)
    print(f"{info['cpu']} | {args.threads} thread(s) | numpy {info['numpy']} | torch {info['torch']}")
    results = []
    for text in args.shapes:
        result = run_shape(text, args.repeats, rng)
        results.append(result)
        print(f"\n{text}  ({result['gflop']:.3g} GFLOP; loops timed on {result['naive_timed_on']}, extrapolated)")
        print(f"{'rung':<26}{'time':>12}{'GFLOP/s':>10}{'x conv2d time':>15}")
        for r in result["rungs"]:
            print(f"{r['name']:<26}{bench.format_seconds(r['seconds']):>12}{r['gflops']:>10.3g}{r['ratio_to_conv2d']:>15.3g}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
