"""Every course kernel compiled for sm_80 and sm_90 (and T4-sized fp16 variants for sm_75) at the
configurations its benchmark launches, on a machine without a GPU (course_utils.devtools.compile_matrix): the
GEMMs, and lesson 06's forward and both backward kernels for d = 64 and 128, GROUP 1 and 4, causal and not.
Results are cached on disk by source hash (gemm_compile.compile_cases), so a rerun compiles only what changed.

Fails on a spill, on shared memory over the device's per-block limit, on a Hopper GEMM or attention
kernel without ``wgmma``, on a descriptor kernel without TMA, on a pointer kernel that is not
pipelined with ``cp.async``, and on a warp-specialized rung without its producer/consumer split
(``setmaxnreg``). About 180 compiles of a few seconds each the first time, in two processes.
"""
from __future__ import annotations

import pytest

pytest.importorskip("triton")
from _grading_helpers import gpu_compiler  # noqa: E402

gc = gpu_compiler(allow_module_level=True)

from course_utils import gemm as G  # noqa: E402
from course_utils import gemm_compile as GC  # noqa: E402
from course_utils.devtools.compile_matrix import compile_matrix  # noqa: E402

pytestmark = pytest.mark.slow

CASES = compile_matrix()
# Two extra compiles that show why the configurations are what they are.
WS_AT_8 = GC.gemm_case("warp-specialized", G.Config(128, 256, 64, 8, 3, 8), 90)
PERSISTENT_4_STAGES = GC.gemm_case("descriptor persistent", G.Config(128, 256, 64, 8, 4, 8), 90)


class _ByCase(dict):
    """Compiled kernels looked up by case (a case holds dicts, so it is keyed by arch and label)."""

    def __getitem__(self, case):
        return super().__getitem__((case.arch, case.label))


@pytest.fixture(scope="module")
def compiled():
    todo = [*CASES, WS_AT_8, PERSISTENT_4_STAGES]
    return _ByCase({(c.arch, c.label): r for c, r in zip(todo, GC.compile_cases(todo, processes=2, keep_ptx=True))})


@pytest.mark.parametrize("case", CASES, ids=[f"sm{c.arch}-{c.label}" for c in CASES])
def test_kernel_compiles_cleanly(compiled, case):
    found = GC.compile_problems(compiled[case], case)
    assert not found, f"{case.label} sm_{case.arch}: {'; '.join(found)} ({compiled[case].summary()})"


def test_every_benchmark_configuration_is_compiled():
    labels = {(c.arch, c.extra["variant"], tuple(sorted(c.extra["config"].items()))) for c in CASES}
    for arch in (75, 80, 90):
        for variant in G.VARIANTS:
            if variant == "tiled row-major":
                continue                                  # the grouped kernel's code with GROUP_M = 1
            for cfg in G.gpu_configs(variant, arch):
                assert (arch, variant, tuple(sorted(cfg.__dict__.items()))) in labels
    assert G.gpu_configs("warp-specialized", 80) == []    # Hopper only
    attention = {(c.arch, c.extra["kernel"], c.extra["group"], c.extra["causal"], c.constexprs["HEAD_DIM"],
                  tuple(c.extra["config"].values())) for c in CASES if "kernel" in c.extra}
    from course_utils import attention_triton as att
    for arch in (75, 80, 90):
        for kind, kernels in (("fwd", ("fwd",)), ("bwd", ("dkdv", "dq"))):
            for cfg in att.attention_configs(arch, kind):
                for kernel in kernels:
                    for group in (1, 4):
                        for causal in (True, False):
                            for d in (64, 128) if arch >= 80 or kind == "fwd" else GC.T4_BACKWARD_HEAD_DIMS:
                                assert (arch, kernel, group, causal, d, tuple(cfg)) in attention


def test_the_attention_kernels_compile_for_float64_gradcheck():
    """float64 inputs (gradcheck on a GPU): fp64 accumulators, so every kernel compiles (the interpreter does not
    type-check loop-carried values, so only a compile shows this)."""
    from course_utils import attention_triton as att

    configs = [dict(arch=arch, kernel=k, dtype="fp64", head_dim=16, block_m=16, block_n=16, num_warps=4, num_stages=2,
                    causal=True, group=2) for arch in (75, 80, 90) for k in ("fwd", "dkdv", "dq")]
    compiled = att.compile_attention_kernels(configs)
    assert len(compiled) == 9
    for config, c in zip(configs, compiled):
        assert not c.spills and c.name.endswith({"fwd": "fwd_kernel", "dkdv": "dkdv_kernel", "dq": "dq_kernel"}[config["kernel"]])


def test_the_warp_specialized_rung_splits_at_four_warps_and_not_at_eight(compiled):
    for cfg in G.gpu_configs("warp-specialized", 90):
        assert cfg.num_warps == 4
        split = compiled[GC.gemm_case("warp-specialized", cfg, 90)]
        assert split.has("setmaxnreg") and split.has("tma") and split.has("wgmma")
        assert ".reqntid 384" in split.ptx or ".maxntid 384" in split.ptx   # 4 consumer warps + worker warps
        assert "setmaxnreg.dec" in split.ptx and "setmaxnreg.inc" in split.ptx   # producer gives, consumers take
    plain = compiled[WS_AT_8]
    assert not plain.has("setmaxnreg"), "Triton now splits at num_warps=8: the 4-warp restriction can go"
    desc = compiled[GC.gemm_case("descriptor (TMA)", G.GPU_CONFIG, 90)]
    assert plain.registers == desc.registers and plain.shared_bytes == desc.shared_bytes   # the plain descriptor kernel


def test_the_persistent_descriptor_kernel_at_four_stages_would_not_fit(compiled):
    big = compiled[PERSISTENT_4_STAGES]
    assert big.shared_bytes > gc.ARCH_LIMITS[90]["smem_per_block"]
    assert all(s.num_stages < 4 for s in G.gpu_configs("descriptor persistent", 90) if s.block_n == 256)


def test_pointer_loads_use_cp_async_and_descriptors_tma_on_hopper(compiled):
    tiled = compiled[GC.gemm_case("tiled grouped", G.GPU_CONFIG, 90)]
    desc = compiled[GC.gemm_case("descriptor (TMA)", G.GPU_CONFIG, 90)]
    assert tiled.has("cp.async") and not tiled.has("tma") and tiled.has("wgmma")
    assert desc.has("tma") and desc.has("mbarrier") and not desc.has("cp.async")


def test_the_warp_specialized_launcher_refuses_eight_warps(monkeypatch):
    import torch

    monkeypatch.setattr(G, "interpreted", lambda: False)
    monkeypatch.setattr(G, "warp_specialize_available", lambda: (True, "test"))
    a = torch.zeros(64, 64)
    with pytest.raises(ValueError, match="num_warps=4"):
        G.matmul_warp_specialized(a, a, G.Config(128, 256, 64, 8, 3, 8))
