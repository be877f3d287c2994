r"""Memory math for training a transformer: parameters, model states, activations.

Used by ``notebooks/08_training_memory.ipynb``, which derives every formula here first (equation
numbers refer to it). The ZeRO sharding formula and the memory calculator are in
:mod:`course_utils.training_memory_plan`; ``course_utils/zero1_demo.py`` is the two-process ZeRO-1
script the lesson launches with torchrun; the problem set's checks are in
:mod:`course_utils.grading.training_memory`. Byte counting of tensors (:func:`tensor_bytes`) and the
FP32-master-weight optimizer come from topic 02's :mod:`course_utils.mixed_precision`.

Units: bytes everywhere; :data:`GB` (10^9, as GPU datasheets and the ZeRO paper use) and
:data:`GiB` (2^30, as ``nvidia-smi`` and PyTorch's allocator report) are named, never mixed.

Formulas (numbers as in the lesson):

* parameters of a LLaMA-style decoder from its shape (eq. 1);
* bytes per parameter of a training recipe: weights + gradients + optimizer state (eq. 2);
* activation bytes per transformer layer for GPT-style models (dropout, GELU 4h MLP), Korthikanti
  et al. (eq. 3): s·b·h·(34 + 5·a·s/h) with 16-bit activations and 1-byte dropout masks, plus their
  tensor-parallel / recomputation variants; LLaMA models (no dropout, SwiGLU, FlashAttention) use
  eq. (3b) of :mod:`course_utils.training_memory_llama`, which :func:`activation_bytes` picks for
  gated shapes.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable

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
    """Bytes autograd keeps for backward in ``module(x)``, parameters excluded (lesson 08, section 3)."""
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
    r"""Bytes one GPT-style layer (dropout, GELU 4h MLP) keeps for backward: Korthikanti et al., Table 2 (eq. 3).

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
    """All layers plus the output layer, for one micro-batch, per GPU.

    A gated (SwiGLU) shape is taken as a LLaMA model: no dropout, FlashAttention, eq. (3b) of
    :func:`course_utils.training_memory_llama.activation_bytes_llama` (selective recomputation has
    nothing left to drop: flash already recomputes the scores). Otherwise a GPT-style model: eq. (3).
    """
    s, b, h = seq_len, micro_batch, shape.hidden
    if shape.gated_mlp and recompute != "full":
        if recompute not in ("none", "selective"):
            raise ValueError(f"recompute must be 'none', 'selective' or 'full', not {recompute!r}")
        from .training_memory_llama import activation_bytes_llama

        per_layer = activation_bytes_llama(s, b, h, shape.ffn, shape.heads, kv_heads=shape.kv_heads, t=t,
                                           sequence_parallel=sequence_parallel)
    else:  # GPT-style (dropout, GELU 4h MLP), or full recomputation: only the layer input, 2sbh
        per_layer = activation_bytes_per_layer(s, b, h, shape.heads, t=t, sequence_parallel=sequence_parallel,
                                               recompute=recompute)
    return shape.layers * per_layer + output_layer_activation_bytes(s, b, h, shape.vocab_size, t=t)


__all__ = [
    "GB", "GiB", "TransformerShape", "LLAMA2_7B", "LLAMA2_13B", "LLAMA2_70B", "PRESETS", "TINY",
    "parameter_breakdown", "count_parameters", "build_model", "tensor_bytes", "SavedTensorLog",
    "saved_tensors", "saved_bytes", "Recipe", "RECIPES", "model_state_bytes", "measure_recipe_state",
    "activation_bytes_per_layer", "output_layer_activation_bytes", "activation_bytes",
]
