"""FlashAttention (topic 06): the course's Triton forward and backward kernels against scaled_dot_product_attention.

    python benchmarks/attention_gpu.py                 # on a CUDA GPU: the full sweep, JSON under results/
    python benchmarks/attention_gpu.py --dry-run       # anywhere: interpreter run at tiny sizes, no timing

On a CUDA device, for head dims 64 and 128, sequence lengths 1k-16k, causal and not, and key/value head
groups of 1 (MHA) and 4 (GQA), in bf16, it times with ``triton.testing.do_bench``:

* the forward of ``course_utils.attention_triton.flash_attention_triton`` (best of a few block/warp
  configurations, chosen per case by measurement) against ``torch.nn.functional.scaled_dot_product_attention``
  (torch picks its flash backend where available; ``enable_gqa=True`` for GQA);
* forward + backward of ``course_utils.attention_triton.flash_attention`` (Triton forward, the Triton
  backward of ``course_utils.attention_triton_backward``: delta pre-pass, dK/dV kernel, dQ kernel; best
  of a few backward configurations) against SDPA's, with the inputs' ``.grad`` reset by ``grad_to_none``
  so that no run pays for accumulating into the last one's gradients.

Throughput = matmul FLOPs / time: ``4 B H L^2 D`` forward, 2.5x that backward, halved when causal
(``course_utils.attention_io.attention_flops``), also reported as a share of this GPU's dense bf16 peak
(looked up by the GPU's name in ``benchmarks/_record.py``, with its datasheet). SDPA is timed as torch
dispatches it (the aten ops it ran are recorded: which backend) and again with the flash backend forced.
Every output and gradient (ours and SDPA's) is compared with an fp32
reference; a variant whose relative error exceeds the bf16 tolerance, or that fails, makes the script exit 1.
Batch x heads keep ``B L = 16k`` tokens and ``H_q D = 2048``; d = 128 and L = 4k-16k come first. Results, with
``course_utils.provenance``'s machine record, go to a dated ``benchmarks/results/attention_gpu_<gpu>_<date>.json``,
rewritten after every case (``benchmarks/_record.py``: a time limit or SIGTERM keeps what finished).
``--plan`` prints the planned cases, timed runs and compiles without running anything.

On the CPU tier (no CUDA device, or ``COURSE_TIER=cpu``), or with ``--dry-run``, it runs the kernels in
fp32 at tiny sizes (under Triton's interpreter on the CPU tier, compiled on a GPU): forward, forward +
backward and GQA/MQA against SDPA (causal and not, ragged lengths), prints that timing needs CUDA, and
exits 1 on any mismatch. Needs only torch and triton (plus this repository's ``course_utils`` on the path).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from course_utils.env import configure_triton, detect_tier  # noqa: E402

TIER = detect_tier()  # "cpu", "cuda" or "sm90"; COURSE_TIER=cpu forces the CPU tier on a GPU machine

configure_triton(TIER)  # on the CPU tier: Triton's interpreter, chosen before the kernel module imports Triton
from course_utils import attention_io as aio  # noqa: E402
from course_utils import attention_triton as att  # noqa: E402
from course_utils import provenance  # noqa: E402
from course_utils.checks import tolerance_for  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))

from _record import Record, peak_for  # noqa: E402  (benchmarks/_record.py: rewritten after every case)


def _arch() -> int:
    if TIER == "cpu" or not torch.cuda.is_available():
        return 90
    major, minor = torch.cuda.get_device_capability(0)
    return 10 * major + minor


# (block_m, block_n, num_warps, num_stages), tried per case on this GPU's generation; the table and why
# configurations were left out: course_utils.attention_triton.ATTENTION_GPU_CONFIGS (compile-tested for
# both head dims, GROUP 1 and 4, causal and not: tests/test_compile_kernels.py).
FWD_CONFIGS = att.attention_configs(_arch(), "fwd")
BWD_CONFIGS = att.attention_configs(_arch(), "bwd")
REL_TOL = tolerance_for(torch.bfloat16)[0]  # relative (Frobenius) error against the fp32 reference


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def _grads(fn, q, k, v, do):
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(qg, kg, vg)
    return (out, *torch.autograd.grad(out, (qg, kg, vg), do))


def dry_run(output: Path | None = None) -> int:
    """Interpreter check at tiny sizes: forward, backward and GQA against SDPA in fp32. Returns the failures.

    With ``output`` each check's verdict is written there as it finishes (``"dry_run": true``)."""
    torch.manual_seed(0)
    rec = Record(output, {"benchmark": "attention_gpu", "dry_run": True, "machine": provenance.machine_info(),
                          "checks": []}) if output else None
    device = "cpu" if TIER == "cpu" else "cuda"
    rtol, atol = tolerance_for("triton_interpreter", n=128)
    failures = 0
    cases = [  # (B, H_q, H_kv, L, D, block_m, block_n); 40, 72, 50: not multiples of the blocks
        ("forward", 1, 2, 2, 40, 16, 16, 16), ("forward", 1, 1, 1, 72, 32, 32, 16),
        ("backward", 1, 2, 2, 40, 16, 16, 16), ("backward", 1, 1, 1, 72, 32, 32, 16),
        ("GQA backward", 1, 4, 2, 50, 16, 16, 32), ("MQA backward", 1, 3, 1, 40, 16, 32, 16),
    ]
    for causal in (False, True):
        for kind, b, hq, hkv, l, d, bm, bn in cases:
            q, do = (torch.randn(b, hq, l, d, device=device) for _ in range(2))
            k, v = (torch.randn(b, hkv, l, d, device=device) for _ in range(2))
            gqa = hq != hkv
            if kind == "forward":
                got = att.flash_attention_triton(q, k, v, causal=causal, block_m=bm, block_n=bn)[:1]
                want = (F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),)
            else:
                got = _grads(lambda a, b_, c: att.flash_attention(a, b_, c, causal, None, bm, bn), q, k, v, do)
                want = _grads(lambda a, b_, c: F.scaled_dot_product_attention(a, b_, c, is_causal=causal,
                                                                              enable_gqa=gqa), q, k, v, do)
            err = max((g - w).abs().max().item() for g, w in zip(got, want))
            ok = all(torch.allclose(g, w, rtol=rtol, atol=atol) for g, w in zip(got, want))
            failures += not ok
            # The verdict, not the error's last digits (they change with the CPU's SIMD kernels and thread count).
            verdict = f"ok, within rtol={rtol:g} atol={atol:g}" if ok else f"MISMATCH (max |diff| {err:.1e})"
            print(f"dry run: {kind:<12} causal={causal!s:5} B={b} H_q={hq} H_kv={hkv} L={l} D={d} "
                  f"blocks={bm}x{bn} vs SDPA: {verdict}", flush=True)
            if rec:
                rec.add("checks", {"kind": kind, "causal": causal, "shape": [b, hq, hkv, l, d], "blocks": [bm, bn],
                                   "ok": ok})
    mode = "under the Triton interpreter" if TIER == "cpu" else "on the GPU"
    print(f"timing needs a CUDA GPU: this was a correctness dry run {mode} (fp32, tiny sizes); "
          + (f"checks in {output}." if output else "no results were written."))
    if rec:
        rec.finish(failures=failures)
    return failures


