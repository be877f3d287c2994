"""A release for learners: ``python -m course_utils release OUT``.

Writes what learners get: the lessons (``notebooks/``), the problem sets (``exercises/``) and a course
package whose ``course_utils.grading`` holds **no reference implementation**: each ``check_*`` function
replays a *bank* recorded here from the real references, at release time. For every check built on
:func:`~course_utils.classroom.checking.check_function`, the bank holds fixed inputs drawn from the check's
own input maker, the reference's outputs on them, and the outputs of every named mistake; the released
check calls the learner's function on those inputs, compares at the check's tolerance, and names the
mistake whose recorded output the learner's matches. The instructor's grader keeps fresh inputs and the
real references. No ``solutions/``, no tests, no benchmark scripts are copied.

Inputs that hold callables are objects of :mod:`course_utils.classroom.released` (shipped: inputs and harnesses,
no answer), which the bank stores as data; a check that adapts the learner's call passes
``functools.partial(driver, fn)`` with a driver of that module, recorded by name and run around the learner's
function by the released check. A grading module that holds no reference and says so (``RELEASED_AS_SOURCE``,
:func:`shipped_modules`) is copied as it is, and its checks run on fresh inputs. A check that fits none of these
(its inputs hold an object of a grading module, or it adapts the learner's call without a released driver) is
released as a check that says so and passes nothing: the learner is told that this exercise is checked only by
the instructor's grader. CONTRIBUTING.md ("Checks in the learners' release") has the rules for grading modules.
Self-study from the repository (``solutions/``, ``exercises/`` and the real ``course_utils.grading``)
stays as it is.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import pickle
import pickletools
import re
import shutil
from pathlib import Path

import numpy as np

from ..paths import ROOT
from . import checking
from .forbidden import ByHand

__all__ = ["ReleaseError", "record_module", "build_release", "BANK_TRIALS"]

BANK_TRIALS = 4          # fixed inputs per check in the bank
BANK_SEED = 20_261_203   # the release's inputs; the grader draws fresh ones
_MARKERS = re.compile(r"### BEGIN SOLUTION|### BEGIN HIDDEN TESTS")


_RELEASED = "course_utils.classroom.released"


class ReleaseError(RuntimeError):
    """The release could not be written (the output folder is inside the repository, not empty...)."""


class _Recorded(Exception):
    pass


def _copy(x):
    return checking._copy_inputs([x])[0] if not isinstance(x, (list, tuple, dict)) else pickle.loads(pickle.dumps(x))


def _recorder(sink: list, probe):
    def check_function(learner_fn, reference_fn, make_inputs, *, name, trials=3, seed=None, rtol=None, atol=None, n=None,
                       mistakes=(), check_inputs_unchanged=True, forbidden=(), by_hand=None, quiet=False,
                       **_later_options):
        driver = _driver(learner_fn, probe)
        direct = driver is not None or learner_fn is probe or _passes_through(learner_fn, probe, make_inputs)
        spec = ByHand.of(by_hand)
        entry = {"name": name, "direct": direct, "driver": driver, "rtol": rtol, "atol": atol, "n": n,
                 "check_inputs_unchanged": check_inputs_unchanged, "forbidden": [f for f in forbidden
                                                                                 if not f.startswith("course_utils.grading")],
                 "by_hand": _by_hand_fields(spec), "trials": []}
        for trial in range(BANK_TRIALS):
            rng = np.random.default_rng([BANK_SEED, trial])
            args, kwargs = checking._as_args(make_inputs(rng))
            originals = checking._copy_inputs(args)
            want = reference_fn(*checking._copy_inputs(originals), **kwargs)
            wrong = []
            for mistake in mistakes:
                try:
                    wrong.append((mistake.hint, mistake.fn(*checking._copy_inputs(originals), **kwargs)))
                except Exception:  # a variant that cannot run on these inputs never matches
                    continue
            entry["trials"].append({"args": originals, "kwargs": kwargs, "want": want, "mistakes": wrong,
                                    "limits": _by_hand_limits(spec, originals, kwargs)})
        sink.append(entry)
        raise _Recorded

    return check_function


_LIMITS = ("max_numel", "max_traced_bytes")  # ByHand fields that may be functions of the call's (args, kwargs)


def _by_hand_fields(spec: ByHand | None) -> dict | None:
    """A check's by-hand watch as plain data (the release's ``ByHand(**fields)``): names of the grading modules
    (references, absent from a release) are left out, and size limits given as functions are stored per input
    by :func:`_by_hand_limits`."""
    if spec is None:
        return None
    fields = {f: getattr(spec, f) for f in spec.__dataclass_fields__ if f not in _LIMITS or not callable(getattr(spec, f))}
    fields["names"] = tuple(n for n in spec.names if not n.startswith("course_utils.grading"))
    return fields


def _by_hand_limits(spec: ByHand | None, args, kwargs) -> dict:
    """The size limits that ``spec`` computes from a call's inputs, evaluated on one fixed input of the bank."""
    if spec is None:
        return {}
    return {f: int(getattr(spec, f)(tuple(checking._copy_inputs(args)), dict(kwargs)))
            for f in _LIMITS if callable(getattr(spec, f))}


