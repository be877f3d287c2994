r"""Topic 02 (mixed precision): the measured bytes per parameter of a training recipe.

Used by ``notebooks/02_mixed_precision.ipynb`` (section 11: 16 bytes per parameter for FP32 Adam,
2 + 2 + 12 with FP16 weights and FP32 masters), by the bytes-per-parameter check in
:mod:`course_utils.grading.mixed_precision`, and by topic 08 (training memory).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .mixed_precision import MasterWeightOptimizer, tensor_bytes

__all__ = ["MemoryBreakdown", "make_optimizer", "measure_recipe_memory"]


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
