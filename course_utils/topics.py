"""The one registry of the course's topics: what each topic's files, modules, checks and kernels are.

Read by the tests (file-name slugs, the anatomy's library modules, the compile matrix's kernels, the README
syllabus and the package index in ``course_utils/__init__.py``) and by the website (``site/build.py``). Adding
a topic is one :class:`Topic` here plus its files (CONTRIBUTING.md, "Adding topic 13").
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Topic", "TOPICS", "by_number", "slugs", "library_modules", "subprocess_modules", "kernels", "package_index", "aliases"]


@dataclass(frozen=True)
class Topic:
    """One topic: a lesson (one notebook, or parts a, b, c), a problem set, its library and its checks."""

    number: str                          # "03"
    slug: str                            # "03_convolution": the problem set's file name, and the lesson's when it has one part
    title: str                           # a few words, for indexes
    lessons: tuple[str, ...]             # the lesson notebooks' stems, in order: ("07a_small_language_models", ...)
    library: tuple[str, ...]             # course_utils modules of the topic (later lessons and benchmarks reuse them)
    grading: tuple[str, ...]             # course_utils.grading modules its problem set imports
    kernels: tuple[str, ...] = ()        # Triton kernels the compile matrix compiles: "module:attribute" ("...()" calls it)
    subprocess_modules: tuple[str, ...] = ()  # library modules that run as their own processes (not imported by lessons)

    @property
    def lesson_paths(self) -> tuple[str, ...]:
        return tuple(f"notebooks/{stem}.ipynb" for stem in self.lessons)

    @property
    def alias(self) -> str:
        """The notebooks' name for the topic's first library module; its other modules add their suffix (``conv_blocking``)."""
        return _ALIASES[self.number]

    def alias_of(self, module: str, *, grading: bool = False) -> str:
        """The one alias notebooks import ``course_utils.<module>`` (``course_utils.grading.<module>`` with ``grading``) under."""
        if grading and module in self.grading:  # the problem set's checks: `grading`, and `grading_<part>` for a second one
            return "grading" if module == self.grading[0] else "grading" + module[len(self.grading[0]):]
        head = self.library[0]
        if not grading and module in self.library:
            return self.alias + module[len(head):] if module.startswith(head) else module
        raise KeyError(f"{module} is not a {'grading' if grading else 'library'} module of topic {self.number}")

    @property
    def problem_set(self) -> str:
        return f"{self.slug}.ipynb"   # solutions/ (the source) and exercises/ (generated)


TOPICS: tuple[Topic, ...] = (
    Topic("00", "00_foundations", "NumPy/PyTorch memory model", ("00_foundations",), ("foundations",), ("foundations",)),
    Topic("01", "01_floating_point", "floating-point formats", ("01_floating_point",),
          ("floating_point", "floating_point_rounding", "floating_point_summation"), ("floating_point",)),
    Topic("02", "02_mixed_precision", "mixed precision", ("02_mixed_precision",), ("mixed_precision", "mixed_precision_memory"),
          ("mixed_precision",)),
    Topic("03", "03_convolution", "convolution", ("03_convolution",),
          ("convolution", "convolution_blocking", "convolution_compiled", "convolution_machine"), ("convolution",),
          kernels=("course_utils.convolution:_jitted_kernel()",)),
    Topic("04", "04_upsampling", "upsampling and transposed convolution", ("04_upsampling",), ("upsampling",), ("upsampling",)),
    Topic("05", "05_gemm_triton", "GEMM in Triton", ("05_gemm_triton",), ("gemm", "gemm_models", "gemm_kernels"), ("gemm", "gemm_split_k"),
          kernels=("course_utils.gemm_kernels:matmul_kernel", "course_utils.gemm_kernels:matmul_persistent_kernel",
                   "course_utils.gemm_kernels:matmul_descriptor_kernel",
                   "course_utils.gemm_kernels:matmul_descriptor_persistent_kernel")),
    Topic("06", "06_flash_attention", "FlashAttention", ("06_flash_attention",),
          ("attention", "attention_io", "attention_triton", "attention_triton_backward", "attention_results"),
          ("attention", "attention_backward", "attention_kernels"),
          kernels=("course_utils.attention_triton:flash_attention_fwd_kernel",
                   "course_utils.attention_triton_backward:flash_attention_bwd_dkdv_kernel",
                   "course_utils.attention_triton_backward:flash_attention_bwd_dq_kernel")),
    Topic("07", "07_small_language_models", "small language models",
          ("07a_small_language_models", "07b_small_language_models", "07c_small_language_models"),
          ("slm", "slm_train", "slm_quant", "slm_nas"), ("slm",)),
    Topic("08", "08_training_memory", "memory math for training", ("08_training_memory",),
          ("training_memory", "training_memory_plan", "training_memory_llama", "zero1_demo"), ("training_memory",),
          subprocess_modules=("zero1_demo",)),
    Topic("09", "09_parallelism", "parallelism with torch.distributed", ("09_parallelism",),
          ("parallelism", "parallelism_data", "parallelism_tensor", "parallelism_pipeline", "parallelism_moe",
           "parallelism_workers", "parallelism_comm"), ("parallelism",), subprocess_modules=("parallelism_workers",)),
    Topic("10", "10_vae", "variational autoencoders", ("10_vae",), ("vae",), ("vae",)),
    Topic("11", "11_ddpm_ddim", "DDPM and DDIM", ("11_ddpm_ddim",), ("diffusion", "diffusion_training", "diffusion_metrics"),
          ("diffusion",)),
    Topic("12", "12_score_sde", "score matching and SDEs", ("12_score_sde",), ("score_sde", "score_sde_solvers",
          "score_sde_fokker_planck", "score_sde_edm"), ("score_sde",)),
)


# Short names of the topics, the stem of every alias (CONTRIBUTING.md, "One alias per module").
_ALIASES = {"00": "fnd", "01": "fp", "02": "mp", "03": "cv", "04": "up", "05": "gemm", "06": "attn", "07": "slm",
            "08": "tm", "09": "par", "10": "vae", "11": "diff", "12": "sde"}


def by_number(number: str) -> Topic:
    for topic in TOPICS:
        if topic.number == number:
            return topic
    raise KeyError(f"no topic {number!r}; the topics are {', '.join(t.number for t in TOPICS)} (course_utils/topics.py).")


def slugs() -> list[str]:
    return [t.slug for t in TOPICS]


def library_modules() -> list[str]:
    """Every topic's library modules as full names (``course_utils.convolution``...)."""
    return [f"course_utils.{m}" for t in TOPICS for m in t.library]


