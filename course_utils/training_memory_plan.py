r"""ZeRO sharding and the training-memory calculator (lesson 08, sections 4-5).

Used by ``notebooks/08_training_memory.ipynb``: per-GPU model states under ZeRO stages 0-3 (eq. 4,
Rajbhandari et al.), the calculator that adds activations (:func:`plan_memory`, :func:`fewest_gpus`,
its plot and its widget), and the helpers of the two-process ZeRO-1 demo
(:mod:`course_utils.zero1_demo`). The formulas it combines are in :mod:`course_utils.training_memory`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .training_memory import (GB, LLAMA2_7B, PRESETS, RECIPES, Recipe, TransformerShape, activation_bytes,
                              count_parameters)

def zero_bytes_per_gpu(n_params: float, recipe: str | Recipe, n_d: int, stage: int) -> dict[str, float]:
    r"""Model-state bytes per GPU under ZeRO ``stage`` (0 = plain data parallel) over ``n_d`` ranks (eq. 4).

    Stage 1 shards the optimizer state (master copy + moments, K bytes), stage 2 also the
    gradients (and any FP32 accumulator), stage 3 also the 16-bit weights.
    """
    r = RECIPES[recipe] if isinstance(recipe, str) else recipe
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage!r}")
    share = lambda sharded: 1 / n_d if sharded else 1.0  # noqa: E731
    return {
        "weights": n_params * r.weights * share(stage >= 3),
        "gradients": n_params * (r.grads + r.grad_accum) * share(stage >= 2),
        "optimizer": n_params * r.K * share(stage >= 1),
    }


@dataclass(frozen=True)
class TrainingSetup:
    """One training configuration for the calculator; each field is one knob of the widget."""

    shape: TransformerShape = LLAMA2_7B
    seq_len: int = 4096  # s: tokens per sequence
    micro_batch: int = 1  # b: sequences per GPU per forward pass
    recipe: str = "mixed_adam"  # a key of RECIPES
    zero_stage: int = 0  # 0 (plain data parallel) to 3
    dp: int = 1  # N_d: data-parallel (ZeRO) degree
    tp: int = 1  # t: tensor-parallel degree (weights and activations split t ways)
    sequence_parallel: bool = False  # also split the non-tensor-parallel activations t ways
    recompute: str = "none"  # "none", "selective" or "full"


def plan_memory(cfg: TrainingSetup) -> dict[str, float]:
    """Bytes per GPU by component: weights, gradients, optimizer, activations."""
    n_per_tp_rank = count_parameters(cfg.shape) / cfg.tp
    out = zero_bytes_per_gpu(n_per_tp_rank, cfg.recipe, cfg.dp, cfg.zero_stage)
    out["activations"] = activation_bytes(cfg.shape, cfg.seq_len, cfg.micro_batch, t=cfg.tp,
                                          sequence_parallel=cfg.sequence_parallel, recompute=cfg.recompute)
    return out


def fewest_gpus(cfg: TrainingSetup, gpu_bytes: float, *, max_dp: int = 4096) -> int | None:
    """Smallest total GPU count (dp · tp, dp varied) whose per-GPU bytes fit ``gpu_bytes``; None if none."""
    for dp in range(1, max_dp + 1):
        if sum(plan_memory(replace(cfg, dp=dp)).values()) <= gpu_bytes:
            return dp * cfg.tp
        if cfg.zero_stage == 0:  # more data-parallel ranks do not shrink anything
            return None
    return None


COMPONENT_COLORS = {"weights": "#1f77b4", "gradients": "#ff7f0e", "optimizer": "#2ca02c", "activations": "#9467bd"}


def plot_plan(cfg: TrainingSetup, gpu_gb: float = 80, ax=None):
    """Stacked bars of per-GPU GB for dp = 1, 2, 4, ..., 64 at ``cfg``, against the GPU's capacity."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    dps = [2**i for i in range(7)]
    plans = [plan_memory(replace(cfg, dp=d)) for d in dps]
    bottom = np.zeros(len(dps))
    for comp, color in COMPONENT_COLORS.items():
        vals = np.array([p[comp] / GB for p in plans])
        ax.bar([str(d) for d in dps], vals, bottom=bottom, color=color, label=comp)
        bottom += vals
    ax.axhline(gpu_gb, color="k", ls="--", lw=1, label=f"{gpu_gb:g} GB GPU")
    n = fewest_gpus(cfg, gpu_gb * GB)
    ax.set_xlabel(f"data-parallel degree N_d (ZeRO stage {cfg.zero_stage}, tensor parallel t={cfg.tp})")
    ax.set_ylabel("GB per GPU")
    ax.set_title(f"{cfg.recipe}, s={cfg.seq_len}, b={cfg.micro_batch}, recompute={cfg.recompute}: "
                 f"smallest fit = {n if n else 'none'} GPUs", fontsize=9)
    ax.legend(fontsize=8, ncol=5, loc="upper right")
    return ax


