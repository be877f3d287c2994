"""Weight-only quantization and the memory arithmetic of decoding (lesson 07b).

Lesson 07b writes int8 per-channel and int4 group-wise quantization by hand and checks them against
these. :class:`QuantLinear` swaps into a :class:`~course_utils.slm.TinyDecoder` in place of ``nn.Linear``:
int8 weights run through PyTorch's fused CPU kernel ``torch._weight_int8pack_mm`` (int8 weights read
from memory, dequantized inside the kernel) with bf16 activations, its fast path (with fp32 activations the
kernel is several times slower); int4 weights are stored packed two per byte and
dequantized before an fp32 matmul (no fused int4 CPU kernel is used here, so int4 saves memory, not time).
:func:`awq_input_scales` adds one outlier-aware method, activation-aware per-input-channel scaling (AWQ-style).
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn


def int8_per_channel(w):
    """Symmetric int8 per output row: ``q = round(w / s)``, ``s = max|w_row| / 127``; returns (q int8, s float32 (out,))."""
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0                     # (out,)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)      # (out, in)
    return q, scale.float()


def int4_groupwise(w, group: int = 32, bits: int = 4):
    """Symmetric int4 in groups of ``group`` inputs: values in [-7, 7]; returns (q int8 (out, in), s (out, in/group)).

    ``bits`` 3 or 2 use the grids [-3, 3] and [-1, 1] in the same 4-bit storage (to measure what fewer levels cost).
    """
    if bits not in (2, 3, 4):
        raise ValueError(f"int4_groupwise handles 2, 3 or 4 bits, got {bits}")
    levels = 2 ** (bits - 1) - 1
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // group, group)                               # (out, G, group)
    scale = wg.abs().amax(dim=2).clamp(min=1e-12) / levels                    # (out, G)
    q = torch.round(wg / scale[..., None]).clamp(-levels, levels).to(torch.int8)
    return q.reshape(out_f, in_f), scale.float()


def dequantize_int4(q, scale, group: int = 32):
    out_f, in_f = q.shape
    return (q.reshape(out_f, in_f // group, group).float() * scale[..., None]).reshape(out_f, in_f)


def pack_int4(q):
    """Two signed 4-bit values per byte: (out, in) int8 in [-8, 7] -> (out, in/2) uint8."""
    u = (q + 8).to(torch.uint8)                                               # [0, 15]
    return u[:, 0::2] | (u[:, 1::2] << 4)


def unpack_int4(packed):
    low, high = (packed & 0xF).to(torch.int8) - 8, (packed >> 4).to(torch.int8) - 8
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)


class QuantLinear(nn.Module):
    """A bias-free linear layer with int8 per-channel or packed int4 group-wise weights (group divides the inputs)."""

    def __init__(self, linear: nn.Linear, bits: int = 8, group: int | None = 32, input_scale=None):
        super().__init__()
        w = linear.weight.detach()
        if input_scale is not None:                 # AWQ-style: quantize W diag(s), divide the input by s
            w = w * input_scale[None, :]
            self.register_buffer("input_scale", input_scale.float())
        else:
            self.input_scale = None
        # group None: one scale per output row (per channel); else 176 inputs with group 32 -> groups of 16
        group = w.shape[1] if group is None else math.gcd(w.shape[1], group)
        self.bits, self.group = bits, group
        if bits == 8:
            if w.shape[1] % 16:  # torch 2.13's _weight_int8pack_mm segfaults on such widths (for more than one row)
                raise ValueError(f"int8 QuantLinear needs an input width divisible by 16, got {w.shape[1]}")
            q, s = int8_per_channel(w)
            self.register_buffer("qweight", q)
        elif bits in (2, 3, 4):
            q, s = int4_groupwise(w, group, bits)
            self.register_buffer("qweight", pack_int4(q))
        else:
            raise ValueError(f"bits must be 8, 4, 3 or 2, got {bits}")
        self.register_buffer("scale", s)
        if bits == 8:
            self.register_buffer("scale_bf16", s.bfloat16())

    def dequantized(self):
        if self.bits == 8:
            w = self.qweight.float() * self.scale[:, None]
        else:
            w = dequantize_int4(unpack_int4(self.qweight), self.scale, self.group)
        return w if self.input_scale is None else w / self.input_scale[None, :]     # the weight in x's units

    def forward(self, x):
        if self.bits == 8:
            if self.input_scale is not None:
                x = x / self.input_scale
            flat = x.reshape(-1, x.shape[-1]).bfloat16()
            out = torch._weight_int8pack_mm(flat, self.qweight, self.scale_bf16)
            return out.to(x.dtype).reshape(*x.shape[:-1], -1)
        return x @ self.dequantized().T


def quantize_model(model: nn.Module, bits: int = 8, group: int | None = 32, *, skip=("lm_head",),
                   input_scales: dict | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) except those named in ``skip``.

    ``input_scales`` (from :func:`awq_input_scales`) maps a layer's name to its AWQ-style per-input scale.
    """
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not any(s in full for s in skip):
                scale = None if input_scales is None else input_scales[full]
                setattr(module, child_name, QuantLinear(child, bits, group, scale))
    return model


