"""The lessons' library kernels (03 convolution, 05 GEMM, 06 attention) checked on a CUDA device.

    python benchmarks/lesson_kernels_gpu.py --output-dir $OUT   # on a GPU: compiled kernels, real sizes
    python benchmarks/lesson_kernels_gpu.py --dry-run           # anywhere: interpreter, tiny sizes

Each kernel is launched at the lesson's GPU configuration on ragged shapes and compared with the
production op (F.conv2d, torch.matmul, scaled_dot_product_attention) within the course's tolerance;
on a GPU the launched kernel's own compile facts are recorded too (registers and spills from the
driver's view of the cubin, wgmma/TMA/setmaxnreg in its PTX). Writes
``lesson_kernels_gpu_<date>.json`` with provenance; exits 1 when any check fails.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _facts(handle) -> dict:
    asm = getattr(handle, "asm", None) or {}
    ptx = asm.get("ptx", "")
    facts = {f: (pat in ptx) for f, pat in (("wgmma", "wgmma.mma_async"), ("tma", "cp.async.bulk.tensor"),
                                             ("setmaxnreg", "setmaxnreg"), ("mma.sync", "mma.sync"))}
    for attr in ("n_regs", "n_spills"):
        value = getattr(handle, attr, None)
        if value is not None:
            facts[attr] = int(value)
    return facts


def run(dry: bool, rec=None) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from course_utils import attention_triton as att
    from course_utils import convolution as cv
    from course_utils import gemm
    from course_utils.checks import tolerance_for

    dev = "cpu" if dry else "cuda"
    rows = []

    def record(name, fn):
        try:
            detail = fn() or {}
            rows.append({"check": name, "status": "ok", **detail})
        except Exception as exc:  # noqa: BLE001 - record and go on
            rows.append({"check": name, "status": f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"})
        print(f"{name:<52} {rows[-1]['status']}", flush=True)
        if rec is not None:
            rec.add("checks", rows[-1])  # on disk before the next check

    gen = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen).to(dev, dtype)

    def conv():
        x, w = rand(2, 8, 13, 11), rand(16, 8, 3, 3)               # (N, C, H, W), (C_out, C_in, KH, KW)
        got = cv.conv2d_triton(x, w, padding=1)
        rtol, atol = tolerance_for("triton_interpreter" if dry else torch.float32, n=72)
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False       # cuDNN's default for fp32 convolutions is TF32: the
        try:                                          # reference must be exact fp32, as the kernel is
            want = F.conv2d(x, w, padding=1)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)

    record("03 conv2d_triton (implicit GEMM, fp32)", conv)
    gdtype = torch.float32 if dry else torch.bfloat16
    shapes = [(50, 40, 68)] if dry else [(1000, 1096, 1000), (4096, 4096, 4096)]
    for name in gemm.VARIANTS:
        def one(name=name):
            out = {}
            for m, n, k in shapes:
                a, b = rand(m, k, dtype=gdtype), rand(k, n, dtype=gdtype)
                if name in ("tiled grouped", "descriptor (TMA)", "warp-specialized") and not dry:
                    launch = {"tiled grouped": gemm.matmul_tiled, "descriptor (TMA)": gemm.matmul_descriptor,
                              "warp-specialized": gemm.matmul_warp_specialized}[name]
                    got, handle = launch(a, b, return_kernel=True)
                    out = _facts(handle)
                else:
                    got = gemm.VARIANTS[name](a, b)
                want = a.float() @ b.float()
                err = ((got.float() - want).abs().max() / want.abs().max()).item()
                assert err < (1e-4 if dry else 1e-2), f"{m}x{n}x{k}: relative error {err:.3g}"
            if name == "warp-specialized" and not dry:
                assert out.get("setmaxnreg"), "no producer/consumer split (setmaxnreg) in the PTX"
            return out

        record(f"05 gemm {name}", one)

    def attention(d, causal):
        arch = 0 if dry else 10 * torch.cuda.get_device_capability(0)[0] + torch.cuda.get_device_capability(0)[1]
        adtype = torch.float32 if dry else torch.bfloat16 if arch >= 80 else torch.float16   # a T4 has no bf16
        b, h, seq = (1, 2, 40) if dry else (2, 8, 1000)
        q, k, v = (rand(b, h, seq, d, dtype=adtype) for _ in range(3))  # (B, H, L, D)
        bm, bn, warps, stages = (16, 16, None, None) if dry else att.attention_configs(arch, "fwd")[0]
        o, _ = att.flash_attention_triton(q, k, v, causal, None, bm, bn, warps, stages)
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
        err = (o.float() - ref).abs().max().item()
        assert err < (1e-4 if dry else 2e-2), f"max |error| {err:.3g}"
        return {"max_abs_error": err}

    for d in (64, 128):
        for causal in (False, True):
            record(f"06 flash_attention_triton d={d} causal={causal}", lambda d=d, c=causal: attention(d, c))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--output-dir", type=Path, default=None, help="default $OUT if set, else benchmarks/results")
    args = p.parse_args(argv)
    if args.dry_run:  # before Triton is imported: the interpreter, whatever the machine has
        os.environ["COURSE_TIER"] = "cpu"
        os.environ["TRITON_INTERPRET"] = "1"
    from course_utils.env import configure_triton, detect_tier

    configure_triton()  # before a kernel module imports Triton: the interpreter on the CPU tier
    from course_utils.provenance import machine_info, results_path

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _record import Record

    dry = args.dry_run or detect_tier() == "cpu"
    folder = args.output_dir or (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results")
    rec = Record(results_path("lesson_kernels_gpu" + ("_dryrun" if dry else ""), folder=folder),
                 {**machine_info(extra={"mode": "dry run" if dry else "gpu"}), "checks": []})
    rows = run(dry, rec)
    failed = [r["check"] for r in rows if r["status"] != "ok"]
    rec.finish(failed=failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
