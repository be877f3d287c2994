"""Shared helpers of the Loops to Kernels course, one module per concern.

Infrastructure (every notebook, the tests, the grader):

* :mod:`~course_utils.env` -- ``setup()``: seeds, device tier, Triton mode; ``import_triton(stub=True)``
* :mod:`~course_utils.checks` -- ``check_function``/``check_value``/``assert_close``, the course's exceptions
* :mod:`~course_utils.tolerances` -- the one per-dtype tolerance table, grown with a reduction's length
* :mod:`~course_utils.forbidden` -- catching calls of the functions an exercise asks to write by hand
* :mod:`~course_utils.bench` -- timing, FLOP/byte counters, measured ceilings, ladder and roofline plots
* :mod:`~course_utils.progress`, :mod:`~course_utils.plotting` -- stable progress bars, the figure style
* :mod:`~course_utils.gpu_compile` -- compile any kernel for sm_75/80/90 without a GPU: PTX, SASS, registers
* :mod:`~course_utils.gemm_compile` -- every course kernel at its GPU configurations (the compile tests)
* :mod:`~course_utils.provenance` -- machine, versions and commit for every recorded result
* :mod:`~course_utils.assignments` -- ``solutions/`` -> ``exercises/`` and the drift check
* :mod:`~course_utils.grader`, :mod:`~course_utils.pristine`, :mod:`~course_utils.remote` -- grading one
  notebook: pristine checks in the grading process, the learner's code remote in its kernel
* :mod:`~course_utils.gradebook` -- grading a class folder into a gradebook
* :mod:`~course_utils.doctor`, :mod:`~course_utils.notebook_times`, :mod:`~course_utils.portable` --
  the installation check, recorded notebook times, nbval under emulated CPUs and without Triton

Lesson libraries (what later lessons and benchmarks reuse; each lesson writes its own version first):
00 ``foundations`` · 01 ``floating_point[_rounding|_summation]`` · 02 ``mixed_precision[_memory]`` ·
03 ``convolution[_blocking|_compiled|_machine]`` · 04 ``upsampling`` · 05 ``gemm[_models|_kernels]`` ·
06 ``attention[_io|_triton|_triton_backward]`` · 07 ``slm[_train|_quant|_nas]`` ·
08 ``training_memory[_plan]``, ``zero1_demo`` · 09 ``parallelism[_data|_tensor|_pipeline|_moe|_workers]`` ·
10 ``vae`` · 11 ``diffusion[_training|_metrics]`` · 12 ``score_sde``.

Grading side, apart from the lesson libraries: :mod:`course_utils.grading` (one module per topic).

Command line: ``python -m course_utils {exercises,grade,grade-class,doctor,times}``.
"""
from .checks import CheckFailed, Mistake, NotAttempted, check_function, check_value
from .env import Env, setup

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
