r"""Memory math for training a transformer: parameters, model states, activations, ZeRO.

Used by ``notebooks/08_training_memory.ipynb`` (which derives every formula here first) and its
problem set ``solutions/08_training_memory.ipynb`` (the ``check_*`` functions at the bottom);
``course_utils/zero1_demo.py`` is the two-process ZeRO-1 script that lesson launches with torchrun.
Byte counting of tensors (:func:`tensor_bytes`) and the FP32-master-weight optimizer come from
topic 02's :mod:`course_utils.mixed_precision`.

Units: bytes everywhere; :data:`GB` (10^9, as GPU datasheets and the ZeRO paper use) and
:data:`GiB` (2^30, as ``nvidia-smi`` and PyTorch's allocator report) are named, never mixed.

Formulas (numbers as in the lesson):

* parameters of a LLaMA-style decoder from its shape (eq. 1);
* bytes per parameter of a training recipe: weights + gradients + optimizer state (eq. 2);
* activation bytes per transformer layer, Korthikanti et al. (eq. 3): s·b·h·(34 + 5·a·s/h) with
  16-bit activations and 1-byte dropout masks, plus their tensor-parallel / recomputation variants;
* per-GPU model states under ZeRO stages 0-3 (eq. 4), Rajbhandari et al.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import numpy as np

from .checks import CheckFailed, Mistake, check_function, check_value
from .mixed_precision import MasterWeightOptimizer, tensor_bytes  # topic 02: bytes of distinct storages, FP32 masters

GB = 10**9  # decimal gigabyte: datasheets ("80 GB"), the ZeRO paper, the source article
GiB = 2**30  # binary gibibyte: nvidia-smi, torch.cuda.memory_allocated()/2**30


# ---------------------------------------------------------------- model shape and parameter count
@dataclass(frozen=True)
class TransformerShape:
    """The numbers that fix a decoder-only transformer's size (LLaMA layout by default)."""

    vocab_size: int  # V: rows of the token-embedding table (and of the output head)
    hidden: int  # h: width of the residual stream
    layers: int  # L: number of decoder blocks
    heads: int  # a: query heads; head_dim = h / a
    ffn: int  # inner width of the MLP (11008 for LLaMA-2-7B)
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None means = heads
    tied_embeddings: bool = False  # output head shares the embedding matrix (GPT-2) or not (LLaMA)
    gated_mlp: bool = True  # SwiGLU: gate, up, down (3 matrices); False: GPT's up, down (2)
    qkv_bias: bool = False  # biases on W_q, W_k, W_v (Qwen-style); LLaMA has none

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads


LLAMA2_7B = TransformerShape(vocab_size=32000, hidden=4096, layers=32, heads=32, ffn=11008)
LLAMA2_13B = TransformerShape(vocab_size=32000, hidden=5120, layers=40, heads=40, ffn=13824)
LLAMA2_70B = TransformerShape(vocab_size=32000, hidden=8192, layers=80, heads=64, ffn=28672, kv_heads=8)
PRESETS = {"LLaMA-2-7B": LLAMA2_7B, "LLaMA-2-13B": LLAMA2_13B, "LLaMA-2-70B": LLAMA2_70B}
TINY = TransformerShape(vocab_size=512, hidden=128, layers=2, heads=4, ffn=344)  # CPU-sized, same layout


def parameter_breakdown(shape: TransformerShape) -> dict[str, int]:
    """Parameters per part of a LLaMA-style model (no biases, RMSNorm weights only), eq. (1)."""
    h, L = shape.hidden, shape.layers
    kv_dim = shape.n_kv_heads * shape.head_dim
    attention = h * h + 2 * h * kv_dim + h * h  # W_q, W_k, W_v, W_o
    if shape.qkv_bias:
        attention += h + 2 * kv_dim  # b_q, b_k, b_v
    mlp = (3 if shape.gated_mlp else 2) * h * shape.ffn
    return {
        "embedding": shape.vocab_size * h,
        "attention": L * attention,
        "mlp": L * mlp,
        "norms": (2 * L + 1) * h,  # two RMSNorms per block and a final one
        "output head": 0 if shape.tied_embeddings else shape.vocab_size * h,
    }


