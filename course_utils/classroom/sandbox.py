"""The learner's kernel in a bubblewrap sandbox: no answers, no other submissions, no network, limits.

Used by :mod:`course_utils.classroom.grader` (``grade`` and ``grade-class``). The grader keeps the
pristine check cells and the references in its own process; only the kernel that runs the learner's
cells is sandboxed, with `bubblewrap <https://github.com/containers/bubblewrap>`_ (``bwrap``):

* the file system is read-only system folders (``/usr``, ``/lib``, ``/etc``, the Python installation
  and its virtual environment) plus two things the grader prepares: a copy of the course
  (:func:`course_copy`) **without** ``solutions/`` and with ``course_utils/grading`` replaced by
  stand-ins that hold no reference (the graded checks never run in the kernel), and a copy of the
  learner's own notebook in a private, writable ``tmpfs`` working folder;
* the class folder, the repository, the home folder and other submissions are not mounted at all;
  an installed copy of ``course_utils`` in site-packages is hidden under an empty ``tmpfs``;
* no network (``--unshare-net``), own process and IPC namespaces, a new session, dies with the grader;
* ``prlimit`` caps address space, processes and CPU seconds of the kernel;
* ``/tmp`` and the working folder are ``tmpfs``: nothing the learner's code writes outlives the kernel.

The grader talks to the kernel through Unix sockets (ZeroMQ ``ipc``) and the request/reply files of
:mod:`course_utils.classroom.remote`, both in one private folder bound into the sandbox at the same
path and deleted after the grading. Interrupts travel as Jupyter messages (``interrupt_mode
"message"``), since a signal to ``bwrap`` would end the sandbox.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..paths import ROOT

__all__ = ["SandboxUnavailable", "Limits", "bwrap_path", "sandbox_problem", "course_copy", "sandbox_command",
           "SandboxedKernelManager", "sandbox_wanted", "WORK", "COURSE", "NO_SANDBOX_HINT"]

WORK = "/sandbox/work"      # the learner's notebook copy and its writable working folder (tmpfs)
COURSE = "/sandbox/course"  # the course copy without answers (read-only)
NO_SANDBOX_HINT = ("install bubblewrap (`apt-get install bubblewrap`) so that learners' code runs isolated, "
                   "or pass --no-sandbox to grade trusted notebooks without isolation")
_HIDDEN_DIRS = {"solutions", "tests", ".git", ".venv", "site", "exercises", "notebooks"}


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here."""


class Limits:
    """Resource limits of a sandboxed kernel (``prlimit``): bytes of address space, processes, CPU seconds."""

    def __init__(self, memory_bytes: int = 8 << 30, processes: int = 256, cpu_seconds: int = 3600):
        self.memory_bytes, self.processes, self.cpu_seconds = int(memory_bytes), int(processes), int(cpu_seconds)


def sandbox_wanted() -> bool:
    """Grading is sandboxed unless ``--no-sandbox`` is given or the environment sets ``L2K_NO_SANDBOX=1``
    (the test suite does so where bubblewrap is missing, saying so)."""
    return os.environ.get("L2K_NO_SANDBOX", "") != "1"


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


_PROBLEM: list = []


def sandbox_problem() -> str | None:
    """None when a bubblewrap sandbox can be made here, else a one-sentence reason naming the fix."""
    if _PROBLEM:
        return _PROBLEM[0]
    import subprocess

    bwrap = bwrap_path()
    if bwrap is None:
        problem = f"bubblewrap (bwrap) is not installed, so learners' code cannot be isolated; {NO_SANDBOX_HINT}."
    else:
        probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--proc", "/proc", "--dev", "/dev",
                                "true"], capture_output=True, text=True)
        problem = None if probe.returncode == 0 else (
            f"bubblewrap cannot create a sandbox here ({probe.stderr.strip()[:120]}); allow unprivileged user namespaces "
            f"(sysctl kernel.unprivileged_userns_clone=1) or pass --no-sandbox to grade trusted notebooks without isolation.")
    _PROBLEM.append(problem)
    return problem


def _stub_module(name: str) -> str:
    return (f'"""Stand-in for course_utils.grading.{name} in the grading sandbox: the references stay with the grader.\n\n'
            'Graded check cells never run in the learner\'s kernel; the grader runs them in its own process.\n"""\n\n\n'
            "def __getattr__(name):\n"
            "    if not name.startswith('check'):\n"
            f"        raise AttributeError(f'course_utils.grading.{name}.{{name}} is not in the grading sandbox: "
            "the references stay with the grader.')\n\n"
            "    def graded_by_the_grader(*args, **kwargs):\n"
            "        return None\n\n"
            "    graded_by_the_grader.__name__ = name\n"
            "    return graded_by_the_grader\n")