def fake_quantize(w, bits: int, group: int | None):
    """Round ``w`` (out, in) to the symmetric grid QuantLinear uses and return it in float: the weight it computes with."""
    group = w.shape[1] if group is None else math.gcd(w.shape[1], group)
    levels = 2 ** (bits - 1) - 1                                              # 127 for int8, 7 for int4
    wg = w.reshape(w.shape[0], -1, group)
    scale = wg.abs().amax(dim=2, keepdim=True).clamp(min=1e-12) / levels
    return (torch.round(wg / scale).clamp(-levels, levels) * scale).reshape(w.shape)


@torch.no_grad()
def linear_inputs(model: nn.Module, batches, *, skip=("lm_head",), max_rows: int = 4096) -> dict:
    """The inputs every ``nn.Linear`` (but ``skip``) sees on ``batches`` of tokens: name -> (rows, in) float tensor."""
    seen, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and not any(s in name for s in skip):
            def hook(_module, args, name=name):
                seen.setdefault(name, []).append(args[0].reshape(-1, args[0].shape[-1]))
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        for tokens in batches:
            model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return {name: torch.cat(xs)[:max_rows] for name, xs in seen.items()}


@torch.no_grad()
def awq_input_scales(model: nn.Module, inputs: dict, bits: int = 4, group: int | None = 32,
                     alphas=(0.0, 0.25, 0.5, 0.75, 1.0)) -> dict:
    """AWQ-style activation-aware scales: per input channel ``s = mean|x|^alpha``, alpha chosen per layer.

    Input channels that carry large activations matter more to the output; multiplying their weight column by
    ``s`` before rounding gives them a finer grid (relative to their size), and dividing the input by ``s`` undoes it
    exactly in real arithmetic. Per layer, the alpha with the smallest output error ``|x W^T - (x/s) Q(W s)^T|^2``
    on the calibration inputs wins (alpha 0 is plain rounding, so the search never does worse on them).
    """
    modules = dict(model.named_modules())
    scales = {}
    for name, x in inputs.items():
        w = modules[name].weight
        magnitude = x.abs().mean(0).clamp(min=1e-6)                               # (in,)
        reference = x @ w.T
        best = (math.inf, None)
        for alpha in alphas:
            s = magnitude ** alpha
            s = s / (s.max() * s.min()).sqrt()                                   # centre the scales around 1
            error = ((x / s) @ fake_quantize(w * s, bits, group).T - reference).pow(2).mean().item()
            best = min(best, (error, s), key=lambda pair: pair[0])
        scales[name] = best[1]
    return scales


def torch_dynamic_int8(model: nn.Module) -> nn.Module:
    """PyTorch's own CPU int8 path: ``torch.ao.quantization.quantize_dynamic`` (int8 weights *and* activations).

    It is deprecated in favour of torchao and warns on every call; the warnings are silenced here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer (quantized weights and their scales included)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def kv_cache_bytes(n_layers: int, n_kv_heads: int, head_dim: int, seq_len: int, batch: int, bytes_per: int = 4) -> int:
    """2 (keys and values) * layers * KV heads * head_dim * positions * batch * bytes per number."""
    return 2 * n_layers * n_kv_heads * head_dim * seq_len * batch * bytes_per