def subprocess_modules() -> set[str]:
    return {f"course_utils.{m}" for t in TOPICS for m in t.subprocess_modules}


def kernels() -> set[str]:
    return {k for t in TOPICS for k in t.kernels}


def package_index() -> str:
    """The lesson-library line of ``course_utils/__init__.py``'s docstring, e.g. ``03 ``convolution[_blocking|...]````."""
    parts = []
    for t in TOPICS:
        head, rest = t.library[0], t.library[1:]
        grouped = [m[len(head):] for m in rest if m.startswith(head + "_")]
        others = [m for m in rest if not m.startswith(head + "_")]
        text = f"``{head}[{'|'.join(grouped)}]``" if grouped else f"``{head}``"
        parts.append(f"{t.number} " + ", ".join([text, *(f"``{m}``" for m in others)]))
    return " · ".join(parts) + "."


def aliases() -> dict[str, str]:
    """``{"convolution": "cv", "convolution_blocking": "cv_blocking", "grading.convolution": "grading", ...}``: the one
    alias of every topic module, and of its grading modules (keys prefixed ``grading.``)."""
    out = {}
    for t in TOPICS:
        out.update({m: t.alias_of(m) for m in t.library})
        out.update({f"grading.{m}": t.alias_of(m, grading=True) for m in t.grading})
    out["gemm_compile"] = "gemm_compile"
    return out