def course_copy(dest: Path | str | None = None, root: Path = ROOT) -> Path:
    """A copy of the course for the sandbox: ``course_utils`` with stand-ins for ``grading``, ``benchmarks``.

    No ``solutions/``, no reference implementation, no tests (they import the references)."""
    dest = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="l2k-course-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "grading", "*.so.lock")
    shutil.copytree(root / "course_utils", dest / "course_utils", ignore=ignore, dirs_exist_ok=True)
    grading = dest / "course_utils" / "grading"
    grading.mkdir()
    (grading / "__init__.py").write_text('"""Stand-ins: the grading references are not part of the sandbox."""\n')
    for module in sorted((root / "course_utils" / "grading").glob("*.py")):
        if module.name != "__init__.py":
            (grading / module.name).write_text(_stub_module(module.stem))
    if (root / "benchmarks").is_dir():
        shutil.copytree(root / "benchmarks", dest / "benchmarks", ignore=ignore, dirs_exist_ok=True)
    return dest


def _system_binds() -> list[str]:
    args: list[str] = []
    for folder in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc"):
        if os.path.lexists(folder):
            kind = "--symlink" if os.path.islink(folder) else "--ro-bind"
            args += [kind, os.readlink(folder), folder] if kind == "--symlink" else [kind, folder, folder]
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    for prefix in sorted(prefixes):
        if not prefix.startswith(("/usr/", "/lib")) and prefix != "/usr":
            args += ["--ro-bind", prefix, prefix]
            if os.path.realpath(sys.prefix) == prefix and prefix != os.path.abspath(sys.prefix):
                pass
    if os.path.abspath(sys.prefix) != os.path.realpath(sys.prefix):  # a venv reached through a symlink
        args += ["--ro-bind", os.path.realpath(sys.prefix), os.path.abspath(sys.prefix)]
    # an installed (non-editable) course_utils in site-packages would carry the references: hide it
    for entry in sys.path:
        candidate = Path(entry) / "course_utils"
        if entry and candidate.is_dir() and candidate.resolve() != (ROOT / "course_utils").resolve():
            args += ["--tmpfs", str(candidate)]
    return args


def sandbox_command(command: list[str], *, course: Path, notebook: Path | None, shared: Path, limits: Limits) -> list[str]:
    """``command`` wrapped in bwrap + prlimit; ``shared`` is bound read-write at its own path (sockets, requests)."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable(sandbox_problem() or NO_SANDBOX_HINT)
    args = [bwrap, "--unshare-all", "--unshare-net", "--new-session", "--die-with-parent", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/sandbox"]
    args += _system_binds()
    args += ["--ro-bind", str(course), COURSE, "--dir", WORK]
    if notebook is not None:
        args += ["--ro-bind", str(notebook), f"{WORK}/{notebook.name}"]
    args += ["--bind", str(shared), str(shared), "--chdir", WORK]
    env = {"HOME": "/tmp", "PYTHONPATH": COURSE, "IPYTHONDIR": "/tmp/.ipython", "JUPYTER_RUNTIME_DIR": "/tmp/.jupyter",
           "MPLCONFIGDIR": "/tmp/.matplotlib", "TRITON_CACHE_DIR": "/tmp/.triton", "TMPDIR": "/tmp",
           "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    args += ["--clearenv"]
    for key, value in os.environ.items():  # thread counts, Triton mode, locale; never paths of the grader's machine
        if key.startswith(("OMP_", "MKL_", "OPENBLAS_", "TRITON_", "TORCH_", "CUDA_", "LC_", "LANG", "PYTHONHASHSEED", "L2K_")) \
                and "DIR" not in key and "PATH" not in key and "HOME" not in key:
            env.setdefault(key, value)
    for key, value in env.items():
        args += ["--setenv", key, value]
    prlimit = shutil.which("prlimit")
    limit = [prlimit, f"--as={limits.memory_bytes}", f"--nproc={_nproc_limit(limits.processes)}", f"--cpu={limits.cpu_seconds}",
             "--core=0", "--"] if prlimit else []
    return args + ["--", *limit, *command]


def _nproc_limit(extra: int) -> int:
    """RLIMIT_NPROC counts all processes of the user, so the cap is what runs now plus ``extra``."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count + extra


def SandboxedKernelManager(*, course: Path, notebook: Path | None, shared: Path, limits: Limits, kernel_name: str = "python3"):
    """An nbclient-ready AsyncKernelManager whose kernel runs in the sandbox, on ipc sockets in ``shared``."""
    from jupyter_client.manager import AsyncKernelManager

    class _Manager(AsyncKernelManager):
        def format_kernel_cmd(self, extra_arguments=None):
            command = super().format_kernel_cmd(extra_arguments)
            return sandbox_command(command, course=course, notebook=notebook, shared=shared, limits=limits)

    manager = _Manager(kernel_name=kernel_name, transport="ipc", ip=str(shared / "k"),
                       connection_file=str(shared / "kernel.json"))
    manager.kernel_spec.interrupt_mode = "message"  # a SIGINT to the process group would end bwrap itself
    return manager
