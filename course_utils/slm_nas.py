"""Nemotron in miniature: per-layer block variants, block distillation, assembly, global distillation (lesson 07c).

Llama-3.1-Nemotron-51B was made from Llama-3.1-70B by (1) building, for every layer, a library of cheaper
blocks (attention with fewer KV heads or none, a narrower FFN or none), (2) training each variant to reproduce the
parent block's output *on the parent block's inputs* (block distillation: every layer and variant independently),
(3) choosing one variant per layer under a cost budget, and (4) a short distillation of the assembled model on the
parent's logits. This module does the same to the 4-layer byte model of lessons 07a/07b.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .bench import single_thread
from .progress import progress
from .slm import DecoderBlock, SLMConfig, TinyDecoder, rope_angles, with_layers
from .slm_train import get_batch


def variant_specs(config: SLMConfig) -> dict[str, tuple[int, int]]:
    """Name -> (n_kv_heads or 0, ffn_dim or 0): the per-layer library, parent first, identity last."""
    kv, f = config.n_kv_heads, config.ffn_dim
    return {"parent": (kv, f), "1 KV head": (1, f), "FFN 1/2": (kv, f // 2), "FFN 1/4": (kv, f // 4),
            "no attention": (0, f), "attention only": (kv, 0), "identity": (0, 0)}


def init_from_parent(parent: DecoderBlock, config: SLMConfig, spec: tuple[int, int]) -> DecoderBlock:
    """A variant block initialized from the parent's weights.

    Fewer KV heads: the mean of each group's key/value heads (the GQA conversion of Ainslie et al.).
    Narrower FFN: the hidden channels with the largest product of gate-row and down-column norms.
    """
    block = DecoderBlock(config, *spec)
    n_kv, ffn = spec
    with torch.no_grad():
        if n_kv:
            block.input_layernorm.load_state_dict(parent.input_layernorm.state_dict())
            src, dst = parent.self_attn, block.self_attn
            dst.q_proj.weight.copy_(src.q_proj.weight)
            dst.o_proj.weight.copy_(src.o_proj.weight)
            d, group = config.head_dim, src.n_kv_heads // n_kv
            for name in ("k_proj", "v_proj"):
                w = getattr(src, name).weight.view(n_kv, group, d, config.dim)            # (Hkv', group, D, C)
                getattr(dst, name).weight.copy_(w.mean(1).reshape(n_kv * d, config.dim))
        if ffn:
            block.post_attention_layernorm.load_state_dict(parent.post_attention_layernorm.state_dict())
            m = parent.mlp
            score = m.gate_proj.weight.norm(dim=1) * m.down_proj.weight.norm(dim=0)            # (F,)
            keep = score.topk(ffn).indices.sort().values
            block.mlp.gate_proj.weight.copy_(m.gate_proj.weight[keep])
            block.mlp.up_proj.weight.copy_(m.up_proj.weight[keep])
            block.mlp.down_proj.weight.copy_(m.down_proj.weight[:, keep])
    return block


@torch.no_grad()
def decode_bytes_per_token(config: SLMConfig, spec: tuple[int, int], *, batch: int = 8, context: int = 256,
                           bytes_per: int = 4) -> float:
    """Bytes one block reads per generated token in a decode step (lesson 07c, eq. 1).

    The weights are read once per step and shared by the ``batch`` sequences; each sequence reads its own
    ``context`` cached keys and values (``2 * n_kv * head_dim`` numbers per position) if the block has attention.
    """
    n_kv, ffn = spec
    c, d = config.dim, config.head_dim
    weights = (2 * c * c + 2 * c * n_kv * d if n_kv else 0) + 3 * c * ffn
    return bytes_per * (weights / batch + 2 * n_kv * d * context)


@torch.no_grad()
def replace_one_block_kl(parent: TinyDecoder, blocks, tokens, *, batch: int = 8, seq_len: int = 128,
                         n_batches: int = 2, seed: int = 3) -> dict:
    """Puzzle's block score: KL(parent || parent with only layer i replaced by ``blocks[i, name]``), nats per byte.

    Unlike the local error of eq. (3), it sees what the rest of the network does with the block's output.
    """
    gen = torch.Generator().manual_seed(seed)
    windows = [get_batch(tokens, batch, seq_len, gen)[0] for _ in range(n_batches)]
    targets = [F.log_softmax(parent(x), -1) for x in windows]
    scores = {}
    for (i, name), block in blocks.items():
        original, parent.layers[i] = parent.layers[i], block             # swap one block in, put it back after
        try:
            kl = [F.kl_div(F.log_softmax(parent(x), -1), t, log_target=True, reduction="sum").item() / t[..., 0].numel()
                  for x, t in zip(windows, targets)]
        finally:
            parent.layers[i] = original
        scores[i, name] = sum(kl) / len(kl)
    return scores


def block_io(parent: TinyDecoder, tokens, n_batches: int, batch: int, seq_len: int, seed: int):
    """The parent's hidden states on fixed windows: ``hidden[i]`` is layer i's input, ``hidden[i+1]`` its output."""
    gen = torch.Generator().manual_seed(seed)
    runs = [parent(get_batch(tokens, batch, seq_len, gen)[0], return_hidden=True)[1] for _ in range(n_batches)]
    return [torch.cat([r[i] for r in runs]) for i in range(parent.config.n_layers + 1)]      # each (N, T, C)


def relative_error(out, x, y) -> float:
    """How much of the parent block's update y - x the variant misses: |out - y|^2 / |y - x|^2 (identity: 1)."""
    return ((out - y).pow(2).sum() / (y - x).pow(2).sum()).item()


