"""The grader's trusted half: pristine check cells run here, against the learner's kernel over the wire.

Used by :mod:`course_utils.grader`. :class:`KernelSession` sends requests into the learner's kernel
(:mod:`course_utils.remote` answers them there); :func:`run_check` runs one pristine graded cell in this
process, in a namespace made from the pristine notebook's opening cells, with the learner's names bound
to remote proxies; :func:`tampered` compares the submission's graded cells with the pristine ones.
"""
from __future__ import annotations

import sys

import ast
import builtins
import contextlib
import io
import json
import os
import time
from pathlib import Path

import nbformat

from .assignments import BEGIN_HIDDEN, END_HIDDEN, _strip_regions, is_graded, is_solution
from .notebooks import error_of, normalized_source, number, one_line

__all__ = ["KernelSession", "tampered", "preamble_namespace", "run_check"]


def _release_source(cell) -> str:
    """The graded cell as learners receive it: hidden tests removed."""
    return "\n".join(_strip_regions(cell.source.split("\n"), BEGIN_HIDDEN, END_HIDDEN, None, "pristine"))


def tampered(pristine_cell, submitted_cell) -> str | None:
    if submitted_cell is None:
        return "the graded cell was deleted (or its grade_id changed); restore it from a fresh copy of the exercise."
    allowed = {normalized_source(pristine_cell.source), normalized_source(_release_source(pristine_cell))}
    if submitted_cell.cell_type != "code" or normalized_source(submitted_cell.source) not in allowed:
        return "the graded cell was changed; graded cells must stay as handed out (restore it from a fresh copy)."
    return None