def describe_plan(cfg: TrainingSetup, gpu_gb: float = 80) -> str:
    """The calculator's text answer: GB per component, total, and the smallest number of GPUs that fits."""
    plan = plan_memory(cfg)
    parts = ", ".join(f"{k} {v / GB:.3g}" for k, v in plan.items())
    n = fewest_gpus(cfg, gpu_gb * GB)
    fit = (f"smallest fit on {gpu_gb:g} GB GPUs (N_d varied, t={cfg.tp}): {n} GPUs" if n
           else f"does not fit on {gpu_gb:g} GB GPUs at any N_d")
    return f"per GPU (GB): {parts}; total {sum(plan.values()) / GB:.3g} | {fit}"


def memory_calculator(cfg: TrainingSetup = TrainingSetup(), gpu_gb: float = 80, *, interactive: bool = True):
    """The interactive calculator (ipywidgets); without ipywidgets (or ``interactive=False``) a plain answer."""
    import matplotlib.pyplot as plt

    def show(preset, seq_len, micro_batch, recipe, zero_stage, dp, tp, recompute, gpu):
        c = TrainingSetup(PRESETS[preset], seq_len, micro_batch, recipe, zero_stage, dp, tp, False, recompute)
        print(describe_plan(c, gpu))
        plot_plan(c, gpu)
        plt.show()

    start = dict(preset=next(k for k, v in PRESETS.items() if v == cfg.shape) if cfg.shape in PRESETS.values()
                 else "LLaMA-2-7B", seq_len=cfg.seq_len, micro_batch=cfg.micro_batch, recipe=cfg.recipe,
                 zero_stage=cfg.zero_stage, dp=cfg.dp, tp=cfg.tp, recompute=cfg.recompute, gpu=gpu_gb)
    if interactive:
        try:
            import ipywidgets as w
        except ImportError:
            interactive = False
    if not interactive:
        show(**start)
        return None
    return w.interactive(
        show,
        preset=w.Dropdown(options=list(PRESETS), value=start["preset"]),
        seq_len=w.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=start["seq_len"]),
        micro_batch=w.IntSlider(value=start["micro_batch"], min=1, max=16),
        recipe=w.Dropdown(options=list(RECIPES), value=start["recipe"]),
        zero_stage=w.IntSlider(value=start["zero_stage"], min=0, max=3),
        dp=w.Dropdown(options=[1, 2, 4, 8, 16, 32, 64, 128], value=start["dp"]),
        tp=w.Dropdown(options=[1, 2, 4, 8], value=start["tp"]),
        recompute=w.Dropdown(options=["none", "selective", "full"], value=start["recompute"]),
        gpu=w.Dropdown(options=[24, 40, 80, 141], value=start["gpu"]),
    )


# ---------------------------------------------------------------- ZeRO-1 demo (two processes)
def shard_bounds(numel: int, world: int, rank: int) -> tuple[int, int, int]:
    """``(lo, hi, per)``: rank's slice ``[lo, hi)`` of a flat vector split in ``world`` equal padded parts."""
    per = -(-numel // world)
    lo = min(rank * per, numel)
    return lo, min(lo + per, numel), per


def zero1_command(out_path: str, *, steps: int = 5, nproc: int = 2) -> list[str]:
    """The ``torchrun`` command (with this interpreter) that runs :mod:`course_utils.zero1_demo`."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "course_utils.zero1_demo", "--steps", str(steps), "--out", str(out_path)]


__all__ = [
    "zero_bytes_per_gpu", "TrainingSetup", "plan_memory", "fewest_gpus", "COMPONENT_COLORS", "plot_plan",
    "describe_plan", "memory_calculator", "shard_bounds", "zero1_command",
]
