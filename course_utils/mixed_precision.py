r"""Topic 02 (mixed precision): a small digits MLP, loss scaling by hand, autocast by hand, memory per recipe.

Used by:

* ``notebooks/02_mixed_precision.ipynb`` -- derives every piece below (the recipes, the flush-to-zero
  thresholds, :class:`DynamicLossScaler`, :func:`autocast_mlp_forward`, :func:`measure_recipe_memory`)
  and then imports it from here;
* ``solutions/02_mixed_precision.ipynb`` -- the ``check_*`` functions of its exercises;
* topic 08 (training memory) can reuse :func:`measure_recipe_memory` / :func:`tensor_bytes` for the
  measured bytes of weights, gradients, master weights and optimizer state of a training recipe.

Loss scaling (lesson 02, eq. 5): with scale :math:`S`, backpropagate :math:`S\,L` so that every
gradient is multiplied by :math:`S` (and moved out of the 16-bit underflow range), then unscale
:math:`g = \tilde g / S` in FP32 before clipping or the optimizer step. Dynamic scaling (eq. 6):
on a non-finite gradient skip the step and set :math:`S \leftarrow \beta_\downarrow S`; after
``growth_interval`` consecutive finite steps set :math:`S \leftarrow \beta_\uparrow S`, exactly as
``torch.amp.GradScaler`` does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .checks import CheckFailed, Mistake, check_function

__all__ = [
    "format_ranges",
    "flush_to_zero_fraction",
    "load_digits_split",
    "init_mlp",
    "mlp_forward",
    "autocast_mlp_forward",
    "mlp_loss",
    "RECIPES",
    "TrainLog",
    "train_mlp",
    "StaticLossScaler",
    "DynamicLossScaler",
    "MasterWeightOptimizer",
    "tensor_bytes",
    "MemoryBreakdown",
    "measure_recipe_memory",
    "autocast_dtype_table",
    "check_dynamic_loss_scaler",
    "check_unscale_and_clip",
    "check_master_weight_step",
    "check_bytes_per_param",
    "check_classify_cast",
]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------- formats
def format_ranges(dtype: torch.dtype) -> dict[str, float]:
    r"""Smallest subnormal, smallest normal and largest finite value of a floating dtype (from ``torch.finfo``).

    The smallest subnormal is the smallest normal times machine epsilon: :math:`2^{e_{min}} \cdot 2^{-m}`.
    """
    fi = torch.finfo(dtype)
    return {"min_subnormal": float(fi.smallest_normal) * float(fi.eps), "min_normal": float(fi.smallest_normal), "max": float(fi.max)}


def flush_to_zero_fraction(values: torch.Tensor, dtype: torch.dtype) -> float:
    """Fraction of the *nonzero* entries of ``values`` that become exactly 0 when cast to ``dtype``."""
    nonzero = values[values != 0]
    if nonzero.numel() == 0:
        return 0.0
    return float((nonzero.to(dtype) == 0).float().mean())


# ---------------------------------------------------------------- data and model
def load_digits_split(n_train: int = 1400, seed: int = 0):
    """scikit-learn's bundled 8x8 digits as float32 in [0, 1]: ``(X_train (n, 64), y_train (n,), X_test, y_test)``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = torch.tensor(digits.data / 16.0, dtype=torch.float32)  # (1797, 64)
    y = torch.tensor(digits.target, dtype=torch.long)  # (1797,)
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    train, test = perm[:n_train], perm[n_train:]
    return X[train], y[train], X[test], y[test]


def init_mlp(hidden: int = 64, n_in: int = 64, n_out: int = 10, seed: int = 1) -> list[torch.Tensor]:
    """FP32 parameters ``[W1 (hidden, n_in), b1 (hidden,), W2 (n_out, hidden), b2 (n_out,)]`` (He init), requiring grad."""
    g = torch.Generator().manual_seed(seed)
    W1 = torch.randn(hidden, n_in, generator=g) * (2.0 / n_in) ** 0.5
    W2 = torch.randn(n_out, hidden, generator=g) * (1.0 / hidden) ** 0.5
    params = [W1, torch.zeros(hidden), W2, torch.zeros(n_out)]
    return [p.requires_grad_(True) for p in params]


