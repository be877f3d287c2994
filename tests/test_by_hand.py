"""The by-hand watch (course_utils.classroom.forbidden): what it refuses, through which paths, and what it lets pass."""
from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import course_utils.grading.foundations as grading_foundations
from course_utils.classroom.checking import call_learner, check_function
from course_utils.classroom.forbidden import ByHand, watch
from course_utils.errors import CheckFailed, ForbiddenCall

from _grading_helpers import pasted

MATMUL = ByHand(ops=("@matmul",))


def hit(fn, spec, *args):
    guard = watch(spec)
    try:
        guard.call(fn, args)
    except ForbiddenCall as exc:
        return str(exc)
    return guard.hit


A, B = torch.randn(4, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)


@pytest.mark.parametrize("shortcut", [
    lambda x, y: x @ y,
    lambda x, y: torch.inner(x, y.T),
    lambda x, y: torch.einsum("ik,kj->ij", x, y),
    lambda x, y: torch.tensordot(x, y, dims=1),
    lambda x, y: torch.nn.functional.linear(x, y.T),
    lambda x, y: torch.nn.functional.conv1d(x.T[None], y.T[:, :, None])[0].T,
], ids=["matmul", "inner", "einsum", "tensordot", "linear", "conv1d"])
def test_whole_result_operators_are_seen_whatever_the_python_path(shortcut):
    assert hit(shortcut, ByHand(ops=("@matmul", "@conv")), A, B)


def test_elementary_operations_pass_and_allow_ops_takes_one_back():
    assert hit(lambda x, y: (x[:, :, None] * y[None]).sum(1), MATMUL, A, B) is None
    assert hit(lambda x, y: x @ y, ByHand(ops=("@matmul",), allow_ops=("mm",)), A, B) is None
    with pytest.raises(ValueError, match="operator family"):
        ByHand(ops=("@nope",)).refused_ops()


def test_the_watch_holds_in_threads_the_learner_starts_and_refuses_pools():
    def threaded(x, y):
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", x @ y))
        t.start()
        t.join()
        return out["r"]

    assert "mm" in hit(threaded, MATMUL, A, B)
    with ThreadPoolExecutor(1) as pool:
        assert "another thread" in hit(lambda x, y: pool.submit(lambda: x @ y).result(), MATMUL, A, B)


def test_course_references_lesson_modules_and_libraries_are_refused_by_module():
    q = torch.randn(1, 3, 2, 4)
    ref = grading_foundations._reference_attention_scores
    assert "course_utils.grading.foundations" in hit(lambda x: ref(x, x), ByHand(), q)
    rearranged = lambda x: (lambda f: f(x, x))(getattr(grading_foundations, "_reference_" + "attention_scores"))
    assert "course_utils.grading" in hit(rearranged, ByHand(), q)
    import course_utils.convolution as conv
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5))
    assert "course_utils.convolution" in hit(lambda v: conv.im2col(v, 3, 3), ByHand(modules=("course_utils.convolution",)), x)
    # the lesson's neighbouring modules count as the same topic
    assert ByHand(modules=("course_utils.convolution",)).refused_modules()[-1] == "course_utils.convolution"
    assert hit(lambda v: conv.im2col(v, 3, 3), ByHand(modules=("course_utils.convolution",),
                                                      allow=("course_utils.convolution.im2col",)), x) is None


def test_pasted_source_is_the_learners_own():
    q = torch.randn(1, 3, 2, 4)
    copy = pasted(grading_foundations)
    assert hit(lambda x: copy._reference_attention_scores(x, x), ByHand(), q) is None


def test_callables_the_check_hands_over_may_be_called():
    class Model:
        def __call__(self, x):
            return self.inner(x)

        def inner(self, x):
            return x * 2

    Model.__module__ = "course_utils.grading.foundations"  # as if the check had built it there
    assert hit(lambda f, x: f(x), ByHand(modules=("course_utils.grading",)), Model(), A) is None


def test_numpy_ufuncs_and_methods_are_refused_under_aliases():
    x = np.random.default_rng(0).random(10) * 10
    spec = ByHand(names=("numpy.rint", "numpy.ndarray.sum"))
    assert hit(lambda v: np.rint(v), spec, x) == "numpy.rint"
    assert hit(lambda v: np.asarray(v).sum(), spec, x) == "numpy.ndarray.sum"
    assert hit(lambda v: np.floor(v + 0.5), spec, x) is None
    namespace = {}
    exec("from numpy import rint as r\ndef f(v):\n    return r(v)\n", namespace)
    assert "held as `r`" in hit(namespace["f"], spec, x)


