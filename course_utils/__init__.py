"""Shared helpers of the Loops to Kernels course, grouped by who uses them.

At the bottom (every module may import these):

* :mod:`~course_utils.errors` -- ``CheckFailed``, ``NotAttempted``, ``ForbiddenCall``, ``TritonUnavailable``
* :mod:`~course_utils.paths` -- where things are in a checkout (``ROOT``, ``SOLUTIONS``, ``BENCHMARK_RESULTS``...)
* :mod:`~course_utils.topics` -- the registry of topics: lessons, problem set, library modules, checks, kernels

Lesson-facing runtime (every notebook, the topic modules, the benchmarks):

* :mod:`~course_utils.env` -- ``setup()``: seeds, device tier, Triton mode; ``import_triton(stub=True)``
* :mod:`~course_utils.checks` -- ``assert_close`` for lessons, at the tolerance of :mod:`~course_utils.tolerances`
* :mod:`~course_utils.tolerances` -- the one per-dtype tolerance table, grown with a reduction's length
* :mod:`~course_utils.bench` -- timing, FLOP/byte counters, measured ceilings, ladder and roofline plots
* :mod:`~course_utils.progress`, :mod:`~course_utils.plotting` -- stable progress bars, the figure style
* :mod:`~course_utils.gpu_compile` -- compile any kernel for sm_75/80/90 without a GPU: PTX, SASS, registers
* :mod:`~course_utils.gemm_compile` -- a kernel at a launch configuration as a compile case, compiled in fresh processes
* :mod:`~course_utils.provenance` -- machine, versions and commit for every recorded result

The classroom, never imported by lessons or topic modules (:mod:`course_utils.classroom`): exercise checks
(``checking``, ``forbidden``), ``assignments`` (``solutions/`` -> ``exercises/``), grading a notebook (``grader``,
``pristine``, ``remote``) and a class (``gradebook``); the per-topic checks in :mod:`course_utils.grading`.

Maintainers' tools (:mod:`course_utils.devtools`): ``doctor``, ``notebook_times``, ``portable`` and the
``compile_matrix`` of every course kernel.

Lesson libraries (what later lessons and benchmarks reuse; each lesson writes its own version first;
the list is ``topics.package_index()``, which a test compares with this one):
00 ``foundations`` · 01 ``floating_point[_rounding|_summation]`` · 02 ``mixed_precision[_memory]`` ·
03 ``convolution[_blocking|_compiled|_machine]`` · 04 ``upsampling`` · 05 ``gemm[_models|_kernels]`` ·
06 ``attention[_io|_triton|_triton_backward|_results]`` · 07 ``slm[_train|_quant|_nas]`` ·
08 ``training_memory[_plan|_llama]``, ``zero1_demo`` · 09 ``parallelism[_data|_tensor|_pipeline|_moe|_workers|_comm]`` ·
10 ``vae`` · 11 ``diffusion[_training|_metrics]`` · 12 ``score_sde[_solvers|_fokker_planck|_edm]``.

Command line: ``python -m course_utils {exercises,grade,grade-class,release,doctor,times}``.
"""
import os as _os

from .env import Env, setup
from .errors import CheckFailed, NotAttempted

# Modules that moved into classroom/ and devtools/ keep their old import paths (course_utils.grader, ...)
# through the thin modules in _shims/, found because that folder is part of this package's path.
__path__.append(_os.path.join(_os.path.dirname(__file__), "_shims"))

__all__ = [
    "CheckFailed",
    "Env",
    "Mistake",
    "NotAttempted",
    "check_function",
    "check_value",
    "setup",
]
__version__ = "0.1.0"

_CLASSROOM = {"Mistake", "check_function", "check_value"}


def __getattr__(name: str):
    """``course_utils.check_function`` and friends, imported from the classroom on first use only."""
    if name in _CLASSROOM:
        from .classroom import checking

        return getattr(checking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
