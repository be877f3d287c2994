"""setup(): seeding, tier detection, Triton mode and the one-line description."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from course_utils import env as env_module
from course_utils.env import detect_tier, setup


def test_setup_seeds_every_generator(capsys):
    setup(seed=123, quiet=True)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    setup(seed=123, quiet=True)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    assert capsys.readouterr().out == ""


def test_setup_prints_one_line_with_tier_and_versions(capsys):
    env = setup(seed=0)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert f"tier={env.tier}" in out and f"torch {torch.__version__.split('+')[0]}" in out and "seed=0" in out


def test_cpu_tier_switches_triton_to_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("COURSE_TIER", "cpu")
    env = setup(quiet=True)
    assert env.tier == "cpu" and str(env.device) == "cpu"
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert env.triton_mode in ("interpreted", "missing")
    assert env.low_precision == torch.float32
    assert env.pick(cpu=64, cuda=4096) == 64


def test_tier_detection_without_override(monkeypatch):
    monkeypatch.delenv("COURSE_TIER", raising=False)
    expected = "cpu" if not torch.cuda.is_available() else ("sm90" if torch.cuda.get_device_capability(0)[0] == 9 else "cuda")
    assert detect_tier() == expected


def test_bad_tier_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_TIER", "tpu")
    with pytest.raises(ValueError, match="not a tier"):
        detect_tier()


def test_pick_by_tier():
    gpu = env_module.Env(tier="sm90", seed=0, triton_mode="compiled", device_name="H200")
    assert gpu.pick(cpu=1, cuda=2) == 2 and gpu.pick(cpu=1, cuda=2, sm90=3) == 3 and gpu.is_hopper


def test_configure_triton_chooses_the_interpreter_on_the_cpu_tier_and_importing_changes_nothing():
    import subprocess
    import sys

    code = ("import os; from course_utils.env import configure_triton, import_triton; triton, tl = import_triton(); "
            "before = os.environ.get('TRITON_INTERPRET'); mode = configure_triton(); "
            "print(before, os.environ.get('TRITON_INTERPRET'), mode, triton is not None and tl is not None)")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["COURSE_TIER"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["None", "1", "interpreted", "True"]


def test_importing_every_course_module_leaves_the_environment_alone():
    import subprocess
    import sys

    code = ("import os, pkgutil, importlib, course_utils; before = dict(os.environ)\n"
            "for m in pkgutil.walk_packages(course_utils.__path__, 'course_utils.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "NUMBA_"))}
    env["COURSE_TIER"] = "cpu"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]", f"importing course_utils changed these environment variables: {out.strip()}"


def test_setup_configures_numba_explicitly(monkeypatch):
    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    monkeypatch.setenv("COURSE_TIER", "cpu")
    setup(quiet=True)
    assert os.environ["NUMBA_THREADING_LAYER"] == "workqueue"


def test_without_triton_kernels_still_define_and_a_launch_becomes_one_notice(monkeypatch, capsys):
    import sys

    from course_utils import env as env_mod

    monkeypatch.setitem(sys.modules, "triton", None)            # `import triton` now raises ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    triton, tl = env_mod.import_triton(stub=True)

    @triton.jit
    def kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

    env = env_mod.Env(tier="cpu", seed=0, triton_mode="missing", device_name="cpu")
    assert not env.has_triton
    with env.needs_triton("the Triton rung"):
        kernel[(triton.cdiv(10, 4),)](None, 10, BLOCK=4)
        raise AssertionError("not reached")
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "Triton is not installed" in out and "the kernel kernel" not in out
    assert "the Triton rung is skipped" in out
    assert env_mod.import_triton() == (None, None)