def _learner_names(source: str, known: dict) -> list[str]:
    """Names a check cell reads that the pristine preamble does not define: the learner's objects."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return sorted(n for n in names if n not in known and not hasattr(builtins, n))


class KernelSession:
    """The learner's kernel, seen from the grading process: cells to run and remote requests."""

    def __init__(self, client, cell_timeout: float, workdir: Path, sandboxed: bool = False):
        self.client, self.cell_timeout, self.workdir = client, cell_timeout, workdir
        self.sandboxed = sandboxed  # the kernel has no course_utils.grading: check-made inputs travel by value
        self.count = 0
        self.dead = False

    def run_code(self, source: str):
        from nbclient.exceptions import DeadKernelError

        cell = nbformat.v4.new_code_cell(source)
        cells = self.client.nb.cells
        cells.append(cell)  # nbclient writes a cell back by its index: lend it a slot past the learner's cells
        try:
            self.client.execute_cell(cell, len(cells) - 1)
        except DeadKernelError:
            self.dead = True
        finally:
            cells.pop()
        return cell

    def warm_up(self, seconds: float) -> None:
        """Import the kernel side of the protocol (numpy; torch only once the learner's code imports it) before the
        learner's cells, outside their limit."""
        saved = self.client.timeout
        self.client.timeout = seconds
        try:
            self.run_code("import course_utils.classroom.remote")
        finally:
            self.client.timeout = saved

    def resync(self, patience: float = 30.0) -> bool:
        """After an interrupt, wait until the kernel answers again (True), interrupting once more if needed."""
        saved = self.client.timeout
        self.client.timeout = max(patience, self.cell_timeout)
        try:
            for _attempt in range(2):
                tick = time.monotonic()
                self.run_code("pass")
                if self.dead:
                    return False
                if time.monotonic() - tick < self.client.timeout:
                    return True
            return False
        finally:
            self.client.timeout = saved

    def request(self, request: dict):
        """Send one request (see :mod:`course_utils.remote`) and return ``(reply, arrays)``."""
        import cloudpickle
        import numpy as np

        from .remote import RemoteDead, RemoteTimeout, remote_error

        if self.dead:
            raise RemoteDead("DeadKernel", "the learner's kernel died earlier")
        self.count += 1
        grading = sys.modules.get("course_utils.grading")  # loaded whenever a check runs; classroom never imports it
        if self.sandboxed and grading is not None:
            cloudpickle.register_pickle_by_value(grading)
        base = str(self.workdir / f"r{self.count}")
        with open(base + ".in", "wb") as f:
            cloudpickle.dump(request, f)
        tick = time.monotonic()
        cell = self.run_code(f"import course_utils.classroom.remote as _l2k_remote; _l2k_remote.serve({base!r})")
        if self.dead:
            raise RemoteDead("DeadKernel", "the kernel died while running your code (a crash or out of memory)")
        if not os.path.exists(base + ".json"):
            if time.monotonic() - tick >= self.cell_timeout:
                if not self.resync():
                    self.dead = True
                raise RemoteTimeout("Timeout", f"your code ran longer than {number(self.cell_timeout)} s and was interrupted")
            error = error_of(cell)
            raise remote_error(*(error or ("NoReply", "the kernel did not answer")))
        reply = json.loads(Path(base + ".json").read_text())
        with np.load(base + ".npz", allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        if "error" in reply:
            if reply["error"]["type"] == "KeyboardInterrupt" and time.monotonic() - tick >= self.cell_timeout:
                self.resync()
                raise RemoteTimeout("Timeout", f"your code ran longer than {number(self.cell_timeout)} s and was interrupted")
            raise remote_error(reply["error"]["type"], reply["error"]["message"], reply["error"].get("line", ""))
        return reply, arrays

    def resolve(self, name: str):
        """The learner's global ``name``: data comes back as data, anything else as a RemoteObject."""
        from .remote import RemoteObject, decode

        reply, arrays = self.request({"op": "resolve", "name": name, "handle": None})
        if reply.get("missing"):
            return None, False
        value = decode(reply["value"], arrays, self)
        if isinstance(value, RemoteObject):  # keep the name: the learner may redefine it later
            value = RemoteObject(self, name=name, type_name=value._type_name, is_callable=value._is_callable)
        return value, True


def preamble_namespace(pristine) -> dict:
    """Run the pristine notebook's opening code cells (imports, setup) here, before its first exercise."""
    namespace: dict = {"__name__": "__course_check__"}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for cell in pristine.cells:
            if cell.cell_type != "code":
                continue
            if is_solution(cell) or is_graded(cell):
                break
            exec(compile(cell.source, "<pristine preamble>", "exec"), namespace)  # noqa: S102 (the course's own code)
    return namespace


def run_check(source: str, preamble: dict, session: KernelSession) -> tuple[str, str]:
    """Run a pristine graded cell here against the learner's kernel; return (status, hint)."""
    from .remote import RemoteDead, RemoteError, RemoteTimeout

    namespace = dict(preamble)
    for name in _learner_names(source, namespace):
        try:
            value, found = session.resolve(name)
        except RemoteTimeout as exc:
            return "timed out", exc.message
        except RemoteError as exc:
            return "error", f"{name}: {exc.type_name}: {exc.message}"
        if found:
            namespace[name] = value
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exec(compile(source, "<pristine check>", "exec"), namespace)  # noqa: S102 (the course's own code)
    except RemoteTimeout as exc:
        return "timed out", f"{exc.message}; look for an endless loop."
    except RemoteDead as exc:
        return "error", exc.message
    except NotImplementedError as exc:
        return "not attempted", one_line(getattr(exc, "message", "") or str(exc)) or "not attempted yet."
    except AssertionError as exc:  # CheckFailed, NotAttempted, ForbiddenCall, a hidden test's assert
        if type(exc).__name__ == "NotAttempted":
            return "not attempted", one_line(str(exc))
        return "failed", one_line(str(exc)) or "the check failed."
    except NameError as exc:
        return "error", f"{one_line(str(exc))}: define it (run the exercise's cell without errors)."
    except RemoteError as exc:
        return "error", one_line(f"your code raised {exc.type_name}: {exc.message}")
    except Exception as exc:  # the check itself could not use what the learner's code returned
        return "failed", one_line(f"{type(exc).__name__}: {exc}")[:300]
    return "passed", ""
