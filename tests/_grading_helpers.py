"""Helpers for the tests of exercise checks (tests/test_grading_*.py)."""
from __future__ import annotations

import contextlib
import io

import pytest

from course_utils.errors import CheckFailed, NotAttempted

SEED = 12345  # the tests pin seeds so that they are reproducible; the checks themselves draw fresh ones


def stub(*args, **kwargs):
    """What an untouched exercise function does."""
    raise NotImplementedError("Exercise not attempted yet")


def passes(check, fn, **kwargs):
    """``check(fn)`` passes on two different seeds and prints one ✅ line each time."""
    for seed in (SEED, SEED + 1):
        check(fn, seed=seed, **kwargs)


def fails(check, fn, fragment, *, seed=SEED, **kwargs):
    """``check(fn)`` fails as a wrong answer with a one-line message holding ``fragment``; returns the message.

    ``seed=None`` lets the check draw its own inputs (for checks that take no seed)."""
    with pytest.raises(CheckFailed) as info:
        check(fn, **({} if seed is None else {"seed": seed}), **kwargs)
    message = str(info.value)
    assert not isinstance(info.value, NotAttempted), message
    assert fragment in message, message
    assert "\n" not in message
    return message


def fails_with(check, fn, fragment):
    """:func:`fails` with the check's own fresh inputs."""
    return fails(check, fn, fragment, seed=None)


def forbidden(check, fn, name, **kwargs):
    """``check(fn)`` fails because ``fn`` calls ``name``, which the exercise forbids."""
    message = fails(check, fn, name, **kwargs)
    assert "calls " in message and "by hand" in message, message
    return message


def not_attempted(check, fn, **kwargs):
    with pytest.raises(NotAttempted):
        check(fn, seed=SEED, **kwargs)


def _plain(a):
    return a.tolist() if hasattr(a, "tolist") and not isinstance(a, (int, float)) else a


class Recorder:
    """A lookup-table answer: learns the reference's outputs on one run, replays them afterwards."""

    def __init__(self, reference):
        self.reference, self.table, self.learning = reference, {}, True

    def __call__(self, *args):
        # keyed by plain values (a tensor's repr calls Tensor.to, which a cast exercise refuses), without a Python
        # loop (an exercise may refuse loops in the answer's code)
        key = repr(tuple(map(_plain, args)))
        if self.learning:
            self.table[key] = self.reference(*args)
        return self.table.get(key, next(iter(self.table.values())))


def rejects_recorded_answers(check, solution):
    """A lookup table that replays the answers of one run fails on the next run's fresh inputs."""
    table = Recorder(solution)
    check(table, seed=SEED)
    table.learning = False
    with pytest.raises(AssertionError):
        check(table, seed=SEED + 1)


def each_mistake_is_named(module, check, solution, monkeypatch, *, trials, hints=None):
    """Every ``Mistake`` a check lists, fed as the answer, fails with that mistake's own hint.

    The mistakes are built from the course's own references, which the check forbids: they are fed
    with the guard off (``forbidden`` and ``by_hand`` dropped), so that the value comparison alone is tested.
    ``hints`` maps a mistake's name to the text expected instead, for mistakes that coincide.
    """
    captured = {}
    original = module.check_function

    def spy(fn, ref, make_inputs, **kw):
        captured["mistakes"] = list(kw.get("mistakes", ()))
        kw.pop("forbidden", None)
        kw.pop("by_hand", None)
        return original(fn, ref, make_inputs, **kw)

    monkeypatch.setattr(module, "check_function", spy)
    check(solution, trials=1)
    assert captured["mistakes"], "the check lists no named mistakes"
    for mistake in captured["mistakes"]:
        # a pinned seed: on rare fresh inputs two mistakes coincide, and the test must not be flaky
        fails_with(lambda fn: check(fn, trials=trials, seed=SEED), mistake.fn, (hints or {}).get(mistake.name, mistake.hint))


def right_answers_pass(check, solution, other, capsys, *, trials):
    """The solution and a right answer written differently pass with one ✅ line; the stub is not attempted."""
    check(solution)
    check(other, trials=trials)
    assert capsys.readouterr().out.startswith("✅")
    with pytest.raises(NotAttempted):
        check(stub)