def distill_block(block: DecoderBlock, x, y, config: SLMConfig, *, steps: int = 30, lr: float = 1e-3, batch: int = 4,
                  seed: int = 0):
    """Train ``block`` so that block(x) matches the parent block's output y (MSE), on the parent's inputs x."""
    if not list(block.parameters()):
        return block.eval()                                                 # identity: nothing to train
    cos, sin = rope_angles(torch.arange(x.shape[1]), config.head_dim, config.rope_base)
    opt = torch.optim.Adam(block.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        loss = F.mse_loss(block(x[idx], cos, sin), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return block.eval()


def block_library(parent: TinyDecoder, train_io, held_io, *, steps: int = 30, desc: str = "block distillation"):
    """Every (layer, variant): initialized from the parent, block-distilled; returns blocks and held-out errors."""
    config, specs = parent.config, variant_specs(parent.config)
    blocks, errors = {}, {}
    jobs = [(i, name) for i in range(config.n_layers) for name in specs]
    with single_thread():
        for i, name in progress(jobs, desc=desc):
            block = init_from_parent(parent.layers[i], config, specs[name])
            if name != "parent":
                distill_block(block, train_io[i], train_io[i + 1], config, steps=steps, seed=i)
            x, y = held_io[i], held_io[i + 1]
            cos, sin = rope_angles(torch.arange(x.shape[1]), config.head_dim, config.rope_base)
            with torch.no_grad():
                errors[i, name] = relative_error(block(x, cos, sin), x, y)
            blocks[i, name] = block
    return blocks, errors


def assemble(parent: TinyDecoder, blocks, choice) -> TinyDecoder:
    """A child with layer i = ``blocks[i, choice[i]]``, the parent's embedding, final norm and head."""
    specs = variant_specs(parent.config)
    child = TinyDecoder(with_layers(parent.config, [specs[name] for name in choice]))
    child.embed_tokens.load_state_dict(parent.embed_tokens.state_dict())
    child.norm.load_state_dict(parent.norm.state_dict())
    child.lm_head.load_state_dict(parent.lm_head.state_dict())
    for i, name in enumerate(choice):
        child.layers[i] = copy.deepcopy(blocks[i, name])
    return child.eval()


def global_distill(child: TinyDecoder, parent: TinyDecoder, tokens, *, steps: int = 40, lr: float = 1e-3,
                   batch: int = 8, seq_len: int = 128, seed: int = 0) -> TinyDecoder:
    """Train the whole child on KL(parent || child) of next-byte distributions."""
    child = copy.deepcopy(child).train()
    opt = torch.optim.AdamW(child.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    with single_thread():
        for _ in range(steps):
            x, _ = get_batch(tokens, batch, seq_len, gen)
            with torch.no_grad():
                target = F.log_softmax(parent(x), -1)
            loss = F.kl_div(F.log_softmax(child(x), -1), target, log_target=True, reduction="batchmean") / seq_len
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return child.eval()