def mlp_forward(params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, n_out)`` in the parameters' dtype (the input is cast to it): no autocast."""
    W1, b1, W2, b2 = params
    h = torch.relu(F.linear(x.to(W1.dtype), W1, b1))  # (B, hidden)
    return F.linear(h, W2, b2)  # (B, n_out)


def autocast_mlp_forward(params: Sequence[torch.Tensor], x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Autocast by hand (lesson 02, sections 5 and 9): cast the *inputs* of each linear layer to ``dtype``.

    The casts are differentiable, so gradients flow back to the FP32 parameters (the master weights).
    Returns low-precision logits ``(B, n_out)``; :func:`mlp_loss` does the softmax and mean in FP32.
    """
    W1, b1, W2, b2 = (p.to(dtype) for p in params)
    h = torch.relu(F.linear(x.to(dtype), W1, b1))  # (B, hidden), low precision
    return F.linear(h, W2, b2)  # (B, n_out), low precision


def mlp_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy computed in FP32 (log-softmax and the mean are reductions: keep them wide)."""
    return F.cross_entropy(logits.float(), y)


# ---------------------------------------------------------------- loss scalers
class StaticLossScaler:
    """A fixed scale :math:`S` with GradScaler's interface: ``scale``, ``unscale_``, ``step``, ``update``."""

    def __init__(self, scale: float):
        self._scale = float(scale)
        self.found_inf = False
        self._unscaled = False

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale  # lesson eq. 5: backprop S * L

    def _params(self, optimizer) -> list[torch.Tensor]:
        return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]

    def unscale_(self, optimizer) -> None:
        """Divide every gradient by the scale in place (lesson eq. 5) and note whether any is inf/NaN."""
        inv_scale = torch.tensor(self._scale, dtype=torch.float64).reciprocal().float()  # as GradScaler does
        found = False
        for p in self._params(optimizer):
            p.grad.mul_(inv_scale)
            found = found or not bool(torch.isfinite(p.grad).all())
        self.found_inf, self._unscaled = found, True

    def step(self, optimizer) -> bool:
        """Unscale if not done yet; run ``optimizer.step()`` unless a gradient is inf/NaN. Returns True if skipped."""
        if not self._unscaled:
            self.unscale_(optimizer)
        if not self.found_inf:
            optimizer.step()
        return self.found_inf

    def update(self) -> None:
        self._unscaled = False