# ---------------------------------------------------------------- seed sweeps (topics 03 and 04)
SWEEP_SEEDS = range(4)


def sweep_passes(check, fn, seeds=SWEEP_SEEDS, **kwargs):
    """``check(fn)`` passes on each pinned seed and on fresh inputs, printing nothing (``quiet=True``)."""
    for seed in seeds:
        quiet_passes(check, fn, seed=seed, **kwargs)
    quiet_passes(check, fn)  # fresh inputs


def quiet_passes(check, fn, **kwargs):
    """``check(fn, quiet=True)`` passes and prints nothing, not even its ✅ line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        check(fn, quiet=True, **kwargs)
    assert out.getvalue() == "", out.getvalue()


def sweep_named(check, fn, fragment):
    """``fn`` fails with a one-line message holding ``fragment`` on every pinned seed."""
    for seed in SWEEP_SEEDS:
        fails_with(lambda f: check(f, seed=seed, quiet=True), fn, fragment)


def forbidden_call(check, fn, fragment):
    """``fn`` fails as a forbidden call, the message naming ``fragment``."""
    from course_utils.checks import ForbiddenCall

    with pytest.raises(ForbiddenCall) as info:
        check(fn, seed=0, quiet=True)
    assert fragment in str(info.value), str(info.value)


def replayed_answer_fails(check, solution, *, names_inputs=False):
    """Record the solution's first answer on seed 0's inputs and return it for everything: fresh inputs catch it.

    ``names_inputs``: the failure must also point at the inputs (the seed or the differing values), not only
    at a named mistake the replayed answer happens to match."""
    table = []

    def recorder(*args):
        out = solution(*args)
        table.append(out)
        return out

    check(recorder, seed=0, quiet=True)
    with pytest.raises(CheckFailed) as info:
        check(lambda *args: table[0], seed=1, quiet=True)
    assert not isinstance(info.value, NotAttempted)
    if names_inputs:
        assert "seed=1" in str(info.value) or "expected" in str(info.value) or "differ" in str(info.value), str(info.value)


def pasted(module):
    """``module``'s functions as if the learner had pasted its source into a cell.

    The by-hand watch refuses calls into the course's grading and lesson modules, but code the learner wrote or
    pasted is theirs: this is how a test builds a right answer (or a named mistake) from the course's own helpers.
    Every function of the module is re-created over a copy of its globals named ``__main__``, so helpers it calls
    are the pasted copies too.
    """
    import types

    namespace = dict(vars(module))
    namespace["__name__"] = "__main__"
    for key, value in list(namespace.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            copy = types.FunctionType(value.__code__, namespace, value.__name__, value.__defaults__, value.__closure__)
            copy.__kwdefaults__ = value.__kwdefaults__
            namespace[key] = copy
    return types.SimpleNamespace(**namespace)


def solution_cells_module(tmp_path_factory, slug: str, grade_ids, header: str, replace=()):
    """The solution cells ``grade_ids`` of ``solutions/<slug>.ipynb`` written to a module file and imported.

    ``@triton.jit`` wants its kernel's source in a file. ``replace`` is a tuple of (old, new) edits that make a
    variant (a mistake, or a right answer written differently); each ``old`` must occur in the source.
    """
    import importlib.util
    import json

    from course_utils.paths import ROOT

    cells = json.loads((ROOT / "solutions" / f"{slug}.ipynb").read_text())["cells"]
    source = header + "\n\n\n" + "\n\n\n".join(
        "".join(c["source"]) for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") in grade_ids)
    for old, new in replace:
        assert old in source, old
        source = source.replace(old, new)
    folder = tmp_path_factory.mktemp(f"kernels_{slug[:2]}")
    name = f"solution{slug[:2]}_{abs(hash(replace))}"
    (folder / f"{name}.py").write_text(source)
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_compiler(*, allow_module_level: bool = False):
    """``course_utils.gpu_compile`` when the triton wheel carries the CUDA tools (ptxas), else a skip that says why."""
    gc = pytest.importorskip("course_utils.gpu_compile")
    try:
        gc._bin("ptxas")
    except gc.CompileError as exc:  # pragma: no cover - a triton wheel without the CUDA tools (macOS, Arm)
        pytest.skip(str(exc), allow_module_level=allow_module_level)
    return gc
