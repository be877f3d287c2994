"""Every Triton GEMM of topic 05 against torch.matmul (cuBLAS), BF16, on a CUDA device.

    python benchmarks/gemm_gpu.py                      # on a GPU: check, time, write JSON
    python benchmarks/gemm_gpu.py --output benchmarks/results/gemm_gpu_h200.json
    python benchmarks/gemm_gpu.py --dry-run            # anywhere: interpreter, tiny sizes, checks only

On CUDA: each variant of ``course_utils.gemm.VARIANTS`` is first checked against torch.matmul on
ragged shapes, then timed (``triton.testing.do_bench``: warm-up, then the median of many timed
repeats with CUDA events) at 4096^3, 8192^3 and one non-square shape, on random normal BF16 inputs.
For each variant the best of a few launch configurations is kept (and named in the JSON). Output:
TFLOP/s (2*M*N*K / time) and the ratio to cuBLAS, plus GPU name, driver, torch/triton versions and date.

On the ``cpu`` tier (``course_utils.env.detect_tier``: no CUDA device, or ``COURSE_TIER=cpu``), or with
``--dry-run``, every variant runs under the Triton interpreter in fp32 at tiny
sizes and is checked; nothing is timed. Needs only torch and triton (and NumPy, which torch uses).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 8192)]  # (M, N, K); the last is non-square
CHECK_SHAPES = [(1000, 1096, 1000), (777, 520, 1032), (128, 256, 64)]  # ragged: not multiples of the blocks
DRY_SHAPES = [(50, 40, 68), (33, 48, 20)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="interpreter, tiny sizes, checks only (default without CUDA)")
    p.add_argument("--output", type=Path, default=None, help="JSON path (default benchmarks/results/gemm_gpu_<gpu>.json)")
    p.add_argument("--rep-ms", type=int, default=500, help="do_bench: milliseconds of timed repeats per measurement")
    p.add_argument("--quick", action="store_true", help="one configuration per variant, 4096^3 only")
    return p.parse_args(argv)


def dry_run() -> int:
    os.environ["COURSE_TIER"] = "cpu"  # before course_utils.gemm imports Triton: the env module picks the interpreter
    import torch

    from course_utils import gemm
    from course_utils.checks import tolerance_for

    torch.manual_seed(0)
    failures = 0
    for m, n, k in DRY_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        want = a @ b
        for name, fn in gemm.VARIANTS.items():
            try:
                got = fn(a, b)
                rtol, atol = tolerance_for("triton_interpreter", n=k)
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
                status = "ok"
            except ValueError as exc:  # a descriptor on a stride that is not 16-byte aligned: expected
                status = f"skipped ({str(exc)[:60]}...)"
            except Exception as exc:  # noqa: BLE001 - report every failure, keep going
                failures += 1
                status = f"FAILED: {type(exc).__name__}: {str(exc)[:120]}"
            print(f"dry run {m}x{n}x{k} fp32 {name:<21} {status}")
    print("GPU timing needs a CUDA device: this was a dry run under the Triton interpreter (correctness only, no timings).")
    return 1 if failures else 0


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def _configs(quick: bool):
    from course_utils.gemm import Config

    cfgs = [Config(128, 256, 64, 8, 3, 8), Config(128, 128, 64, 8, 4, 4), Config(128, 256, 64, 8, 4, 8),
            Config(256, 128, 64, 8, 3, 8)]
    return cfgs[:1] if quick else cfgs


def gpu_run(args) -> int:
    import torch
    import triton
    from triton.testing import do_bench

    from course_utils import gemm

    torch.manual_seed(0)
    dev, dtype = "cuda", torch.bfloat16
    props = torch.cuda.get_device_properties(0)
    result = {
        "gpu": torch.cuda.get_device_name(0), "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "sms": props.multi_processor_count, "driver": _driver(), "torch": torch.__version__, "triton": triton.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "dtype": "bfloat16", "timing": f"triton.testing.do_bench(rep={args.rep_ms} ms), median, after warm-up",
        "warp_specialize": gemm.warp_specialize_available()[1], "checks": {}, "results": [],
    }
    ok, wrong = {}, []
    for name, fn in gemm.VARIANTS.items():  # correctness first, on ragged shapes
        try:
            for m, n, k in CHECK_SHAPES:
                a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
                want = (a.float() @ b.float())
                err = ((fn(a, b).float() - want).abs().max() / want.abs().max()).item()
                if not err < 1e-2:  # bf16 output: one rounding is 2^-8 relative
                    raise AssertionError(f"{m}x{n}x{k}: max error {err:.3g} of max |C|")
            ok[name] = True
            result["checks"][name] = "ok"
        except AssertionError as exc:  # a wrong result: the run fails
            ok[name] = False
            result["checks"][name] = f"WRONG: {exc}"
            wrong.append(name)
        except Exception as exc:  # noqa: BLE001 - unsupported here (e.g. warp specialization): recorded, skipped
            ok[name] = False
            result["checks"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        print(f"check {name:<21} {result['checks'][name]}", flush=True)
    try:
        a, b = torch.randn(512, 512, device=dev, dtype=dtype), torch.randn(512, 512, device=dev, dtype=dtype)
        _, handle = gemm.matmul_tiled(a, b, return_kernel=True)
        result["wgmma_in_ptx"] = gemm.wgmma_in_ptx(handle)
    except Exception as exc:  # noqa: BLE001
        result["wgmma_in_ptx"] = f"unknown ({type(exc).__name__})"
    shapes = SHAPES[:1] if args.quick else SHAPES
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
        flops = 2 * m * n * k
        t_ref = do_bench(lambda: torch.matmul(a, b), warmup=100, rep=args.rep_ms, return_mode="median") * 1e-3
        rows = [{"variant": "torch.matmul (cuBLAS)", "shape": [m, n, k], "seconds": t_ref, "tflops": flops / t_ref / 1e12, "ratio_to_cublas": 1.0}]
        for name, fn in gemm.VARIANTS.items():
            if not ok[name]:
                continue
            best = None
            for cfg in _configs(args.quick):
                try:
                    t = do_bench(lambda: fn(a, b, cfg), warmup=100, rep=args.rep_ms, return_mode="median") * 1e-3
                except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for this config
                    print(f"  {name} {cfg}: {type(exc).__name__}", flush=True)
                    continue
                if best is None or t < best[0]:
                    best = (t, cfg)
            if best:
                rows.append({"variant": name, "shape": [m, n, k], "seconds": best[0], "tflops": flops / best[0] / 1e12,
                             "ratio_to_cublas": t_ref / best[0], "config": best[1].__dict__})
        for r in rows:
            print(f"{m}x{n}x{k} {r['variant']:<22} {r['tflops']:8.1f} TFLOP/s  {r['ratio_to_cublas']:.3f}x cuBLAS", flush=True)
        result["results"].extend(rows)
    out = args.output or ROOT / "benchmarks" / "results" / f"gemm_gpu_{result['gpu'].replace(' ', '_').lower()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 1 if wrong else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    from course_utils.env import detect_tier  # the course's one definition of the tier (COURSE_TIER overrides)

    if args.dry_run or detect_tier() == "cpu":
        return dry_run()
    return gpu_run(args)


if __name__ == "__main__":
    sys.exit(main())
