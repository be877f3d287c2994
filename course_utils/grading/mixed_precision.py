"""Grading for topic 02 (mixed precision): the checks, named mistakes and references of ``solutions/02_mixed_precision.ipynb``.

Each ``check_*`` runs the learner's code on fresh random inputs (``seed=None``; a failure names the
seed that reproduces it), compares it with PyTorch (``GradScaler``, ``clip_grad_norm_``, real casts,
measured bytes) and names the likely mistake. Reference answers are private. Exercises 6 and 7 live in
:mod:`course_utils.grading.mixed_precision_fp8` (re-exported here).
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import torch

from ..classroom.checking import Mistake, call_learner, check_function
from ..classroom.forbidden import ByHand
from ..classroom.released import comparable_grads, drive_loss_scaler, scaler_trace
from ..errors import CheckFailed
from ..mixed_precision import DTYPES
from ..mixed_precision_memory import measure_recipe_memory
from .mixed_precision_fp8 import check_delayed_fp8_cast, check_kahan_bf16_sgd  # exercises 6 and 7

__all__ = [
    "check_dynamic_loss_scaler",
    "check_unscale_and_clip",
    "check_master_weight_step",
    "check_training_bytes",
    "check_classify_cast",
    "check_kahan_bf16_sgd",
    "check_delayed_fp8_cast",
]


# ---------------------------------------------------------------- exercise 1: dynamic loss scaler
def _scripted_gradients(rng: np.random.Generator, steps: int) -> list[list[torch.Tensor] | None]:
    """True (unscaled) gradients for ``steps`` steps; some steps carry an inf or NaN entry."""
    out = []
    for _ in range(steps):
        grads = [torch.from_numpy(rng.standard_normal(s).astype(np.float32) * 1e-3) for s in ((3, 4), (5,))]
        r = rng.random()
        if r < 0.15:
            grads[int(rng.integers(2))].view(-1)[0] = float("inf")
        elif r < 0.25:
            grads[int(rng.integers(2))].view(-1)[0] = float("nan")
        out.append(grads)
    return out


def _drive_grad_scaler(hyper, script):
    """torch.amp.GradScaler('cpu', **hyper) fed ``script`` like :func:`~course_utils.classroom.released.drive_loss_scaler`
    feeds the learner's class: the same trace (scales, skipped flags, unscaled gradients)."""
    scales, skipped, unscaled = [], [], []
    scaler = torch.amp.GradScaler("cpu", **hyper)
    params = [torch.zeros(3, 4, requires_grad=True), torch.zeros(5, requires_grad=True)]
    opt = torch.optim.SGD(params, lr=1.0)
    for grads in script:
        current = float(scaler.get_scale())
        scaler.scale(torch.ones(()))  # GradScaler creates its scale tensor lazily, on the first scale()
        for p, g in zip(params, grads):
            p.grad = g * current  # what backward of S * L produces
        scaler.unscale_(opt)
        got = [p.grad.clone() for p in params]
        before = [p.detach().clone() for p in params]
        scaler.step(opt)
        skip = all(torch.equal(b, p.detach()) for b, p in zip(before, params))
        scaler.update()
        scales.append(float(scaler.get_scale()))
        skipped.append(skip)
        unscaled.append(comparable_grads(got, skip))
    return scaler_trace(scales, skipped, unscaled)  # (T,), (T,), (T, 17)


class _BuggyScaler:
    """Plausible wrong scalers for the exercise-1 check, selected by ``bug``."""

    def __init__(self, bug, init_scale, growth_factor, backoff_factor, growth_interval):
        self.bug, self.scale, self.good = bug, float(init_scale), 0
        self.up, self.down, self.interval = growth_factor, backoff_factor, growth_interval

    def unscale_(self, grads):
        found = False
        for g in grads:
            if self.bug == "multiply":
                g.mul_(self.scale)
            else:
                g.div_(self.scale)
            bad = torch.isinf(g).any() if self.bug == "inf_only" else ~torch.isfinite(g).all()
            found = found or bool(bad)
        return False if self.bug == "never_skip" else found

    def update(self, found_inf):
        if found_inf:
            self.scale *= {"divide_backoff": 1.0 / self.down, "fixed_half": 0.5}.get(self.bug, self.down)
            if self.bug != "no_reset":
                self.good = 0
            return
        self.good += 1
        if self.bug == "every_step" or (self.bug != "never_reset_count" and self.good == self.interval) or (
                self.bug == "never_reset_count" and self.good >= self.interval):
            self.scale *= self.up
            if self.bug != "never_reset_count":
                self.good = 0