def _driver(learner_fn, probe) -> dict | None:
    """A check that drives the learner's function through ``functools.partial(driver, fn, ...)``, ``driver`` defined
    outside the grading modules (:mod:`course_utils.classroom.released`): the driver, recorded by name, and the
    partial's other arguments; None for any other learner function."""
    if not (isinstance(learner_fn, functools.partial) and learner_fn.args and learner_fn.args[0] is probe):
        return None
    if getattr(learner_fn.func, "__module__", "").startswith("course_utils.grading"):
        return None  # a driver among the references is not released: the check has no bank
    return {"func": learner_fn.func, "args": tuple(learner_fn.args[1:]), "kwargs": dict(learner_fn.keywords)}


class _ProbeCalled(Exception):
    pass


def _passes_through(wrapper, probe, make_inputs) -> bool:
    """A check that wraps the learner's function (a guard around the call) but hands it the inputs unchanged."""
    rng = np.random.default_rng([BANK_SEED, 0])
    args, kwargs = checking._as_args(make_inputs(rng))
    originals = checking._copy_inputs(args)
    probe.seen = None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            wrapper(*args, **kwargs)
    except Exception:  # _ProbeCalled, or call_learner's report of it: what matters is what the probe saw
        pass
    if probe.seen is None:
        return False
    seen_args, seen_kwargs = probe.seen
    return (len(seen_args) == len(originals) and set(seen_kwargs) == set(kwargs)
            and all(checking._same_input(a, b) for a, b in zip(seen_args, originals)))


def _storable(entry: dict) -> bytes | None:
    try:
        data = pickle.dumps(entry, protocol=4)
    except Exception:  # lambdas, generators, modules among the inputs
        return None
    # the inputs' classes and the drivers of course_utils.classroom.released ship with the release; nothing else of
    # the classroom (a Mistake, a check's helper) and nothing of the grading modules may be pickled into a bank
    if b"course_utils.grading" in data or b"course_utils.classroom" in data.replace(_RELEASED.encode(), b""):
        return None
    return data


def record_module(module_name: str, shipped: set[str] = frozenset()) -> dict[str, bytes | str | None]:
    """For each ``check_*`` of ``course_utils.grading.<module_name>``: its pickled bank, None if it has none, or the
    name of the module in ``shipped`` (released as source, :func:`shipped_modules`) that defines it."""
    module = importlib.import_module(f"course_utils.grading.{module_name}")
    out: dict[str, bytes | str | None] = {}
    for attr, fn in sorted(vars(module).items()):
        # its own checks and those it re-exports from a sibling module (convolution -> convolution_backward)
        if not (attr.startswith("check_") and inspect.isfunction(fn) and fn.__module__.startswith("course_utils.grading.")):
            continue
        home_module = fn.__module__.rsplit(".", 1)[1]
        if home_module in shipped:
            out[attr] = home_module
            continue

        def probe(*args, **kwargs):
            if getattr(probe, "seen", 0) is None:  # asked by _passes_through: what does the wrapper hand over?
                probe.seen = (args, kwargs)
                raise _ProbeCalled
            raise NotImplementedError("release probe")

        sink: list = []
        home = fn.__globals__  # the defining module's namespace: where the check looks check_function up
        saved = home.get("check_function")
        if saved is None:
            out[attr] = None
            continue
        home["check_function"] = _recorder(sink, probe)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                fn(probe)
        except _Recorded:
            pass
        except Exception:  # the check needs more than check_function (its own loop, a process group...)
            sink = []
        finally:
            home["check_function"] = saved
        entry = sink[0] if len(sink) == 1 and sink[0]["direct"] else None
        out[attr] = _storable(entry) if entry is not None else None
    return out


