"""Tests of course_utils.grading.mixed_precision: each check passes right answers (the solution's and ones
written differently), names each plausible mistake, rejects forbidden shortcuts, changed inputs and
lookup tables, and reports a stub as not attempted.
"""
from __future__ import annotations

import math

import pytest
import torch

from course_utils.grading import mixed_precision as gmp
from _grading_helpers import stub  # noqa: E402
from _grading_helpers import SEED, Recorder, fails, forbidden, not_attempted, passes, rejects_recorded_answers  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The models here are tiny: one thread avoids contention on a shared CPU (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- exercise 1: the scaler class
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


class ScalerWrittenDifferently(GoodScaler):
    """Right: multiplies by a float64 reciprocal and checks with isnan/isinf; counts down instead of up."""

    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        super().__init__(init_scale, growth_factor, backoff_factor, growth_interval)
        self.left = growth_interval

    def unscale_(self, grads):
        inv = 1.0 / self.scale  # exact: the scale is a power of two
        for g in grads:
            g.mul_(inv)
        return any(bool(torch.isnan(g).any() or torch.isinf(g).any()) for g in grads)

    def update(self, found_inf):
        if found_inf:
            self.scale, self.left = self.scale * self.down, self.interval
            return
        self.left -= 1
        if self.left == 0:
            self.scale, self.left = self.scale * self.up, self.interval


class StubScaler:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError


def _pasted_class(cls):
    """``cls`` as if the learner had pasted its source: its methods' code over a copy of its module's globals."""
    import sys
    import types

    namespace = dict(vars(sys.modules[cls.__module__]), __name__="__main__")
    body = {k: types.FunctionType(v.__code__, namespace, v.__name__, v.__defaults__, v.__closure__)
            if isinstance(v, types.FunctionType) else v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    body["__module__"] = "__main__"
    return type(cls.__name__, cls.__bases__, body)


BuggyScaler = _pasted_class(gmp._BuggyScaler)  # the check's own named mistakes, pasted as a learner would


def test_scaler_check():
    passes(gmp.check_dynamic_loss_scaler, GoodScaler)
    passes(gmp.check_dynamic_loss_scaler, ScalerWrittenDifferently)
    not_attempted(gmp.check_dynamic_loss_scaler, StubScaler)
    for bug, fragment in [("every_step", "grow only when"), ("never_skip", "must return True"), ("inf_only", "isfinite"),
                          ("no_reset", "restart at 0"), ("divide_backoff", "do not divide"), ("fixed_half", "whatever backoff_factor"),
                          ("multiply", "dividing"), ("never_reset_count", "kept growing")]:
        fails(gmp.check_dynamic_loss_scaler, lambda *a, bug=bug, **k: BuggyScaler(bug, *a, **k), fragment)


class FusedKernelScaler(GoodScaler):
    """Issue 23's leak: GradScaler's own fused kernels do the unscale and the inf check."""

    def unscale_(self, grads):
        found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), 1.0 / self.scale))
        return bool(found.item())


class WrappedGradScaler:
    """Delegates to torch.amp.GradScaler itself."""

    def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
        self.inner = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_factor=growth_factor,
                                          backoff_factor=backoff_factor, growth_interval=growth_interval)
        self.inner.scale(torch.ones(()))

    @property
    def scale(self):
        return float(self.inner.get_scale())

    def unscale_(self, grads):
        found = torch.zeros(1)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), 1.0 / self.scale))
        return bool(found.item())

    def update(self, found_inf):
        self.inner.update()


def _lesson_scaler():
    from course_utils.mixed_precision import DynamicLossScaler

    class LessonScaler(DynamicLossScaler):  # the lesson's scaler with the exercise's method names
        def __init__(self, init_scale, growth_factor, backoff_factor, growth_interval):
            super().__init__(init_scale, growth_factor, backoff_factor, growth_interval)

        def unscale_(self, grads):
            return GoodScaler.unscale_(self, grads)

        def update(self, found_inf):
            super().update()

    return LessonScaler


@pytest.mark.parametrize("make, name", [(lambda: FusedKernelScaler, "_amp_foreach_non_finite_check_and_unscale_"),
                                        (lambda: WrappedGradScaler, "torch.amp"), (_lesson_scaler, "course_utils.mixed_precision")],
                         ids=["fused_kernel", "grad_scaler", "lesson_scaler"])
def test_scaler_check_refuses_grad_scaler_and_its_kernels(make, name):
    forbidden(gmp.check_dynamic_loss_scaler, make(), name)


