"""FlashAttention (topic 06): the course's Triton forward kernel against scaled_dot_product_attention.

    python benchmarks/attention_gpu.py                 # on a CUDA GPU: the full sweep, JSON under results/
    python benchmarks/attention_gpu.py --dry-run       # anywhere: interpreter run at tiny sizes, no timing

On a CUDA device, for head dims 64 and 128, sequence lengths 1k-16k, causal and not, in bf16, it times
the forward of ``course_utils.attention_triton.flash_attention_triton`` (best of a few block/warp configurations,
chosen per case by measurement) and ``torch.nn.functional.scaled_dot_product_attention`` (torch picks its
flash backend where available) with ``triton.testing.do_bench``, and the forward + backward of both for
sequence lengths up to ``--backward-max-seq`` (the course's backward is tiled torch code, not a kernel,
so expect it to be slow). Throughput = matmul FLOPs / time: ``4 B H L^2 D`` forward, 2.5x that backward,
halved when causal (``course_utils.attention_io.attention_flops``). Batch x heads keep ``B L = 16k`` tokens
and ``H D = 2048``. Results go to ``benchmarks/results/attention_gpu_<gpu>_<date>.json`` with the GPU
name, driver, torch and triton versions and the date.

On the CPU tier (no CUDA device, or ``COURSE_TIER=cpu``), or with ``--dry-run``, it runs the kernel in
fp32 at tiny sizes (under Triton's interpreter on the CPU tier, compiled on a GPU), checks it against
SDPA (causal and not, ragged lengths), prints that timing needs CUDA, and exits 0. Needs only torch and triton (plus this repository's ``course_utils`` on the path).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from course_utils.env import detect_tier  # noqa: E402

TIER = detect_tier()  # "cpu", "cuda" or "sm90"; COURSE_TIER=cpu forces the CPU tier on a GPU machine

# Importing the kernel module switches Triton to its interpreter on the CPU tier before Triton is imported.
from course_utils import attention_io as aio  # noqa: E402
from course_utils import attention_triton as att  # noqa: E402

CONFIGS = [  # (block_m, block_n, num_warps, num_stages), tried per case on the GPU
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
    (64, 64, 4, 3),
]


def dry_run() -> int:
    """Interpreter check at tiny sizes: the kernel against SDPA in fp32. Returns the number of failures."""
    torch.manual_seed(0)
    device = "cpu" if TIER == "cpu" else "cuda"
    failures = 0
    for causal in (False, True):
        for b, h, l, d, bm, bn in ((1, 2, 40, 16, 16, 16), (1, 1, 72, 32, 32, 16)):  # 40, 72: not multiples of 32
            q, k, v = (torch.randn(b, h, l, d, device=device) for _ in range(3))
            out, _ = att.flash_attention_triton(q, k, v, causal=causal, block_m=bm, block_n=bn)
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            err = (out - ref).abs().max().item()
            ok = torch.allclose(out, ref, rtol=1e-5, atol=1e-5)
            failures += not ok
            print(f"dry run: causal={causal!s:5} B={b} H={h} L={l} D={d} blocks={bm}x{bn}: "
                  f"max |diff| vs SDPA {err:.1e} -> {'ok' if ok else 'MISMATCH'}")
    mode = "under the Triton interpreter" if TIER == "cpu" else "on the GPU"
    print(f"timing needs a CUDA GPU: this was a correctness dry run {mode} (fp32, tiny sizes); no results were written.")
    return failures


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - the driver version is informative only
        return "unknown"


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3  # seconds (do_bench returns ms)


def gpu_sweep(args) -> dict:
    import triton

    torch.manual_seed(0)
    dtype = torch.bfloat16
    cases = []
    for d in args.head_dims:
        for seq in args.seqs:
            for causal in (False, True):
                b, h = max(1, args.tokens // seq), max(1, 2048 // d)
                q, k, v = (torch.randn(b, h, seq, d, device="cuda", dtype=dtype) for _ in range(3))
                case = {"head_dim": d, "seq": seq, "causal": causal, "batch": b, "heads": h, "dtype": "bfloat16"}
                fwd_flops = aio.attention_flops(b, h, seq, seq, d, causal)
                try:
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    t_sdpa = _bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                    best = None
                    for bm, bn, warps, stages in CONFIGS:
                        try:
                            out, _ = att.flash_attention_triton(q, k, v, causal, None, bm, bn, warps, stages)
                            err = (out.float() - ref.float()).abs().max().item()
                            t = _bench(lambda: att.flash_attention_triton(q, k, v, causal, None, bm, bn, warps, stages))
                        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for this config
                            case.setdefault("config_errors", []).append(f"{bm}x{bn}/w{warps}/s{stages}: {exc!s:.200}")
                            continue
                        if best is None or t < best[0]:
                            best = (t, (bm, bn, warps, stages), err)
                    case.update(sdpa_fwd_s=t_sdpa, sdpa_fwd_tflops=fwd_flops / t_sdpa / 1e12)
                    if best is not None:
                        t, cfg, err = best
                        case.update(triton_fwd_s=t, triton_fwd_tflops=fwd_flops / t / 1e12, triton_config=list(cfg),
                                    triton_max_abs_diff=err, fwd_ratio_vs_sdpa=t_sdpa / t)
                    if seq <= args.backward_max_seq:
                        bwd_flops = aio.attention_flops(b, h, seq, seq, d, causal, backward=True)
                        qg, kg, vg = (t_.detach().requires_grad_() for t_ in (q, k, v))
                        do = torch.randn_like(q)

                        def sdpa_fb():
                            F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(do)

                        def ours_fb():
                            att.flash_attention(qg, kg, vg, causal, None, 128, 64).backward(do)

                        t_s, t_o = _bench(sdpa_fb), _bench(ours_fb)
                        case.update(sdpa_fwd_bwd_s=t_s, ours_fwd_bwd_s=t_o,
                                    sdpa_fwd_bwd_tflops=(fwd_flops + bwd_flops) / t_s / 1e12,
                                    ours_fwd_bwd_tflops=(fwd_flops + bwd_flops) / t_o / 1e12,
                                    backward_note="ours: Triton forward + tiled torch backward (no backward kernel)")
                except Exception as exc:  # noqa: BLE001 - record and go on with the next case
                    case["error"] = f"{type(exc).__name__}: {exc!s:.300}"
                cases.append(case)
                print(json.dumps(case), flush=True)
                q = k = v = None  # free before the next case
                torch.cuda.empty_cache()
    return {
        "benchmark": "attention_gpu",
        "gpu": torch.cuda.get_device_name(0),
        "driver": _driver(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "timer": "triton.testing.do_bench (warmup 25 ms, rep 100 ms), median",
        "flops": "4 B H L^2 D forward, x2.5 backward, /2 causal",
        "cases": cases,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="interpreter correctness run at tiny sizes, no timing")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seq")
    parser.add_argument("--backward-max-seq", type=int, default=4096)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.dry_run or TIER == "cpu":
        return 1 if dry_run() else 0
    result = gpu_sweep(args)
    name = "".join(c if c.isalnum() else "_" for c in result["gpu"]).strip("_").lower()
    out = args.output or ROOT / "benchmarks" / "results" / f"attention_gpu_{name}_{dt.date.today():%Y%m%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
