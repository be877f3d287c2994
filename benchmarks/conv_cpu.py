"""Convolution rungs side by side on the CPU (topic 03): GFLOP/s and each rung's ratio to np.matmul and to F.conv2d.

    python benchmarks/conv_cpu.py                          # default layer shapes, one thread, 3 rounds
    python benchmarks/conv_cpu.py --threads 2 --output auto          # all rungs multi-threaded, dated JSON in results/
    python benchmarks/conv_cpu.py --shapes 1x64x56x56:64x3x1x1 --repeats 5 --rounds 5

Rungs (as in notebooks/03_convolution.ipynb): 1 naive loops (timed on a reduced layer with the same
kernel and channel counts and extrapolated by FLOP ratio, as the full layer would take minutes), 2
vectorized inner loops, 3 im2col + one NumPy GEMM, 4 im2col + the NumPy Goto-blocked GEMM, 4c im2col + the
compiled (Numba) Goto GEMM, 4d the compiled direct (implicit-GEMM) convolution, 5
torch.nn.functional.conv2d (the reference). Per layer it also times ``np.matmul`` on the layer's GEMM
(``(C_out, K) @ (K, N*OH*OW)``, the column matrix built beforehand), and first the compiled GEMM against
``np.matmul`` at 1024^3 (the library's default blocks and panels of other depths, with each one's share of the
measured peak). All of it alternates in ``--rounds`` rounds (each rung the best of ``--repeats``
calls), so that a busy neighbour on a shared machine slows every rung of a round; ratios are per round and
the table gives their median and range. The machine record (provenance.machine_info) adds the CPU's
vector ISA, a measured clock, eq. (7)'s derived peak, the peak measured by a throughput loop of independent FMA
chains, and the caches with the VM sanity check. The Triton
rung is left out: on a CPU it runs in the interpreter, whose time is not a speed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from course_utils.env import configure_numba, configure_triton

configure_numba()   # before Numba compiles anything: 512-bit vectors, workqueue threads
configure_triton()  # before a kernel module imports Triton

from course_utils import bench  # noqa: E402
from course_utils import convolution as cv  # noqa: E402
from course_utils import convolution_blocking as blk  # noqa: E402
from course_utils import convolution_compiled as cc  # noqa: E402
from course_utils import convolution_machine as mach  # noqa: E402
from course_utils import provenance  # noqa: E402

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


def naive_seconds_per_flop(c_in: int, c_out: int, k: int, stride: int, padding: int, rng) -> tuple[float, str]:
    """Time the loops on a reduced layer (at most 8 channels each way, an 8x8 output) and divide by its FLOPs."""
    ci, co = min(c_in, 8), min(c_out, 8)
    side = (8 - 1) * stride + k - 2 * padding  # input side giving an 8x8 output
    x = rng.standard_normal((1, ci, side, side)).astype(np.float32)
    w = rng.standard_normal((co, ci, k, k)).astype(np.float32)
    t = bench.time_cpu(lambda: cv.conv2d_naive(x, w, stride, padding), warmup=0, repeats=2).best
    return t / layer_flops(x.shape, w.shape, stride, padding), f"1x{ci}x{side}x{side} * {co}x{ci}x{k}x{k}"


def alternate(rungs: dict, rounds: int, repeats: int) -> dict:
    """Best time of ``repeats`` calls per rung, per round, the rungs alternating: ``{name: [seconds per round]}``."""
    seconds = {name: [] for name in rungs}
    for _ in range(rounds):
        for name, fn in rungs.items():
            seconds[name].append(bench.time_cpu(fn, warmup=2, repeats=repeats, max_seconds=5.0).best)
    return seconds


def summarize(flops: float, seconds: dict, matmul: str, conv2d: str | None) -> list[dict]:
    """Per rung: median GFLOP/s over rounds, and its per-round speed ratios to the ``matmul`` and ``conv2d`` rungs."""
    rows = []
    for name, times in seconds.items():
        row = {"name": name, "seconds": statistics.median(times), "seconds_per_round": times,
               "gflops": bench.gflops(flops, statistics.median(times))}
        for key, ref in (("vs_matmul", matmul), ("vs_conv2d", conv2d)):
            if ref is not None and ref in seconds:
                ratios = [r / t for t, r in zip(times, seconds[ref])]
                row[key] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
        rows.append(row)
    return rows


def gemm_square(n: int, threads: int, rounds: int, repeats: int, rng, peak_gflops: float) -> dict:
    """The compiled Goto GEMM (every FLOP in course_utils.convolution_compiled) against np.matmul at n^3, fp32.

    Alternates np.matmul, the library's default blocks and panels of other depths (kc = 256 and 768, with eq. (6)'s
    mc and nc for each, as in lesson 03 section 6); per rung the ratio to np.matmul and the share of
    ``peak_gflops`` (the measured peak of the threads used), each as median and range over rounds.
    """
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = (rng.standard_normal((n, n)) / n ** 0.5).astype(np.float32)
    ours = cc.gemm_compiled_parallel if threads > 1 else cc.gemm_compiled
    caches = mach.sane_caches(blk.cache_sizes())
    rungs = {f"compiled, default kc={cc.BLOCKS['kc']} mc={cc.BLOCKS['mc']}": lambda: ours(a, b)}
    for kc in (256, 768):
        panel = blk.goto_block_sizes(dict(caches, L1d=2 * kc * (cc.MR + cc.NR) * 4), 4, cc.MR, cc.NR)
        panel = {k: panel[k] for k in ("mc", "kc", "nc")}
        np.testing.assert_allclose(ours(a, b, **panel), a @ b, rtol=1e-4, atol=1e-4)
        rungs[f"compiled, kc={kc} mc={panel['mc']}"] = lambda panel=panel: ours(a, b, **panel)
    np.testing.assert_allclose(ours(a, b), a @ b, rtol=1e-4, atol=1e-4)
    rungs["np.matmul"] = lambda: a @ b
    seconds = alternate(rungs, rounds, repeats)
    rows = summarize(2 * n ** 3, seconds, "np.matmul", None)
    for row in rows:
        shares = [bench.gflops(2 * n ** 3, t) / peak_gflops for t in row["seconds_per_round"]]
        row["of_measured_peak"] = {"median": statistics.median(shares), "min": min(shares), "max": max(shares)}
    compiled = [r for r in rows if r["name"].startswith("compiled")]
    best = max(compiled, key=lambda r: r["vs_matmul"]["median"])
    return {"shape": f"{n}x{n}x{n}", "gflop": 2 * n ** 3 / 1e9, "measured_peak_gflops": peak_gflops,
            "best_compiled": best["name"], "rungs": rows}


def run_shape(text: str, repeats: int, rounds: int, threads: int, rng) -> dict:
    x_shape, w_shape, stride, padding = parse_shape(text)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    flops = layer_flops(x_shape, w_shape, stride, padding)
    want = F.conv2d(xt, wt, stride=stride, padding=padding).numpy()
    wmat, cols = w.reshape(w.shape[0], -1), np.ascontiguousarray(cv.im2col(x, w.shape[2], w.shape[3], stride, padding))
    rungs = {
        "2 numpy vectorized": lambda: cv.conv2d_vectorized(x, w, stride, padding),
        "3 numpy im2col + GEMM": lambda: cv.conv2d_im2col(x, w, stride, padding),
        "4 numpy blocked GEMM": lambda: blk.conv2d_blocked(x, w, stride, padding, **BLOCKS),
        "4c im2col + compiled GEMM": lambda: cc.conv2d_im2col_compiled(x, w, stride, padding, parallel=threads > 1),
        "4d compiled direct conv": lambda: cc.conv2d_direct_compiled(x, w, stride, padding, threads=threads),
        "5 torch F.conv2d": lambda: F.conv2d(xt, wt, stride=stride, padding=padding),
    }
    for name, fn in rungs.items():
        out = fn()
        out = out.numpy() if isinstance(out, torch.Tensor) else out
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=name)  # fp32 sums of up to 3k O(1) terms
    rungs["np.matmul on the layer's GEMM"] = lambda: wmat @ cols
    spf, reduced = naive_seconds_per_flop(x_shape[1], w_shape[0], w_shape[2], stride, padding, rng)
    seconds = {"1 loops (extrapolated)": [spf * flops] * rounds}
    seconds.update(alternate(rungs, rounds, repeats))
    return {
        "shape": text,
        "x": list(x_shape), "w": list(w_shape), "stride": stride, "padding": padding,
        "gflop": flops / 1e9,
        "naive_timed_on": reduced,
        "rungs": summarize(flops, seconds, "np.matmul on the layer's GEMM", "5 torch F.conv2d"),
    }


def cpu_model(threads: int) -> dict:
    """What the compiled rungs are tuned to: ISA, measured clock, eq. (7)'s peak, caches with the VM check."""
    isa = mach.vector_isa()
    clock = mach.measure_clock_ghz()
    with bench.single_thread():
        fma = {n: mach.fma_throughput_gflops(n, isa["fp32_lanes"])[0] for n in (4, 8, 12, 16)}
    return {"isa": isa, "clock_ghz_measured": clock, "register_tile": [cc.MR, cc.NR], "blocks": cc.BLOCKS,
            "fma_throughput_gflops_by_chains": fma, "measured_peak_gflops_per_core": max(fma.values()),
            "derived_peak_gflops_per_core": mach.derived_peak_gflops(1, isa["fp32_lanes"], isa["fma_units"], clock),
            "derived_peak_gflops_threads_used": mach.derived_peak_gflops(threads, isa["fp32_lanes"], isa["fma_units"], clock),
            "caches": mach.sane_caches(blk.cache_sizes())}