# ---------------------------------------------------------------- exercise 2: unscale, then clip
def good_clip(grads, scale, max_norm):
    grads = [g / scale for g in grads]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return [g * torch.clamp(max_norm / (norm + 1e-6), max=1.0) for g in grads]


def clip_with_cat(grads, scale, max_norm):  # right, written differently: one flat vector, a Python min
    grads = [g.float() / scale for g in grads]
    norm = float(torch.cat([g.reshape(-1) for g in grads]).double().norm())
    return [g * min(1.0, max_norm / (norm + 1e-6)) for g in grads]


def clip_in_place(grads, scale, max_norm):  # the mistake the check must catch: it writes into the caller's tensors
    for g in grads:
        g.div_(scale)
    return good_clip(grads, 1.0, max_norm)


def test_clip_check():
    passes(gmp.check_unscale_and_clip, good_clip)
    passes(gmp.check_unscale_and_clip, clip_with_cat)
    not_attempted(gmp.check_unscale_and_clip, stub)
    fails(gmp.check_unscale_and_clip, lambda g, s, m: [x / s for x in good_clip(g, 1.0, m)], "divide by the scale first")
    fails(gmp.check_unscale_and_clip, lambda g, s, m: good_clip(g, 1.0, m), "only ever shrink")
    fails(gmp.check_unscale_and_clip, lambda g, s, m: [good_clip([x], s, m)[0] for x in g], "global norm")
    fails(gmp.check_unscale_and_clip, clip_in_place, "changed the gradients it was given")

    def always_rescale(g, s, m):
        g = [x / s for x in g]
        norm = torch.linalg.vector_norm(torch.cat([x.reshape(-1) for x in g]))
        return [x * (m / norm) for x in g]

    fails(gmp.check_unscale_and_clip, always_rescale, "only ever shrink")
    forbidden(gmp.check_unscale_and_clip, lambda g, s, m: gmp._reference_unscale_and_clip(g, s, m),
              "_reference_unscale_and_clip")


def by_torch_clip(g, s, m):
    params = [torch.zeros_like(x, requires_grad=True) for x in g]
    for p, x in zip(params, g):
        p.grad = x / s
    torch.nn.utils.clip_grad_norm_(params, m)
    return [p.grad for p in params]


def test_clip_check_rejects_clip_grad_norm():
    forbidden(gmp.check_unscale_and_clip, by_torch_clip, "torch.nn.utils.clip_grad_norm_")


# ---------------------------------------------------------------- exercise 3: the master-weight step
def good_master_step(master, grad16, scale, lr):
    new = master - lr * (grad16.float() / scale)
    return new, new.half()


def master_step_in_place(master, grad16, scale, lr):  # right, written differently: an in-place SGD update
    master.sub_(grad16.float().div(scale).mul(lr))
    return master, master.to(torch.float16)


def test_master_step_check():
    passes(gmp.check_master_weight_step, good_master_step)
    passes(gmp.check_master_weight_step, master_step_in_place)
    not_attempted(gmp.check_master_weight_step, stub)

    def fp16_update(m, g, s, lr):
        w = m.half() - lr * (g / s)
        return w.float(), w

    fails(gmp.check_master_weight_step, fp16_update, "applied in fp16")
    fails(gmp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, 1.0, lr), "loss scale")
    fails(gmp.check_master_weight_step, lambda m, g, s, lr: (good_master_step(m, g, s, lr)[0], m.half()), "rounded to fp16")
    fails(gmp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, 1.0 / s, lr), "multiplied by the scale")
    fails(gmp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, s, lr)[0], "return two tensors")
    fails(gmp.check_master_weight_step, lambda m, g, s, lr: good_master_step(m, g, s, 0.05), "master_weight_step")


# ---------------------------------------------------------------- exercise 4: bytes of a recipe
def good_bytes(layer_sizes, weight_dtype, optimizer, master_weights):
    n = sum(a * b + b for a, b in zip(layer_sizes[:-1], layer_sizes[1:]))
    size = {"float32": 4, "float16": 2, "bfloat16": 2}[weight_dtype]
    states = {"sgd": 0, "momentum": 1, "adam": 2}[optimizer]
    return n * (2 * size + (4 if master_weights else 0) + states * (4 if master_weights else size))