_MODULE_TEMPLATE = '''"""Self-checks of the released course for {module}: no reference implementation is in this file.

Each check replays a bank recorded from the course's references when this release was made: fixed
inputs, the expected outputs and the outputs of the named mistakes (``_bank/{module}.pkl``). The
instructor's grader checks your functions again, on fresh inputs.
"""
from course_utils.classroom.bank import replay, unavailable

{functions}'''


def _module_source(module: str, banks: dict[str, bytes | str | None], shipped: set[str] = frozenset()) -> str:
    imports: dict[str, set[str]] = {}  # module to import from -> names
    parts = []
    for check, data in banks.items():
        if isinstance(data, str):  # defined in a grading module released as source: the check itself
            imports.setdefault(f".{data}", set()).add(check)
        elif data is None:
            parts.append(f"def {check}(fn, *args, **kwargs):\n    unavailable({module!r}, {check!r})\n\n")
        else:
            parts.append(f"def {check}(fn, *args, **kwargs):\n    replay({module!r}, {check!r}, fn)\n\n")
    real = importlib.import_module(f"course_utils.grading.{module}")
    public = getattr(real, "__all__", None) or [n for n in vars(real) if not n.startswith("_")]
    for name in public:  # public names that are released: the inputs' classes, a shipped module's
        home = getattr(getattr(real, name, None), "__module__", None) or ""
        if name.startswith("check_") or home == real.__name__:
            continue
        if home == _RELEASED:
            imports.setdefault(home, set()).add(name)
        elif home.startswith("course_utils.grading.") and home.rsplit(".", 1)[1] in shipped:
            imports.setdefault("." + home.rsplit(".", 1)[1], set()).add(name)
    lines = [f"from {m} import {', '.join(sorted(n))}  # noqa: F401\n" for m, n in sorted(imports.items())]
    return _MODULE_TEMPLATE.format(module=module, functions="".join(lines) + ("\n\n" if lines else "") + "\n".join(parts))


_SHIPPED = re.compile(r"^RELEASED_AS_SOURCE\s*=", flags=re.M)


def shipped_modules(root: Path = ROOT) -> set[str]:
    """Grading modules released as they are: those that define ``RELEASED_AS_SOURCE = "<why no reference is in
    it>"``. Such a module may define no function named like a reference (``*reference*``, ``_ref_*``) and import no
    other grading module unless that one is released as source too; its checks run in the release as they run for
    the grader, on fresh inputs."""
    folder = root / "course_utils" / "grading"
    shipped = {p.stem for p in folder.glob("*.py") if _SHIPPED.search(p.read_text())}
    for name in sorted(shipped):
        text = (folder / f"{name}.py").read_text()
        if re.search(r"^\s*def (\w*reference\w*|_ref_\w*)\s*\(", text, flags=re.M):  # named like a reference
            raise ReleaseError(f"course_utils/grading/{name}.py is marked RELEASED_AS_SOURCE but defines a reference; "
                               f"move the reference to another grading module or drop the mark.")
        imported = set(re.findall(r"^\s*from \.(\w+) import", text, flags=re.M))
        imported |= set(re.findall(r"course_utils\.grading\.(\w+)", text))
        if imported - shipped:
            raise ReleaseError(f"course_utils/grading/{name}.py is marked RELEASED_AS_SOURCE but imports "
                               f"{', '.join(sorted(imported - shipped))}, which is not; mark it too or import from the lesson library.")
    return shipped


def reference_names(root: Path = ROOT) -> set[str]:
    """The grading modules' own top-level private functions and classes (the references and their helpers):
    none may appear in a release. Names that other course modules also define (shared helpers), and the names of the
    modules released as source (:func:`shipped_modules`), are left out."""
    def top_level(path: Path) -> set[str]:
        return set(re.findall(r"^(?:def|class)\s+(_\w+)", path.read_text(), flags=re.M))

    shipped = shipped_modules(root)
    folder = root / "course_utils" / "grading"
    grading = set().union(*(top_level(p) for p in folder.glob("*.py") if p.stem not in shipped))
    elsewhere = set().union(*(top_level(p) for p in (root / "course_utils").rglob("*.py")
                              if "grading" not in p.parts or p.stem in shipped))
    return {n for n in grading - elsewhere if not n.startswith("__") and len(n) > 6}


