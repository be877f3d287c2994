"""The setup cell of every notebook: seeds, device tier, Triton mode, one line about the machine.

Used by every lesson and problem set (``notebooks/``, ``solutions/``) as::

    from course_utils import setup
    env = setup(seed=0)

Tiers (README.md, "Running on a GPU"; CONTRIBUTING.md):

* ``cpu``  -- no CUDA device: everything runs, Triton through its interpreter, small sizes, fp32.
* ``cuda`` -- a CUDA device: compiled Triton kernels, real sizes, bf16/fp16.
* ``sm90`` -- a Hopper GPU (H100/H200, compute capability 9.x): adds the Hopper-only material.

``COURSE_TIER=cpu`` in the environment forces the CPU tier on a GPU machine (useful for checking
that the CPU path of a notebook still works).

``COURSE_TIER_SIMULATE=sm90`` (or ``cuda-sm80``, ``cuda-sm75``) simulates a GPU tier on a CPU, for CI's
GPU-tier dry run (``tests/test_gpu_dry_run.py``): :func:`detect_tier` reports that tier, so every ``cuda`` /
``sm90`` branch of a notebook runs, but tensors stay on the CPU (:attr:`Env.device`), Triton runs in its
interpreter, :meth:`Env.size` gives the CPU tier's (tiny) problem sizes and :attr:`Env.low_precision` fp32
(the interpreter's 16-bit dots are wrong). What the interpreter cannot judge (dtypes in compiled kernels,
shared memory, spills) is covered by the ahead-of-time compile tests (``tests/test_compile_kernels.py``).
"""
from __future__ import annotations

import os
import platform
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import TritonUnavailable

__all__ = ["Env", "setup", "detect_tier", "configure_triton", "configure_numba", "prefer_wide_vectors", "prefer_workqueue_threads",
           "import_triton", "seed_everything", "TritonUnavailable", "TRITON_MISSING", "TIERS"]

TIERS = ("cpu", "cuda", "sm90")
# COURSE_TIER_SIMULATE value -> (tier, compute capability as 10*major+minor, device, SMs)
SIMULATED = {
    "sm90": ("sm90", 90, "NVIDIA H100/H200 (sm_90)", 132),
    "cuda-sm80": ("cuda", 80, "NVIDIA A100 (sm_80)", 108),
    "cuda-sm75": ("cuda", 75, "NVIDIA T4 (sm_75)", 40),
}


def simulated() -> tuple[str, int, str, int] | None:
    """``(tier, arch, device name, SMs)`` when ``COURSE_TIER_SIMULATE`` asks for a simulated GPU tier, else None."""
    name = os.environ.get("COURSE_TIER_SIMULATE", "").strip().lower()
    if not name:
        return None
    if name not in SIMULATED:
        raise ValueError(f"COURSE_TIER_SIMULATE={name!r} is not a simulated tier; use one of {', '.join(SIMULATED)} "
                         "or unset it.")
    return SIMULATED[name]


@dataclass(frozen=True)
class Env:
    """What a notebook needs to know about where it runs."""

    tier: str  # "cpu", "cuda" or "sm90"
    seed: int  # the seed every generator was given
    triton_mode: str  # "compiled", "interpreted" or "missing"
    device_name: str  # e.g. "cpu (x86_64, 2 cores)" or "NVIDIA H200"
    versions: dict = field(default_factory=dict)  # package -> version string
    arch: int | None = None  # the GPU's compute capability as 10*major+minor (90, 80, 75); None on the CPU tier
    simulated: bool = False  # True under COURSE_TIER_SIMULATE: a GPU tier's branches, run on the CPU
    sms: int = 4  # streaming multiprocessors (a pretend 4 on the CPU tier, so the interpreter runs few programs)

    @property
    def has_triton(self) -> bool:
        """False where the triton package is not installed (macOS, Windows, Arm Linux)."""
        return self.triton_mode != "missing"

    def needs_triton(self, what: str):
        """``with env.needs_triton("the Triton rung"):`` runs the block, or prints one notice without Triton.

        Without Triton, a kernel defined through :func:`import_triton` ``(stub=True)`` raises
        :class:`TritonUnavailable` when launched or compiled; this context manager turns that into one line
        saying what is skipped and how to get it, so the rest of the notebook runs.
        """
        return _NeedsTriton(what)

    @property
    def device(self):
        """The torch device for this tier (``cuda`` for both GPU tiers)."""
        import torch

        return torch.device("cpu" if self.tier == "cpu" or self.simulated else "cuda")

    @property
    def on_gpu(self) -> bool:
        return self.tier != "cpu"

    @property
    def is_hopper(self) -> bool:
        return self.tier == "sm90"

    @property
    def low_precision(self):
        """The 16-bit dtype for this tier: bf16 on a GPU, fp16 on a T4 (sm_75: no bf16 tensor cores), fp32 on
        the CPU and under a simulated tier (the interpreter's 16-bit dots are wrong)."""
        import torch

        if not self.on_gpu or self.simulated:
            return torch.float32
        return torch.float16 if (self.arch or 0) < 80 else torch.bfloat16

    def size(self, cpu: Any, cuda: Any, sm90: Any = None) -> Any:
        """:meth:`pick` for problem sizes: a simulated GPU tier runs the CPU tier's (tiny) sizes."""
        return cpu if self.simulated else self.pick(cpu, cuda, sm90)

    def synchronize(self) -> None:
        """Wait for the GPU (a no-op on the CPU and under a simulated tier)."""
        if self.on_gpu and not self.simulated:
            import torch

            torch.cuda.synchronize()

    def pick(self, cpu: Any, cuda: Any, sm90: Any = None) -> Any:
        """Choose a value (a size, a dtype, a repeat count) by tier; ``sm90`` defaults to ``cuda``."""
        if self.tier == "sm90" and sm90 is not None:
            return sm90
        return cpu if self.tier == "cpu" else cuda

    def describe(self) -> str:
        """The one line printed by :func:`setup`."""
        v = self.versions
        parts = [f"tier={self.tier}" + (" (simulated on the CPU)" if self.simulated else ""), self.device_name, f"python {v.get('python', '?')}"]
        for pkg in ("numpy", "torch", "triton"):
            if pkg in v:
                parts.append(f"{pkg} {v[pkg]}")
        parts.append(f"triton {self.triton_mode}")
        parts.append(f"seed={self.seed}")
        return " | ".join(parts)


