"""Tests of course_utils.mixed_precision: the helpers lesson 02 (and 08) import, and every exercise check.

For each check: it passes a correct answer, raises NotAttempted on a stub, and raises CheckFailed
with the specific hint on plausible wrong answers.
"""
from __future__ import annotations

import pytest
import torch

from course_utils import mixed_precision as mp
from course_utils.checks import NotAttempted
from conftest import stub, fails_with  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: one thread avoids contention on a shared CPU (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- reference answers
class GoodScaler:
    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        self.scale, self.up, self.down, self.interval, self.good = init_scale, growth_factor, backoff_factor, growth_interval, 0

    def unscale_(self, grads):
        found = False
        for g in grads:
            g.div_(self.scale)
            found = found or not bool(torch.isfinite(g).all())
        return found

    def update(self, found_inf):
        if found_inf:
            self.scale *= self.down
            self.good = 0
        else:
            self.good += 1
            if self.good == self.interval:
                self.scale *= self.up
                self.good = 0


class StubScaler:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError


def good_clip(grads, scale, max_norm):
    grads = [g / scale for g in grads]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return [g * torch.clamp(max_norm / (norm + 1e-6), max=1.0) for g in grads]


def good_master_step(master, grad16, scale, lr):
    new = master - lr * (grad16.float() / scale)
    return new, new.half()


def good_bytes(weight_dtype, optimizer, master_weights):
    size = {"float32": 4, "float16": 2, "bfloat16": 2}[weight_dtype]
    states = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
    return 2 * size + (4 if master_weights else 0) + states * (4 if master_weights else size)


def good_classify(x, dtype):
    e, m = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}[dtype]
    emin, emax = 2 - 2 ** (e - 1), 2 ** (e - 1) - 1
    a = x.abs().double()
    under = (a <= 2.0 ** (emin - m - 1)) & (x != 0)
    over = a >= 2.0 ** emax * (2 - 2.0 ** -(m + 1))
    return torch.where(under, 0, torch.where(over, 2, 1)).long()


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
    fp32 = mp.measure_recipe_memory(model, torch.float32, "adam")
    mixed = mp.measure_recipe_memory(model, torch.float16, "adam", master_weights=True)
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


# ---------------------------------------------------------------- exercise checks
def test_scaler_check():
    mp.check_dynamic_loss_scaler(GoodScaler)
    with pytest.raises(NotAttempted):
        mp.check_dynamic_loss_scaler(StubScaler)
    for bug, fragment in [("every_step", "grow only when"), ("never_skip", "must return True"), ("inf_only", "isfinite"),
                          ("no_reset", "restart at 0"), ("divide_backoff", "do not divide"), ("fixed_half", "whatever backoff_factor"),
                          ("multiply", "dividing"), ("never_reset_count", "kept growing")]:
        fails_with(mp.check_dynamic_loss_scaler, lambda *a, bug=bug, **k: mp._BuggyScaler(bug, *a, **k), fragment)


def test_clip_check():
    mp.check_unscale_and_clip(good_clip)
    with pytest.raises(NotAttempted):
        mp.check_unscale_and_clip(stub)
    fails_with(mp.check_unscale_and_clip, lambda g, s, m: [x / s for x in good_clip(g, 1.0, m)], "divide by the scale first")
    fails_with(mp.check_unscale_and_clip, lambda g, s, m: good_clip(g, 1.0, m), "only ever shrink")
    fails_with(mp.check_unscale_and_clip, lambda g, s, m: [good_clip([x], s, m)[0] for x in g], "global norm")

    def always_rescale(g, s, m):
        g = [x / s for x in g]
        norm = torch.linalg.vector_norm(torch.cat([x.reshape(-1) for x in g]))
        return [x * (m / norm) for x in g]

    fails_with(mp.check_unscale_and_clip, always_rescale, "only ever shrink")


def test_master_step_check():
    mp.check_master_weight_step(good_master_step)
    with pytest.raises(NotAttempted):
        mp.check_master_weight_step(stub)

    def fp16_update(m, g, s, lr):
        w = m.half() - lr * (g / s)
        return w.float(), w

    fails_with(mp.check_master_weight_step, fp16_update, "applied in fp16")
    fails_with(mp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, 1.0, lr), "loss scale")
    fails_with(mp.check_master_weight_step, lambda m, g, s, lr: (good_master_step(m, g, s, lr)[0], m.half()), "rounded to fp16")
    fails_with(mp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, 1.0 / s, lr), "multiplied by the scale")
    fails_with(mp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, s, lr)[0], "return two tensors")


def test_bytes_check():
    mp.check_bytes_per_param(good_bytes)
    with pytest.raises(NotAttempted):
        mp.check_bytes_per_param(stub)
    fails_with(mp.check_bytes_per_param, lambda w, o, m: good_bytes(w, o, False), "master_weights was ignored")
    fails_with(mp.check_bytes_per_param, lambda w, o, m: good_bytes(w, o, m) - (4 if m else 0), "master copy is missing")
    fails_with(mp.check_bytes_per_param, lambda w, o, m: good_bytes(w, "momentum" if o == "adam" else o, m), "two states")
    states = {"sgd": 0, "momentum": 1, "adam": 2}
    fails_with(mp.check_bytes_per_param, lambda w, o, m: good_bytes(w, o, m) - (1 if m else 0) * 2 * states[o], "state is FP32")
    fails_with(mp.check_bytes_per_param, lambda w, o, m: good_bytes(w, o, m) + (4 - good_bytes(w, "sgd", False) // 2), "FP32 gradient copy is transient")
    fails_with(mp.check_bytes_per_param, lambda w, o, m: good_bytes(w, o, m) - good_bytes(w, "sgd", False) // 2, "gradients are missing")


def test_classify_check():
    mp.check_classify_cast(good_classify)
    with pytest.raises(NotAttempted):
        mp.check_classify_cast(stub)

    def with_edges(lo_scale=1.0, strict=False, over_at_max=False, fp16_only=False):
        def fn(x, dtype):
            e, m = (5, 10) if fp16_only else {torch.float16: (5, 10), torch.bfloat16: (8, 7)}[dtype]
            emin, emax = 2 - 2 ** (e - 1), 2 ** (e - 1) - 1
            a = x.abs().double()
            lo = 2.0 ** (emin - m - 1) * lo_scale
            under = ((a < lo) if strict else (a <= lo)) & (x != 0)
            hi = 2.0 ** emax * (2 - 2.0 ** -m) if over_at_max else 2.0 ** emax * (2 - 2.0 ** -(m + 1))
            over = (a > hi) if over_at_max else (a >= hi)
            return torch.where(under, 0, torch.where(over, 2, 1)).long()
        return fn

    fails_with(mp.check_classify_cast, with_edges(strict=True), "rounds to even")
    fails_with(mp.check_classify_cast, with_edges(lo_scale=2.0, strict=True), "round up to it")
    fails_with(mp.check_classify_cast, with_edges(over_at_max=True), "max + half an ulp")
    fails_with(mp.check_classify_cast, with_edges(fp16_only=True), "exponent bits")

    def normal_only(x, dtype):
        e, m = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}[dtype]
        emin = 2 - 2 ** (e - 1)
        codes = good_classify(x, dtype)
        codes[(x.abs().double() < 2.0 ** emin) & (x != 0)] = 0   # forgot the subnormals
        return codes

    fails_with(mp.check_classify_cast, normal_only, "become subnormals")
