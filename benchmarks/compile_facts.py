"""What every course kernel compiles to, per configuration, for sm_80 and sm_90 (and T4 fp16 for sm_75).

    python benchmarks/compile_facts.py                    # all kernels, benchmarks/results/compile_facts_<date>.json
    python benchmarks/compile_facts.py --quick --output-dir $OUT   # the sm_90 GEMMs only

Needs no GPU: Triton's CUDA backend and the ptxas inside the triton wheel compile for a named GPU
(``course_utils.devtools.compile_matrix``). Per kernel and configuration: registers per thread, spill bytes,
stack, shared memory, an occupancy estimate, and which of wgmma / mma.sync / TMA / cp.async /
mbarrier / setmaxnreg / ldmatrix the PTX contains, with the Triton version and the course commit.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", type=Path, default=None, help="default $OUT if set, else benchmarks/results")
    p.add_argument("--quick", action="store_true", help="the sm_90 GEMM configurations only")
    p.add_argument("--processes", type=int, default=max(1, min(8, (os.cpu_count() or 2))))
    args = p.parse_args(argv)
    from course_utils.env import detect_tier

    tier = detect_tier()                               # the machine's tier, for the record
    os.environ.setdefault("COURSE_TIER", "cpu")        # compiling needs no device; keep this process off the GPU
    from course_utils import gemm_compile as GC
    from course_utils.devtools.compile_matrix import compile_matrix
    from course_utils.gpu_compile import FEATURES
    from course_utils.provenance import machine_info, results_path

    todo = compile_matrix((90,), conv=False, attention=False, t4=False) if args.quick else compile_matrix(full=True)
    compiled = GC.compile_cases(todo, processes=args.processes)
    rows = []
    for case, c in zip(todo, compiled):
        row = {"kernel": c.name, "label": case.label, "arch": case.arch, **case.extra, "registers": c.registers,
               "spill_stores": c.spill_stores, "spill_loads": c.spill_loads, "stack_bytes": c.stack_bytes,
               "shared_bytes": c.shared_bytes, "blocks_per_sm": c.blocks_per_sm,
               "features": [f for f in FEATURES if c.has(f)], "problems": GC.compile_problems(c, case)}
        rows.append(row)
        print(f"sm_{case.arch} {case.label:<52} {c.registers:>3} regs  spill {c.spill_stores:>4} B  "
              f"{c.shared_bytes / 1024:6.1f} KiB  {','.join(row['features']) or '-':<32} {'; '.join(row['problems']) or 'ok'}")
    folder = args.output_dir or (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "benchmarks" / "results")
    folder.mkdir(parents=True, exist_ok=True)
    path = results_path("compile_facts" + ("_quick" if args.quick else ""), folder=folder)
    record = {**machine_info(extra={"compiled_for": sorted({c.arch for c in todo}), "needs_gpu": False, "tier": tier}),
              "kernels": rows}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