def detect_tier() -> str:
    """``cpu``, ``cuda`` or ``sm90`` from the visible CUDA device (``COURSE_TIER`` overrides)."""
    forced = os.environ.get("COURSE_TIER", "").strip().lower()
    sim = simulated()
    if sim and forced != "cpu":
        return sim[0]
    if forced:
        if forced not in TIERS:
            raise ValueError(f"COURSE_TIER={forced!r} is not a tier; use one of {', '.join(TIERS)} or unset it.")
        return forced
    try:
        import torch
    except ImportError:
        return "cpu"
    if not torch.cuda.is_available():
        return "cpu"
    major, _minor = torch.cuda.get_device_capability(0)
    return "sm90" if major == 9 else "cuda"


def configure_triton(tier: str | None = None) -> str:
    """Switch Triton to its interpreter on the CPU tier (``TRITON_INTERPRET=1``); returns the mode.

    The explicit call that :func:`setup` makes: importing a course module never changes the process's
    environment. Run it before anything imports Triton or defines a kernel (a kernel module such as
    ``course_utils.convolution`` does both): Triton reads the switch when a kernel is defined. Scripts and
    test sessions that use kernels without ``setup()`` call it first.
    Returns ``"interpreted"``, ``"compiled"`` or ``"missing"``.
    """
    tier = tier or detect_tier()
    if tier == "cpu" or simulated():  # a simulated GPU tier runs its kernels under the interpreter too
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "missing"
    return "interpreted" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"


TRITON_MISSING = ("Triton is not installed on this machine (it installs only on Linux x86-64): {what} is skipped. "
                  "To run it, use the course's container (README, 'The two commands') or a Linux x86-64 machine.")


_configure_triton = configure_triton   # the name course_utils.doctor and older scripts use


def prefer_wide_vectors() -> str | None:
    """Let Numba's LLVM use 512-bit vectors on AVX-512 CPUs (before the first compilation in the process).

    LLVM tunes Intel AVX-512 cores to prefer 256-bit vectors (to avoid the clock drop of early AVX-512 parts); for a
    GEMM micro-kernel that halves the lanes per instruction. Appending ``-prefer-256-bit`` to the host's feature
    string lifts that. Returns the feature string set, or None where nothing changed.
    """
    if os.environ.get("NUMBA_CPU_FEATURES") or not _has_avx512():
        return None
    import llvmlite.binding as ll

    features = ll.get_host_cpu_features().flatten()
    if "+avx512f" not in features.split(","):
        return None
    # Numba rereads its environment variables before compiling, so the setting goes there (and into its config).
    os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
    _reload_numba_config()
    return os.environ["NUMBA_CPU_FEATURES"]


def prefer_workqueue_threads() -> None:
    """Run Numba's ``prange`` loops on its own ``workqueue`` threads rather than on OpenMP (before the first parallel run).

    PyTorch keeps OpenMP threads of its own; with Numba's OpenMP layer as well, the two pools compete for the same
    cores, and on the course's 2-core machine the compiled GEMM ran 5 to 10x slower on two threads than on one.
    With ``workqueue`` it ran faster on two, as it should.
    """
    os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
    _reload_numba_config()


