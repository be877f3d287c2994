r"""Topic 02 (mixed precision): a small digits MLP, loss scaling by hand, autocast by hand, master weights.

Used by:

* ``notebooks/02_mixed_precision.ipynb`` -- derives every piece below (the recipes, the flush-to-zero
  thresholds, :class:`DynamicLossScaler`, :func:`autocast_mlp_forward`) by hand and asserts that its
  versions equal these;
* topic 08 (training memory) -- :func:`tensor_bytes` and :class:`MasterWeightOptimizer`.

Bytes per recipe live in :mod:`course_utils.mixed_precision_memory`; the problem set's checks in
:mod:`course_utils.grading.mixed_precision`.

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

from .bench import single_thread

__all__ = [
    "DTYPES",
    "format_ranges",
    "flush_to_zero_fraction",
    "load_digits_split",
    "init_mlp",
    "mlp_forward",
    "autocast_mlp_forward",
    "mlp_loss",
    "StaticLossScaler",
    "DynamicLossScaler",
    "RECIPES",
    "TrainLog",
    "train_mlp",
    "tensor_bytes",
    "MasterWeightOptimizer",
    "autocast_dtype_table",
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
    The loop runs on one thread (:func:`course_utils.bench.single_thread`, restored afterwards).
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
    with single_thread():  # a 4810-weight model: one thread beats two fighting over a shared CPU, 10x
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
