"""Tests of course_utils.grading.training_memory: every check of the lesson-08 problem set passes the
solution and a right answer written differently, raises NotAttempted on a stub, names each listed
mistake with its own hint, rejects the course's shortcuts as forbidden and a hard-coded answer on
fresh inputs."""
from __future__ import annotations

import math

import pytest
import torch

import course_utils.training_memory as tm
from course_utils.checks import CheckFailed, NotAttempted
from course_utils.grading import training_memory as g
from _grading_helpers import fails_with  # noqa: E402
from _grading_helpers import each_mistake_is_named, right_answers_pass  # noqa: E402


# ---------------------------------------------------------------- the solutions, as in solutions/08
def gqa_solution(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
    kv_dim = kv_heads * (hidden // heads)
    attention = 2 * hidden * hidden + 2 * hidden * kv_dim + ((hidden + 2 * kv_dim) if qkv_bias else 0)
    return vocab * hidden + layers * (attention + 3 * hidden * ffn + 2 * hidden) + hidden + (0 if tied else vocab * hidden)


def gqa_other(vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias):
    head_dim = hidden // heads
    per_layer = sum([hidden * hidden, hidden * kv_heads * head_dim * 2, hidden * hidden, 3 * ffn * hidden, 2 * hidden])
    per_layer += (heads + 2 * kv_heads) * head_dim * qkv_bias
    return (2 - tied) * vocab * hidden + layers * per_layer + hidden


def adam_solution(n, w, grad):
    return n * (w + grad + (4 if w < 4 else 0) + 8) / 2**30


def adam_other(n, w, grad):
    master = {2: 4, 4: 0}[w]
    return (n * w + n * grad + n * master + 2 * 4 * n) / 1024**3


def act_solution(s, b, h, a, t, selective):
    return 10 * s * b * h + 24 * s * b * h / t + (0 if selective else 5 * a * s * s * b / t)


def act_other(s, b, h, a, t, selective):
    sbh = s * b * h
    return sbh * (10 + (24 + (0 if selective else 5 * a * s / h)) / t)


def zero2_solution(n, nd, acc):
    return 2 * n + (2 + (4 if acc else 0) + 12) * n / nd


def zero2_other(n, nd, acc):
    grads = n * (6 if acc else 2)
    return 2.0 * n + grads / nd + 12.0 * n / nd


def min_gpus_solution(n, act, gpu):
    return math.ceil(16 * n / ((gpu - act) * 1e9))


def min_gpus_other(n, act, gpu):
    free = gpu * 10**9 - act * 10**9
    whole, rest = divmod(16 * n, free)
    return int(whole) + (1 if rest > 0 else 0)


def saved_solution(module, x):
    exclude = {t.untyped_storage().data_ptr() for t in [*module.parameters(), x]}
    storages = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in exclude:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(storages.values())


def saved_other(module, x):
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        module(x)
    skip = {p.untyped_storage().data_ptr() for p in module.parameters()} | {x.untyped_storage().data_ptr()}
    unique = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in kept}
    return sum(s.nbytes() for ptr, s in unique.items() if ptr not in skip)


CASES = {
    "gqa": (g.check_gqa_parameter_count, gqa_solution, gqa_other),
    "adam": (g.check_adam_state_gib, adam_solution, adam_other),
    "act": (g.check_activation_bytes_tp, act_solution, act_other),
    "zero2": (g.check_zero2_bytes, zero2_solution, zero2_other),
    "min_gpus": (g.check_min_gpus, min_gpus_solution, min_gpus_other),
    "saved": (g.check_saved_bytes, saved_solution, saved_other),
}


@pytest.mark.parametrize("key", list(CASES))
def test_solution_and_a_different_right_answer_pass_stub_is_not_attempted(key, capsys):
    right_answers_pass(*CASES[key], capsys, trials=8)


@pytest.mark.parametrize("key", list(CASES))
def test_every_listed_mistake_is_named_with_its_own_hint(key, monkeypatch):
    each_mistake_is_named(g, CASES[key][0], CASES[key][1], monkeypatch, trials=8)


HARD_CODED = {
    "gqa": lambda **kw: 6_738_415_616,
    "adam": lambda *a: 100.4,
    "act": lambda *a: 34 * 4096 * 4096,
    "zero2": lambda *a: 16.6e9,
    "min_gpus": lambda *a: 2,
    "saved": lambda module, x: 8064,
}


@pytest.mark.parametrize("key", list(CASES))
def test_a_hard_coded_answer_fails_on_fresh_inputs(key):
    with pytest.raises(CheckFailed) as info:
        CASES[key][0](HARD_CODED[key])
    assert not isinstance(info.value, NotAttempted)


SHORTCUTS = {
    "gqa": (lambda vocab, hidden, layers, heads, kv_heads, ffn, tied, qkv_bias: tm.count_parameters(
        tm.TransformerShape(vocab, hidden, layers, heads, ffn, kv_heads, tied, qkv_bias=qkv_bias)), "constructor of course_utils.training_memory.TransformerShape"),
    "adam": (lambda n, w, gr: sum(tm.model_state_bytes(n, tm.Recipe("x", w, gr, 0, 4 if w < 4 else 0, 8)).values()) / 2**30,
             "constructor of course_utils.training_memory.Recipe"),
    "act": (lambda s, b, h, a, t, sel: tm.activation_bytes_per_layer(s, b, h, a, t=t, recompute="selective" if sel else "none"),
            "activation_bytes_per_layer"),
    "zero2": (g._reference_zero2_bytes, "_reference_zero2_bytes"),
    "min_gpus": (g._reference_min_gpus, "_reference_min_gpus"),
    "saved": (lambda module, x: _with_course_hook(module, x), "training_memory.saved_tensors"),
}


def _with_course_hook(module, x):
    with tm.saved_tensors([*module.parameters(), x]) as log:
        module(x)
    return log.nbytes


@pytest.mark.parametrize("key", list(CASES))
def test_the_course_shortcut_is_forbidden(key):
    fn, fragment = SHORTCUTS[key]
    fails_with(CASES[key][0], fn, fragment)
    fails_with(CASES[key][0], fn, "replace by hand")


def test_min_gpus_draws_exact_divisions_and_names_the_off_by_one():
    fails_with(g.check_min_gpus, lambda n, act, gpu: int(16 * n / ((gpu - act) * 1e9)) + 1, "int(...) + 1")
    fails_with(g.check_min_gpus, lambda n, act, gpu: 16 * n // ((gpu - act) * 10**9) + 1, "int(...) + 1")


def test_saved_bytes_names_dedup_by_id_and_by_data_pointer():
    def keyed(key):
        def fn(module, x):
            skip = {t.untyped_storage().data_ptr() for t in [*module.parameters(), x]}
            seen = {}

            def pack(t):
                if t.untyped_storage().data_ptr() not in skip:
                    seen[key(t)] = t.untyped_storage().nbytes()
                return t

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                module(x)
            return sum(seen.values())
        return fn

    fails_with(g.check_saved_bytes, keyed(id), "not id(t)")
    fails_with(g.check_saved_bytes, keyed(lambda t: t.data_ptr()), "not t.data_ptr()")


def test_saved_bytes_hints_never_recommend_what_the_check_rejects():
    """The hint for counting elements must not suggest numel()·element_size(), which the 'view bytes' mistake rejects."""
    import inspect

    source = inspect.getsource(g.check_saved_bytes)
    hints = [line for line in source.splitlines() if "element_size" in line and "not t.numel()" not in line]
    assert not hints, hints


# ---------------------------------------------------------------- exercise 7: a LLaMA block's MLP half
from course_utils.checks import ForbiddenCall  # noqa: E402
from course_utils.grading import training_memory_llama as gl  # noqa: E402
from _grading_helpers import SEED, fails  # noqa: E402


def llama_ok(tokens, hidden, ffn, dtype_bytes):
    return dtype_bytes * (tokens + 2 * tokens * hidden + 4 * tokens * ffn)


def llama_other(tokens, hidden, ffn, dtype_bytes):  # tensor by tensor, in the order of the forward
    shapes = {"r": (tokens, 1), "x_r": (tokens, hidden), "n": (tokens, hidden), "w1_out": (tokens, ffn),
              "silu_out": (tokens, ffn), "w3_out": (tokens, ffn), "product": (tokens, ffn)}
    return sum(math.prod(s) for s in shapes.values()) * dtype_bytes


def test_llama_right_answers_pass_and_the_stub_is_not_attempted(capsys):
    right_answers_pass(g.check_llama_mlp_saved_bytes, llama_ok, llama_other, capsys, trials=8)


def test_llama_every_listed_mistake_is_named(monkeypatch):
    each_mistake_is_named(gl, g.check_llama_mlp_saved_bytes, llama_ok, monkeypatch, trials=6)


def test_llama_the_reference_is_a_measurement_that_agrees_with_the_formula_in_both_dtypes():
    for tokens, hidden, ffn in [(5, 8, 32), (37, 24, 64), (130, 64, 160)]:
        for dtype_bytes in (2, 4):
            assert gl._measure(tokens, hidden, ffn, dtype_bytes) == llama_ok(tokens, hidden, ffn, dtype_bytes)


def test_llama_measuring_instead_of_predicting_is_forbidden():
    def measure(tokens, hidden, ffn, dtype_bytes):
        module = gl.LlamaMLPHalf(hidden, ffn, {2: torch.bfloat16, 4: torch.float32}[dtype_bytes])
        x = torch.randn(tokens, hidden).to(module.weight.dtype).requires_grad_(True)
        seen = {}
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.setdefault(t.untyped_storage().data_ptr(), t), lambda t: t):
            module(x)
        return 0

    with pytest.raises(ForbiddenCall):
        g.check_llama_mlp_saved_bytes(measure, seed=SEED, trials=2)
    with pytest.raises(ForbiddenCall):
        g.check_llama_mlp_saved_bytes(lambda *a: gl._reference_llama_mlp_saved_bytes(*a), seed=SEED, trials=2)


def test_llama_the_gpt2_table_or_a_hard_coded_answer_fails():
    fails(g.check_llama_mlp_saved_bytes, lambda t, h, f, b: 34 * t * h, "llama_mlp_saved_bytes")  # the lesson's 34sbh
    fails(g.check_llama_mlp_saved_bytes, lambda t, h, f, b: 45140, "llama_mlp_saved_bytes")


def test_llama_a_lesson_calculator_after_a_rearrangement_is_refused():
    """The old list named only the grading reference; wired, the whole course_utils.training_memory* lesson is refused."""
    import course_utils.training_memory_llama as tml

    calculator = vars(tml)["activation_bytes_" + "llama"]  # reached by lookup: the callee's module is what counts

    def via_lesson(tokens, hidden, ffn, dtype_bytes):
        calculator(tokens, 1, hidden, ffn, 1)
        return llama_ok(tokens, hidden, ffn, dtype_bytes)

    with pytest.raises(ForbiddenCall) as info:
        g.check_llama_mlp_saved_bytes(via_lesson, seed=SEED, trials=2)
    assert "course_utils.training_memory_llama.activation_bytes_llama" in str(info.value)
    assert "\n" not in str(info.value)