class DynamicLossScaler(StaticLossScaler):
    r"""Dynamic loss scaling written by hand, with ``torch.amp.GradScaler``'s semantics (lesson 02, eq. 6).

    * overflow (any inf/NaN gradient): the step is skipped, ``scale *= backoff_factor``, the count of
      good steps restarts at 0;
    * otherwise the count grows by one; when it reaches ``growth_interval``, ``scale *= growth_factor``
      and the count restarts (GradScaler also refuses a growth that would make the scale infinite).
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000):
        super().__init__(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0

    def update(self) -> None:
        scale32 = torch.tensor(self._scale, dtype=torch.float32)  # GradScaler keeps the scale in float32
        if self.found_inf:
            scale32 = scale32 * self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                grown = scale32 * self.growth_factor
                if torch.isfinite(grown):
                    scale32 = grown
                self.good_steps = 0
        self._scale = float(scale32)
        self.found_inf, self._unscaled = False, False


# ---------------------------------------------------------------- training recipes
RECIPES = {
    "fp32": "FP32 weights, FP32 compute",
    "fp16": "pure FP16: FP16 weights, gradients, optimizer state and compute",
    "fp16_master": "FP32 master weights, FP16 compute (casts in the forward pass)",
    "bf16_master": "FP32 master weights, BF16 compute (casts in the forward pass)",
    "bf16_autocast": "FP32 weights, torch.autocast('cpu', bfloat16)",
}


@dataclass
class TrainLog:
    """Per-step record of a training run."""

    recipe: str
    losses: list[float] = field(default_factory=list)  # the unscaled loss of each step (nan once it broke)
    scales: list[float] = field(default_factory=list)  # the loss scale after each update
    skipped: list[bool] = field(default_factory=list)  # True where the optimizer step was skipped
    params: list[torch.Tensor] = field(default_factory=list)  # the parameters at the end

    @property
    def final_loss(self) -> float:
        return float(np.mean(self.losses[-10:]))


def train_mlp(recipe: str, *, steps: int = 200, lr: float = 3e-3, batch_size: int = 128, hidden: int = 64,
              scaler: Any = None, data=None, inject_inf_at: Iterable[int] = (), seed: int = 0, loss_multiplier: float = 1.0,
              on_step: Callable[[int, list[torch.Tensor]], None] | None = None) -> TrainLog:
    """Train the digits MLP with Adam under one of :data:`RECIPES`; the same batches for every recipe.

    ``scaler`` is ``None``, a :class:`StaticLossScaler`/:class:`DynamicLossScaler` or a
    ``torch.amp.GradScaler``; the loop calls ``scale``, ``step``, ``update`` as GradScaler's
    documentation shows. ``inject_inf_at`` forces an overflow (an inf in one gradient) at those steps.
    ``loss_multiplier`` multiplies the loss (and so every gradient) by a constant, as averaging over that
    many times more elements would; Adam's update ignores such a constant (up to its epsilon).
    ``on_step(step, params)`` is called after backward (gradients still scaled), before the step.
    """
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {sorted(RECIPES)}, not {recipe!r}")
    X, y = (data or load_digits_split())[:2]
    params = init_mlp(hidden=hidden)
    if recipe == "fp16":
        params = [p.detach().half().requires_grad_(True) for p in params]
    optimizer = torch.optim.Adam(params, lr=lr)
    batches = torch.Generator().manual_seed(seed)
    inject = set(inject_inf_at)
    log = TrainLog(recipe)
    for step in range(steps):
        idx = torch.randint(0, len(X), (batch_size,), generator=batches)  # (B,)
        if recipe in ("fp32", "fp16"):
            logits = mlp_forward(params, X[idx])
        elif recipe == "bf16_autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = mlp_forward(params, X[idx])
        else:
            logits = autocast_mlp_forward(params, X[idx], torch.float16 if recipe == "fp16_master" else torch.bfloat16)
        loss = mlp_loss(logits, y[idx]) * loss_multiplier
        log.losses.append(float(loss.detach()) / loss_multiplier)
        optimizer.zero_grad(set_to_none=True)
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if step in inject:
            with torch.no_grad():
                params[0].grad[0, 0] = float("inf")  # a forced overflow in one gradient entry
        if on_step is not None:
            on_step(step, params)
        before = [p.detach().clone() for p in params]
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
            log.scales.append(float(scaler.get_scale()))
        log.skipped.append(all(torch.equal(b, p.detach()) for b, p in zip(before, params)))
    log.params = [p.detach().clone() for p in params]
    return log


# ---------------------------------------------------------------- memory per recipe
def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes held by the distinct storages behind ``tensors`` (shared storages and ``None`` counted once / not at all)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


class MasterWeightOptimizer:
    """16-bit model weights plus FP32 master copies that the wrapped optimizer updates (Micikevicius et al.).

    ``step(inv_scale)``: copy the 16-bit gradients to FP32 (transient), unscale, update the masters with
    the inner optimizer, copy the masters back into the 16-bit weights.
    """

    def __init__(self, params16: Sequence[torch.Tensor], make_optimizer: Callable[[list[torch.Tensor]], Any]):
        self.params16 = list(params16)
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params16]
        self.inner = make_optimizer(self.master)

    def step(self, inv_scale: float = 1.0) -> None:
        for p16, m in zip(self.params16, self.master):
            m.grad = None if p16.grad is None else p16.grad.float() * inv_scale
        self.inner.step()
        with torch.no_grad():
            for p16, m in zip(self.params16, self.master):
                p16.copy_(m)
                m.grad = None  # FP32 gradients are transient: freed right after the step


@dataclass(frozen=True)
class MemoryBreakdown:
    """Measured bytes of one training recipe's persistent state (activations not included)."""

    recipe: str
    n_params: int
    weights: int
    grads: int
    master: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.master + self.optimizer

    def per_param(self) -> dict[str, float]:
        return {k: getattr(self, k) / self.n_params for k in ("weights", "grads", "master", "optimizer")}


def _state_tensors(optimizer) -> list[torch.Tensor]:
    """Optimizer state tensors with at least one dimension (0-d per-tensor scalars such as Adam's ``step`` are left out)."""
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return out