def bytes_by_building(layer_sizes, weight_dtype, optimizer, master_weights):  # right, written differently
    model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(layer_sizes[:-1], layer_sizes[1:])])
    n = sum(p.numel() for p in model.parameters())
    weight = torch.empty((), dtype=getattr(torch, weight_dtype)).element_size()
    state_bytes = 4 if master_weights else weight
    per = 2 * weight + 4 * master_weights + {"sgd": 0, "momentum": 1, "adam": 2}[optimizer] * state_bytes
    return float(n * per)


def test_bytes_check():
    passes(gmp.check_training_bytes, good_bytes)
    passes(gmp.check_training_bytes, bytes_by_building)
    not_attempted(gmp.check_training_bytes, stub)
    states = {"sgd": 0, "momentum": 1, "adam": 2}
    n = lambda s: sum(a * b + b for a, b in zip(s[:-1], s[1:]))  # noqa: E731
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, False), "master_weights was ignored")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, m) - n(s) * (4 if m else 0), "master copy is missing")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, "momentum" if o == "adam" else o, m), "two states")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, m) - n(s) * (2 if m else 0) * states[o], "state is FP32")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, m) + n(s) * (4 - good_bytes([1, 1], w, "sgd", False) // 4),
          "FP32 gradient copy is transient")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, m) - n(s) * good_bytes([1, 1], w, "sgd", False) // 4,
          "gradients are missing")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, m) // n(s) * sum(a * b for a, b in zip(s[:-1], s[1:])),
          "leaves out the biases")
    fails(gmp.check_training_bytes, lambda s, w, o, m: good_bytes(s, w, o, m) // n(s), "bytes per parameter")
    forbidden(gmp.check_training_bytes, lambda s, w, o, m: gmp._reference_training_bytes(s, w, o, m), "_reference_training_bytes")


def test_bytes_check_rejects_a_lookup_table():
    table = Recorder(good_bytes)
    gmp.check_training_bytes(table, seed=SEED)
    table.learning = False
    fails(gmp.check_training_bytes, table, "training_bytes", seed=SEED + 1)


# ---------------------------------------------------------------- exercise 5: what a cast destroys
def good_classify(x, dtype):
    e, m = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}[dtype]
    emin, emax = 2 - 2 ** (e - 1), 2 ** (e - 1) - 1
    a = x.abs().double()
    under = (a <= 2.0 ** (emin - m - 1)) & (x != 0)
    over = a >= 2.0 ** emax * (2 - 2.0 ** -(m + 1))
    return torch.where(under, 0, torch.where(over, 2, 1)).long()


def classify_with_finfo(x, dtype):  # right, written differently: thresholds from torch.finfo, codes by addition
    fi = torch.finfo(dtype)
    tiny = fi.smallest_normal * fi.eps  # smallest subnormal
    top = 2.0 ** math.floor(math.log2(fi.max))  # the binade of the largest value
    limit = fi.max + top * fi.eps / 2  # max + half an ulp
    a = x.abs().double()
    return ((a >= limit) * 2 + (a > tiny / 2) * (a < limit) + (x == 0)).long()


def test_classify_check():
    passes(gmp.check_classify_cast, good_classify)
    passes(gmp.check_classify_cast, classify_with_finfo)
    not_attempted(gmp.check_classify_cast, stub)

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

    fails(gmp.check_classify_cast, with_edges(strict=True), "rounds to even")
    fails(gmp.check_classify_cast, with_edges(lo_scale=2.0, strict=True), "round up to it")
    fails(gmp.check_classify_cast, with_edges(over_at_max=True), "max + half an ulp")
    fails(gmp.check_classify_cast, with_edges(fp16_only=True), "exponent bits")

    def normal_only(x, dtype):
        e, m = {torch.float16: (5, 10), torch.bfloat16: (8, 7)}[dtype]
        emin = 2 - 2 ** (e - 1)
        codes = good_classify(x, dtype)
        codes[(x.abs().double() < 2.0 ** emin) & (x != 0)] = 0   # forgot the subnormals
        return codes

    fails(gmp.check_classify_cast, normal_only, "become subnormals")

    def by_casting(x, dtype):
        y = x.to(dtype)
        return torch.where((y == 0) & (x != 0), 0, torch.where(torch.isinf(y), 2, 1)).long()

    forbidden(gmp.check_classify_cast, by_casting, "torch.Tensor.to")


LOOKUPS = [(gmp.check_unscale_and_clip, good_clip), (gmp.check_master_weight_step, good_master_step),
           (gmp.check_classify_cast, good_classify)]


@pytest.mark.parametrize("check, solution", LOOKUPS, ids=[c.__name__ for c, _ in LOOKUPS])
def test_checks_reject_answers_recorded_on_other_inputs(check, solution):
    rejects_recorded_answers(check, solution)


