"""The learners' release (``python -m course_utils release OUT``): no solution, no reference, working self-checks.

One full release per module (a fixture): every check of every grading module must replay in it. The notebooks of
problem sets 00, 03 and 12 are run on it, and the checks that replay through the release's other paths are called
on it: inputs holding callables of ``course_utils.classroom.released`` (score_sde, vae, training_memory, the
simulated ranks of parallelism), drivers (foundations, mixed_precision, slm) and modules released as source (gemm,
floating_point). Each set's released exercise notebook is run with the solution cells filled in from ``solutions/``: every
check passes the right answers; a known mistake per set is named by the released check. Exercise and check cell
ids are read from the current solution notebooks, found by the function each exercise asks for. The other paths'
checks are called in one process on the release, with the right answers and mistakes of tests/test_grading_*.py.
"""
from __future__ import annotations

import importlib
import json
import pickle
import re
import subprocess
import sys

import nbformat
import pytest

from course_utils.paths import ROOT
from course_utils.classroom.release import build_release, find_leaks, pickled_strings, reference_names

pytestmark = pytest.mark.slow
SETS = {"00_foundations": "foundations", "03_convolution": "convolution", "12_score_sde": "score_sde"}

RUN = r'''
import json, sys, traceback
import nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
ns = {"__name__": "__main__"}
out = []
import contextlib, io
for cell in nb.cells:
    if cell.cell_type != "code":
        continue
    meta = cell.metadata.get("nbgrader", {})
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(cell.source, "<cell>", "exec"), ns)
        out.append([meta.get("grade_id"), "ok", "", printed.getvalue()[-2000:]])
    except BaseException as exc:
        out.append([meta.get("grade_id"), type(exc).__name__, str(exc)[:300], printed.getvalue()[-2000:]])
import course_utils
out.append(["__file__", course_utils.__file__, "", ""])
print("RESULT" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("rel") / "release"
    summary = build_release(out, log=lambda *a: None)  # every grading module: a check added without a bank fails below
    return out, summary


def _run(release_dir, nb, tmp_path):
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    script = tmp_path / "run.py"
    script.write_text(RUN)
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True, timeout=900,
                          cwd=release_dir / "exercises", env={"PYTHONPATH": str(release_dir), "PATH": "/usr/bin:/bin",
                                                               "HOME": str(tmp_path)})
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, done.stderr[-2000:]
    results = json.loads(line[len("RESULT"):])
    assert results[-1][1].startswith(str(release_dir)), results[-1]  # the release's package, not the repository's
    return {gid: (status, message, printed) for gid, status, message, printed in results[:-1] if gid}


def _cells(stem):
    """{grade_id: source} of the solution notebook's answer cells and of its graded check cells."""
    cells = [c for c in nbformat.read(ROOT / "solutions" / f"{stem}.ipynb", as_version=4).cells
             if c.metadata.get("nbgrader", {}).get("grade_id")]
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in cells if c.metadata["nbgrader"].get("solution")}
    graded = {c.metadata["nbgrader"]["grade_id"]: c.source for c in cells if c.metadata["nbgrader"].get("grade")}
    return solved, graded


def _exercise(stem, function):
    """(answer cell id, check cell id, check name) of the exercise of ``stem`` that asks for ``function``."""
    solved, graded = _cells(stem)
    answer = [gid for gid, src in solved.items() if re.search(rf"^def {function}\(", src, flags=re.M)]
    assert len(answer) == 1, f"{stem}: no single answer cell defines {function}() any more; update MISTAKES"
    check = [(gid, m.group(1)) for gid, src in graded.items()
             if (m := re.search(rf"grading\.(check_\w+)\({function}\b", src))]
    assert len(check) == 1, f"{stem}: no single graded cell checks {function}(); update MISTAKES"
    return answer[0], check[0][0], check[0][1]


def _filled(release_dir, stem, answers=None):
    """The released exercise notebook with the solution cells of solutions/ (or ``answers``) filled in."""
    nb = nbformat.read(release_dir / "exercises" / f"{stem}.ipynb", as_version=4)
    solved = dict(_cells(stem)[0])
    solved.update(answers or {})
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in solved and cell.metadata["nbgrader"].get("solution"):
            cell.source = solved[gid]
    return nb


def test_the_release_holds_no_solution_and_no_reference(release):
    out, summary = release
    assert not (out / "solutions").exists() and not (out / "tests").exists()
    assert find_leaks(out) == []
    names = reference_names()
    assert "_reference_c_strides" in names and len(names) > 50
    assert "_inputs" in names  # an input maker of the grading modules: a leak as a name, not inside another word
    for bank in (out / "course_utils" / "grading" / "_bank").glob("*.pkl"):
        data = bank.read_bytes()
        assert b"course_utils.grading" not in data
        strings = pickled_strings(data)
        assert "check_inputs_unchanged" in strings  # the scan reads the nested banks' strings
        words = {w for s in strings for w in re.findall(r"\w+", s)}
        assert not words & names, words & names  # no reference's or helper's name, as a whole identifier
        assert pickle.loads(data)
    for module in SETS.values():
        text = (out / "course_utils" / "grading" / f"{module}.py").read_text()
        assert "def check_" in text and "_reference" not in text
        assert (ROOT / "course_utils" / "grading" / f"{module}.py").read_text() != text
    unreplayed = {f"{m}.{c}" for m, checks in summary.items() for c, replays in checks.items() if not replays}
    assert not unreplayed, unreplayed  # every check replays a bank or is released as source
    # the inputs' classes and drivers ship (course_utils/classroom/released.py); modules released as source are copies
    assert (out / "course_utils" / "classroom" / "released.py").exists()
    for module in ("gemm_kernels", "gemm_split_k", "floating_point_stochastic", "parallelism_gloo"):
        assert (out / "course_utils" / "grading" / f"{module}.py").read_text() == \
            (ROOT / "course_utils" / "grading" / f"{module}.py").read_text()


def test_a_planted_reference_is_found(tmp_path):
    from course_utils.grading import foundations

    (tmp_path / "course_utils").mkdir()
    (tmp_path / "course_utils" / "bank.pkl").write_bytes(pickle.dumps({"k": pickle.dumps(foundations._reference_c_strides)}))
    (tmp_path / "course_utils" / "helper.py").write_text("from x import _inputs\n")
    (tmp_path / "course_utils" / "fine.py").write_text("check_inputs_unchanged = True\n")
    leaks = find_leaks(tmp_path)
    assert leaks == ["course_utils/bank.pkl (_reference_c_strides)", "course_utils/helper.py (_inputs)"], leaks


MISTAKES = {  # per set: the function asked for, a wrong answer, words of the hint the released check must give
    "00_foundations": ("c_strides", "def c_strides(shape, itemsize, perm):\n    strides, size = [], 1\n"
                       "    for d in reversed(shape):\n        strides.insert(0, size)\n        size *= d\n"
                       "    return tuple(strides[p] for p in perm)", "in elements"),
    "03_convolution": ("conv_output_shape", "def conv_output_shape(hw, kernel, stride, padding, dilation):\n"
                       "    return tuple((hw[a] + 2 * padding[a] - kernel[a]) // stride[a] + 1 for a in (0, 1))",
                       "forgot the dilation"),
    "12_score_sde": ("ve_probability_flow_drift", "def ve_probability_flow_drift(x, score, u, sigma_min, sigma_max):\n"
                     "    sigma = sigma_min * (sigma_max / sigma_min) ** u\n"
                     "    return math.log(sigma_max / sigma_min) * sigma**2 * score", "sign of the score"),
}


@pytest.mark.parametrize("stem", list(SETS))
def test_the_released_self_checks_pass_the_right_answers_and_name_a_mistake(release, stem, tmp_path):
    """The released notebook filled with the solution's answers: every check passes (those with a bank say they
    replayed it). Then, at its end, one exercise answered again, wrong (MISTAKES), and its check run again: it fails
    naming the mistake. One run of the released notebook per set (right answers and a mistake used to be two)."""
    out, summary = release
    function, source, fragment = MISTAKES[stem]
    answer, check_cell, check = _exercise(stem, function)
    assert summary[SETS[stem]][check], f"{check} has no bank: pick an exercise whose check replays one"
    nb = _filled(out, stem)
    released_check = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == check_cell)
    for gid, code in ((answer + "_wrong", source), (check_cell + "_wrong", released_check.source)):
        nb.cells.append(nbformat.v4.new_code_cell(code, metadata={"nbgrader": {"grade_id": gid}}))
    results = _run(out, nb, tmp_path)
    _, graded = _cells(stem)
    assert graded and set(graded) <= set(results), sorted(set(graded) - set(results))
    assert all(results[gid][0] == "ok" for gid in graded), {gid: results[gid][:2] for gid in graded}
    module = SETS[stem]
    replayed = 0
    for gid, code in graded.items():
        name = re.search(r"grading\.(check_\w+)\(", code).group(1)
        if summary[module][name]:  # a banked check said so; the others say that only the grader checks them
            assert "matches the recorded answers" in results[gid][2], (gid, results[gid][2])
            replayed += 1
    assert replayed >= len(graded) // 2, replayed
    status, message, _ = results[check_cell + "_wrong"]
    assert status == "CheckFailed" and fragment in message, (status, message)


def test_the_released_self_checks_keep_the_by_hand_watch(release, tmp_path):
    """The check's ``by_hand=`` travels with its bank. Its ``allow`` lets conv2d_grouped's answer call the course's
    im2col (the right-answers test above); its operator families refuse a micro-kernel whose GEMM is torch.inner,
    which no name in the check's ``forbidden=`` list covers (it reaches aten's mm)."""
    out, summary = release
    answer, check_cell, check = _exercise("03_convolution", "micro_kernel_update")
    assert summary["convolution"][check]
    source = ("def micro_kernel_update(c, a_panel, b_panel, i0, j0):\n"
              "    mr, nr = a_panel.shape[1], b_panel.shape[1]\n"
              "    rows, cols = min(mr, c.shape[0] - i0), min(nr, c.shape[1] - j0)\n"
              "    out = c.clone()\n"
              "    out[i0:i0 + rows, j0:j0 + cols] += torch.inner(a_panel.T, b_panel.T)[:rows, :cols]\n"
              "    return out")
    results = _run(out, _filled(out, "03_convolution", {answer: source}), tmp_path)
    status, message, _ = results[check_cell]
    assert status == "ForbiddenCall" and "mm" in message, (status, message)


def test_release_refuses_a_folder_inside_the_repository():
    from course_utils.classroom.release import ReleaseError

    with pytest.raises(ReleaseError, match="outside"):
        build_release(ROOT / "build_release_here")


def test_a_size_limit_given_as_a_function_is_stored_per_fixed_input():
    import numpy as np

    from course_utils.classroom.forbidden import ByHand
    from course_utils.classroom.release import _by_hand_fields, _by_hand_limits

    spec = ByHand(names=("torch.mm", "course_utils.grading.foundations._reference_c_strides"),
                  max_numel=lambda args, kwargs: 2 * args[0].size)
    fields = _by_hand_fields(spec)
    assert "max_numel" not in fields and fields["names"] == ("torch.mm",)
    limits = _by_hand_limits(spec, (np.zeros((3, 4)),), {})
    assert limits == {"max_numel": 24}
    assert ByHand(**fields, **limits).max_numel == 24 and pickle.dumps(fields)


REPLAY = r'''
import contextlib, importlib, io, json, pickle, sys
with open(sys.argv[1], "rb") as f:
    cases = pickle.load(f)
