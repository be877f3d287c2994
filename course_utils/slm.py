"""A small Llama-style decoder, block by block (lessons 07a and 07b).

Lesson 07a writes each block by hand (RMSNorm, rotary positions, grouped-query attention, the SwiGLU
feed-forward, the KV cache) and checks it against the versions here; this module is what later cells,
lesson 07b and the tests import. Parameter names follow Hugging Face's ``LlamaForCausalLM`` (``q_proj``,
``gate_proj``, ``input_layernorm``...), so :func:`hf_state_dict` is a renaming, and a model built here
gives the same logits as ``transformers``' implementation loaded with the same weights.

Conventions: activations are ``(B, T, C)``; heads are ``(B, H, T, D)``; rotary positions rotate the pairs
``(i, i + D/2)`` (the "rotate half" pairing of Hugging Face's Llama, not Meta's adjacent pairs).
Every block may have fewer key/value heads (GQA/MQA), no attention, a narrower feed-forward or none:
that is how lesson 07b builds the per-layer variants of a Nemotron-style search.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class SLMConfig:
    """Shape of a decoder. The CPU preset below trains in a few seconds per hundred steps."""

    vocab_size: int = 256        # bytes: no tokenizer to ship
    dim: int = 64                # model width C
    n_layers: int = 4            # decoder blocks
    n_heads: int = 4             # query heads H
    n_kv_heads: int = 2          # key/value heads (H: MHA, 1: MQA, between: GQA)
    ffn_dim: int = 176           # SwiGLU hidden width, about 8/3 * dim (a 4x GELU MLP's parameters)
    max_seq_len: int = 256       # longest sequence the KV cache holds
    rope_base: float = 10000.0   # theta in the rotary frequencies theta^(-2i/D)
    eps: float = 1e-5            # RMSNorm's epsilon
    layers: tuple = field(default=())  # optional per-layer (n_kv_heads or 0, ffn_dim or 0); () = uniform

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def layer_spec(self, i: int) -> tuple[int, int]:
        """``(n_kv_heads, ffn_dim)`` of layer ``i``; 0 means the sub-block is absent."""
        return tuple(self.layers[i]) if self.layers else (self.n_kv_heads, self.ffn_dim)


def swiglu_width(dim: int, multiple: int = 16) -> int:
    """The SwiGLU hidden width with the parameters of a 4*dim GELU MLP: 2/3 * 4 * dim, rounded up.

    A multiple of 16, because PyTorch's fused int8 CPU kernel (lesson 07b) crashes on other input widths.
    """
    return multiple * math.ceil(8 * dim / 3 / multiple)


# ------------------------------------------------------------------ blocks
class RMSNorm(nn.Module):
    r"""y = x / sqrt(mean(x^2) + eps) * weight (lesson 07a, eq. 1), computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_angles(positions, head_dim: int, base: float = 10000.0):
    """``(cos, sin)`` of shape ``(T, D)`` for integer ``positions`` (T,): angle p * base^(-2i/D), repeated for both halves."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))  # (D/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]                                            # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)                                                       # (T, D)
    return angles.cos(), angles.sin()


def rotate_pairs(x, cos, sin):
    """Rotate each pair (x_i, x_{i+D/2}) of ``x`` (..., T, D) by the angles in ``cos``/``sin`` (T, D)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)   # "rotate half"
    return x * cos + rotated * sin


def expand_kv_heads(x, n_rep: int):
    """(B, Hkv, T, D) -> (B, Hkv * n_rep, T, D): each key/value head serves n_rep consecutive query heads."""
    if n_rep == 1:
        return x
    b, h, t, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, t, d).reshape(b, h * n_rep, t, d)


class KVCache:
    """Preallocated keys and values for every attention layer: ``(B, Hkv, max_len, D)`` each, and a length."""

    def __init__(self, config: SLMConfig, batch: int, max_len: int | None = None, dtype=torch.float32):
        self.max_len = max_len or config.max_seq_len
        self.length = 0
        self.k, self.v = {}, {}
        for i in range(config.n_layers):
            n_kv = config.layer_spec(i)[0]
            if n_kv:
                shape = (batch, n_kv, self.max_len, config.head_dim)
                self.k[i], self.v[i] = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.k.values(), *self.v.values()])