_SCALER_MISTAKES = [
    ("every_step", "the scale grows on every finite step: count consecutive finite steps and grow only when the count reaches growth_interval, then restart the count."),
    ("never_skip", "a step with inf/NaN gradients was not reported: unscale_ must return True when any gradient is non-finite so that the step is skipped and the scale backs off."),
    ("inf_only", "NaN gradients were not treated as an overflow: test with torch.isfinite (it catches inf and NaN), not torch.isinf."),
    ("no_reset", "after an overflow the count of good steps must restart at 0; yours kept counting, so the scale grew too early."),
    ("divide_backoff", "on overflow the scale went up: multiply it by backoff_factor (0.5 halves it), do not divide by it."),
    ("fixed_half", "on overflow the scale was halved whatever backoff_factor was: multiply it by backoff_factor."),
    ("never_reset_count", "after a growth the count of good steps must restart at 0; yours kept growing on every later step."),
    ("multiply", "the gradients were multiplied by the scale again: unscale by dividing by it (multiplying by 1/scale)."),
]


# By hand: not GradScaler (torch.amp's Python code) nor its fused kernels (the "@round" family holds
# _amp_foreach_non_finite_check_and_unscale_ and _amp_update_scale_), nor the lesson's DynamicLossScaler.
BY_HAND_SCALER = {"ops": ("@round",), "modules": ("torch.amp", "torch.cuda.amp", "course_utils.mixed_precision"),
                  "names": ("torch._amp_foreach_non_finite_check_and_unscale_", "torch._amp_update_scale_",
                            "torch.amp.GradScaler")}


