"""Checks of the training-memory problem set (``solutions/08_training_memory.ipynb``).

Each ``check_*`` runs the learner's function on fresh random inputs (``seed=None``) against a private
reference built from :mod:`course_utils.training_memory` and names the likely mistake. The formulas are
derived in ``notebooks/08_training_memory.ipynb``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function
from ..classroom.released import Gated, ScaledByFirst, HalvesProduct, HalfKept
from ..training_memory import GB, GiB, TransformerShape, activation_bytes_per_layer, count_parameters, saved_tensors
from ..training_memory_plan import zero_bytes_per_gpu

# For the by-hand watch (passed as by_hand=ByHand.of(BY_HAND_X); "allowed_ops" only documents):
# exercises 1-5 are integer/float formulas (no tensor op
# computes them; the course's planners are refused by name), exercise 6 needs the saved-tensors hooks and
# storage queries, and no aten op computes its result.
_LESSON = ("course_utils.training_memory",)  # lesson modules refused by hand (course_utils.training_memory_* too)
BY_HAND_GQA_PARAMETER_COUNT = {"modules": _LESSON, "allowed_ops": (), "whole_result_ops": ()}
BY_HAND_ADAM_STATE_GIB = {"modules": _LESSON, "allowed_ops": (), "whole_result_ops": ()}
BY_HAND_ACTIVATION_BYTES_TP = {"modules": _LESSON, "allowed_ops": (), "whole_result_ops": ()}
BY_HAND_ZERO2_BYTES = {"modules": _LESSON, "allowed_ops": (), "whole_result_ops": ()}
BY_HAND_MIN_GPUS = {"modules": _LESSON, "allowed_ops": (), "whole_result_ops": ()}
BY_HAND_SAVED_BYTES = {"modules": _LESSON, "allowed_ops": ("the module's own forward ops",), "whole_result_ops": ()}


# ---------------------------------------------------------------- exercise 1: GQA parameter count
def _shape_from(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) -> TransformerShape:
    return TransformerShape(int(vocab), int(hidden), int(layers), int(heads), int(ffn), int(kv_heads), bool(tied),
                            qkv_bias=bool(qkv_bias))


def _reference_gqa_parameter_count(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
    return count_parameters(_shape_from(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias))


def _gqa_inputs(rng):
    heads = int(rng.choice([8, 16, 32, 64]))
    kv_heads = int(rng.choice([d for d in (1, 2, 4, 8) if d < heads]))
    hidden = heads * int(rng.choice([32, 64, 128]))
    return dict(vocab=int(rng.integers(1000, 130000)), hidden=hidden, layers=int(rng.integers(2, 48)), heads=heads,
                kv_heads=kv_heads, ffn=64 * int(rng.integers(hidden // 32, hidden // 16)), tied=bool(rng.integers(2)),
                qkv_bias=bool(rng.integers(2)))


def check_gqa_parameter_count(fn: Callable, *, seed: int | None = None, trials: int = 6, quiet: bool = False) -> None:
    """Exercise 1: parameters of a LLaMA-style model with grouped-query attention, optional tying and q/k/v biases."""
    ref = _reference_gqa_parameter_count

    def twice(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return ref(vocab, hidden, layers, heads, kv_heads, ffn, False, qkv_bias)

    def full_kv(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return ref(vocab, hidden, layers, heads, heads, ffn, tied, qkv_bias)

    def no_bias(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return ref(vocab, hidden, layers, heads, kv_heads, ffn, tied, False)

    def bias_full(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        extra = layers * 2 * (hidden - kv_heads * hidden // heads) if qkv_bias else 0
        return ref(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) + extra

    def no_norms(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return ref(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) - (2 * layers + 1) * hidden

    def two_mlp(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
        return ref(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias) - layers * hidden * ffn

    mistakes = [
        Mistake("tied twice", "with tied embeddings the output head IS the embedding matrix: count V·h once.", twice),
        Mistake("full kv", "W_k and W_v map h to kv_heads·head_dim, not to h: use kv_heads, not heads.", full_kv),
        Mistake("no bias", "with qkv_bias, add the biases of W_q, W_k, W_v: h + 2·kv_heads·head_dim per layer.", no_bias),
        Mistake("bias full", "the biases of W_k and W_v have kv_heads·head_dim entries, not h.", bias_full),
        Mistake("no norms", "add the RMSNorm weights: two vectors of size h per layer plus the final one.", no_norms),
        Mistake("two mlp", "a SwiGLU MLP has three matrices (gate, up, down), not two.", two_mlp),
    ]
    combos = iter([(t, q) for t in (True, False) for q in (True, False)] * trials)  # trial k: combination k mod 4

    def inputs(rng):  # every (tied, qkv_bias) combination within 4 trials, so each named mistake can show
        tied, qkv_bias = next(combos)
        return {**_gqa_inputs(rng), "tied": tied, "qkv_bias": qkv_bias}

    check_function(fn, ref, inputs, name="gqa_parameter_count", trials=trials, seed=seed, mistakes=mistakes,
                   by_hand=ByHand.of(BY_HAND_GQA_PARAMETER_COUNT),
                   forbidden=("course_utils.training_memory.count_parameters",
                              "course_utils.training_memory.parameter_breakdown",
                              "course_utils.grading.training_memory._reference_gqa_parameter_count"), quiet=quiet)


# ---------------------------------------------------------------- exercise 2: GiB of Adam model states
def _reference_adam_state_gib(n_params, weight_bytes, grad_bytes):
    master = 4 if weight_bytes < 4 else 0
    return n_params * (weight_bytes + grad_bytes + master + 8) / GiB


def _adam_inputs(rng):
    return (int(rng.integers(10**8, 10**11)), int(rng.choice([2, 4])), int(rng.choice([2, 4])))


def _gb_variant(n, w, g):
    return _reference_adam_state_gib(n, w, g) * GiB / GB


def check_adam_state_gib(fn: Callable, *, seed: int | None = None, trials: int = 6, quiet: bool = False) -> None:
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
    check_function(fn, _reference_adam_state_gib, _adam_inputs, name="adam_state_gib", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_ADAM_STATE_GIB),
                   mistakes=mistakes, forbidden=("course_utils.training_memory.model_state_bytes",
                                                 "course_utils.grading.training_memory._reference_adam_state_gib"), quiet=quiet)


# ---------------------------------------------------------------- exercise 3: activations with tensor parallelism
def _reference_activation_bytes_tp(s, b, h, a, t, selective):
    return activation_bytes_per_layer(s, b, h, a, t=t, recompute="selective" if selective else "none")


def _act_inputs(rng):
    a = int(rng.choice([8, 16, 32, 64]))
    h = a * int(rng.choice([64, 128]))
    t = int(rng.choice([d for d in (2, 4, 8) if d != a]))  # t = a and s = 2h would make two named mistakes coincide
    return (int(rng.choice([512, 1024, 2048, 4096, 8192])), int(rng.integers(1, 9)), h, a, t, bool(rng.integers(2)))


def check_activation_bytes_tp(fn: Callable, *, seed: int | None = None, trials: int = 6, quiet: bool = False) -> None:
    """Exercise 3: per-layer activation bytes with tensor parallelism and optional selective recomputation."""
    ref = _reference_activation_bytes_tp
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
                lambda s, b, h, a, t, sel: ref(s, b, h, a, t, False)),
    ]
    check_function(fn, ref, _act_inputs, name="activation_bytes_tp", trials=trials, seed=seed, mistakes=mistakes,
                   by_hand=ByHand.of(BY_HAND_ACTIVATION_BYTES_TP),
                   forbidden=("course_utils.training_memory.activation_bytes_per_layer",
                              "course_utils.grading.training_memory._reference_activation_bytes_tp"), quiet=quiet)


# ---------------------------------------------------------------- exercise 4: ZeRO-2
def _recipe_key(accum):
    return "mixed_adam_fp32_accum" if accum else "mixed_adam"


def _reference_zero2_bytes(n_params, n_ranks, fp32_grad_accum):
    return sum(zero_bytes_per_gpu(n_params, _recipe_key(fp32_grad_accum), n_ranks, 2).values())


def _zero2_inputs(rng):
    return (int(rng.integers(10**8, 2 * 10**11)), int(rng.choice([2, 8, 16, 64, 256])), bool(rng.integers(2)))


def check_zero2_bytes(fn: Callable, *, seed: int | None = None, trials: int = 6, quiet: bool = False) -> None:
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
    check_function(fn, _reference_zero2_bytes, _zero2_inputs, name="zero2_bytes", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_ZERO2_BYTES),
                   mistakes=mistakes, forbidden=("course_utils.training_memory_plan.zero_bytes_per_gpu",
                                                 "course_utils.grading.training_memory._reference_zero2_bytes"), quiet=quiet)


# ---------------------------------------------------------------- exercise 5: the fewest GPUs
def _gpus_for(n_params, activation_gb, gpu_gb, *, bytes_per_param=16, capacity_unit=GB, with_act=True,
              rounding=math.ceil):
    free = gpu_gb * capacity_unit - (activation_gb * GB if with_act else 0)
    return int(rounding(bytes_per_param * n_params / free))


def _reference_min_gpus(n_params, activation_gb, gpu_gb):
    return _gpus_for(n_params, activation_gb, gpu_gb)


def _min_gpus_inputs():
    """Every other trial divides exactly: n_params fills a whole number of GPUs to the byte (integer GB, so no rounding)."""
    trial = [0]

    def make(rng):
        gpu = int(rng.choice([40, 80, 141]))
        exact = trial[0] % 2 == 0
        trial[0] += 1
        if exact:  # activations 30-50 % of the GPU and 20+ GPUs keep the named mistakes' answers apart
            act = int(rng.integers(3 * gpu // 10, gpu // 2 + 1))
            n_gpus = int(rng.integers(20, 300))
            return ((gpu - act) * GB * n_gpus // 16, act, gpu)  # 16 bytes/param: exactly n_gpus GPUs full
        return (int(rng.integers(10**9, 3 * 10**11)), round(float(rng.uniform(0.05, 0.6)) * gpu, 1), gpu)
    return make


def check_min_gpus(fn: Callable, *, seed: int | None = None, trials: int = 6, quiet: bool = False) -> None:
    """Exercise 5: the fewest GPUs for ZeRO-3 mixed-precision Adam (16 bytes/param) plus activations."""
    mistakes = [
        Mistake("floor", "round the GPU count up (math.ceil): a fraction of a GPU still needs a whole one.",
                lambda n, act, gpu: _gpus_for(n, act, gpu, rounding=math.floor)),
        Mistake("GiB", "'80 GB' on a datasheet means 80·10**9 bytes, the unit of activation_gb too: do not use 2**30.",
                lambda n, act, gpu: _gpus_for(n, act, gpu, capacity_unit=GiB)),
        Mistake("no activations", "each GPU also holds its activations: subtract activation_gb from the capacity first.",
                lambda n, act, gpu: _gpus_for(n, act, gpu, with_act=False)),
        Mistake("no master", "mixed-precision Adam is 16 bytes/param: 2 + 2 + 4 (FP32 master) + 8 (m, v).",
                lambda n, act, gpu: _gpus_for(n, act, gpu, bytes_per_param=12)),
        Mistake("floor plus one", "when the model states fill the GPUs exactly, N = 16·n_params / free GPUs suffice: "
                "round up with math.ceil, not int(...) + 1 (or // + 1), which adds a GPU on exact divisions.",
                lambda n, act, gpu: _gpus_for(n, act, gpu, rounding=lambda v: math.floor(v) + 1)),
    ]
    check_function(fn, _reference_min_gpus, _min_gpus_inputs(), name="min_gpus", trials=trials, seed=seed,
                   by_hand=ByHand.of(BY_HAND_MIN_GPUS),
                   mistakes=mistakes, forbidden=("course_utils.grading.training_memory._reference_min_gpus",), quiet=quiet)


# ---------------------------------------------------------------- exercise 6: bytes saved for backward
def _reference_saved_bytes_beyond_input(module, x) -> int:
    """Bytes of distinct storages autograd saves in ``module(x)`` beyond the parameters and ``x``."""
    with saved_tensors(list(module.parameters()) + [x]) as log:
        module(x)
    return log.nbytes


def _probe_inputs():
    """Small random modules. The first four trials always save one tensor twice, a tensor and a view of it
    at the same address, two views at different addresses, and a view smaller than its storage; later
    trials draw any of the six kinds."""
    trial = [0]

    def make(rng):
        torch.manual_seed(int(rng.integers(2**31)))
        h = int(rng.choice([16, 32, 48]))
        kind = trial[0] if trial[0] < 4 else int(rng.integers(6))
        trial[0] += 1
        if kind == 0:  # the 3h-wide hidden activation is saved twice inside Gated
            module = nn.Sequential(nn.Linear(h, 3 * h), Gated(3 * h), nn.Linear(3 * h, h))
        elif kind == 1:
            module = nn.Sequential(nn.Linear(h, 2 * h), ScaledByFirst(2 * h))
        elif kind == 2:
            module = nn.Sequential(nn.Linear(h, h), HalvesProduct(h))
        elif kind == 3:
            module = nn.Sequential(nn.Linear(h, h), HalfKept(h), nn.Linear(h, h))
        elif kind == 4:
            module = nn.Sequential(nn.LayerNorm(h), nn.Linear(h, 2 * h), nn.GELU(), nn.Linear(2 * h, h))
        else:
            module = nn.Sequential(nn.Linear(h, 2 * h), Gated(2 * h))
        x = torch.randn(int(rng.integers(2, 9)), h, requires_grad=True)
        return dict(module=module, x=x)  # keywords: check_function passes them uncopied (keeps requires_grad)
    return make


def _count_saved(module, x, *, key, size, skip_params=True, skip_input=True) -> int:
    """A family of plausible wrong counts: dedup by ``key(t)`` (None: no dedup), bytes by ``size(t)``."""
    skip = {t.untyped_storage().data_ptr() for t in [*(module.parameters() if skip_params else ()), *([x] if skip_input else [])]}
    seen: dict = {}
    total = [0]

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            k = key(t)
            if k is None:
                total[0] += size(t)
            else:
                seen[k] = size(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return total[0] + sum(seen.values())


def _storage_key(t):
    return t.untyped_storage().data_ptr()


def _storage_size(t):
    return t.untyped_storage().nbytes()


def _view_size(t):
    return t.numel() * t.element_size()


def check_saved_bytes(fn: Callable, *, seed: int | None = None, trials: int = 5, quiet: bool = False) -> None:
    """Exercise 6: bytes autograd saves for backward beyond the parameters and the input, via saved_tensors_hooks."""
    mistakes = [
        Mistake("params", "the parameters exist anyway: exclude their storages (module.parameters()) from the count.",
                lambda module, x: _count_saved(module, x, key=_storage_key, size=_storage_size, skip_params=False)),
        Mistake("input", "the input x exists anyway (the caller holds it): exclude its storage from the count.",
                lambda module, x: _count_saved(module, x, key=_storage_key, size=_storage_size, skip_input=False)),
        Mistake("elements", "count bytes, not elements: t.untyped_storage().nbytes() is the bytes of the whole "
                "allocation (numel() counts only the view's elements).",
                lambda module, x: _reference_saved_bytes_beyond_input(module, x) // 4),
        Mistake("dedup by data_ptr", "two views of one storage (the halves of y.chunk(2)) have different t.data_ptr() "
                "but share one allocation: key the count on t.untyped_storage().data_ptr(), not t.data_ptr().",
                lambda module, x: _count_saved(module, x, key=lambda t: t.data_ptr(), size=_storage_size)),
        Mistake("dedup by id", "a tensor and a view of it (y and y[:, :1]) are different Python objects with different "
                "id() but one allocation: key the count on t.untyped_storage().data_ptr(), not id(t).",
                lambda module, x: _count_saved(module, x, key=id, size=_storage_size)),
        Mistake("no dedup", "one tensor saved twice (here by a linear layer and by a product) occupies memory once: "
                "count unique storages, keyed by t.untyped_storage().data_ptr().",
                lambda module, x: _count_saved(module, x, key=lambda t: None, size=_storage_size)),
        Mistake("view bytes", "a saved view keeps its WHOLE storage alive (here half of fc(x) keeps all of it): count "
                "t.untyped_storage().nbytes(), not t.numel() * t.element_size().",
                lambda module, x: _count_saved(module, x, key=_storage_key, size=_view_size)),
    ]
    check_function(fn, _reference_saved_bytes_beyond_input, _probe_inputs(), name="saved_bytes", trials=trials,
                   by_hand=ByHand.of(BY_HAND_SAVED_BYTES),
                   seed=seed, mistakes=mistakes, check_inputs_unchanged=False,
                   forbidden=("course_utils.training_memory.SavedTensorLog.pack", "course_utils.training_memory.saved_bytes",
                              "course_utils.grading.training_memory._reference_saved_bytes_beyond_input"), quiet=quiet)


__all__ = ["check_gqa_parameter_count", "check_adam_state_gib", "check_activation_bytes_tp", "check_zero2_bytes",
           "check_min_gpus", "check_saved_bytes"]


# ---------------------------------------------------------------- exercise 7: a LLaMA block's MLP half, measured
from .training_memory_llama import LlamaMLPHalf, check_llama_mlp_saved_bytes  # noqa: E402,F401