class Attention(nn.Module):
    """Causal grouped-query attention with rotary positions and an optional KV cache."""

    def __init__(self, config: SLMConfig, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, n_kv_heads, config.head_dim
        self.q_proj = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)      # (B, H, T, D)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, Hkv, T, D)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, Hkv, T, D)
        q, k = rotate_pairs(q, cos, sin), rotate_pairs(k, cos, sin)
        start = 0
        if cache is not None:
            start = cache.length
            cache.k[layer][:, :, start:start + t] = k          # write the new positions only
            cache.v[layer][:, :, start:start + t] = v
            k, v = cache.k[layer][:, :, :start + t], cache.v[layer][:, :, :start + t]      # (B, Hkv, L+T, D)
        if start == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # query i sits at absolute position start + i and sees keys 0..start+i
            mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))                        # (B, T, C)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)): the gated feed-forward of Llama-style models."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderBlock(nn.Module):
    """x + attn(norm(x)), then + ffn(norm(x)); either sub-block may be absent (``n_kv_heads`` or ``ffn_dim`` 0)."""

    def __init__(self, config: SLMConfig, n_kv_heads: int, ffn_dim: int):
        super().__init__()
        self.spec = (n_kv_heads, ffn_dim)
        if n_kv_heads:
            self.input_layernorm = RMSNorm(config.dim, config.eps)
            self.self_attn = Attention(config, n_kv_heads)
        if ffn_dim:
            self.post_attention_layernorm = RMSNorm(config.dim, config.eps)
            self.mlp = SwiGLU(config.dim, ffn_dim)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0):
        if self.spec[0]:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
        if self.spec[1]:
            x = x + self.mlp(self.post_attention_layernorm(x))
        return x


class TinyDecoder(nn.Module):
    """Embedding, ``n_layers`` decoder blocks, a final RMSNorm and an untied output head."""

    def __init__(self, config: SLMConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(DecoderBlock(config, *config.layer_spec(i)) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.eps)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens, cache: KVCache | None = None, return_hidden: bool = False):
        """Logits ``(B, T, V)`` for ``tokens`` ``(B, T)``; with a cache, the tokens continue it."""
        start = cache.length if cache is not None else 0
        cos, sin = rope_angles(torch.arange(start, start + tokens.shape[1]), self.config.head_dim, self.config.rope_base)
        x = self.embed_tokens(tokens)                         # (B, T, C)
        hidden = [x]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i)
            hidden.append(x)
        if cache is not None:
            cache.length += tokens.shape[1]
        logits = self.lm_head(self.norm(x))                   # (B, T, V)
        return (logits, hidden) if return_hidden else logits


def _init_weights(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)


def count_module_parameters(model: nn.Module, *, embeddings: bool = True) -> int:
    """The elements of a module's parameter tensors (``embeddings=False``: those outside the embedding).

    Counts a built model; :func:`course_utils.training_memory.count_parameters` computes the count from a shape."""
    return sum(p.numel() for name, p in model.named_parameters() if embeddings or "embed" not in name)



@torch.no_grad()
def generate(model: TinyDecoder, prompt, n_new: int, *, temperature: float = 0.0, generator=None, use_cache: bool = True):
    """Greedy (temperature 0) or sampled continuation of ``prompt`` (B, T); returns (B, T + n_new)."""
    tokens = prompt
    cache = KVCache(model.config, prompt.shape[0], prompt.shape[1] + n_new) if use_cache else None
    logits = model(prompt, cache)[:, -1]                      # prefill: (B, V)
    for _ in range(n_new):
        if temperature == 0:
            nxt = logits.argmax(-1, keepdim=True)
        else:
            nxt = torch.multinomial(F.softmax(logits / temperature, -1), 1, generator=generator)
        tokens = torch.cat([tokens, nxt], dim=1)
        logits = (model(nxt, cache) if use_cache else model(tokens))[:, -1]   # decode: one token
    return tokens


# ------------------------------------------------------------------ Hugging Face interop
def hf_config(config: SLMConfig):
    """The ``transformers.LlamaConfig`` of the same shape (no download: built from arguments)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.dim, intermediate_size=config.ffn_dim,
                       num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads,
                       num_key_value_heads=config.n_kv_heads, max_position_embeddings=config.max_seq_len,
                       rms_norm_eps=config.eps, rope_theta=config.rope_base, tie_word_embeddings=False,
                       attention_bias=False, mlp_bias=False)


def hf_state_dict(model: TinyDecoder) -> dict:
    """Our parameter names -> ``LlamaForCausalLM``'s: everything but the head lives under ``model.``."""
    return {(k if k.startswith("lm_head") else "model." + k): v for k, v in model.state_dict().items()}


def with_layers(config: SLMConfig, layers) -> SLMConfig:
    """A copy of ``config`` whose layer ``i`` has ``layers[i] = (n_kv_heads or 0, ffn_dim or 0)``."""
    return replace(config, layers=tuple(tuple(s) for s in layers))
