"""The exercise-check machinery: validation, tolerances, named mistakes, not attempted."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from course_utils.checks import CheckFailed, Mistake, NotAttempted, TOLERANCES, check_function, check_value, tolerance_for


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


def test_inputs_are_fresh_per_trial_and_reproducible():
    seen = []
    check_function(lambda x: (seen.append(x.copy()), x)[1], lambda x: x, inputs, name="id", trials=3, quiet=True)
    assert not np.allclose(seen[0], seen[1])
    again = []
    check_function(lambda x: (again.append(x.copy()), x)[1], lambda x: x, inputs, name="id", trials=3, quiet=True)
    assert all(np.array_equal(a, b) for a, b in zip(seen, again))


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