out = []
for module, check, fn in cases:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            getattr(importlib.import_module("course_utils.grading." + module), check)(fn)
        out.append(["ok", "", printed.getvalue()])
    except BaseException as exc:
        out.append([type(exc).__name__, str(exc)[:400], printed.getvalue()])
import course_utils
print("RESULT" + json.dumps([out, course_utils.__file__]))
'''


def _replay_in_release(release_dir, cases, tmp_path):
    """[(status, message, printed)] of ``module.check(fn)`` for each case, in one process on the release's package.
    The answers travel by value (cloudpickle): they come from test modules that the release does not hold."""
    cloudpickle = pytest.importorskip("cloudpickle")
    modules = {importlib.import_module(fn.__module__) for _, _, fn in cases if fn.__module__ != __name__}
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        (tmp_path / "cases.pkl").write_bytes(cloudpickle.dumps(cases))
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    (tmp_path / "replay.py").write_text(REPLAY)
    done = subprocess.run([sys.executable, str(tmp_path / "replay.py"), str(tmp_path / "cases.pkl")], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env={"PYTHONPATH": str(release_dir), "PATH": "/usr/bin:/bin",
                                                                     "HOME": str(tmp_path), "OMP_NUM_THREADS": "1"})
    line = next((l for l in done.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, done.stderr[-3000:]
    results, package = json.loads(line[len("RESULT"):])
    assert package.startswith(str(release_dir)), package  # the release's package, not the repository's
    return results


def test_checks_with_callables_drivers_and_simulated_ranks_replay_and_name_mistakes(release, tmp_path):
    """Right answers pass the released checks and a named mistake of each path is named: inputs holding the
    callables of course_utils.classroom.released (a noise predictor, a score function, a decoder, small modules,
    simulated peer ranks), drivers (numerical_jacobian's restore, the loss scaler's script, choose_variants's total
    loss) and the modules released as source (stochastic rounding, the GEMM kernels' launchers)."""
    import math

    tfd = importlib.import_module("test_grading_foundations")
    tmp = importlib.import_module("test_grading_mixed_precision")
    tss = importlib.import_module("test_grading_score_sde")
    tvae = importlib.import_module("test_grading_vae")
    ttm = importlib.import_module("test_grading_training_memory")
    tpar = importlib.import_module("test_grading_parallelism")
    tslm = importlib.import_module("test_grading_slm")
    tfp = importlib.import_module("test_grading_floating_point")

    zero2, sr_bf16 = tpar.zero2_solution, tfp.sr_bf16  # the local functions hold functions, not the test modules

    class NeverSkips(tmp.GoodScaler):
        def unscale_(self, grads):
            super().unscale_(grads)
            return False

    def greedy(costs, losses, budget):  # the slm check's named mistake, written by a learner
        choice, used = [0] * len(costs), sum(c[0] for c in costs)
        while used > budget:
            _, i, j = min(((losses[i][j] - losses[i][choice[i]]) / (costs[i][choice[i]] - costs[i][j]), i, j)
                          for i in range(len(costs)) for j in range(len(costs[i])) if costs[i][j] < costs[i][choice[i]])
            used, choice[i] = used + costs[i][j] - costs[i][choice[i]], j
        return choice

    def unpadded(param, grad, m, v, step, lr, betas, eps, comm):  # reduce-scatter of the gradient as it is
        comm.reduce_scatter(grad.new_empty(m.numel()), grad)
        return zero2(param, grad, m, v, step, lr, betas, eps, comm)

    def linear_stub(x, w, out, block_m=32, block_n=32, block_k=16):
        raise NotImplementedError

    def linear_by_torch(x, w, out, block_m=32, block_n=32, block_k=16):
        out.copy_(torch.matmul(x, w.T))

    import torch

    right = "matches the recorded answers"
    # (diffusion's checks are left out here: resolving their forbidden diffusers names imports diffusers, seconds)
    cases = [  # (module, check, answer, expected status, a fragment of the message or of the printed line)
        ("score_sde", "check_langevin_step", tss.langevin_solution, "ok", right),
        ("score_sde", "check_langevin_step", lambda x, s, tau, z: x - tau * s(x) + math.sqrt(2 * tau) * z,
         "CheckFailed", "sign of the score"),
        ("vae", "check_negative_elbo", tvae.neg_elbo_ok, "ok", right),
        ("training_memory", "check_saved_bytes", ttm.saved_solution, "ok", right),
        ("parallelism", "check_zero2_adam_step", tpar.zero2_solution, "ok", right),
        ("parallelism", "check_zero2_adam_step", unpadded, "CheckFailed", "zero-padded"),  # the simulated ranks say so
        ("foundations", "check_numerical_jacobian", tfd.jacobian_in_place, "ok", right),
        ("foundations", "check_numerical_jacobian", tfd.jacobian_forward, "CheckFailed", "forward difference"),
        ("foundations", "check_numerical_jacobian", tfd.jacobian_not_restored_in_place, "CheckFailed",
         "put each perturbed entry back"),  # the driver's own check
        ("foundations", "check_numerical_jacobian", tfd.jacobian_not_restored_on_copy, "CheckFailed",
         "restore x[i] = original"),
        ("mixed_precision", "check_dynamic_loss_scaler", tmp.GoodScaler, "ok", right),
        ("mixed_precision", "check_dynamic_loss_scaler", NeverSkips, "CheckFailed", "was not reported"),
        ("slm", "check_choose_variants", tslm.choose_variants, "ok", right),
        ("slm", "check_choose_variants", greedy, "CheckFailed", "greedy"),
        ("floating_point", "check_stochastic_rounding", tfp.sr_bf16, "ok", "bf16 neighbour"),
        ("floating_point", "check_stochastic_rounding", lambda x, rng: sr_bf16(x, rng, variant="truncate"),
         "CheckFailed", "never round up"),
        ("gemm", "check_linear", linear_stub, "NotAttempted", "not attempted"),
        ("gemm", "check_linear", linear_by_torch, "ForbiddenCall", "torch.matmul"),
    ]
    results = _replay_in_release(release[0], [c[:3] for c in cases], tmp_path)
    for (module, check, _, status, fragment), (got, message, printed) in zip(cases, results):
        assert got == status and fragment in (message if status != "ok" else printed), (module, check, got, message, printed)


def test_a_driver_from_the_grading_modules_gets_no_bank(monkeypatch):
    """Only course_utils.classroom.released travels in a bank: a driver that adapts the learner's call, defined in a
    grading module (where references live), leaves the check without one; the module's other checks still bank."""
    import functools
    import types

    from course_utils.classroom import checking
    from course_utils.classroom.release import _storable, record_module
    from course_utils.classroom.released import SmoothMap, call_restoring
    from course_utils.grading import foundations

    assert record_module("foundations")["check_numerical_jacobian"] is not None  # SmoothMap + call_restoring: banked

    def private_driver(fn, f, x, eps):  # adapts the call: not a guard that hands the inputs over unchanged
        return fn(f, x + 0.5, eps)

    private_driver.__module__ = "course_utils.grading.foundations"
    reference = foundations._reference_numerical_jacobian

    def check(fn, **kwargs):  # run with the grading module's globals: the release swaps its check_function
        check_function(functools.partial(private_driver, fn), reference,  # noqa: F821
                       lambda rng: (SmoothMap(rng, 2, 3), rng.standard_normal(2), 1e-3), name="numerical_jacobian")

    check = types.FunctionType(check.__code__, foundations.__dict__, "check", None, check.__closure__)
    monkeypatch.setattr(foundations, "check_numerical_jacobian", check)
    banks = record_module("foundations")
    assert banks["check_numerical_jacobian"] is None and banks["check_c_strides"] is not None
    monkeypatch.undo()
    # a pickle that names the classroom outside released.py (a Mistake, a check's helper) is refused
    assert _storable({"f": call_restoring}) is not None
    assert _storable({"f": checking.check_function}) is None


def test_a_module_released_as_source_may_hold_no_reference(tmp_path):
    from course_utils.classroom.release import ReleaseError, reference_names, shipped_modules

    grading = tmp_path / "course_utils" / "grading"
    grading.mkdir(parents=True)
    (grading / "kernels.py").write_text('RELEASED_AS_SOURCE = "compares with torch"\n\ndef _emulated_mistake():\n    pass\n')
    (grading / "topic.py").write_text("def _reference_answer():\n    pass\n\ndef _emulated_mistake():\n    pass\n")
    assert shipped_modules(tmp_path) == {"kernels"}
    assert reference_names(tmp_path) == {"_reference_answer"}  # a name the shipped module defines is not a leak
    (grading / "kernels.py").write_text('RELEASED_AS_SOURCE = "x"\nfrom .topic import _reference_answer\n')
    with pytest.raises(ReleaseError, match="imports topic"):
        shipped_modules(tmp_path)
    for reference in ("_reference_answer", "_kahan_reference", "_ref_rne"):
        (grading / "kernels.py").write_text(f'RELEASED_AS_SOURCE = "x"\n\ndef {reference}(x):\n    return x\n')
        with pytest.raises(ReleaseError, match="defines a reference"):
            shipped_modules(tmp_path)


def test_a_drivers_watch_goes_with_each_call_of_a_remote_learner():
    """In the grader the learner's function is a remote proxy: a driver around it (functools.partial(driver, fn)) gets
    the check's watch sent along with each call of the proxy, into the learner's kernel."""
    import functools

    import numpy as np

    from course_utils.classroom.checking import call_learner
    from course_utils.classroom.released import call_restoring
    from course_utils.errors import ForbiddenCall

    class Remote:
        specs = []

        def __course_remote_call__(self, args, kwargs, spec):
            self.specs.append(spec)
            return np.ones((1, 1)), ("torch.autograd.functional.jacobian" if len(self.specs) > 1 else None)

        def __call__(self, *args, **kwargs):
            raise AssertionError("called locally, unwatched")

    remote = Remote()
    args = (np.sin, np.zeros(1), 1e-3)
    got = call_learner("numerical_jacobian", functools.partial(call_restoring, remote), args,
                       forbidden=("torch.autograd.functional.jacobian",))
    assert got.shape == (1, 1) and remote.specs and remote.specs[0]
    with pytest.raises(ForbiddenCall, match="jacobian"):
        call_learner("numerical_jacobian", functools.partial(call_restoring, remote), args,
                     forbidden=("torch.autograd.functional.jacobian",))


def test_only_a_released_driver_marked_runs_in_kernel_goes_to_the_kernel_whole():
    """RemoteDriver sends the whole driver to the learner's kernel only for a function of released.py marked
    ``runs_in_kernel`` (its whole result is compared with the reference); any other driver runs in the grader."""
    import functools

    from course_utils.classroom.released import call_restoring, drive_loss_scaler
    from course_utils.classroom.remote import RemoteDriver

    class Remote:
        def __course_remote_call__(self, args, kwargs, spec=()):
            raise AssertionError("not called here")

    def lookalike(make_scaler, hyper, script):
        return None

    lookalike.runs_in_kernel = True  # marked, but not a function of released.py
    assert RemoteDriver.applies(functools.partial(drive_loss_scaler, Remote()))
    assert not RemoteDriver.applies(functools.partial(call_restoring, Remote()))  # its check stays in the grader
    assert not RemoteDriver.applies(functools.partial(lookalike, Remote()))
    assert not RemoteDriver.applies(functools.partial(drive_loss_scaler, lambda **h: None))  # a local class
    assert not RemoteDriver.applies(drive_loss_scaler)
