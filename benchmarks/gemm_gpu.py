"""Every Triton GEMM of topic 05 against torch.matmul (cuBLAS), BF16, on a CUDA device.

    python benchmarks/gemm_gpu.py                          # on a GPU: check, time, write dated JSON
    python benchmarks/gemm_gpu.py --quick --output-dir $OUT   # 4096^3 only, shorter timings
    python benchmarks/gemm_gpu.py --dry-run                # anywhere: interpreter, tiny sizes, checks only

On CUDA: every (variant, configuration) pair that will be timed (``course_utils.gemm.gpu_configs`` for
this GPU's generation) is first checked against torch.matmul on ragged shapes; the warp-specialized
variant must also show its producer/consumer split (``setmaxnreg`` in the PTX). Then each passing pair
is timed (``triton.testing.do_bench``: warm-up, then the median of repeats timed with CUDA events) at
4096^3, 8192^3 and one non-square shape on random normal BF16 inputs, and the best configuration per
variant is kept (and named). Output: TFLOP/s (2*M*N*K / time) and the ratio to cuBLAS, with the
machine, driver, versions, course commit and date (``course_utils.provenance``), in
``<output-dir>/gemm_gpu_<gpu>_<date>.json``. The exit status is 1 when any pair fails its check.

On the ``cpu`` tier (no CUDA device, or ``COURSE_TIER=cpu``), or with ``--dry-run``, every variant runs
under the Triton interpreter in fp32 at tiny sizes, at the CPU configuration and at every GPU
configuration, and is checked; nothing is timed. Needs only torch and triton (NumPy comes with torch).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # _record.py

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 1024, 8192)]  # (M, N, K); the last is non-square
# Every timed shape is aligned (multiples of 256: the 16-byte specializations the timing sees) and has more
# output tiles than an H100/H200 has SMs (512 or more 128x256 tiles for 132 SMs), so the persistent loops
# really loop; each configuration is checked at the timed shape itself right before it is timed.
CHECK_SHAPES = [(1000, 1096, 1000), (777, 520, 1032)]  # ragged: not multiples of the blocks (rows 16-byte aligned)
DRY_SHAPES = [(50, 40, 68), (33, 48, 20)]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="interpreter, tiny sizes, checks only (default without CUDA)")
    p.add_argument("--output-dir", type=Path, default=None,
                   help="folder for the dated JSON (default $OUT if set, else benchmarks/results)")
    p.add_argument("--rep-ms", type=int, default=None, help="do_bench: ms of timed repeats (default 500, --quick 100)")
    p.add_argument("--quick", action="store_true", help="8192^3 only, 100 ms per measurement")
    p.add_argument("--plan", action="store_true", help="print the planned checks, timed runs and compiles as JSON")
    return p.parse_args(argv)


def _output_dir(args) -> Path:
    return args.output_dir or (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results")


def _write(args, name: str, record: dict) -> Path:
    from course_utils.provenance import results_path

    folder = _output_dir(args)
    folder.mkdir(parents=True, exist_ok=True)
    path = results_path(name, folder=folder)
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def _label(cfg) -> str:
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} g{cfg.group_m} s{cfg.num_stages} w{cfg.num_warps}"


def dry_run(args) -> int:
    import torch

    from course_utils import gemm
    from course_utils.checks import tolerance_for
    from course_utils.provenance import machine_info

    torch.manual_seed(0)
    failures, rows = 0, []
    configs = {name: [None, *gemm.gpu_configs(name, 90)] for name in gemm.VARIANTS}  # CPU default, then the GPU ones
    for m, n, k in DRY_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        want = a @ b
        for name, fn in gemm.VARIANTS.items():
            for cfg in configs[name] if (m, n, k) == DRY_SHAPES[0] else [None]:
                try:
                    got = fn(a, b, cfg)
                    rtol, atol = tolerance_for("triton_interpreter", n=k)
                    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
                    status = "ok"
                except ValueError as exc:  # a descriptor on a stride that is not 16-byte aligned: expected
                    status = f"skipped ({str(exc)[:60]}...)"
                except Exception as exc:  # noqa: BLE001 - report every failure, keep going
                    failures += 1
                    status = f"FAILED: {type(exc).__name__}: {str(exc)[:120]}"
                where = "cpu default" if cfg is None else _label(cfg)
                rows.append({"shape": [m, n, k], "variant": name, "config": where, "status": status})
                print(f"dry run {m}x{n}x{k} fp32 {name:<21} {where:<26} {status}")
    print("GPU timing needs a CUDA device: this was a dry run under the Triton interpreter (correctness only, no timings).")
    if args.output_dir or os.environ.get("OUT"):
        _write(args, "gemm_gpu_dryrun", {**machine_info(extra={"mode": "dry run (interpreter, fp32)"}), "checks": rows,
                                          "failures": failures})
    return 1 if failures else 0


def _check_shapes(args):
    return CHECK_SHAPES[:1] if args.quick else CHECK_SHAPES   # quick: one ragged shape, then the timed shape itself


def _check(name, cfg, dev, dtype, shapes=CHECK_SHAPES):
    """None when ``name`` at ``cfg`` is right on every ragged shape, else why not."""
    import torch

    from course_utils import gemm

    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
        want = a.float() @ b.float()
        if name == "warp-specialized":
            got, handle = gemm.matmul_warp_specialized(a, b, cfg, return_kernel=True)
            ptx = getattr(handle, "asm", {}).get("ptx", "")
            if "setmaxnreg" not in ptx:
                return "compiled without the producer/consumer split (no setmaxnreg in the PTX)"
        else:
            got = gemm.VARIANTS[name](a, b, cfg)
        err = ((got.float() - want).abs().max() / want.abs().max()).item()
        if not err < 1e-2:  # bf16 output: one rounding is 2^-8 relative
            return f"{m}x{n}x{k}: max error {err:.3g} of max |C|"
    return None


def _rel_err(got, want) -> float:
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def plan(args, arch: int = 90) -> dict:
    """What :func:`gpu_run` will do on ``sm_<arch>``: checks, timed runs and kernel compiles."""
    from course_utils import gemm

    configs = [(name, cfg) for name in gemm.VARIANTS for cfg in gemm.gpu_configs(name, arch)]
    shapes = SHAPES[:1] if args.quick else SHAPES
    # one compile for the ragged check shapes and one for the aligned timed shapes (16-byte specializations)
    return {"script": "gemm_gpu", "arch": arch, "configs": len(configs), "shapes": shapes,
            "checks": len(configs) * (len(_check_shapes(args)) + len(shapes)), "timed_runs": len(shapes) * (1 + len(configs)),
            "compiles": 2 * len(configs)}


def gpu_run(args) -> int:
    import torch
    from triton.testing import do_bench

    from _record import Record, peak_for
    from course_utils import gemm
    from course_utils.provenance import machine_info, results_path

    torch.manual_seed(0)
    dev, dtype = "cuda", torch.bfloat16
    major, minor = torch.cuda.get_device_capability(0)
    arch = 10 * major + minor
    rep = args.rep_ms or (100 if args.quick else 500)
    machine = machine_info()
    peak, peak_source = peak_for(machine["gpu"], "bfloat16")
    name = "".join(ch if ch.isalnum() else "_" for ch in machine["gpu"]).strip("_").lower()
    folder = _output_dir(args)
    folder.mkdir(parents=True, exist_ok=True)
    rec = Record(results_path(f"gemm_gpu_{name}", folder=folder), {
        **machine, "dtype": "bfloat16", "timing": f"triton.testing.do_bench(rep={rep} ms), median, after warm-up",
        "warp_specialize": gemm.warp_specialize_available()[1], "configs_for": f"sm_{90 if arch >= 90 else 80}",
        "peak_flops": peak, "peak_source": peak_source, "plan": plan(args, arch), "checks": {}, "results": [],
    })
    passing, failed = {}, []
    for vname in gemm.VARIANTS:  # correctness first: every (variant, configuration) that will be timed, ragged shapes
        for cfg in gemm.gpu_configs(vname, arch):
            key = f"{vname} @ {_label(cfg)}"
            try:
                why = _check(vname, cfg, dev, dtype, _check_shapes(args))
            except Exception as exc:  # noqa: BLE001 - a compile or launch error is a failure too
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            rec.data["checks"][key] = why or "ok"
            rec.save()
            if why:
                failed.append(key)
            else:
                passing.setdefault(vname, []).append(cfg)
            print(f"check {key:<48} {why or 'ok'}", flush=True)
    try:
        a, b = torch.randn(512, 512, device=dev, dtype=dtype), torch.randn(512, 512, device=dev, dtype=dtype)
        _, handle = gemm.matmul_tiled(a, b, return_kernel=True)
        rec.set(wgmma_in_ptx=gemm.wgmma_in_ptx(handle))
    except Exception as exc:  # noqa: BLE001
        rec.set(wgmma_in_ptx=f"unknown ({type(exc).__name__})")
    for m, n, k in SHAPES[:1] if args.quick else SHAPES:
        a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
        want = a.float() @ b.float()                         # fp32 reference for the timed shape itself
        flops = 2 * m * n * k
        t_ref = do_bench(lambda: torch.matmul(a, b), warmup=100, rep=rep, return_mode="median") * 1e-3
        rec.add("results", {"variant": "torch.matmul (cuBLAS)", "shape": [m, n, k], "seconds": t_ref,
                            "tflops": flops / t_ref / 1e12, "ratio_to_cublas": 1.0,
                            "rel_err": _rel_err(torch.matmul(a, b), want),
                            "peak_share": flops / t_ref / peak if peak else None})
        for vname, cfgs in passing.items():
            for cfg in cfgs:                                 # each configuration guarded: one failure loses one row
                row = {"variant": vname, "shape": [m, n, k], "config": cfg.__dict__}
                try:
                    err = _rel_err(gemm.VARIANTS[vname](a, b, cfg), want)
                    row["rel_err"] = err
                    if not err < 1e-2:                       # bf16 output: one rounding is 2^-8 relative
                        raise AssertionError(f"max error {err:.3g} of max |C| at the timed shape")
                    t = do_bench(lambda: gemm.VARIANTS[vname](a, b, cfg), warmup=100, rep=rep, return_mode="median") * 1e-3
                    row.update(seconds=t, tflops=flops / t / 1e12, ratio_to_cublas=t_ref / t,
                               peak_share=flops / t / peak if peak else None)
                    print(f"{m}x{n}x{k} {vname:<22} {_label(cfg):<26} {row['tflops']:8.1f} TFLOP/s  "
                          f"{row['ratio_to_cublas']:.3f}x cuBLAS", flush=True)
                except Exception as exc:  # noqa: BLE001
                    row["failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    failed.append(f"{vname} @ {_label(cfg)} {m}x{n}x{k}")
                    print(f"{m}x{n}x{k} {vname:<22} {_label(cfg):<26} FAILED {row['failed']}", flush=True)
                rec.add("results", row)
        a = b = want = None                                  # free the timed shape before the next
        torch.cuda.empty_cache()
    rec.finish(failed=failed)
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plan:
        print(json.dumps(plan(args)))
        return 0
    if args.dry_run:  # before anything imports Triton: the interpreter, whatever the machine has
        os.environ["COURSE_TIER"] = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
    from course_utils.env import configure_triton, detect_tier  # the course's one definition of the tier (COURSE_TIER overrides)

    configure_triton()  # before a kernel module imports Triton: the interpreter on the CPU tier

    if args.dry_run or detect_tier() == "cpu":
        return dry_run(args)
    return gpu_run(args)


if __name__ == "__main__":
    sys.exit(main())