def count_parameters(shape: TransformerShape) -> int:
    """Total parameters of :func:`build_model` ``(shape)``, by formula (eq. 1 of the lesson)."""
    return sum(parameter_breakdown(shape).values())


def build_model(shape: TransformerShape, device="cpu", dtype=None):
    """A LLaMA-style decoder (RMSNorm, causal attention, SwiGLU) as plain ``torch.nn`` modules.

    On ``device="meta"`` no memory is allocated: the lesson counts a 7B model's parameters that way.
    """
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h, kv = shape.hidden, shape.n_kv_heads * shape.head_dim
            self.attn_norm, self.mlp_norm = nn.RMSNorm(h), nn.RMSNorm(h)
            qb = shape.qkv_bias
            self.q, self.k = nn.Linear(h, h, bias=qb), nn.Linear(h, kv, bias=qb)
            self.v, self.o = nn.Linear(h, kv, bias=qb), nn.Linear(h, h, bias=False)
            self.up, self.down = nn.Linear(h, shape.ffn, bias=False), nn.Linear(shape.ffn, h, bias=False)
            self.gate = nn.Linear(h, shape.ffn, bias=False) if shape.gated_mlp else None

        def forward(self, x):  # x: (B, T, h)
            B, T, h = x.shape
            y = self.attn_norm(x)
            q = self.q(y).view(B, T, shape.heads, shape.head_dim).transpose(1, 2)  # (B, a, T, d)
            k = self.k(y).view(B, T, shape.n_kv_heads, shape.head_dim).transpose(1, 2)  # (B, a_kv, T, d)
            v = self.v(y).view(B, T, shape.n_kv_heads, shape.head_dim).transpose(1, 2)  # (B, a_kv, T, d)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=shape.n_kv_heads != shape.heads)
            x = x + self.o(att.transpose(1, 2).reshape(B, T, h))  # (B, T, h)
            y = self.mlp_norm(x)
            inner = F.silu(self.gate(y)) * self.up(y) if self.gate is not None else F.gelu(self.up(y))
            return x + self.down(inner)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(shape.vocab_size, shape.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.norm = nn.RMSNorm(shape.hidden)
            self.head = nn.Linear(shape.hidden, shape.vocab_size, bias=False)
            if shape.tied_embeddings:
                self.head.weight = self.embed.weight  # one matrix, two uses

        def forward(self, tokens):  # tokens: (B, T) -> logits (B, T, V)
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    with torch.device(device):
        model = Decoder()
    return model if dtype is None else model.to(dtype)


# ---------------------------------------------------------------- bytes of tensors and of saved activations
class SavedTensorLog:
    """What autograd saved for backward while the context was open (see :func:`saved_tensors`)."""

    def __init__(self, exclude: Iterable = ()):
        self.excluded = {p.untyped_storage().data_ptr() for p in exclude}
        self.entries: list[tuple[tuple, str, int]] = []  # (shape, dtype, storage bytes) per save
        self._storages: dict[int, int] = {}

    def pack(self, t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.excluded:
            self.entries.append((tuple(t.shape), str(t.dtype).replace("torch.", ""), storage.nbytes()))
            self._storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct storages saved (a tensor saved twice, or two views of one, count once)."""
        return sum(self._storages.values())


@contextmanager
def saved_tensors(exclude: Iterable = ()):
    """Log every tensor autograd saves for backward, e.g. ``with saved_tensors(model.parameters()) as log:``.

    Storages of ``exclude`` (the parameters, which exist anyway) are not counted.
    """
    import torch

    log = SavedTensorLog(exclude)
    with torch.autograd.graph.saved_tensors_hooks(log.pack, lambda t: t):
        yield log


def saved_bytes(module, x) -> int:
    """Bytes autograd keeps for backward in ``module(x)``, parameters excluded (the problem set's reference)."""
    with saved_tensors(module.parameters()) as log:
        module(x)
    return log.nbytes


# ---------------------------------------------------------------- recipes: bytes per parameter
@dataclass(frozen=True)
class Recipe:
    """Bytes per parameter that live for the whole run, by role (eq. 2 of the lesson)."""

    name: str
    weights: int  # the copy forward/backward use
    grads: int  # gradients in the weights' dtype
    grad_accum: int  # a separate FP32 gradient accumulation buffer
    master: int  # FP32 master copy of the weights (mixed precision)
    moments: int  # optimizer moments: Adam m and v (8), SGD momentum (4)

    @property
    def K(self) -> int:
        """The ZeRO paper's K: optimizer-state bytes per parameter (master copy + moments)."""
        return self.master + self.moments

    @property
    def total(self) -> int:
        return self.weights + self.grads + self.grad_accum + self.K

    def parts(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.grads, "FP32 grad accumulator": self.grad_accum,
                "FP32 master copy": self.master, "optimizer moments": self.moments}


RECIPES = {
    "fp32_adam": Recipe("FP32 + Adam", 4, 4, 0, 0, 8),
    "mixed_adam": Recipe("16-bit + FP32 master + Adam", 2, 2, 0, 4, 8),
    "mixed_adam_fp32_accum": Recipe("16-bit + Adam + FP32 grad accum", 2, 2, 4, 4, 8),
    "fp32_sgd_momentum": Recipe("FP32 + SGD momentum", 4, 4, 0, 0, 4),
}


def model_state_bytes(n_params: int, recipe: str | Recipe) -> dict[str, int]:
    """Bytes of weights, gradients and optimizer state for ``n_params`` parameters (eq. 2)."""
    r = RECIPES[recipe] if isinstance(recipe, str) else recipe
    return {name: n_params * b for name, b in r.parts().items()}


def measure_recipe_state(recipe: str, shape: TransformerShape = TINY, *, batch: int = 2, seq: int = 16,
                         seed: int = 0, device="cpu") -> dict[str, int]:
    """Train ``build_model(shape)`` for one optimizer step with ``recipe`` and count the bytes held after it.

    Returns measured bytes by role (keys of :meth:`Recipe.parts`) from the tensors themselves:
    parameters, ``.grad``, FP32 master copies and everything in ``optimizer.state`` (Adam's 0-d
    ``step`` counters included, unlike topic 02's ``measure_recipe_memory``).
    """
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    mixed = recipe.startswith("mixed")
    model = build_model(shape, device=device, dtype=torch.bfloat16 if mixed else torch.float32)
    params = list(model.parameters())

    def make_opt(ps):
        if recipe == "fp32_sgd_momentum":
            return torch.optim.SGD(ps, lr=1e-2, momentum=0.9)
        return torch.optim.AdamW(ps, lr=1e-3)

    if recipe == "mixed_adam":  # topic 02's optimizer: FP32 masters, FP32 gradients freed after the step
        opt = MasterWeightOptimizer(params, make_opt)
        master, inner = opt.master, opt.inner
    elif recipe == "mixed_adam_fp32_accum":  # FP32 gradients accumulated over micro-batches, kept
        master = [p.detach().float().clone().requires_grad_(True) for p in params]
        opt = inner = make_opt(master)
    else:
        master, opt = [], make_opt(params)
        inner = opt
    micro_batches = 2 if recipe == "mixed_adam_fp32_accum" else 1
    for _ in range(micro_batches):
        for p in params:
            p.grad = None
        tokens = torch.randint(0, shape.vocab_size, (batch, seq + 1), device=device)
        logits = model(tokens[:, :-1])  # (B, T, V)
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        if recipe == "mixed_adam_fp32_accum":  # accumulate the 16-bit gradients into FP32 buffers
            for m, p in zip(master, params):
                m.grad = p.grad.float() if m.grad is None else m.grad + p.grad.float()
    opt.step()
    if recipe == "mixed_adam_fp32_accum":
        with torch.no_grad():
            for m, p in zip(master, params):
                p.copy_(m)  # new 16-bit weights from the FP32 master
    state = [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t)]
    return {
        "weights": tensor_bytes(params),
        "gradients": tensor_bytes(p.grad for p in params),
        "FP32 grad accumulator": tensor_bytes(m.grad for m in master),
        "FP32 master copy": tensor_bytes(master),
        "optimizer moments": tensor_bytes(state),
    }


# ---------------------------------------------------------------- activations (Korthikanti et al.)
def activation_bytes_per_layer(s: int, b: int, h: int, a: int, *, t: int = 1, sequence_parallel: bool = False,
                               recompute: str = "none") -> float:
    r"""Bytes one transformer layer keeps for backward: Korthikanti et al., Table 2 (eq. 3).

    16-bit activations, 1-byte dropout masks. ``t``: tensor-parallel degree. ``recompute``:
    ``"none"``, ``"selective"`` (recompute the attention core: drops the 5·a·s²·b term) or
    ``"full"`` (keep only the layer's input, 2·s·b·h; during backward one layer's full activations
    exist again while it is recomputed, which this steady-state count leaves out, as the paper does).
    """
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5 * a * s / h  # 5·a·s²·b = s·b·h·5as/h
    if recompute not in ("none", "selective"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', not {recompute!r}")
    if sequence_parallel:
        return sbh * (34 + scores) / t
    return sbh * (10 + 24 / t + scores / t)


def output_layer_activation_bytes(s: int, b: int, h: int, vocab: int, *, t: int = 1) -> float:
    """Embedding dropout, final norm, output projection and FP32 logits: about 4·s·b·h·(1 + V/h)/t."""
    return 4 * s * b * h * (1 + vocab / h) / t


def activation_bytes(shape: TransformerShape, seq_len: int, micro_batch: int, *, t: int = 1,
                     sequence_parallel: bool = False, recompute: str = "none") -> float:
    """All layers plus the output layer, for one micro-batch, per GPU."""
    per_layer = activation_bytes_per_layer(seq_len, micro_batch, shape.hidden, shape.heads, t=t,
                                           sequence_parallel=sequence_parallel, recompute=recompute)
    return shape.layers * per_layer + output_layer_activation_bytes(seq_len, micro_batch, shape.hidden,
                                                                    shape.vocab_size, t=t)


# ---------------------------------------------------------------- ZeRO and the calculator
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


def min_gpus(cfg: TrainingSetup, gpu_bytes: float, *, max_dp: int = 4096) -> int | None:
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
    n = min_gpus(cfg, gpu_gb * GB)
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
    n = min_gpus(cfg, gpu_gb * GB)
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


# ================================================================ problem-set checks
def _shape_from(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) -> TransformerShape:
    return TransformerShape(int(vocab), int(hidden), int(layers), int(heads), int(ffn), int(kv_heads), bool(tied),
                            qkv_bias=bool(qkv_bias))


def _ref_gqa(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
    return count_parameters(_shape_from(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias))


def _gqa_inputs(rng):
    heads = int(rng.choice([8, 16, 32, 64]))
    kv_heads = int(rng.choice([d for d in (1, 2, 4, 8) if d < heads]))
    hidden = heads * int(rng.choice([32, 64, 128]))
    return dict(vocab=int(rng.integers(1000, 130000)), hidden=hidden, layers=int(rng.integers(2, 48)), heads=heads,
                kv_heads=kv_heads, ffn=64 * int(rng.integers(hidden // 32, hidden // 16)), tied=bool(rng.integers(2)),
                qkv_bias=bool(rng.integers(2)))


def check_gqa_parameter_count(fn: Callable, *, seed: int = 0, trials: int = 6) -> None:
    """Exercise 1: parameters of a LLaMA-style model with grouped-query attention, optional tying and q/k/v biases."""
    def twice(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return _ref_gqa(vocab, hidden, layers, heads, kv_heads, ffn, False, qkv_bias)

    def full_kv(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return _ref_gqa(vocab, hidden, layers, heads, heads, ffn, tied, qkv_bias)

    def no_bias(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return _ref_gqa(vocab, hidden, layers, heads, kv_heads, ffn, tied, False)

    def bias_full(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        extra = layers * 2 * (hidden - kv_heads * hidden // heads) if qkv_bias else 0
        return _ref_gqa(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) + extra

    def no_norms(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return _ref_gqa(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) - (2 * layers + 1) * hidden

    def two_mlp(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return _ref_gqa(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) - layers * hidden * ffn

    mistakes = [
        Mistake("tied twice", "with tied embeddings the output head IS the embedding matrix: count V·h once.", twice),
        Mistake("full kv", "W_k and W_v map h to kv_heads·head_dim, not to h: use kv_heads, not heads.", full_kv),
        Mistake("no bias", "with qkv_bias, add the biases of W_q, W_k, W_v: h + 2·kv_heads·head_dim per layer.", no_bias),
        Mistake("bias full", "the biases of W_k and W_v have kv_heads·head_dim entries, not h.", bias_full),
        Mistake("no norms", "add the RMSNorm weights: two vectors of size h per layer plus the final one.", no_norms),
        Mistake("two mlp", "a SwiGLU MLP has three matrices (gate, up, down), not two.", two_mlp),
    ]
    check_function(fn, _ref_gqa, _gqa_inputs, name="gqa_parameter_count", trials=trials, seed=seed,
                   mistakes=mistakes)


def _ref_adam_gib(n_params, weight_bytes, grad_bytes):
    master = 4 if weight_bytes < 4 else 0
    return n_params * (weight_bytes + grad_bytes + master + 8) / GiB


def _adam_inputs(rng):
    return (int(rng.integers(10**8, 10**11)), int(rng.choice([2, 4])), int(rng.choice([2, 4])))


def check_adam_state_gib(fn: Callable, *, seed: int = 0, trials: int = 6) -> None:
    """Exercise 2: GiB of weights + gradients + Adam state for a given weight/gradient precision."""
    mistakes = [
        Mistake("no master", "16-bit weights need an FP32 master copy for the optimizer: add 4 bytes per parameter.",
                lambda n, w, g: n * (w + g + 8) / GiB),
        Mistake("GB", "the answer is in GiB (2**30 bytes), not GB (10**9 bytes).", _gb_variant),
        Mistake("master fp32", "FP32 weights already are the master copy: no extra 4 bytes when weight_bytes == 4.",
                lambda n, w, g: n * (w + g + 12) / GiB),
        Mistake("no moments", "Adam keeps two FP32 moments (m and v): 8 bytes per parameter.",
                lambda n, w, g: n * (w + g + (4 if w < 4 else 0)) / GiB),
    ]
    check_function(fn, _ref_adam_gib, _adam_inputs, name="adam_state_gib", trials=trials, seed=seed,
                   mistakes=mistakes, rtol=1e-9, atol=0.0)


def _gb_variant(n, w, g):
    return _ref_adam_gib(n, w, g) * GiB / GB


def _ref_act_tp(s, b, h, a, t, selective):
    return activation_bytes_per_layer(s, b, h, a, t=t, recompute="selective" if selective else "none")


def _act_inputs(rng):
    a = int(rng.choice([8, 16, 32, 64]))
    h = a * int(rng.choice([64, 128]))
    return (int(rng.choice([512, 1024, 2048, 4096, 8192])), int(rng.integers(1, 9)), h, a,
            int(rng.choice([2, 4, 8])), bool(rng.integers(2)))


def check_activation_bytes_tp(fn: Callable, *, seed: int = 0, trials: int = 6) -> None:
    """Exercise 3: per-layer activation bytes with tensor parallelism and optional selective recomputation."""
    mistakes = [
        Mistake("no heads", "the attention scores are (b, a, s, s): multiply the 5·s²·b term by the number of heads a.",
                lambda s, b, h, a, t, sel: s * b * h * (10 + 24 / t) + (0 if sel else 5 * s * s * b / t)),
        Mistake("all sharded", "without sequence parallelism the layer norms, dropouts and the inputs of the first "
                "linears (10·s·b·h) are replicated on every rank: do not divide them by t.",
                lambda s, b, h, a, t, sel: s * b * h * (34 + (0 if sel else 5 * a * s / h)) / t),
        Mistake("nothing sharded", "tensor parallelism splits 24·s·b·h and the scores t ways: divide them by t.",
                lambda s, b, h, a, t, sel: s * b * h * (34 + (0 if sel else 5 * a * s / h))),
        Mistake("selective ignored", "selective recomputation drops the whole 5·a·s²·b/t term (scores, softmax, "
                "dropout mask): leave it out when selective is True.",
                lambda s, b, h, a, t, sel: _ref_act_tp(s, b, h, a, t, False)),
    ]
    check_function(fn, _ref_act_tp, _act_inputs, name="activation_bytes_tp", trials=trials, seed=seed,
                   mistakes=mistakes, rtol=1e-9, atol=0.0)


def _recipe_key(accum):
    return "mixed_adam_fp32_accum" if accum else "mixed_adam"


def _ref_zero2(n_params, n_ranks, fp32_grad_accum):
    return sum(zero_bytes_per_gpu(n_params, _recipe_key(fp32_grad_accum), n_ranks, 2).values())


def _zero2_inputs(rng):
    return (int(rng.integers(10**8, 2 * 10**11)), int(rng.choice([2, 8, 16, 64, 256])), bool(rng.integers(2)))


def check_zero2_bytes(fn: Callable, *, seed: int = 0, trials: int = 6) -> None:
    """Exercise 4: per-rank model-state bytes of ZeRO-2 with mixed-precision Adam (K = 12), optional FP32 accumulator."""
    def stage(k):
        return lambda n, nd, acc: sum(zero_bytes_per_gpu(n, _recipe_key(acc), nd, k).values())

    mistakes = [
        Mistake("stage 1", "ZeRO-2 also shards the gradients: divide the gradient bytes by N_d too.", stage(1)),
        Mistake("stage 3", "ZeRO-2 keeps the full 16-bit weights on every rank: only stage 3 shards them.", stage(3)),
        Mistake("no master", "K = 12 for mixed-precision Adam: the FP32 master copy (4) plus m and v (8).",
                lambda n, nd, acc: 2 * n + (2 + (4 if acc else 0) + 8) * n / nd),
        Mistake("accum replicated", "the FP32 accumulator is a gradient buffer: ZeRO-2 shards it like the gradients.",
                lambda n, nd, acc: 2 * n + (4 * n if acc else 0) + (2 + 12) * n / nd),
        Mistake("stage 0", "ZeRO-2 shards the optimizer state and the gradients over the N_d ranks.", stage(0)),
    ]
    check_function(fn, _ref_zero2, _zero2_inputs, name="zero2_bytes", trials=trials, seed=seed, mistakes=mistakes,
                   rtol=1e-9, atol=0.0)


def _min_gpus_for(n_params, activation_gb, gpu_gb, *, bytes_per_param=16, capacity_unit=GB, with_act=True,
                  rounding=math.ceil):
    free = gpu_gb * capacity_unit - (activation_gb * GB if with_act else 0)
    return int(rounding(bytes_per_param * n_params / free))


def _ref_min_gpus(n_params, activation_gb, gpu_gb):
    return _min_gpus_for(n_params, activation_gb, gpu_gb)


def _min_gpus_inputs(rng):
    gpu = int(rng.choice([40, 80, 141]))
    return (int(rng.integers(10**9, 3 * 10**11)), round(float(rng.uniform(0.05, 0.6)) * gpu, 1), gpu)


def check_min_gpus(fn: Callable, *, seed: int = 0, trials: int = 6) -> None:
    """Exercise 5: the fewest GPUs for ZeRO-3 mixed-precision Adam (16 bytes/param) plus activations."""
    mistakes = [
        Mistake("GiB", "'80 GB' on a datasheet means 80·10**9 bytes, the unit of activation_gb too: do not use 2**30.",
                lambda n, act, gpu: _min_gpus_for(n, act, gpu, capacity_unit=GiB)),
        Mistake("no activations", "each GPU also holds its activations: subtract activation_gb from the capacity first.",
                lambda n, act, gpu: _min_gpus_for(n, act, gpu, with_act=False)),
        Mistake("no master", "mixed-precision Adam is 16 bytes/param: 2 + 2 + 4 (FP32 master) + 8 (m, v).",
                lambda n, act, gpu: _min_gpus_for(n, act, gpu, bytes_per_param=12)),
        Mistake("floor", "round the GPU count up (math.ceil): a fraction of a GPU still needs a whole one.",
                lambda n, act, gpu: _min_gpus_for(n, act, gpu, rounding=math.floor)),
    ]
    check_function(fn, _ref_min_gpus, _min_gpus_inputs, name="min_gpus", trials=trials, seed=seed, mistakes=mistakes)


def saved_bytes_beyond_input(module, x) -> int:
    """Bytes autograd saves in ``module(x)`` beyond what exists anyway (parameters and ``x``): exercise 6."""
    with saved_tensors(list(module.parameters()) + [x]) as log:
        module(x)
    return log.nbytes


class _ProbeBlock:
    """Small random modules for exercise 6: some save one storage twice, all have parameters."""

    @staticmethod
    def make(rng):
        import torch
        from torch import nn

        torch.manual_seed(int(rng.integers(2**31)))
        h = int(rng.choice([16, 32, 48]))
        kind = int(rng.integers(3))

        class Gated(nn.Module):  # its input is saved by fc and by the product: one storage, two saves
            def __init__(self, width):
                super().__init__()
                self.fc = nn.Linear(width, width)

            def forward(self, x):
                return torch.tanh(self.fc(x)) * x

        if kind == 0:
            module = nn.Sequential(nn.LayerNorm(h), nn.Linear(h, 2 * h), nn.GELU(), nn.Linear(2 * h, h))
        elif kind == 1:
            module = nn.Sequential(nn.Linear(h, 2 * h), Gated(2 * h))
        else:  # the 3h-wide hidden activation is saved twice inside Gated
            module = nn.Sequential(nn.Linear(h, 3 * h), Gated(3 * h), nn.Linear(3 * h, h))
        x = torch.randn(int(rng.integers(2, 9)), h, requires_grad=True)
        return dict(module=module, x=x)  # keywords: check_function passes them uncopied (keeps requires_grad)


def _no_dedup(module, x):
    import torch

    params = {p.untyped_storage().data_ptr() for p in list(module.parameters()) + [x]}
    total = 0

    def pack(t):
        nonlocal total
        if t.untyped_storage().data_ptr() not in params:
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return total


def _with_params(module, x):
    with saved_tensors([x]) as log:
        module(x)
    return log.nbytes


def _elements(module, x):
    return saved_bytes_beyond_input(module, x) // 4  # float32: bytes / 4 = elements


def check_saved_bytes(fn: Callable, *, seed: int = 0, trials: int = 5) -> None:
    """Exercise 6: bytes autograd saves for backward beyond the parameters and the input, via saved_tensors_hooks."""
    mistakes = [
        Mistake("params", "the parameters exist anyway: exclude their storages (module.parameters()) from the count.",
                _with_params),
        Mistake("input", "the input x exists anyway (the caller holds it): exclude its storage from the count.",
                saved_bytes),
        Mistake("no dedup", "one storage saved twice (or two views of it) occupies memory once: count unique "
                "storages (t.untyped_storage().data_ptr()).", _no_dedup),
        Mistake("elements", "count bytes, not elements: use untyped_storage().nbytes() (or numel()·element_size()).",
                _elements),
    ]
    check_function(fn, saved_bytes_beyond_input, _ProbeBlock.make, name="saved_bytes", trials=trials, seed=seed,
                   mistakes=mistakes, check_inputs_unchanged=False)


__all__ = [
    "GB", "GiB", "TransformerShape", "LLAMA2_7B", "LLAMA2_13B", "LLAMA2_70B", "PRESETS", "TINY",
    "parameter_breakdown", "count_parameters", "build_model", "tensor_bytes", "SavedTensorLog",
    "saved_tensors", "saved_bytes", "saved_bytes_beyond_input", "Recipe", "RECIPES", "model_state_bytes", "measure_recipe_state",
    "activation_bytes_per_layer", "output_layer_activation_bytes", "activation_bytes", "zero_bytes_per_gpu",
    "TrainingSetup", "plan_memory", "min_gpus", "plot_plan", "describe_plan", "memory_calculator",
    "shard_bounds", "zero1_command", "check_gqa_parameter_count", "check_adam_state_gib",
    "check_activation_bytes_tp", "check_zero2_bytes", "check_min_gpus", "check_saved_bytes", "CheckFailed",
    "check_value",
]