def configure_numba() -> None:
    """The course's two Numba settings (:func:`prefer_wide_vectors`, :func:`prefer_workqueue_threads`).

    The explicit call that :func:`setup` makes (importing ``course_utils.convolution_machine`` changes nothing);
    it must come before Numba compiles anything in the process, so scripts that use the compiled GEMM without
    ``setup()`` call it first.
    """
    prefer_wide_vectors()
    prefer_workqueue_threads()


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:  # not Linux: ask LLVM
        return True


def _reload_numba_config() -> None:
    if "numba" in sys.modules:  # otherwise Numba reads the environment when it is imported
        sys.modules["numba"].config.reload_config()


class _NeedsTriton:
    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, etype, value, tb):
        if etype is not None and issubclass(etype, TritonUnavailable):
            print("⚠️ " + TRITON_MISSING.format(what=self.what))
            return True
        return False


class _StubKernel:
    """What ``@triton.jit`` gives without Triton: defined fine, raises :class:`TritonUnavailable` when used."""

    def __init__(self, fn=None, **kwargs):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, *args, **kwargs):
        if self.fn is None and len(args) == 1 and callable(args[0]) and not kwargs:  # @triton.jit(...) with options
            return _StubKernel(args[0])
        raise TritonUnavailable(TRITON_MISSING.format(what=f"the kernel {self.__name__}"))

    def __getitem__(self, grid):
        return self


class _StubModule:
    """A stand-in for ``triton`` and ``triton.language``: any attribute is another stand-in, usable in annotations."""

    def __init__(self, name: str):
        self.__name__ = name

    def jit(self, fn=None, **kwargs):
        return _StubKernel(fn) if fn is not None else (lambda f: _StubKernel(f))

    def cdiv(self, a, b):
        return -(-a // b)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubModule(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        raise TritonUnavailable(TRITON_MISSING.format(what=self.__name__))

    def __repr__(self):
        return f"<{self.__name__}: Triton is not installed>"


def import_triton(*, stub: bool = False):
    """Import Triton for a module that defines kernels: ``(triton, triton.language)``, or ``(None, None)``.

    With ``stub=True`` (lessons and problem sets) a machine without Triton gets stand-ins instead of
    None: kernel cells still define their kernels, and launching one raises :class:`TritonUnavailable`,
    which ``with env.needs_triton(...)`` turns into a one-line notice.

    Importing changes nothing in the process: on a CPU, Triton's interpreter is chosen by
    :func:`configure_triton`, which :func:`setup` calls (scripts that use kernels without ``setup()`` call
    it before importing a kernel module).
    """
    try:
        import triton
        import triton.language as tl
    except ImportError:
        if stub:
            triton = _StubModule("triton")
            return triton, triton.language
        return None, None
    return triton, tl


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)  # also seeds every CUDA device


def _versions() -> dict:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for pkg in ("torch", "triton"):
        try:
            out[pkg] = __import__(pkg).__version__.split("+")[0]
        except ImportError:
            pass
    return out


def _device_name(tier: str) -> str:
    sim = simulated()
    if sim and tier != "cpu":
        return f"cpu ({platform.machine()}) simulating {sim[2]}"
    if tier == "cpu":
        return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
    import torch

    return torch.cuda.get_device_name(0)


def _install_short_tracebacks() -> None:
    """In IPython, show a failed check as its one-line message instead of a long traceback."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or not hasattr(ip, "_showtraceback"):
        return
    from .errors import CheckFailed

    def one_line(shell, etype, value, tb, tb_offset=None):
        stb = [f"\x1b[0;31m{etype.__name__}\x1b[0m: {value}"]
        shell._showtraceback(etype, value, stb)
        return stb

    ip.set_custom_exc((CheckFailed,), one_line)


def setup(seed: int = 0, *, quiet: bool = False) -> Env:
    """Seed every generator, detect the tier, configure Triton and matplotlib; print one line.

    Call it in the first code cell, before anything imports Triton or defines a kernel (the
    interpreter switch, ``TRITON_INTERPRET=1``, is safest set before the first ``import triton``).
    Tag that cell ``nbval-ignore-output``.
    """
    tier = detect_tier()
    triton_mode = configure_triton(tier)
    configure_numba()
    seed_everything(seed)
    arch, sms, sim = None, 4, simulated()
    if sim and tier != "cpu":
        arch, sms = sim[1], sim[3]
    elif tier != "cpu":
        import torch

        major, minor = torch.cuda.get_device_capability(0)
        arch, sms = 10 * major + minor, torch.cuda.get_device_properties(0).multi_processor_count
    env = Env(tier=tier, seed=seed, triton_mode=triton_mode, device_name=_device_name(tier), versions=_versions(),
              arch=arch, simulated=bool(sim) and tier != "cpu", sms=sms)
    if "matplotlib" in sys.modules or "ipykernel" in sys.modules:
        from .plotting import apply_style

        apply_style()
    _install_short_tracebacks()
    if not quiet:
        print(env.describe())
    return env