def check_dynamic_loss_scaler(fn: Callable, *, trials: int = 3, seed: int | None = None, steps: int = 40,
                              quiet: bool = False) -> None:
    """Exercise 1: ``ListLossScaler(init_scale, growth_factor, backoff_factor, growth_interval)`` with ``.scale``,
    ``unscale_(grads) -> found_inf`` and ``update(found_inf)``, compared with ``torch.amp.GradScaler('cpu')``
    on a scripted sequence of finite, inf and NaN gradients: the scales, skipped steps and unscaled gradients.
    """

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        k = next(counter)  # alternate the factors so that every trial pattern exercises a different rule
        hyper = dict(init_scale=float(2.0 ** int(rng.integers(8, 17))), growth_factor=(2.0, 4.0)[k % 2],
                     backoff_factor=(0.5, 0.25)[(k // 2) % 2], growth_interval=int(rng.integers(2, 5)))
        return {"hyper": hyper, "script": _scripted_gradients(rng, steps)}

    def buggy(bug):
        return lambda hyper, script: drive_loss_scaler(functools.partial(_BuggyScaler, bug), hyper, script)

    # drive_loss_scaler builds the learner's class and feeds it the script (released with the course's self-checks)
    check_function(functools.partial(drive_loss_scaler, fn), _drive_grad_scaler, make_inputs, name="ListLossScaler",
                   trials=trials, seed=seed, rtol=1e-6, atol=1e-12, mistakes=[Mistake(b, hint, buggy(b)) for b, hint in _SCALER_MISTAKES],
                   by_hand=ByHand(**BY_HAND_SCALER), quiet=quiet)


# ---------------------------------------------------------------- exercise 2: unscale before clipping
def _reference_unscale_and_clip(grads, scale, max_norm):
    params = [torch.zeros_like(g, requires_grad=True) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g / scale
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad for p in params]


def _clip_global(grads, max_norm):
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return [g * factor for g in grads]


# "with tensor arithmetic": torch's clipping utilities and the course's reference
CLIP_FORBIDDEN = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grads_with_norm_",
                  "torch.nn.utils.get_total_norm", "course_utils.grading.mixed_precision._reference_unscale_and_clip")


def check_unscale_and_clip(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: ``unscale_and_clip(scaled_grads, scale, max_norm) -> list of gradients`` must unscale
    first and then clip the *global* norm, as ``clip_grad_norm_`` after ``GradScaler.unscale_`` does."""

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        k = next(counter)
        scale = float(2.0 ** int(rng.integers(8, 17)))
        count = 3 if k == 1 else int(rng.integers(1, 5))  # one to four tensors; the first clipping trial has three
        shapes = [(4, 6), (6,), (3, 4), (1,)][:count]
        true = [(rng.standard_normal(s) * 10.0 ** rng.uniform(-1, 1)).astype(np.float32) for s in shapes]
        grads = [torch.from_numpy(g) * scale for g in true]
        norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in true)))
        max_norm = norm * (0.3 if k % 2 else 3.0)  # alternately not clipping and clipping
        return grads, scale, max_norm

    def learner(grads, scale, max_norm):
        given = [g.clone() for g in grads]
        out = call_learner("unscale_and_clip", fn, (given, scale, max_norm), forbidden=CLIP_FORBIDDEN)
        if len(given) != len(grads) or not all(torch.equal(a, b) for a, b in zip(given, grads)):
            raise CheckFailed("unscale_and_clip: your function changed the gradients it was given (g /= scale, g.mul_ or "
                              "scaled_grads[i] = ... write into the caller's list); return a new list of new tensors.")
        return out

    mistakes = [
        Mistake("clip_then_unscale", "you clipped the scaled gradients and unscaled afterwards, so the norm you clipped was scale times too big: divide by the scale first, then clip.",
                lambda g, s, m: [x / s for x in _clip_global(g, m)]),
        # Not unscaling at all and always rescaling to max_norm give the same numbers whenever the
        # scaled norm exceeds max_norm (always, for S >= 256), so one hint names both.
        Mistake("rescaled_up", "your gradients came out with norm max_norm although their true norm was smaller: divide by the loss scale before measuring the norm, and only ever shrink (factor min(1, max_norm / norm)).",
                lambda g, s, m: _clip_global(g, m)),
        Mistake("per_tensor", "you clipped each tensor's own norm: clip_grad_norm_ uses one global norm over all gradients together.",
                lambda g, s, m: [_clip_global([x / s], m)[0] for x in g]),
    ]
    check_function(learner, _reference_unscale_and_clip, make_inputs, name="unscale_and_clip", trials=trials, seed=seed,
                   mistakes=mistakes, check_inputs_unchanged=False, quiet=quiet)  # `learner` reports a changed input itself


# ---------------------------------------------------------------- exercise 3: the master-weight step
def _reference_master_step(master, grad16, scale, lr):
    return master - lr * (grad16.float() / scale)  # lesson eqs. 4-5: unscale in FP32, then SGD on the FP32 master


def check_master_weight_step(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 3: ``master_weight_step(master32, scaled_grad16, scale, lr) -> (new_master32, new_weights16)``.

    Updating ``master32`` in place (and returning it) is accepted, as an optimizer's ``step`` does.
    """

    def make_inputs(rng):
        master = torch.from_numpy((rng.uniform(0.25, 1.0, 500) * rng.choice([-1, 1], 500)).astype(np.float32))  # (500,) fp32
        scale = float(2.0 ** int(rng.integers(10, 16)))
        true = rng.standard_normal(500) * 10.0 ** rng.uniform(-4, -2, 500)  # small gradients
        grad16 = torch.from_numpy((true * scale).astype(np.float32)).half()
        lr = float(rng.uniform(0.02, 0.1))
        return master, grad16, scale, lr  # updates 2e-6..1e-3: many below half an fp16 ulp

    def new_master(master, grad16, scale, lr):
        out = call_learner("master_weight_step", fn, (master, grad16, scale, lr),
                           forbidden=("course_utils.grading.mixed_precision._reference_master_step",))
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise CheckFailed("master_weight_step: return two tensors, (new_master32, new_weights16).")
        m, w16 = out
        if isinstance(m, torch.Tensor) and isinstance(w16, torch.Tensor):
            if w16.dtype != torch.float16:
                raise CheckFailed(f"master_weight_step: the model's weights must be float16, got {w16.dtype}; return new_master.half().")
            if m.dtype == torch.float32 and not torch.equal(w16, m.half()):
                raise CheckFailed("master_weight_step: the fp16 weights are not the new master rounded to fp16; return new_master.half() after the update.")
        return m

    mistakes = [
        Mistake("fp16_update", "the update was applied in fp16 (small updates round away): subtract lr * grad from the fp32 master, then cast a copy to fp16.",
                lambda m, g, s, lr: (m.half() - lr * (g / s)).float()),
        Mistake("no_unscale", "the gradient still carries the loss scale: divide it by scale (in fp32) before the update.",
                lambda m, g, s, lr: m - lr * g.float()),
        Mistake("times_scale", "you multiplied by the scale again: unscale by dividing by it.",
                lambda m, g, s, lr: m - lr * g.float() * s),
    ]
    check_function(new_master, _reference_master_step, make_inputs, name="master_weight_step", trials=trials, seed=seed,
                   mistakes=mistakes, check_inputs_unchanged=False, quiet=quiet)  # an in-place update of the master is fine


# ---------------------------------------------------------------- exercise 4: bytes of a training recipe
def _mlp(layer_sizes):
    layers = []
    for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        layers += [torch.nn.Linear(n_in, n_out), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _reference_training_bytes(layer_sizes, weight_dtype: str, optimizer: str, master_weights: bool) -> int:
    return measure_recipe_memory(lambda: _mlp(layer_sizes), DTYPES[weight_dtype], optimizer, master_weights).total


def check_training_bytes(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 4: ``training_bytes(layer_sizes, weight_dtype, optimizer, master_weights)``: the persistent bytes of
    training an MLP of ``Linear`` layers (with biases) of the given widths, checked against a measurement
    (:func:`measure_recipe_memory`: weights + gradients + FP32 masters + optimizer state after one step).
    The widths are drawn afresh, so that only a formula passes."""
    cases = [(w, o, m) for w in ("float32", "float16", "bfloat16") for o in ("sgd", "momentum", "adam")
             for m in (False, True) if not (m and w == "float32")]

    # Telling cases first, ordered so that each listed mistake is first exposed by a case where its
    # number differs from those of the mistakes listed before it; then random cases.
    fixed = iter([("float16", "momentum", False), ("float32", "adam", False), ("bfloat16", "momentum", True),
                  ("float16", "adam", True)])

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        # 1 to 3 layers, widths 1..64; the first trial's widths are above 16, so that its biases (under 1/17 of
        # the count) cannot make a bias mistake look like a bytes-per-parameter one (those differ by 1/8 or more)
        low = 17 if next(counter) == 0 else 1
        sizes = [int(n) for n in rng.integers(low, 65, size=int(rng.integers(2, 5)))]
        return (sizes,) + (next(fixed, None) or cases[int(rng.integers(len(cases)))])

    def size(w):
        return torch.finfo(DTYPES[w]).bits // 8

    def count(layer_sizes, biases=True):
        return sum(a * b + (b if biases else 0) for a, b in zip(layer_sizes[:-1], layer_sizes[1:]))

    states = {"sgd": 0, "momentum": 1, "adam": 2}

    def right(w, o, m):
        return 2 * size(w) + (4 if m else 0) + states[o] * (4 if m else size(w))

    def per_param(per):  # a mistake in the bytes per parameter, times the right count
        return lambda sizes, w, o, m: count(sizes) * per(w, o, m)

    mistakes = [
        Mistake("ignored_master", "master_weights was ignored: with master weights add a 4-byte FP32 copy per parameter, and the optimizer state (kept for the masters) is FP32.",
                per_param(lambda w, o, m: (2 + states[o]) * size(w))),
        Mistake("no_master", "the FP32 master copy is missing: with master weights add 4 bytes per parameter.",
                per_param(lambda w, o, m: 2 * size(w) + states[o] * (4 if m else size(w)))),
        Mistake("adam_one_state", "Adam keeps two states per parameter (first and second moments), momentum SGD one, plain SGD none.",
                per_param(lambda w, o, m: 2 * size(w) + (4 if m else 0) + min(states[o], 1) * (4 if m else size(w)))),
        Mistake("state_in_weight_dtype", "with master weights the optimizer updates the FP32 masters, so its state is FP32 (4 bytes each), not 16-bit.",
                per_param(lambda w, o, m: 2 * size(w) + (4 if m else 0) + states[o] * size(w))),
        Mistake("fp32_grads", "the gradients have the weights' dtype (2 bytes for 16-bit weights): the FP32 gradient copy is transient.",
                per_param(lambda w, o, m: size(w) + 4 + (4 if m else 0) + states[o] * (4 if m else size(w)))),
        Mistake("no_grads", "gradients are missing: they are held from backward until the step (one per parameter, in the weights' dtype).",
                per_param(lambda w, o, m: size(w) + (4 if m else 0) + states[o] * (4 if m else size(w)))),
        Mistake("no_biases", "your parameter count leaves out the biases: Linear(a, b) holds a * b weights and b biases.",
                lambda sizes, w, o, m: count(sizes, biases=False) * right(w, o, m)),
        Mistake("per_param", "that is the number of bytes per parameter: multiply it by the model's parameter count.",
                lambda sizes, w, o, m: right(w, o, m)),
    ]
    check_function(fn, _reference_training_bytes, make_inputs, name="training_bytes", trials=trials,
                   seed=seed, rtol=0.0, atol=0.5, mistakes=mistakes,
                   forbidden=("course_utils.mixed_precision_memory.measure_recipe_memory",
                              "course_utils.grading.mixed_precision._reference_training_bytes"), quiet=quiet)


# ---------------------------------------------------------------- exercise 5: predict flush-to-zero and overflow
def _reference_classify_cast(x, dtype):
    y = x.to(dtype)
    return torch.where((y == 0) & (x != 0), 0, torch.where(torch.isinf(y) & torch.isfinite(x), 2, 1)).to(torch.int64)


def _classify_with(x, lo, hi, *, lo_inclusive=True, hi_inclusive=True):
    a = x.abs().double()
    under = ((a <= lo) if lo_inclusive else (a < lo)) & (x != 0)
    over = (a >= hi) if hi_inclusive else (a > hi)
    return torch.where(under, 0, torch.where(over, 2, 1)).to(torch.int64)


def _bits(dtype):
    return {torch.float16: (5, 10), torch.bfloat16: (8, 7)}[dtype]


def _edges(dtype):
    e, m = _bits(dtype)
    emin, emax = 2 - 2 ** (e - 1), 2 ** (e - 1) - 1
    half_sub = 2.0 ** (emin - m - 1)
    big = 2.0 ** emax * (2 - 2.0 ** -(m + 1))  # max + half an ulp: the first value that rounds to inf
    return emin, emax, m, half_sub, big


# "rather than by casting": the casts themselves (use .double() / .long() for wide copies) and the reference
CAST_FORBIDDEN = ("torch.Tensor.to", "torch.Tensor.half", "torch.Tensor.bfloat16", "torch.Tensor.type",
                  "course_utils.grading.mixed_precision._reference_classify_cast")


def check_classify_cast(fn: Callable, *, trials: int = 4, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: ``classify_cast(x_fp32, dtype) -> int64`` codes: 0 flushes to zero, 1 stays finite and nonzero
    (or was zero), 2 overflows to inf, for ``torch.float16`` and ``torch.bfloat16``; compared with the real cast."""

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        dtype = (torch.float16, torch.bfloat16)[next(counter) % 2]
        emin, emax, m, half_sub, big = _edges(dtype)
        edges = [half_sub, 2 * half_sub, 2.0 ** emin, 2.0 ** emax * (2 - 2.0 ** -m), big]
        near = [e * f for e in edges for f in (0.75, 1.0, 1.0 + 2.0 ** -12, 1.3)]  # ties and their neighbours
        wide = 2.0 ** rng.uniform(emin - m - 4, emax + 2, 200)
        vals = np.concatenate([near, wide, [0.0]]).astype(np.float64)
        vals = vals[vals < 3.4e38]
        signs = rng.choice([-1.0, 1.0], len(vals))
        return torch.tensor(vals * signs, dtype=torch.float32), dtype

    def normal_only(x, dtype):
        emin, emax, m, half_sub, big = _edges(dtype)
        return _classify_with(x, 2.0 ** emin, big, lo_inclusive=False)

    def below_subnormal(x, dtype):
        emin, emax, m, half_sub, big = _edges(dtype)
        return _classify_with(x, 2 * half_sub, big, lo_inclusive=False)

    def strict_tie(x, dtype):
        emin, emax, m, half_sub, big = _edges(dtype)
        return _classify_with(x, half_sub, big, lo_inclusive=False)

    def over_at_max(x, dtype):
        emin, emax, m, half_sub, big = _edges(dtype)
        return _classify_with(x, half_sub, 2.0 ** emax * (2 - 2.0 ** -m), hi_inclusive=False)

    def fp16_ranges(x, dtype):
        emin, emax, m, half_sub, big = _edges(torch.float16)
        return _classify_with(x, half_sub, big)

    mistakes = [
        Mistake("normal_only", "values between the smallest subnormal and the smallest normal do not flush: they become subnormals; only |x| <= half the smallest subnormal rounds to 0.", normal_only),
        Mistake("below_subnormal", "values between half the smallest subnormal and the smallest subnormal round up to it; the flush threshold is half the smallest subnormal.", below_subnormal),
        Mistake("strict_tie", "exactly half the smallest subnormal is a tie and rounds to even, i.e. to 0: use <= for the flush threshold.", strict_tie),
        Mistake("over_at_max", "values a little above the largest finite value round back down to it; overflow starts at max + half an ulp (65520 for fp16).", over_at_max),
        Mistake("fp16_ranges", "bfloat16 has FP32's 8 exponent bits, so its range is FP32's: use the format's own exponent and mantissa widths.", fp16_ranges),
    ]
    check_function(fn, _reference_classify_cast, make_inputs, name="classify_cast", trials=trials, seed=seed,
                   mistakes=mistakes, forbidden=CAST_FORBIDDEN, quiet=quiet)
