"""Tests of course_utils.mixed_precision and mixed_precision_memory: the helpers lesson 02 (and 08) import.
The exercise checks are tested in test_grading_mixed_precision.py."""
from __future__ import annotations

import pytest
import torch

from course_utils import mixed_precision as mp
from course_utils import mixed_precision_memory as mpm


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: one thread avoids contention on a shared CPU (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- helpers
def test_format_ranges_and_flush_fraction():
    r = mp.format_ranges(torch.float16)
    assert r == {"min_subnormal": 2.0**-24, "min_normal": 2.0**-14, "max": 65504.0}
    assert mp.format_ranges(torch.bfloat16)["min_subnormal"] == 2.0**-133
    x = torch.tensor([0.0, 1e-9, 1e-7, 1.0])  # 1e-9 flushes in fp16, not in bf16
    assert mp.flush_to_zero_fraction(x, torch.float16) == pytest.approx(1 / 3)
    assert mp.flush_to_zero_fraction(x, torch.bfloat16) == 0.0


def test_autocast_by_hand_matches_torch_autocast():
    X, y, _, _ = mp.load_digits_split()
    assert X.shape == (1400, 64) and X.dtype == torch.float32 and float(X.max()) <= 1.0
    params = mp.init_mlp()
    hand = mp.autocast_mlp_forward(params, X[:32], torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = mp.mlp_forward(params, X[:32])
    assert hand.dtype == auto.dtype == torch.bfloat16
    torch.testing.assert_close(hand, auto, rtol=0, atol=0)
    loss = mp.mlp_loss(hand, y[:32])
    assert loss.dtype == torch.float32
    loss.backward()
    assert params[0].grad.dtype == torch.float32  # gradients land on the FP32 master weights


def test_hand_scaler_reproduces_gradscaler_and_skips():
    kw = dict(steps=30, scaler_kwargs=dict(init_scale=2.0**20, growth_interval=4), inject=(10, 11, 20))
    logs = []
    for make in (mp.DynamicLossScaler, lambda **k: torch.amp.GradScaler("cpu", **k)):
        logs.append(mp.train_mlp("fp16_master", steps=kw["steps"], scaler=make(**kw["scaler_kwargs"]),
                                 inject_inf_at=kw["inject"]))
    ours, theirs = logs
    assert ours.scales == theirs.scales and ours.skipped == theirs.skipped
    assert all(ours.skipped[i] for i in kw["inject"])
    assert max(ours.scales) > min(ours.scales)  # both back-off and growth happened
    for a, b in zip(ours.params, theirs.params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_static_scaler_unscales():
    p = torch.zeros(3, requires_grad=True)
    opt = torch.optim.SGD([p], lr=1.0)
    s = mp.StaticLossScaler(8.0)
    assert float(s.scale(torch.tensor(2.0))) == 16.0
    p.grad = torch.tensor([8.0, 16.0, 24.0])
    assert s.step(opt) is False
    s.update()
    torch.testing.assert_close(p.detach(), torch.tensor([-1.0, -2.0, -3.0]))
    p.grad = torch.tensor([float("inf"), 0.0, 0.0])
    assert s.step(opt) is True  # skipped
    torch.testing.assert_close(p.detach(), torch.tensor([-1.0, -2.0, -3.0]))


def test_pure_fp16_adam_breaks_and_master_weights_do_not():
    fp32 = mp.train_mlp("fp32", steps=30)
    fp16 = mp.train_mlp("fp16", steps=30)
    master = mp.train_mlp("fp16_master", steps=30)
    assert any(l != l for l in fp16.losses)  # NaN appears
    assert abs(master.final_loss - fp32.final_loss) < 0.02


def test_measure_recipe_memory_counts_16_bytes_for_adam():
    model = lambda: torch.nn.Linear(64, 64)
    fp32 = mpm.measure_recipe_memory(model, torch.float32, "adam")
    mixed = mpm.measure_recipe_memory(model, torch.float16, "adam", master_weights=True)
    assert fp32.per_param() == {"weights": 4.0, "grads": 4.0, "master": 0.0, "optimizer": 8.0}
    assert mixed.per_param() == {"weights": 2.0, "grads": 2.0, "master": 4.0, "optimizer": 8.0}
    assert fp32.total == mixed.total == 16 * fp32.n_params
    a = torch.zeros(10)
    assert mp.tensor_bytes([a, a[2:], None]) == 40  # a view shares its storage


def test_autocast_table_lists_lowered_and_widened_ops():
    rows = {op: (from32, from16) for op, from32, from16 in mp.autocast_dtype_table()}
    assert rows["matmul"][0] == "bfloat16" and rows["linear"][0] == "bfloat16"
    assert rows["cross_entropy"][1] == "float32"  # widened
    assert rows["relu"] == ("float32", "bfloat16")  # follows its input