# ---------------------------------------------------------------- exercise 6: BF16 weights, Kahan-compensated SGD
import numpy as np  # noqa: E402

from course_utils import mixed_precision as mp  # noqa: E402
from course_utils.grading import mixed_precision_fp8 as gmp8  # noqa: E402


def kahan_ok(w, grads, lr):
    c = torch.zeros_like(w)
    for g in grads:
        y = -lr * g - c.float()
        t = (w.float() + y).bfloat16()
        c = ((t.float() - w.float()) - y).bfloat16()
        w = t
    return w, c


def kahan_negated(w, grads, lr):  # right, written differently: carry the lost part (-c) and add it
    lost = torch.zeros(w.shape, dtype=torch.bfloat16)
    for step in range(grads.shape[0]):
        y = lost.float() - grads[step] * lr
        t = (w.float() + y).bfloat16()
        lost = (y - (t.float() - w.float())).bfloat16()  # exact negation of the reference's c
        w = t
    return w, -lost


def kahan_variant(**how):
    def fn(w, grads, lr):
        c = torch.zeros(w.shape, dtype=how.get("c_dtype", torch.bfloat16))
        for g in grads:
            u = -lr * g
            if how.get("round_update"):
                u = u.bfloat16().float()
            y = u - c.float() if how.get("compensate", True) else u
            t = (w.float() + y).bfloat16()
            if how.get("compensate", True):
                c = (how.get("sign", 1.0) * ((t.float() - w.float()) - y)).to(c.dtype)
            w = t
        return w, c.bfloat16()
    return fn


def test_check_kahan_bf16_sgd():
    passes(gmp.check_kahan_bf16_sgd, kahan_ok)
    passes(gmp.check_kahan_bf16_sgd, kahan_negated)
    not_attempted(gmp.check_kahan_bf16_sgd, stub)
    fails(gmp.check_kahan_bf16_sgd, kahan_variant(compensate=False), "without the compensation")
    fails(gmp.check_kahan_bf16_sgd, kahan_variant(sign=-1.0), "wrong sign")
    fails(gmp.check_kahan_bf16_sgd, kahan_variant(c_dtype=torch.float32), "kept in float32")
    fails(gmp.check_kahan_bf16_sgd, kahan_variant(round_update=True), "before compensating")
    fails(gmp.check_kahan_bf16_sgd, lambda w, g, lr: (kahan_ok(w, g, lr)[0].float(), kahan_ok(w, g, lr)[1]), "dtype")

    def master(w, grads, lr):  # an FP32 master instead: more accurate, but not the recipe asked for
        m = w.float() - lr * grads.sum(0)
        return m.bfloat16(), (m - m.bfloat16().float()).bfloat16()

    fails(gmp.check_kahan_bf16_sgd, master, "kahan_bf16_sgd")


def test_kahan_keeps_bf16_weights_near_the_fp32_trajectory():
    """What the exercise is for: plain BF16 SGD loses the small updates, Kahan keeps them."""
    w, grads, lr = gmp8._kahan_inputs(np.random.default_rng(SEED))
    exact = w.double() - lr * grads.double().sum(0)
    plain = kahan_variant(compensate=False)(w, grads, lr)[0]
    kahan, c = kahan_ok(w, grads, lr)
    plain_error = (plain.double() - exact).abs().mean()
    assert (kahan.double() - c.double() - exact).abs().mean() * 30 < plain_error  # w - c: the sum it carries


def test_check_kahan_bf16_sgd_refuses_the_lesson_and_optimizers():
    def by_optimizer(w, grads, lr):
        p = torch.nn.Parameter(w.clone())
        opt = torch.optim.SGD([p], lr=lr)
        for g in grads:
            p.grad = g.bfloat16()
            opt.step()
        return p.detach(), torch.zeros_like(w)

    forbidden(gmp.check_kahan_bf16_sgd, by_optimizer, "torch.optim")
    forbidden(gmp.check_kahan_bf16_sgd, lambda w, g, lr: (mp.MasterWeightOptimizer, kahan_ok(w, g, lr))[1]
              if mp.tensor_bytes([w]) else None, "course_utils.mixed_precision")
    forbidden(gmp.check_kahan_bf16_sgd, gmp8._reference_kahan_bf16_sgd, "_reference_kahan_bf16_sgd")
    forbidden(gmp.check_kahan_bf16_sgd, lambda w, g, lr: gmp8._kahan_steps(w, g, lr), "_kahan_steps")


