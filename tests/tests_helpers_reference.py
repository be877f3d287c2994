"""A stand-in for a course reference function, for tests/test_checks.py's forbidden-call test."""
import numpy as np


def reference_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