def pickled_strings(data: bytes) -> list[str]:
    """Every string a pickle holds (dictionary keys, texts, the module and name of a pickled function or class),
    read from its opcodes without unpickling anything; pickles nested as bytes (a module's bank of banks) too."""
    found: list[str] = []
    try:
        ops = list(pickletools.genops(data))
    except Exception:  # not a pickle (the raw bytes of an array)
        return found
    for _, arg, _ in ops:
        if isinstance(arg, str):
            found.append(arg)  # GLOBAL's "module name" too: the patterns below match whole identifiers
        elif isinstance(arg, (bytes, bytearray)) and arg[:1] == b"\x80":
            found.extend(pickled_strings(bytes(arg)))
    return found


def _leak_pattern(names: set[str]) -> re.Pattern:
    # whole identifiers only: a grading helper's name is a leak, the same letters inside a longer name (the
    # bank key "check_..._unchanged" holds those of an input maker's name) are not
    return re.compile(r"(?<![\w])(" + "|".join(sorted(map(re.escape, names), key=len, reverse=True)) + r")(?![\w])")


def find_leaks(out: Path, root: Path = ROOT) -> list[str]:
    """Files of a release that hold a solution marker (notebooks), a grading module's own private name (code,
    notebooks, and the strings of the banks: a pickled reference is stored as its module and name) or the
    grading modules' package path inside a bank."""
    names = reference_names(root)
    pattern = _leak_pattern(names)
    leaks = []
    for path in sorted(out.rglob("*")):
        if path.suffix == ".ipynb" and _MARKERS.search(path.read_text(errors="replace")):
            leaks.append(f"{path.relative_to(out)} (a solution marker)")
        elif path.suffix in (".py", ".ipynb") and (hit := pattern.search(path.read_text(errors="replace"))):
            leaks.append(f"{path.relative_to(out)} ({hit.group(1)})")
        elif path.suffix == ".pkl":
            strings = pickled_strings(path.read_bytes())
            hit = next((m.group(1) for t in strings if (m := pattern.search(t))), None)
            hit = hit or next((t for t in strings if "course_utils.grading" in t), None)
            if hit:
                leaks.append(f"{path.relative_to(out)} ({hit})")
    if (out / "solutions").exists():
        leaks.append("solutions/")
    return leaks


def build_release(out: Path | str, root: Path = ROOT, modules: list[str] | None = None, log=print) -> dict:
    """Write the learners' release into ``out``; return {module: {check: replays in the release}} (a bank, or a
    check released as source)."""
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise ReleaseError(f"{out}: not empty; pass a new folder for the release.")
    if root.resolve() in out.parents or out == root.resolve():
        raise ReleaseError(f"{out}: inside the repository; pass a folder outside it.")
    out.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("notebooks", "exercises"):
        shutil.copytree(root / folder, out / folder, ignore=ignore)
    shutil.copytree(root / "course_utils", out / "course_utils", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "grading"))
    for name in ("README.md", "LICENSE", "LICENSE-text.md", "pyproject.toml", "constraints.txt"):
        if (root / name).exists():
            shutil.copy(root / name, out / name)
    grading = out / "course_utils" / "grading"
    (grading / "_bank").mkdir(parents=True)
    (grading / "__init__.py").write_text('"""Released self-checks: banks recorded from the references, no reference code."""\n')
    names = modules or sorted(p.stem for p in (root / "course_utils" / "grading").glob("*.py") if not p.stem.startswith("_"))
    shipped = shipped_modules(root)
    for module in sorted(shipped):  # every one, whatever `modules` says: a released module may import it
        shutil.copy(root / "course_utils" / "grading" / f"{module}.py", grading / f"{module}.py")
    summary = {}
    for module in names:
        banks = record_module(module, shipped)
        if not banks:
            continue
        if module not in shipped:
            (grading / f"{module}.py").write_text(_module_source(module, banks, shipped))
            (grading / "_bank" / f"{module}.pkl").write_bytes(
                pickle.dumps({k: v for k, v in banks.items() if isinstance(v, bytes)}))
        summary[module] = {k: v is not None for k, v in banks.items()}
        sources = sum(isinstance(v, str) for v in banks.values())
        log(f"{module}: {sum(isinstance(v, bytes) for v in banks.values())} of {len(banks)} checks with a bank"
            + (f", {sources} released as source" if sources else ""))
    leaks = find_leaks(out, root)
    if leaks:
        raise ReleaseError(f"the release would contain solutions or references in {', '.join(leaks[:5])}; fix the copy rules.")
    return summary