# ---------------------------------------------------------------- exercise 7: delayed FP8 scaling
def delayed_ok(xs, history_len):
    fmax = 448.0
    history, qs, scales, saturated = [], [], [], []
    for x in xs:
        window = history[-history_len:]
        amax = max(window) if window else 0.0
        scale = torch.tensor(fmax / amax if amax > 0 else 1.0, dtype=torch.float32)
        y = x * scale
        saturated.append(int((y.abs() > fmax).sum()))
        qs.append(y.clamp(-fmax, fmax).to(torch.float8_e4m3fn).float())
        scales.append(scale)
        history.append(float(x.abs().max()))
    return torch.stack(qs), torch.stack(scales), torch.tensor(saturated)


def delayed_vectorized(xs, history_len):  # right, written differently: all amaxes first, a sliding max, one cast
    amax = xs.abs().amax(dim=1)  # (steps,)
    padded = torch.cat([torch.zeros(history_len), amax[:-1]])  # step t sees padded[t : t + history_len]
    window_max = padded.unfold(0, history_len, 1).amax(dim=1)  # (steps,)
    scales = torch.where(window_max > 0, torch.tensor(448.0) / window_max, torch.tensor(1.0))
    y = xs * scales[:, None]
    return (y.clamp(-448, 448).to(torch.float8_e4m3fn).float(), scales,
            (y.abs() > 448).sum(dim=1).to(torch.int64))


def delayed_variant(**how):
    return lambda xs, h: gmp8._delayed(xs, h, **{k: (v(h) if callable(v) and k == "window" else v)
                                                  for k, v in how.items()})


def test_check_delayed_fp8_cast():
    passes(gmp.check_delayed_fp8_cast, delayed_ok)
    passes(gmp.check_delayed_fp8_cast, delayed_vectorized)
    not_attempted(gmp.check_delayed_fp8_cast, stub)


def test_check_delayed_fp8_cast_names_each_mistake():
    """The mistakes, written as a learner would (pasted course code is the learner's own)."""
    from _grading_helpers import pasted

    own = pasted(gmp8)

    def as_learner(**how):
        return lambda xs, h: own._delayed(xs, h, **{k: (v(h) if k == "window" else v) for k, v in how.items()})

    fails(gmp.check_delayed_fp8_cast, as_learner(current=True), "just-in-time")
    fails(gmp.check_delayed_fp8_cast, as_learner(window=lambda h: h + 1), "one step too long")
    fails(gmp.check_delayed_fp8_cast, as_learner(window=lambda h: h - 1), "one step too short")
    fails(gmp.check_delayed_fp8_cast, as_learner(window=lambda h: 1), "previous step's amax")
    fails(gmp.check_delayed_fp8_cast, as_learner(reduce=lambda v: float(np.float32(np.mean(v)))), "average")
    fails(gmp.check_delayed_fp8_cast, as_learner(amax_of_q=True), "already scaled")
    fails(gmp.check_delayed_fp8_cast, as_learner(inverse=True), "inverse")
    fails(gmp.check_delayed_fp8_cast, as_learner(dequantize=True), "dequantized")
    passes(gmp.check_delayed_fp8_cast, as_learner())

    def no_saturation_count(xs, h):
        q, s, n = delayed_ok(xs, h)
        return q, s, torch.zeros_like(n)

    fails(gmp.check_delayed_fp8_cast, no_saturation_count, "delayed_fp8_cast")


def test_check_delayed_fp8_cast_refuses_the_references():
    forbidden(gmp.check_delayed_fp8_cast, gmp8._reference_delayed_fp8_cast, "_reference_delayed_fp8_cast")
    forbidden(gmp.check_delayed_fp8_cast, lambda xs, h: gmp8._delayed(xs, h), "_delayed")
    e4m3_max = lambda: mp.format_ranges(torch.float8_e4m3fn)["max"]  # noqa: E731  the lesson's table of a format
    forbidden(gmp.check_delayed_fp8_cast, lambda xs, h: delayed_ok(xs, h) if e4m3_max() else None,
              "course_utils.mixed_precision")


NEW_LOOKUPS = [(gmp.check_kahan_bf16_sgd, kahan_ok), (gmp.check_delayed_fp8_cast, delayed_ok)]


@pytest.mark.parametrize("check, solution", NEW_LOOKUPS, ids=[c.__name__ for c, _ in NEW_LOOKUPS])
def test_new_checks_reject_answers_recorded_on_other_inputs(check, solution):
    rejects_recorded_answers(check, solution)
