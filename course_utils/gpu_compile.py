"""Compile a Triton kernel for a GPU this machine does not have, and read what the hardware would run.

Used by lessons 03, 05 and 06 on the CPU tier (PTX and SASS, registers, spills, shared memory,
``wgmma``/TMA/``setmaxnreg``) and by ``tests/test_gpu_compile.py``, which compiles every course
kernel at its GPU configurations and fails on a spill, on shared memory over the device's limit, on a
Hopper kernel without ``wgmma``, or on a warp-specialized rung without its producer/consumer split.

Triton's CUDA backend needs no GPU to compile: ``triton.compile(ASTSource(...), target=GPUTarget(...))``
runs LLVM and the ``ptxas`` shipped inside the triton wheel. What a real launch would specialize must
be given by hand: the argument types, the constexprs, and which pointers and integers are multiples of
16 (``tt.divisibility``), or the compiler can neither vectorize nor pipeline and the figures mislead.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .paths import ROOT

__all__ = ["compile_for", "compile_for_each", "Compiled", "CompileError", "ARCH_LIMITS", "FEATURES", "GPU_NAMES"]

# Per architecture: registers and shared memory per SM, shared memory one block may use, threads per SM.
# From NVIDIA's CUDA C++ Programming Guide, "Compute capabilities" table (per-SM and per-block limits).
ARCH_LIMITS: dict[int, dict[str, int]] = {
    75: {"regs_per_sm": 65536, "smem_per_sm": 64 * 1024, "smem_per_block": 64 * 1024, "threads_per_sm": 1024, "blocks_per_sm": 16},
    80: {"regs_per_sm": 65536, "smem_per_sm": 164 * 1024, "smem_per_block": 163 * 1024, "threads_per_sm": 2048, "blocks_per_sm": 32},
    86: {"regs_per_sm": 65536, "smem_per_sm": 100 * 1024, "smem_per_block": 99 * 1024, "threads_per_sm": 1536, "blocks_per_sm": 16},
    89: {"regs_per_sm": 65536, "smem_per_sm": 100 * 1024, "smem_per_block": 99 * 1024, "threads_per_sm": 1536, "blocks_per_sm": 24},
    90: {"regs_per_sm": 65536, "smem_per_sm": 228 * 1024, "smem_per_block": 227 * 1024, "threads_per_sm": 2048, "blocks_per_sm": 32},
}
GPU_NAMES = {75: "T4 (sm_75)", 80: "A100 (sm_80)", 86: "RTX 30xx (sm_86)", 89: "L4 / RTX 40xx (sm_89)", 90: "H100/H200 (sm_90)"}

# What to look for in the PTX, with what each means.
FEATURES: dict[str, tuple[str, str]] = {
    "wgmma": (r"wgmma\.mma_async", "Hopper warpgroup MMA (tensor cores, operands from shared memory)"),
    "mma.sync": (r"\bmma\.sync\.aligned", "Ampere-style warp MMA (tensor cores, operands in registers)"),
    "tma": (r"cp\.async\.bulk\.tensor", "TMA: bulk tensor copies global -> shared by the copy engine"),
    "cp.async": (r"\bcp\.async\.(ca|cg)\.shared", "Ampere asynchronous copies global -> shared (pipelined loads)"),
    "mbarrier": (r"\bmbarrier\.", "transaction barriers in shared memory (TMA completion, producer/consumer)"),
    "setmaxnreg": (r"\bsetmaxnreg\.", "warp-specialized register rebalancing (producer gives registers to consumers)"),
    "ldmatrix": (r"\bldmatrix\.", "shared -> register matrix fragments for mma.sync"),
}


class CompileError(RuntimeError):
    """Triton or ptxas refused the kernel for this target."""


def _bin(tool: str) -> str:
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / tool
    if not path.exists():
        raise CompileError(f"{tool} is not inside this triton wheel ({path}); install triton for Linux x86-64.")
    return str(path)


@dataclass
class Compiled:
    """What a kernel engineer reads off a compiled kernel."""

    name: str
    arch: int
    num_warps: int
    num_stages: int
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    shared_bytes: int
    ptx: str = field(repr=False)
    sass: str = field(repr=False)
    features: dict[str, int] = field(default_factory=dict)

    @property
    def threads(self) -> int:
        return 32 * self.num_warps

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0

    @property
    def limits(self) -> dict[str, int]:
        return ARCH_LIMITS[self.arch]

    @property
    def fits_shared_memory(self) -> bool:
        return self.shared_bytes <= self.limits["smem_per_block"]

    @property
    def blocks_per_sm(self) -> int:
        """Occupancy estimate: resident blocks per SM limited by registers, shared memory, threads."""
        lim = self.limits
        regs_per_warp = -(-max(self.registers, 1) * 32 // 256) * 256     # allocated in units of 256 per warp
        by_regs = lim["regs_per_sm"] // (regs_per_warp * self.num_warps)
        by_smem = lim["smem_per_sm"] // self.shared_bytes if self.shared_bytes else lim["blocks_per_sm"]
        by_threads = lim["threads_per_sm"] // self.threads
        return max(0, min(by_regs, by_smem, by_threads, lim["blocks_per_sm"]))

    @property
    def occupancy(self) -> float:
        """Resident warps per SM over the maximum (an estimate, as CUDA's occupancy calculator gives)."""
        return self.blocks_per_sm * self.threads / self.limits["threads_per_sm"]

    def has(self, feature: str) -> bool:
        return self.features.get(feature, 0) > 0

    def summary(self) -> str:
        feats = ", ".join(f for f in FEATURES if self.has(f)) or "none of the tensor-core/async features"
        return (f"{self.name} sm_{self.arch} warps={self.num_warps} stages={self.num_stages}: {self.registers} registers/thread, "
                f"{'spills ' + str(self.spill_stores) + ' B' if self.spills else 'no spills'}, "
                f"{self.shared_bytes / 1024:.0f} KiB shared, ~{self.blocks_per_sm} block(s)/SM; uses {feats}")

    def excerpt(self, pattern: str, *, context: int = 6, source: str = "ptx", limit: int = 1) -> str:
        """Lines around the first ``limit`` matches of ``pattern`` in the PTX (or ``source="sass"``)."""
        lines = (self.ptx if source == "ptx" else self.sass).splitlines()
        hits = [i for i, line in enumerate(lines) if re.search(pattern, line)][:limit]
        chunks = ["\n".join(lines[max(0, i - context): i + context + 1]) for i in hits]
        return "\n...\n".join(chunks)


def _ptxas(arch: int) -> str:
    """The ptxas Triton itself uses for this arch (newer Tritons ship a second, newer one for sm_90+)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(arch).path
    except (ImportError, AttributeError, TypeError):
        return _bin("ptxas")


def _ptxas_report(ptx: str, arch: int) -> dict[str, int]:
    """Registers, spills and stack from ``ptxas -v`` on the PTX Triton produced."""
    target = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        Path(src).write_text(ptx)
        done = subprocess.run([_ptxas(arch), f"-arch={target}", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        raise CompileError(f"ptxas failed: {text.strip().splitlines()[-1] if text.strip() else done.returncode}")

    def grab(pattern: str) -> int:
        match = re.search(pattern, text)
        return int(match.group(1)) if match else 0

    return {"registers": grab(r"Used (\d+) registers"), "spill_stores": grab(r"(\d+) bytes spill stores"),
            "spill_loads": grab(r"(\d+) bytes spill loads"), "stack_bytes": grab(r"(\d+) bytes stack frame")}


def _sass(cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        Path(path).write_bytes(cubin)
        done = subprocess.run([_bin("nvdisasm"), "-c", path], capture_output=True, text=True, timeout=300)
    return done.stdout


def _require_triton() -> None:
    try:
        import triton  # noqa: F401
    except ImportError:
        from .env import TRITON_MISSING
        from .errors import TritonUnavailable

        raise TritonUnavailable(TRITON_MISSING.format(what="compiling for a GPU")) from None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _kernel_fn(kernel: Any):
    fn = getattr(kernel, "fn", None)
    if fn is None:
        raise TypeError(f"{kernel!r} is not a @triton.jit kernel")
    return fn


def _recipe(kernel: Any) -> dict:
    """How a fresh process can rebuild ``kernel``: its module and name, or (for a notebook cell) its source.

    A kernel defined in a notebook travels as source: its own, that of the ``@triton.jit`` helpers it
    calls, and the plain constants it reads, in the order the kernel needs them.
    """
    import inspect
    import sys as _sys

    fn = _kernel_fn(kernel)
    module = getattr(fn, "__module__", None)
    if module and module != "__main__" and getattr(_sys.modules.get(module), "__file__", None):
        # the folder that makes ``module`` importable (a test file's folder is on pytest's path, not the child's)
        folder = Path(_sys.modules[module].__file__).resolve().parents[module.count(".")]
        return {"module": module, "name": fn.__name__, "path": str(folder)}
    globs, seen, parts = fn.__globals__, set(), []

    def visit(f):
        for name in f.__code__.co_names:
            if name in seen or name not in globs:
                continue
            seen.add(name)
            value = globs[name]
            inner = getattr(value, "fn", None)
            if callable(inner) and hasattr(inner, "__code__") and type(value).__name__ in ("InterpretedFunction", "JITFunction"):
                visit(inner)
                parts.append(inspect.getsource(inner))
            elif isinstance(value, (int, float, bool)) or type(value).__name__ == "constexpr":
                parts.append(f"{name} = {getattr(value, 'value', value)!r}")
    visit(fn)
    header = "import triton\nimport triton.language as tl\nfrom triton.language import constexpr\n"
    return {"source": header + "\n\n".join(parts + [inspect.getsource(fn)]), "name": fn.__name__}


def _compile_elsewhere(kernel: Any, arch: int | list[int], kwargs: dict) -> "Compiled | list[Compiled]":
    """Compile in a fresh process with Triton's compiler on (this one runs Triton's interpreter, whose
    stand-ins for ``tl.zeros`` and friends cannot go through the GPU compiler). A list of archs is
    compiled in the same process, which saves Triton's start-up per arch."""
    import json
    import sys as _sys

    request = {"recipe": _recipe(kernel), "arch": arch, "kwargs": kwargs}
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    folders = [str(ROOT), request["recipe"].get("path", ""), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(f for f in folders if f)
    done = subprocess.run([_sys.executable, "-m", "course_utils.gpu_compile"], input=json.dumps(request), capture_output=True,
                          text=True, env=env, timeout=900)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CompileError(last.split("CompileError: ", 1)[-1][:400])
    data = json.loads(done.stdout)
    return [Compiled(**d) for d in data] if isinstance(arch, list) else Compiled(**data)


def _main() -> int:
    """``python -m course_utils.gpu_compile`` reads a compile request as JSON on stdin, writes the result."""
    import importlib
    import importlib.util
    import json
    import sys as _sys

    request = json.loads(_sys.stdin.read())
    recipe = request["recipe"]
    if "module" in recipe:
        kernel = getattr(importlib.import_module(recipe["module"]), recipe["name"])
    else:
        with tempfile.TemporaryDirectory() as tmp:  # @triton.jit wants its source in a file
            path = Path(tmp) / "course_kernel_from_notebook.py"
            path.write_text(recipe["source"])
            spec = importlib.util.spec_from_file_location("course_kernel_from_notebook", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            kernel = getattr(module, recipe["name"])
            print(json.dumps(_compile_request(kernel, request)))
        return 0
    print(json.dumps(_compile_request(kernel, request)))
    return 0


def _compile_request(kernel: Any, request: dict):
    from dataclasses import asdict

    archs = request["arch"]
    if isinstance(archs, list):
        return [asdict(compile_for(kernel, arch=a, **request["kwargs"])) for a in archs]
    return asdict(compile_for(kernel, arch=archs, **request["kwargs"]))


def compile_for_each(kernel: Any, archs: Iterable[int], **kwargs: Any) -> dict[int, Compiled]:
    """:func:`compile_for` for several archs (one helper process under the interpreter): ``{arch: Compiled}``."""
    _require_triton()
    archs = list(archs)
    for arch in archs:
        if arch not in ARCH_LIMITS:
            raise ValueError(f"arch {arch} unknown; use one of {sorted(ARCH_LIMITS)}")
    if _interpreting():
        kw = {"signature": kwargs.pop("signature"), "constexprs": dict(kwargs.pop("constexprs", None) or {}),
              "divisible": list(kwargs.pop("divisible", ())), **kwargs}
        return dict(zip(archs, _compile_elsewhere(kernel, archs, kw)))
    return {arch: compile_for(kernel, arch=arch, **kwargs) for arch in archs}


def compile_for(kernel: Any, *, arch: int, signature: dict[str, str], constexprs: dict[str, Any] | None = None,
                divisible: Iterable[str] = (), num_warps: int = 4, num_stages: int = 3, sass: bool = True,
                **options: Any) -> Compiled:
    """Compile ``kernel`` (a ``@triton.jit`` function) for ``sm_<arch>`` without a GPU.

    ``signature`` maps every parameter to its type (``"*fp32"``, ``"*bf16"``, ``"i32"``, ``"fp32"``,
    ``"nvTmaDesc"``...) or ``"constexpr"``; ``constexprs`` gives the constexpr values (block sizes, unit
    strides specialized to 1); ``divisible`` names the parameters a real launch would see as multiples
    of 16 (aligned pointers, sizes and strides that are multiples of 16).
    """
    # Triton 3.9 warns on every compile until the FP-fusion default is chosen; keep today's default (fused FMAs).
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if arch not in ARCH_LIMITS:
        raise ValueError(f"arch {arch} unknown; use one of {sorted(ARCH_LIMITS)}")
    _require_triton()
    params = list(_kernel_fn(kernel).__code__.co_varnames[:_kernel_fn(kernel).__code__.co_argcount])
    missing = [p for p in params if p not in signature]
    if missing:
        raise ValueError(f"{_kernel_fn(kernel).__name__}: give a type for {missing} in signature (or 'constexpr')")
    if _interpreting():
        kwargs = {"signature": signature, "constexprs": dict(constexprs or {}), "divisible": list(divisible),
                  "num_warps": num_warps, "num_stages": num_stages, "sass": sass, **options}
        return _compile_elsewhere(kernel, arch, kwargs)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = dict(constexprs or {})
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in divisible}
    source = ASTSource(fn=kernel, signature={p: signature[p] for p in params}, constexprs=constexprs, attrs=attrs)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": num_warps, "num_stages": num_stages, **options})
    except Exception as exc:  # triton's compile errors are long MLIR dumps: keep their first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompileError(f"{kernel.__name__} for sm_{arch}: {first[:300]}") from exc
    ptx = compiled.asm["ptx"]
    usage = _ptxas_report(ptx, arch)
    feats = {name: len(re.findall(pattern, ptx)) for name, (pattern, _) in FEATURES.items()}
    return Compiled(name=kernel.__name__, arch=arch, num_warps=num_warps, num_stages=num_stages,
                    shared_bytes=int(compiled.metadata.shared), ptx=ptx,
                    sass=_sass(compiled.asm["cubin"]) if sass else "", features=feats, **usage)


if __name__ == "__main__":
    import sys

    sys.exit(_main())
