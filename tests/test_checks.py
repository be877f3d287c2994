"""The exercise-check machinery: validation, tolerances, named mistakes, not attempted."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils.checks import TOLERANCES, tolerance_for
from course_utils.classroom.checking import Mistake, check_function, check_value
from course_utils.errors import CheckFailed, NotAttempted


def ref_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def inputs(rng):
    return (rng.standard_normal((3, 5)),)


MISTAKES = [
    Mistake("axis", "you normalized over axis 0; use axis=-1 (the last axis).", lambda x: np.exp(x) / np.exp(x).sum(axis=0, keepdims=True)),
]


def run(fn, **kw):
    check_function(fn, ref_softmax, inputs, name="softmax", mistakes=MISTAKES, **kw)


def test_correct_answer_prints_one_line(capsys):
    run(lambda x: ref_softmax(x))
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "softmax" in out and "3 random inputs" in out


def test_stub_is_not_attempted():
    def stub(x):
        raise NotImplementedError
    with pytest.raises(NotAttempted, match="not attempted yet"):
        run(stub)


def test_not_attempted_is_a_check_failure_and_an_assertion():
    assert issubclass(NotAttempted, CheckFailed) and issubclass(CheckFailed, AssertionError)


def test_named_mistake_gives_its_hint():
    with pytest.raises(CheckFailed, match="axis=-1"):
        run(lambda x: np.exp(x) / np.exp(x).sum(axis=0, keepdims=True))


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda x: ref_softmax(x).T, r"expected shape \(3, 5\), got \(5, 3\)"),
        (lambda x: ref_softmax(x).astype(np.float32), "expected dtype float64, got float32"),
        (lambda x: torch.from_numpy(ref_softmax(x)), "expected a numpy.ndarray, got torch.Tensor"),
        (lambda x: None, "returned None"),
        (lambda x: ref_softmax(x) * np.nan, "contains NaN"),
        (lambda x: ref_softmax(x) * 1.01, "values differ from the reference by up to"),
        (lambda x: x.undefined_attribute, "raised AttributeError"),
    ],
)
def test_wrong_outputs_get_one_line_messages(fn, message):
    with pytest.raises(CheckFailed, match=message) as info:
        run(fn)
    assert "\n" not in str(info.value)


def test_modifying_the_input_in_place_is_caught():
    def inplace(x):
        x -= x.max(axis=-1, keepdims=True)
        return ref_softmax(x)
    with pytest.raises(CheckFailed, match="modified its input in place"):
        run(inplace)


def test_inputs_are_fresh_per_trial_and_per_run_and_reproducible_by_seed():
    def collect(seed=None):
        seen = []
        check_function(lambda x: (seen.append(x.copy()), x)[1], lambda x: x, inputs, name="id", trials=3, seed=seed, quiet=True)
        return seen
    first, second = collect(), collect()
    assert not np.allclose(first[0], first[1])                    # fresh per trial
    assert not np.allclose(first[0], second[0])                   # fresh per run: a lookup table cannot pass
    assert all(np.array_equal(a, b) for a, b in zip(collect(7), collect(7)))   # a named seed reproduces


def test_failure_names_the_seed_that_reproduces_it():
    with pytest.raises(CheckFailed, match=r"reproduce with seed=\d+") as failure:
        run(lambda x: ref_softmax(x) + 1e-3)
    seed = int(str(failure.value).rsplit("seed=", 1)[1].split(")")[0])
    with pytest.raises(CheckFailed) as again:
        run(lambda x: ref_softmax(x) + 1e-3, seed=seed)
    assert str(again.value) == str(failure.value)


def test_torch_device_and_dtype_validation():
    ref = lambda x: x * 2  # noqa: E731
    make = lambda rng: (torch.from_numpy(rng.standard_normal(4)).float(),)  # noqa: E731
    check_function(lambda x: x * 2, ref, make, name="t", quiet=True)
    with pytest.raises(CheckFailed, match="expected dtype float32, got float64"):
        check_function(lambda x: (x * 2).double(), ref, make, name="t")


def test_tolerance_follows_dtype():
    assert tolerance_for(np.float32) == TOLERANCES["float32"]
    assert tolerance_for(torch.bfloat16) == TOLERANCES["bfloat16"]
    assert tolerance_for(np.int64) == (0.0, 0.0)
    make = lambda rng: (torch.from_numpy(rng.standard_normal(64)).to(torch.bfloat16),)  # noqa: E731
    # a bf16 result computed through fp32 passes; an error of 5% does not
    check_function(lambda x: (x.float() * 3).to(torch.bfloat16), lambda x: x * 3, make, name="bf16", quiet=True)
    with pytest.raises(CheckFailed):
        check_function(lambda x: x * 3.15, lambda x: x * 3, make, name="bf16")


def test_tuple_outputs_are_compared_item_by_item():
    ref = lambda x: (x.sum(), x.max())  # noqa: E731
    check_function(lambda x: (x.sum(), x.max()), ref, inputs, name="pair", quiet=True)
    with pytest.raises(CheckFailed, match="expected a tuple of 2 results"):
        check_function(lambda x: x.sum(), ref, inputs, name="pair")


def test_check_value():
    check_value(112e9, 112e9, name="bytes", quiet=True)
    with pytest.raises(NotAttempted):
        check_value(..., 3, name="answer")
    with pytest.raises(CheckFailed, match="GiB"):
        check_value(112e9 / 2**30, 112e9, name="bytes", mistakes={112e9 / 2**30: "you divided by 2**30 (GiB); the question asks for bytes."})
    with pytest.raises(CheckFailed, match="not right yet"):
        check_value(7, 3, name="answer")


def test_not_a_function_is_reported():
    with pytest.raises(CheckFailed, match="expected a function"):
        check_function(np.zeros(3), ref_softmax, inputs, name="softmax")


# ------------------------------------------------------------------ forbidden shortcuts
def conv_inputs(rng):
    return torch.from_numpy(rng.standard_normal((1, 2, 6, 6))).float(), torch.from_numpy(rng.standard_normal((3, 2, 3, 3))).float()


def conv_by_hand(x, w):
    cols = x.unfold(2, 3, 1).unfold(3, 3, 1)                       # (1, 2, 4, 4, 3, 3)
    return torch.einsum("nchwij,ocij->nohw", cols, w)


@pytest.mark.parametrize("shortcut", [
    lambda x, w: torch.nn.functional.conv2d(x, w),
    lambda x, w: torch.conv2d(x, w),                               # the same builtin under another name
    lambda x, w: torch.nn.Conv2d(2, 3, 3, bias=False).requires_grad_(False)._conv_forward(x, w, None),
])
def test_a_forbidden_call_fails_under_any_alias(shortcut):
    from course_utils.checks import ForbiddenCall
    with pytest.raises(ForbiddenCall, match="calls torch.nn.functional.conv2d, which this exercise asks you to replace by hand"):
        check_function(shortcut, lambda x, w: torch.nn.functional.conv2d(x, w), conv_inputs, name="conv",
                       forbidden=["torch.nn.functional.conv2d"], quiet=True)


def test_a_forbidden_python_function_is_caught_even_when_imported_under_another_name():
    from course_utils.checks import ForbiddenCall
    from tests_helpers_reference import reference_softmax as my_alias  # noqa: F401  (see below)
    with pytest.raises(ForbiddenCall, match="tests_helpers_reference.reference_softmax"):
        run(lambda x: my_alias(x), forbidden=["tests_helpers_reference.reference_softmax"])


def test_honest_code_passes_with_a_guard_and_the_guard_is_removed_afterwards():
    import sys
    before = sys.getprofile()
    check_function(conv_by_hand, lambda x, w: torch.nn.functional.conv2d(x, w), conv_inputs, name="conv",
                   forbidden=["torch.nn.functional.conv2d", "numpy.matmul"], quiet=True)
    assert sys.getprofile() is before
    assert torch.nn.functional.conv2d(*conv_inputs(np.random.default_rng(0))).shape == (1, 3, 4, 4)


# ------------------------------------------------------------------ tolerances and messages
def test_tolerance_grows_with_accumulation_length_but_not_for_a_16_bit_accumulator():
    assert tolerance_for(torch.float32, 16) == TOLERANCES["float32"]
    r, _ = tolerance_for(torch.float32, 1 << 20)
    assert TOLERANCES["float32"][0] < r < 1e-3
    # positive terms (a pinned draw): the fp16 running sum stalls once its spacing passes the terms (2048 and up),
    # far outside any fp32 tolerance; zero-mean terms let it pass by luck on some draws
    x = torch.rand(1 << 14, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    exact = x.sum()
    r32, a32 = tolerance_for(torch.float32, x.numel())
    assert torch.allclose(x.float().sum().double(), exact, rtol=r32, atol=a32)       # fp32 accumulator passes
    acc16 = torch.zeros((), dtype=torch.float16)
    for chunk in x.half():
        acc16 = acc16 + chunk                                                   # fp16 accumulator fails
    assert not torch.allclose(acc16.double(), exact, rtol=r32, atol=a32)


def test_a_scalar_answer_shows_got_and_expected_and_a_tuple_names_its_element():
    make = lambda rng: (float(rng.uniform(1, 2)),)  # noqa: E731
    with pytest.raises(CheckFailed, match=r"got float .*, expected float"):
        check_function(lambda x: x + 1, lambda x: x, make, name="s", quiet=True)
    make2 = lambda rng: (rng.standard_normal(3),)  # noqa: E731
    with pytest.raises(CheckFailed, match=r"pair\[1\] \(element 2 of the 2 you return\)"):
        check_function(lambda x: (x, -x), lambda x: (x, x), make2, name="pair", quiet=True)


def test_a_dtype_mistake_is_reported_as_such_even_when_a_named_mistake_matches_its_values():
    wrong = [Mistake("double", "you doubled.", lambda x: (x * 2).astype(np.float64))]
    make = lambda rng: (rng.standard_normal(3).astype(np.float32),)  # noqa: E731
    with pytest.raises(CheckFailed, match="expected dtype float32, got float64"):
        check_function(lambda x: x.astype(np.float64) * 2, lambda x: x, make, name="d", mistakes=wrong, quiet=True)


def test_messages_never_say_empty_inputs_or_cut_a_number():
    make = lambda rng: {"x": float(rng.uniform(1, 2)), "steps": 123456789.123456789}  # noqa: E731
    with pytest.raises(CheckFailed) as failure:
        check_function(lambda x, steps: x + 1, lambda x, steps: x, make, name="k", quiet=True)
    text = str(failure.value)
    assert "inputs ()" not in text and "x=" in text and "steps=123456789.12345679" in text


def test_assert_close_uses_the_table():
    from course_utils.checks import assert_close
    x = torch.randn(8)
    assert_close(x + 1e-7, x)
    with pytest.raises(CheckFailed, match="differs by up to"):
        assert_close(x + 1e-3, x, name="x")