def make_optimizer(name: str, params: list[torch.Tensor], lr: float = 1e-3):
    """``sgd`` (no state), ``momentum`` (one buffer per weight) or ``adam`` (two moments per weight)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"optimizer must be 'sgd', 'momentum' or 'adam', not {name!r}")


def measure_recipe_memory(make_model: Callable[[], torch.nn.Module], weight_dtype: torch.dtype = torch.float32,
                          optimizer: str = "adam", master_weights: bool = False, make_batch: Callable | None = None,
                          label: str | None = None) -> MemoryBreakdown:
    """Build the model in ``weight_dtype``, take one training step, and measure the bytes it holds.

    ``master_weights=True`` keeps FP32 master copies updated by the optimizer
    (:class:`MasterWeightOptimizer`), so the optimizer state is FP32 too. Gradients are kept (as after
    ``backward``, before ``zero_grad``). ``make_batch(model)`` returns the loss input; by default a
    random batch is pushed through the model and summed.
    """
    model = make_model().to(weight_dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if master_weights:
        opt = MasterWeightOptimizer(params, lambda ps: make_optimizer(optimizer, ps))
        inner, master = opt.inner, opt.master
    else:
        opt = inner = make_optimizer(optimizer, params)
        master = []
    if make_batch is None:
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        loss = model(torch.randn(8, first.in_features, dtype=weight_dtype)).float().sum()
    else:
        loss = make_batch(model)
    loss.backward()
    opt.step()
    return MemoryBreakdown(
        recipe=label or f"{str(weight_dtype).replace('torch.', '')} {optimizer}{' + fp32 master' if master_weights else ''}",
        n_params=sum(p.numel() for p in params),
        weights=tensor_bytes(params),
        grads=tensor_bytes(p.grad for p in params),
        master=tensor_bytes(master),
        optimizer=tensor_bytes(_state_tensors(inner)),
    )


# ---------------------------------------------------------------- what autocast lowers
def autocast_dtype_table(device: str = "cpu", dtype: torch.dtype = torch.bfloat16, n: int = 16) -> list[tuple[str, str, str]]:
    """Run a list of ops under ``torch.autocast(device, dtype)`` and report output dtypes.

    Returns ``(op, dtype out for float32 inputs, dtype out for dtype inputs)``: an op whose output is
    low-precision from FP32 inputs was *lowered*; one whose output is FP32 from low-precision inputs
    was *widened* (autocast's FP32 list); the rest follow their inputs.
    """
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen)
    img = torch.randn(1, 2, 8, 8, generator=gen)
    target = torch.randint(0, n, (n,), generator=gen)
    ops = {
        "matmul": lambda t, u, i: t @ u,
        "linear": lambda t, u, i: F.linear(t, u),
        "bmm": lambda t, u, i: torch.bmm(t[None], u[None]),
        "conv2d": lambda t, u, i: F.conv2d(i, i[:, :, :3, :3].expand(3, 2, 3, 3).contiguous()),
        "add": lambda t, u, i: t + u,
        "relu": lambda t, u, i: torch.relu(t),
        "exp": lambda t, u, i: torch.exp(t),
        "softmax": lambda t, u, i: torch.softmax(t, dim=-1),
        "log_softmax": lambda t, u, i: torch.log_softmax(t, dim=-1),
        "sum": lambda t, u, i: t.sum(),
        "mean": lambda t, u, i: t.mean(),
        "layer_norm": lambda t, u, i: F.layer_norm(t, (n,)),
        "cross_entropy": lambda t, u, i: F.cross_entropy(t, target),
        "mse_loss": lambda t, u, i: F.mse_loss(t, u),
    }
    rows = []
    for name, op in ops.items():
        outs = []
        for in_dtype in (torch.float32, dtype):
            with torch.autocast(device, dtype=dtype):
                out = op(a.to(in_dtype), a.T.contiguous().to(in_dtype), img.to(in_dtype))
            outs.append(str(out.dtype).replace("torch.", ""))
        rows.append((name, outs[0], outs[1]))
    return rows


# ================================================================ exercise checks
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


def _drive_scaler(make_scaler, script, *, reference: bool):
    """Feed ``script`` through a scaler; return (scales after each update, skipped flags, unscaled grads)."""
    scales, skipped, unscaled = [], [], []
    if reference:
        scaler, params = make_scaler(), [torch.zeros(3, 4, requires_grad=True), torch.zeros(5, requires_grad=True)]
        opt = torch.optim.SGD(params, lr=1.0)
    else:
        scaler = make_scaler()
    for grads in script:
        current = float(scaler.get_scale()) if reference else float(scaler.scale)
        scaled = [g * current for g in grads]  # what backward of S * L produces
        if reference:
            scaler.scale(torch.ones(()))  # GradScaler creates its scale tensor lazily, on the first scale()
            for p, g in zip(params, scaled):
                p.grad = g.clone()
            scaler.unscale_(opt)
            got = [p.grad.clone() for p in params]
            before = [p.detach().clone() for p in params]
            scaler.step(opt)
            skip = all(torch.equal(b, p.detach()) for b, p in zip(before, params))
            scaler.update()
            scales.append(float(scaler.get_scale()))
        else:
            got = [g.clone() for g in scaled]
            skip = bool(scaler.unscale_(got))
            scaler.update(skip)
            scales.append(float(scaler.scale))
        skipped.append(skip)
        flat = torch.zeros(17) if skip else torch.cat([g.reshape(-1) for g in got])  # (17,)
        unscaled.append(torch.nan_to_num(flat, nan=-7.0, posinf=7e30, neginf=-7e30))  # comparable even when wrong
    return torch.tensor(scales, dtype=torch.float64), torch.tensor(skipped), torch.stack(unscaled)  # (T,), (T,), (T, 17)


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


def check_dynamic_loss_scaler(scaler_class: Callable, *, trials: int = 3, seed: int = 0, steps: int = 40) -> None:
    """Exercise 1: a class ``(init_scale, growth_factor, backoff_factor, growth_interval)`` with ``.scale``,
    ``unscale_(grads) -> found_inf`` and ``update(found_inf)``, compared with ``torch.amp.GradScaler('cpu')``
    on a scripted sequence of finite, inf and NaN gradients: the scales, skipped steps and unscaled gradients.
    """

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        k = next(counter)  # alternate the factors so that every trial pattern exercises a different rule
        hyper = dict(init_scale=float(2.0 ** int(rng.integers(8, 17))), growth_factor=(2.0, 4.0)[k % 2],
                     backoff_factor=(0.5, 0.25)[(k // 2) % 2], growth_interval=int(rng.integers(2, 5)))
        return {"hyper": hyper, "script": _scripted_gradients(rng, steps)}

    def learner(hyper, script):
        return _drive_scaler(lambda: scaler_class(**hyper), script, reference=False)

    def reference(hyper, script):
        return _drive_scaler(lambda: torch.amp.GradScaler("cpu", **hyper), script, reference=True)

    def buggy(bug):
        return lambda hyper, script: _drive_scaler(lambda: _BuggyScaler(bug, **hyper), script, reference=False)

    check_function(learner, reference, make_inputs, name="DynamicLossScaler", trials=trials, seed=seed,
                   rtol=1e-6, atol=1e-12, mistakes=[Mistake(b, hint, buggy(b)) for b, hint in _SCALER_MISTAKES])


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


def check_unscale_and_clip(unscale_and_clip: Callable, *, trials: int = 4, seed: int = 0) -> None:
    """Exercise 2: ``unscale_and_clip(scaled_grads, scale, max_norm) -> list of gradients`` must unscale
    first and then clip the *global* norm, as ``clip_grad_norm_`` after ``GradScaler.unscale_`` does."""

    counter = iter(range(1 << 30))

    def make_inputs(rng):
        scale = float(2.0 ** int(rng.integers(8, 17)))
        true = [(rng.standard_normal(s) * 10.0 ** rng.uniform(-1, 1)).astype(np.float32) for s in ((4, 6), (6,), (3, 4))]
        grads = [torch.from_numpy(g) * scale for g in true]
        norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in true)))
        max_norm = norm * (3.0 if next(counter) % 2 else 0.3)  # alternately clipping and not
        return grads, scale, max_norm

    def learner(grads, scale, max_norm):
        return unscale_and_clip([g.clone() for g in grads], scale, max_norm)

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
                   mistakes=mistakes)


# ---------------------------------------------------------------- exercise 3: the master-weight step
def _reference_master_step(master, grad16, scale, lr):
    return master - lr * (grad16.float() / scale)  # lesson eqs. 4-5: unscale in FP32, then SGD on the FP32 master


def check_master_weight_step(master_weight_step: Callable, *, trials: int = 3, seed: int = 0) -> None:
    """Exercise 3: ``master_weight_step(master32, scaled_grad16, scale, lr) -> (new_master32, new_weights16)``."""

    def make_inputs(rng):
        master = torch.from_numpy((rng.uniform(0.25, 1.0, 500) * rng.choice([-1, 1], 500)).astype(np.float32))  # (500,) fp32
        scale = float(2.0 ** int(rng.integers(10, 16)))
        true = rng.standard_normal(500) * 10.0 ** rng.uniform(-4, -2, 500)  # small gradients
        grad16 = torch.from_numpy((true * scale).astype(np.float32)).half()
        return master, grad16, scale, 0.05  # updates 5e-6..5e-4: many below half an fp16 ulp

    def new_master(master, grad16, scale, lr):
        out = master_weight_step(master, grad16, scale, lr)
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
                   mistakes=mistakes)


# ---------------------------------------------------------------- exercise 4: bytes per parameter
def _bytes_model():
    return torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.ReLU(), torch.nn.Linear(48, 8))


def _reference_bytes_per_param(weight_dtype: str, optimizer: str, master_weights: bool) -> float:
    m = measure_recipe_memory(_bytes_model, DTYPES[weight_dtype], optimizer, master_weights)
    return m.total / m.n_params


def check_bytes_per_param(bytes_per_param: Callable, *, trials: int = 6, seed: int = 0) -> None:
    """Exercise 4: ``bytes_per_param(weight_dtype, optimizer, master_weights)``, checked against a measurement
    (:func:`measure_recipe_memory`: weights + gradients + FP32 masters + optimizer state after one step)."""
    cases = [(w, o, m) for w in ("float32", "float16", "bfloat16") for o in ("sgd", "momentum", "adam")
             for m in (False, True) if not (m and w == "float32")]

    # Telling cases first, ordered so that each listed mistake is first exposed by a case where its
    # number differs from those of the mistakes listed before it; then random cases.
    fixed = iter([("float16", "momentum", False), ("float32", "adam", False), ("bfloat16", "momentum", True),
                  ("float16", "adam", True)])

    def make_inputs(rng):
        return next(fixed, None) or cases[int(rng.integers(len(cases)))]

    def size(w):
        return torch.finfo(DTYPES[w]).bits // 8

    states = {"sgd": 0, "momentum": 1, "adam": 2}
    mistakes = [
        Mistake("ignored_master", "master_weights was ignored: with master weights add a 4-byte FP32 copy per parameter, and the optimizer state (kept for the masters) is FP32.",
                lambda w, o, m: (2 + states[o]) * size(w)),
        Mistake("no_master", "the FP32 master copy is missing: with master weights add 4 bytes per parameter.",
                lambda w, o, m: 2 * size(w) + states[o] * (4 if m else size(w))),
        Mistake("adam_one_state", "Adam keeps two states per parameter (first and second moments), momentum SGD one, plain SGD none.",
                lambda w, o, m: 2 * size(w) + (4 if m else 0) + min(states[o], 1) * (4 if m else size(w))),
        Mistake("state_in_weight_dtype", "with master weights the optimizer updates the FP32 masters, so its state is FP32 (4 bytes each), not 16-bit.",
                lambda w, o, m: 2 * size(w) + (4 if m else 0) + states[o] * size(w)),
        Mistake("fp32_grads", "the gradients have the weights' dtype (2 bytes for 16-bit weights): the FP32 gradient copy is transient.",
                lambda w, o, m: size(w) + 4 + (4 if m else 0) + states[o] * (4 if m else size(w))),
        Mistake("no_grads", "gradients are missing: they are held from backward until the step (one per parameter, in the weights' dtype).",
                lambda w, o, m: size(w) + (4 if m else 0) + states[o] * (4 if m else size(w))),
    ]
    check_function(bytes_per_param, _reference_bytes_per_param, make_inputs, name="bytes_per_param", trials=trials,
                   seed=seed, rtol=1e-9, atol=1e-9, mistakes=mistakes)


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


def check_classify_cast(classify_cast: Callable, *, trials: int = 4, seed: int = 0) -> None:
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
    check_function(classify_cast, _reference_classify_cast, make_inputs, name="classify_cast", trials=trials, seed=seed,
                   mistakes=mistakes)