def test_structure_largest_tensor_and_python_loops():
    L = 64
    q = torch.randn(L, 8)
    tiled = ByHand(max_numel=32 * L, large="the L×L score matrix")
    assert "L×L score matrix" in hit(lambda q: (q @ q.T).softmax(-1) @ q, tiled, q)
    blocks = lambda q: torch.cat([(q[i:i + 16] @ q.T[:, :32]) @ q[:32] for i in range(0, L, 16)])
    assert hit(blocks, tiled, q) is None
    assert hit(lambda q: q.new_ones(L, 1).expand(L, L)[:, :8] * q, tiled, q) is None  # a view stores L elements

    def loop(v):
        total = 0.0
        for e in v:
            total += e
        return total

    no_loop = ByHand(max_loop_iterations=0)
    x = np.arange(10.0)
    assert "Python loop" in hit(loop, no_loop, x)
    assert "Python loop" in hit(lambda v: sum([e for e in v]), no_loop, x)
    assert hit(lambda v: v * 2, no_loop, x) is None

    def one_call_over_lines(v):  # the line numbers go back (the call's own line comes after its arguments'): no loop
        return np.where(
            v > 3,
            v, 0.0)

    assert hit(one_call_over_lines, no_loop, x) is None

    def while_loop(v):
        i = 0
        while i < 3:
            i += 1
        return v * i

    assert "Python loop" in hit(while_loop, no_loop, x)


def test_numpy_c_functions_and_ufunc_methods_are_refused_by_name():
    def counts(v):
        return np.bincount(v.astype(np.int64))

    def scattered(v):
        out = np.zeros(10)
        np.add.at(out, v.astype(np.int64), 1.0)
        return out

    spec = ByHand(names=("numpy.bincount", "numpy.add.at"))
    x = np.arange(10.0)
    assert "numpy.bincount" in hit(counts, spec, x)
    assert "numpy.add.at" in hit(scattered, spec, x)
    assert hit(lambda v: np.add(v, 1.0), spec, x) is None  # the ufunc itself, called, is not its .at method
    assert type(np.bincount).__name__ == "_ArrayFunctionDispatcher"  # the stand-in is gone after the watch


def test_the_learner_cannot_switch_the_watch_off():
    def sneaky(v):
        saved = sys.getprofile()
        sys.setprofile(None)
        out = v @ v.T
        sys.setprofile(saved)
        return out

    assert hit(sneaky, MATMUL, A)


def test_a_refused_call_before_a_crash_is_reported_as_the_refusal():
    def crashes(x, y):
        x @ y
        raise ValueError("later")

    with pytest.raises(ForbiddenCall, match="aten::mm"):
        call_learner("f", crashes, (A, B), by_hand=MATMUL)


def test_feedback_line_seed_zero_d_value_and_float32_hint():
    def bad(v):
        w = v + 1
        return w[100]

    with pytest.raises(CheckFailed) as info:
        check_function(bad, lambda v: v, lambda rng: rng.random(5), name="bad", seed=3)
    assert "line" in str(info.value) and "of `bad`" in str(info.value) and "seed=3" in str(info.value)
    with pytest.raises(CheckFailed, match="holding 2"):
        check_function(lambda v: torch.tensor(2.0), lambda v: torch.tensor(3.0), lambda rng: rng.random(5), name="z", seed=1)
    with pytest.raises(CheckFailed, match="float32 rounding"):
        check_function(lambda v: v.astype(np.float32).astype(np.float64) * 3, lambda v: v * 3, lambda rng: rng.random(5),
                       name="f32", seed=3, rtol=1e-10, atol=0)


def test_memory_limits_may_depend_on_the_inputs_and_see_numpy_buffers():
    per_call = ByHand(max_traced_bytes=lambda args, kwargs: 40 * args[0].nbytes, large="the full score matrix")
    x = np.random.default_rng(0).standard_normal(2000)
    assert "full score matrix" in hit(lambda v: np.exp(v[:, None] - v[None, :]).sum(1), per_call, x)
    assert hit(lambda v: np.concatenate([np.exp(v[i:i + 10, None] - v[None, :]).sum(1) for i in range(0, 2000, 10)]),
               per_call, x) is None
    sized = ByHand(max_numel=lambda args, kwargs: 2 * args[0].shape[0] * 8)
    q = torch.randn(64, 8)
    assert hit(lambda q: q @ q.T, sized, q) and hit(lambda q: q * 2, sized, q) is None


def test_an_answer_that_is_the_reference_itself_is_refused():
    q = torch.randn(1, 3, 2, 4)
    assert "answer is that function itself" in hit(grading_foundations._reference_attention_scores, ByHand(), q, q)
    import course_utils.convolution as conv
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 5))
    assert hit(conv.im2col, ByHand(modules=("course_utils.convolution",)), x, 3, 3)
    assert hit(conv.im2col, ByHand(modules=("course_utils.convolution",), allow=("course_utils.convolution.im2col",)),
               x, 3, 3) is None


def test_refusals_name_what_the_learner_wrote():
    """A lazy import reads as an import from its package, a constructor as its class, not the machinery's names."""
    from course_utils.classroom.forbidden import forbidden_message

    lazy = forbidden_message("ex", "diffusers.utils.import_utils._LazyModule.__getattr__")
    assert "calls an import from diffusers," in lazy and "_LazyModule" not in lazy
    assert "calls the constructor of diffusers.configuration_utils.DDPMScheduler," in forbidden_message(
        "ex", "diffusers.configuration_utils.DDPMScheduler.inner_init")
    assert "calls the constructor of course_utils.floating_point.FloatFormat," in forbidden_message(
        "ex", "course_utils.floating_point.FloatFormat.__init__")
    assert "calls torch.inner," in forbidden_message("ex", "torch.inner")