def sdpa_ops(fn) -> list[str]:
    """The aten attention ops one call runs (``_scaled_dot_product_flash_attention``, ``..._efficient_...``,
    ``..._cudnn_...``): which backend SDPA chose."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sorted({e.name for e in prof.events() if "attention" in e.name and e.name != "aten::scaled_dot_product_attention"})


def _bench(fn, grad_to_none=None) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median") / 1e3  # s


def _best(configs, run, check, case, key):
    """Time ``run(config)`` for each config that passes ``check(config)``; returns (seconds, config) or None."""
    best = None
    for cfg in configs:
        try:
            check(cfg)
            t = run(cfg)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory for this config
            case.setdefault(f"{key}_config_errors", []).append(f"{cfg}: {type(exc).__name__}: {exc!s:.200}")
            continue
        if best is None or t < best[0]:
            best = (t, cfg)
    return best


def one_case(d, seq, causal, group, args, device="cuda", dtype=torch.bfloat16) -> dict:
    """One shape: forward and forward + backward of ours and SDPA, errors against fp32, best configurations."""
    b, h = max(1, args.tokens // seq), max(1, args.width // d)
    hkv = h // group
    q, do = (torch.randn(b, h, seq, d, device=device, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(b, hkv, seq, d, device=device, dtype=dtype) for _ in range(2))
    gqa = group > 1
    case = {"head_dim": d, "seq": seq, "causal": causal, "group": group, "batch": b, "heads_q": h, "heads_kv": hkv,
            "dtype": str(dtype).removeprefix("torch."), "kv_bytes": 2 * k.numel() * k.element_size(),
            "kv_bytes_mha": 2 * b * h * seq * d * k.element_size()}
    peak = getattr(args, "peak", None)  # dense FLOP/s of this GPU and dtype (benchmarks/_record.py), None if unknown
    fwd_flops = aio.attention_flops(b, h, seq, seq, d, causal)
    bwd_flops = aio.attention_flops(b, h, seq, seq, d, causal, backward=True)

    def sdpa(a, b_, c):
        return F.scaled_dot_product_attention(a, b_, c, is_causal=causal, enable_gqa=gqa)

    ref32 = _grads(sdpa, q.float(), k.float(), v.float(), do.float()) if seq <= args.backward_max_seq else None
    ref_o = ref32[0] if ref32 is not None else sdpa(q.float(), k.float(), v.float())
    case["sdpa_fwd_rel_err"] = rel_err(sdpa(q, k, v), ref_o)
    case["sdpa_ops"] = sdpa_ops(lambda: sdpa(q, k, v))  # which SDPA backend torch picked (its aten ops)
    t_sdpa = _bench(lambda: sdpa(q, k, v))
    try:  # SDPA again with the flash backend forced (GQA through enable_gqa where this torch supports it)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            case["sdpa_flash_fwd_rel_err"] = rel_err(sdpa(q, k, v), ref_o)
            t_flash = _bench(lambda: sdpa(q, k, v))
        case.update(sdpa_flash_fwd_s=t_flash, sdpa_flash_fwd_tflops=fwd_flops / t_flash / 1e12)
    except Exception as exc:  # noqa: BLE001 - the flash backend refuses some shapes/dtypes/devices
        case["sdpa_flash_fwd_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"

    def fwd_check(cfg):
        err = rel_err(att.flash_attention_triton(q, k, v, causal, None, *cfg)[0], ref_o)
        case.setdefault("triton_fwd_rel_err", {})[str(cfg)] = err
        if not err <= REL_TOL:
            raise AssertionError(f"relative error {err:.3g} > {REL_TOL}")

    best = _best(FWD_CONFIGS, lambda cfg: _bench(lambda: att.flash_attention_triton(q, k, v, causal, None, *cfg)),
                 fwd_check, case, "fwd")
    case.update(sdpa_fwd_s=t_sdpa, sdpa_fwd_tflops=fwd_flops / t_sdpa / 1e12,
                sdpa_fwd_peak_share=fwd_flops / t_sdpa / peak if peak else None)
    if best is None:
        case["failed"] = "no forward configuration passed"
        return case
    t, fcfg = best
    case.update(triton_fwd_s=t, triton_fwd_tflops=fwd_flops / t / 1e12, triton_fwd_config=list(fcfg),
                triton_fwd_peak_share=fwd_flops / t / peak if peak else None, fwd_speed_vs_sdpa=t_sdpa / t)
    if ref32 is None:
        return case
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

    def ours(a, b_, c, cfg):
        bm, bn, warps, stages = cfg
        return att.flash_attention(a, b_, c, causal, None, *fcfg[:2], launch=dict(
            num_warps=fcfg[2], num_stages=fcfg[3], bwd_block_m=bm, bwd_block_n=bn, bwd_num_warps=warps,
            bwd_num_stages=stages))

    def bwd_check(cfg):
        got = _grads(lambda a, b_, c: ours(a, b_, c, cfg), q, k, v, do)
        errs = [rel_err(g, w) for g, w in zip(got[1:], ref32[1:])]
        case.setdefault("triton_grad_rel_err", {})[str(cfg)] = errs
        if not max(errs) <= REL_TOL:
            raise AssertionError(f"gradient relative errors {errs} > {REL_TOL}")

    sdpa_grads = _grads(sdpa, q, k, v, do)
    case["sdpa_grad_rel_err"] = [rel_err(g, w) for g, w in zip(sdpa_grads[1:], ref32[1:])]
    t_s = _bench(lambda: sdpa(qg, kg, vg).backward(do), grad_to_none=[qg, kg, vg])
    best = _best(BWD_CONFIGS, lambda cfg: _bench(lambda: ours(qg, kg, vg, cfg).backward(do), grad_to_none=[qg, kg, vg]),
                 bwd_check, case, "bwd")
    total = fwd_flops + bwd_flops
    case.update(sdpa_fwd_bwd_s=t_s, sdpa_fwd_bwd_tflops=total / t_s / 1e12,
                sdpa_fwd_bwd_peak_share=total / t_s / peak if peak else None)
    if best is None:
        case["failed"] = "no backward configuration passed"
        return case
    t_o, bcfg = best
    if device == "cuda":  # measured: the peak memory of one forward + backward (GQA: smaller K, V and their grads)
        qg.grad = kg.grad = vg.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        ours(qg, kg, vg, bcfg).backward(do)
        torch.cuda.synchronize()
        case["triton_fwd_bwd_peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
    case.update(triton_fwd_bwd_s=t_o, triton_fwd_bwd_tflops=total / t_o / 1e12, triton_bwd_config=list(bcfg),
                triton_fwd_bwd_peak_share=total / t_o / peak if peak else None, fwd_bwd_speed_vs_sdpa=t_s / t_o)
    return case


def plan(args) -> dict:
    """What the GPU sweep will do: cases, timed runs and kernel compiles (each Triton specialization once)."""
    cases = [(d, seq, causal, group) for d in args.head_dims for seq in args.seqs for causal in (False, True)
             for group in args.groups]
    backward = [c for c in cases if c[1] <= args.backward_max_seq]
    fwd_specs = {(d, causal, group, cfg) for d, _, causal, group in cases for cfg in FWD_CONFIGS}
    bwd_specs = {(d, causal, group, cfg) for d, _, causal, group in backward for cfg in BWD_CONFIGS}
    compiles = len(fwd_specs) + 3 * len(bwd_specs)  # forward; delta pre-pass, dK/dV and dQ per backward config
    timed = len(cases) * (2 + len(FWD_CONFIGS)) + len(backward) * (1 + len(BWD_CONFIGS))
    return {"script": "attention_gpu", "cases": len(cases), "backward_cases": len(backward), "compiles": compiles,
            "timed_runs": timed, "configs": {"fwd": FWD_CONFIGS, "bwd": BWD_CONFIGS}}


def gpu_sweep(args, out: Path) -> int:
    torch.manual_seed(0)
    from course_utils.provenance import machine_info

    machine = machine_info()
    args.peak, peak_source = peak_for(machine.get("gpu", ""), "bfloat16")
    rec = Record(out, {
        "benchmark": "attention_gpu",
        "machine": machine,
        "plan": plan(args),
        "timer": "triton.testing.do_bench (warmup 25 ms, rep 100 ms, grad_to_none for backward), median",
        "flops": "4 B H L^2 D forward, x2.5 backward, /2 causal",
        "peak_flops": args.peak,
        "peak_source": peak_source,
        "tolerance": f"relative Frobenius error vs an fp32 SDPA reference <= {REL_TOL} (bf16)",
        "cases": [],
    })
    failures = 0
    for d in args.head_dims:
        for seq in args.seqs:
            for causal in (False, True):
                for group in args.groups:
                    try:
                        case = one_case(d, seq, causal, group, args)
                    except Exception as exc:  # noqa: BLE001 - record, count, go on with the next case
                        case = {"head_dim": d, "seq": seq, "causal": causal, "group": group,
                                "failed": f"{type(exc).__name__}: {exc!s:.300}"}
                    failures += "failed" in case
                    rec.add("cases", case)  # on disk before the next case starts
                    print(json.dumps(case), flush=True)
                    torch.cuda.empty_cache()
    rec.finish(failures=failures)
    print(f"{failures} failing case(s)")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="interpreter correctness run at tiny sizes, no timing")
    parser.add_argument("--plan", action="store_true", help="print the planned cases and compiles as JSON, run nothing")
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384, 1024, 2048])
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 4], help="query heads per key/value head")
    parser.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seq")
    parser.add_argument("--width", type=int, default=2048, help="query heads = width // head dim")
    parser.add_argument("--backward-max-seq", type=int, default=16384)
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.plan:
        print(json.dumps(plan(args)))
        return 0
    if args.dry_run or TIER == "cpu":
        return 1 if dry_run(args.output) else 0
    name = "".join(c if c.isalnum() else "_" for c in torch.cuda.get_device_name(0)).strip("_").lower()
    out = args.output or provenance.results_path(f"attention_gpu_{name}")
    return 1 if gpu_sweep(args, out) else 0


if __name__ == "__main__":
    sys.exit(main())
