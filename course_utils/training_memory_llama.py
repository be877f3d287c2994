r"""Activation memory of a LLaMA-style layer (lesson 08, section 3, eq. 3b), and a block to measure it.

Korthikanti et al.'s count (eq. 3, :func:`course_utils.training_memory.activation_bytes_per_layer`)
is for GPT-style blocks: dropout masks, a 4h GELU MLP and an attention that stores its s x s
scores and probabilities. A LLaMA layer has no dropout, a SwiGLU MLP of width f (three matrices:
gate, up, down) and is trained with FlashAttention, which keeps only its output and one FP32
log-sum-exp per query and head. :func:`activation_bytes_llama` counts what such a layer saves for
backward, tensor by tensor; :class:`LlamaBlock` is a block that saves exactly that (RMSNorm written as
a fused kernel would save it: its input and one FP32 reciprocal RMS per token), so the lesson can
check the count against autograd's saved tensors to the byte.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def activation_bytes_llama(s: int, b: int, h: int, f: int, a: int, *, kv_heads: int | None = None,
                           flash: bool = True, t: int = 1, sequence_parallel: bool = False,
                           act_bytes: int = 2, stat_bytes: int = 4) -> float:
    r"""Bytes one LLaMA layer (RMSNorm, attention, SwiGLU, no dropout) keeps for backward (eq. 3b).

    ``act_bytes``: bytes per activation (2 for 16-bit); ``stat_bytes``: FP32 statistics (RMSNorm's
    reciprocal RMS, flash attention's log-sum-exp). ``flash=False``: an attention that stores its
    probabilities (b·a·s·s) for softmax and ``P @ V``; its output is then copied into (b, s, h) for
    W_o. ``t``: tensor-parallel degree (splits the heads and the SwiGLU width; the norm inputs and the
    linears' shared inputs are split too only with ``sequence_parallel``).
    """
    kv = h if kv_heads is None else kv_heads * (h // a)
    sb = s * b
    replicated = (2 * sb * h * act_bytes + 2 * sb * stat_bytes  # two RMSNorm inputs (the residual stream) + 1/rms
                  + sb * h * act_bytes  # the normed x, shared by W_q, W_k, W_v
                  + sb * h * act_bytes)  # the normed x, shared by gate and up
    q_k_v = sb * (h + 2 * kv) * act_bytes  # Q, K, V saved by the attention kernel
    if flash:  # output (b, s, a, d) storage, also W_o's input, + log-sum-exp (b, a, s)
        core = sb * h * act_bytes + a * sb * stat_bytes
    else:  # probabilities (b, a, s, s) + W_o's input, a (b, s, h) copy of the output
        core = a * s * sb * act_bytes + sb * h * act_bytes
    swiglu = 4 * sb * f * act_bytes  # gate output (SiLU input), SiLU output, up output, product (W_down input)
    return replicated / (t if sequence_parallel else 1) + (q_k_v + core + swiglu) / t


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm that saves what a fused kernel saves: the input and one FP32 1/rms per row."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        acc = torch.promote_types(x.dtype, torch.float32)  # FP32 statistics (FP64 stays FP64)
        rstd = torch.rsqrt(x.to(acc).square().mean(-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (x.to(acc) * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd  # recomputed from the saved input
        gw = (grad.to(rstd.dtype) * xhat).flatten(0, -2).sum(0).to(weight.dtype)
        gx_hat = grad.to(rstd.dtype) * weight.to(rstd.dtype)
        gx = rstd * (gx_hat - xhat * (gx_hat * xhat).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw, None


class FusedRMSNorm(nn.Module):
    """``nn.RMSNorm`` numerics with a fused kernel's saved tensors (PyTorch's CPU RMSNorm saves FP32 copies)."""

    def __init__(self, h: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight, self.eps)


class LlamaBlock(nn.Module):
    """One LLaMA decoder block: RMSNorm, causal SDPA attention (flash kernel on CPU), SwiGLU; no dropout."""

    def __init__(self, h: int, a: int, f: int, kv_heads: int | None = None):
        super().__init__()
        self.a, self.a_kv = a, a if kv_heads is None else kv_heads
        d = h // a
        self.attn_norm, self.mlp_norm = FusedRMSNorm(h), FusedRMSNorm(h)
        self.q, self.k = nn.Linear(h, h, bias=False), nn.Linear(h, self.a_kv * d, bias=False)
        self.v, self.o = nn.Linear(h, self.a_kv * d, bias=False), nn.Linear(h, h, bias=False)
        self.gate, self.up = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x):  # x: (b, s, h)
        B, S, H = x.shape
        y = self.attn_norm(x)
        q = self.q(y).view(B, S, self.a, -1).transpose(1, 2)  # (b, a, s, d)
        k = self.k(y).view(B, S, self.a_kv, -1).transpose(1, 2)  # (b, a_kv, s, d)
        v = self.v(y).view(B, S, self.a_kv, -1).transpose(1, 2)  # (b, a_kv, s, d)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.a_kv != self.a)
        x = x + self.o(att.transpose(1, 2).reshape(B, S, H))  # residual 1, (b, s, h)
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))  # residual 2, SwiGLU


__all__ = ["activation_bytes_llama", "FusedRMSNorm", "LlamaBlock"]
