"""benchmarks/run_gpu.sh without a GPU: its plan fits the first GPU run's budget, and a SIGTERM keeps what finished."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("triton")

# Assumed costs on an H100/H200 host (not measured here: no GPU has been lent yet): a Triton compile of one
# specialization <= 4 s, one do_bench timing (warm-up + 100 ms of repeats + fp32 reference) <= 1 s, one
# correctness check after its compile <= 0.25 s (a 1000^2 GEMM and its fp32 reference take milliseconds). The step limits of run_gpu.sh must cover the plan at these costs.
COMPILE_S, TIMED_S, CHECK_S = 4.0, 1.0, 0.25
LIMITS = {"gemm_gpu": 170, "attention_gpu": 200}


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "COURSE_TIER_SIMULATE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def test_the_planned_gpu_run_fits_its_step_limits_and_eight_minutes():
    script = (ROOT / "benchmarks" / "run_gpu.sh").read_text()
    gpu_branch = script.split('if [ "$MODE" = gpu ]; then\n    step "gemm"', 1)[1].split("\nelse", 1)[0]
    limits = [int(x) for x in re.findall(r'step "[^"]+" (\d+) ', 'step "gemm"' + gpu_branch)]
    assert limits and sum(limits) <= 480, limits          # the GPU branch's step limits: under 8 minutes in all
    plans = []
    for cmd in (["benchmarks/gemm_gpu.py", "--plan", "--quick"],
                ["benchmarks/attention_gpu.py", "--plan", "--head-dims", "128", "--seqs", "4096", "8192", "16384",
                 "--groups", "1", "4", "--backward-max-seq", "16384"]):
        out = subprocess.run([sys.executable, *cmd], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        plans.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for plan in plans:
        cost = plan["compiles"] * COMPILE_S + plan["timed_runs"] * TIMED_S + plan.get("checks", 0) * CHECK_S
        assert cost <= LIMITS[plan["script"]], (plan, cost)
    gemm, attention = plans
    assert gemm["shapes"] == [[8192, 8192, 8192]]            # the most valuable GEMM first (and only, when quick)
    assert attention["cases"] == 12 and attention["backward_cases"] == 12


def test_sigterm_midway_keeps_the_finished_results(tmp_path):
    out = tmp_path / "attention.json"
    proc = subprocess.Popen([sys.executable, "benchmarks/attention_gpu.py", "--dry-run", "--output", str(out)], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 600
        while time.time() < deadline:
            if out.exists():
                data = json.loads(out.read_text())
                if len(data.get("checks", [])) >= 2:
                    break
            time.sleep(0.2)
        else:
            pytest.fail("the dry run wrote no results within 10 minutes")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    data = json.loads(out.read_text())
    assert proc.returncode == 143
    assert data["complete"] is False and "SIGTERM" in data["interrupted"]
    assert len(data["checks"]) >= 2 and all(c["ok"] for c in data["checks"])
    assert len(data["checks"]) < 12                          # it really stopped midway