def print_rows(rows: list[dict]) -> None:
    peak = "of_measured_peak" in rows[0]
    print(f"{'rung':<32}{'time':>10}{'GFLOP/s':>11}  {'vs np.matmul':<28}"
          f"{'of the measured peak' if peak else 'vs F.conv2d':<28}(median [min, max] over rounds)")
    for r in rows:
        cells = []
        for key in ("vs_matmul", "of_measured_peak" if peak else "vs_conv2d"):
            v = r.get(key)
            fmt = "{:.0%}" if key == "of_measured_peak" else "{:.3g}"
            cells.append(f"{fmt.format(v['median'])} [{fmt.format(v['min'])}, {fmt.format(v['max'])}]" if v else "")
        print(f"{r['name']:<32}{bench.format_seconds(r['seconds']):>10}{r['gflops']:>11.3g}  {cells[0]:<28}{cells[1]:<28}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES,
                        help="NxCxHxW:C_OUTxKxSTRIDExPADDING (default: three ResNet-50 layers)")
    parser.add_argument("--threads", type=int, default=1, help="threads for torch, NumPy's BLAS and Numba (default 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per rung and round; the best is kept")
    parser.add_argument("--rounds", type=int, default=3, help="rounds in which all rungs alternate (default 3)")
    parser.add_argument("--gemm-size", type=int, default=1024, help="square GEMM size for compiled vs np.matmul (0: skip)")
    parser.add_argument("--output", help="also write the results as JSON here ('auto': a dated file in benchmarks/results/)")
    args = parser.parse_args(argv)

    import numba

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    try:
        from threadpoolctl import threadpool_limits  # installed with scikit-learn
        threadpool_limits(args.threads)
    except ImportError:  # pragma: no cover
        print("threadpoolctl missing: NumPy's BLAS uses its default thread count", file=sys.stderr)
    rng = np.random.default_rng(0)
    model = cpu_model(args.threads)
    info = provenance.machine_info(threads=args.threads, extra={"cpu_model": model, "numba": numba.__version__,
                                                                 "rounds": args.rounds, "repeats": args.repeats,
                                                                 "load_average_at_start": os.getloadavg()})
    isa = model["isa"]
    print(f"{info['cpu']} | {args.threads} thread(s) | numpy {info['numpy']} | torch {info['torch']} | numba {numba.__version__}")
    print(f"{isa['isa']}, {isa['fp32_lanes']} lanes x {isa['fma_units']} FMA units, clock {model['clock_ghz_measured']:.2f} GHz "
          f"(measured) -> derived peak {model['derived_peak_gflops_per_core']:.0f} GFLOP/s per core, "
          f"{model['derived_peak_gflops_threads_used']:.0f} on {args.threads} thread(s); measured (FMA throughput loop) "
          f"{model['measured_peak_gflops_per_core']:.0f} per core; L3: {model['caches']['L3_note']}")
    results = {"gemm": None, "layers": []}
    if args.gemm_size:
        peak = model["measured_peak_gflops_per_core"] * args.threads
        results["gemm"] = gemm_square(args.gemm_size, args.threads, args.rounds, args.repeats, rng, peak)
        print(f"\nGEMM {results['gemm']['shape']} fp32, {args.rounds} rounds; measured peak {peak:.0f} GFLOP/s on "
              f"{args.threads} thread(s); best compiled: {results['gemm']['best_compiled']}")
        print_rows(results["gemm"]["rungs"])
    for text in args.shapes:
        result = run_shape(text, args.repeats, args.rounds, args.threads, rng)
        results["layers"].append(result)
        print(f"\n{text}  ({result['gflop']:.3g} GFLOP; loops timed on {result['naive_timed_on']}, extrapolated)")
        print_rows(result["rungs"])
    info["load_average_at_end"] = os.getloadavg()   # 1, 5, 15 minutes: other work on the machine while it ran
    print(f"\nload average (1, 5, 15 min) at start {info['load_average_at_start']}, at end {info['load_average_at_end']}")
    if args.output:
        path = provenance.results_path("conv_cpu") if args.output == "auto" else Path(args.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
