""""By hand", checked by construction: a watch around the learner's call that refuses whatever does the job for them.

Used by :func:`course_utils.classroom.checking.call_learner` (``forbidden=...`` or ``by_hand=ByHand(...)``) in
the learner's own kernel, and by :mod:`course_utils.classroom.remote`, which runs the same watch around a
learner's call when the grader asks.

An exercise that says "by hand" describes what it refuses with a :class:`ByHand`. The watch sees:

* **Whole-result torch operators, at the operator level.** A ``TorchDispatchMode`` sees every ATen operator
  the learner's code reaches, whatever Python path reached it: ``torch.inner``, ``torch.einsum``, a ``conv1d``
  used as a GEMM and ``x @ w`` all arrive as ``aten::mm``/``aten::bmm``/``aten::convolution``. ``ByHand.ops``
  names the refused operators, or whole families from :data:`WHOLE_RESULT_OPS` (``"@matmul"``, ``"@conv"``,
  ``"@attention"``, ``"@softmax"``, ...); ``allow_ops`` takes single operators back out.
* **Whole modules of Python functions.** Every function of ``course_utils.grading`` (the references), of
  ``transformers`` and ``diffusers``, and of the topic's lesson modules (``ByHand.modules``, prefixes: naming
  ``course_utils.score_sde`` covers ``score_sde_solvers`` too) is refused when the learner's code calls it,
  directly or through any rearrangement, because the test is the callee's module, not its name. Calls the
  course's own wrappers make (a check's lambda around the learner's function) do not count.
* **Named functions** (``ByHand.names``, the older ``forbidden=`` lists): torch functions under any alias
  (a ``TorchFunctionMode``), Python functions by code object, C functions by identity, NumPy ufuncs and
  methods by name (``"numpy.rint"``, ``"numpy.ndarray.sum"``: a ufunc call is seen through NumPy's override
  protocol on the learner's arrays, a method call through the profiler), a ufunc's methods (``"numpy.add.at"``) and
  NumPy's C functions that the profiler does not see (``"numpy.bincount"``, replaced by a stand-in while watching).
* **Threads.** Threads the learner's code starts run under the same watch (``threading.setprofile`` installs
  it there, torch's dispatch mode included); handing work to a pool or a queue that already existed, a raw
  ``_thread``, or another process, is refused, since the watch cannot follow it.
* **Structure.** ``max_numel`` bounds the largest tensor the learner's code allocates (a tiled attention never
  holds an L×L score matrix, a causal mask is never materialised; views do not count, only storage);
  ``max_loop_iterations`` bounds the Python-level loop iterations in the learner's own code ("without a Python
  loop" is ``max_loop_iterations=0``; an iteration is a jump back in the bytecode, so a call written over several
  lines is not one); ``atomic_outputs`` names returned tensors that the learner's Triton kernels must accumulate
  with atomic adds, never write with a plain store (seen under Triton's interpreter, by
  :mod:`course_utils.classroom.triton_writes`).

The refusal is one line naming the call. Pasting a library's source into the answer is fine: what counts is
which code does the work, and code the learner wrote (or pasted) is theirs.

Wiring an exercise: ``check_function(..., by_hand=ByHand(ops=("@matmul",), modules=("course_utils.convolution",)))``.
A problem set's grading module may keep its restrictions as data, ``BY_HAND_X = {"ops": (...), "modules": (...)}``,
and pass ``by_hand=ByHand.of(BY_HAND_X)``; there ``"whole_result_ops": ("aten.mse_loss",)`` adds to ``ops`` and
``"allowed_ops"`` only documents what the exercise needs (the watch refuses, it enforces no allow-list).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import ForbiddenCall

# torch is imported when the first watch is made (_load_torch), not with this module: a learner's kernel that runs
# no by-hand check (the toy problem sets, a NumPy-only set) need not pay torch's import for an error's line number.
torch = None
TorchFunctionMode = TorchDispatchMode = object


def _load_torch() -> None:
    global torch, TorchFunctionMode, TorchDispatchMode
    if torch is not None:
        return
    try:
        import torch as _torch
        from torch.overrides import TorchFunctionMode as _function_mode
        from torch.utils._python_dispatch import TorchDispatchMode as _dispatch_mode
    except ImportError:  # pragma: no cover
        return
    torch, TorchFunctionMode, TorchDispatchMode = _torch, _function_mode, _dispatch_mode


__all__ = ["ByHand", "ForbiddenCall", "WHOLE_RESULT_OPS", "forbidden_message", "learner_line", "watch"]

# ATen operator packets that compute a whole result an exercise may ask for. Composite ops (matmul, einsum,
# tensordot, inner, linear, conv1d/2d, F.scaled_dot_product_attention's math path) decompose into these.
WHOLE_RESULT_OPS: dict[str, tuple[str, ...]] = {
    "@matmul": ("mm", "bmm", "addmm", "addbmm", "baddbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation",
                "matmul", "linear", "einsum", "tensordot", "inner", "outer", "ger", "addr", "_mkldnn_matmul"),
    "@conv": ("convolution", "_convolution", "convolution_overrideable", "mkldnn_convolution", "_slow_conv2d_forward",
              "slow_conv_transpose2d", "slow_conv3d_forward", "_nnpack_spatial_convolution", "conv1d", "conv2d",
              "conv3d", "conv_transpose1d", "conv_transpose2d", "_convolution_mode", "thnn_conv2d",
              "convolution_backward", "mkldnn_convolution_backward"),
    "@unfold": ("im2col", "col2im", "unfold", "unfold_backward"),
    "@attention": ("_scaled_dot_product_attention_math", "_scaled_dot_product_flash_attention",
                   "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention", "_fused_sdp_choice"),
    "@softmax": ("_softmax", "_log_softmax", "softmax", "log_softmax", "_softmax_backward_data",
                 "_log_softmax_backward_data", "logsumexp"),
    "@interpolate": ("upsample_nearest1d", "upsample_nearest2d", "upsample_bilinear2d", "upsample_bicubic2d",
                     "_upsample_nearest_exact2d", "_upsample_bilinear2d_aa", "grid_sampler_2d", "pixel_shuffle",
                     "pixel_unshuffle"),
    "@norm": ("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm", "native_batch_norm",
              "_native_batch_norm_legit", "native_group_norm", "linalg_vector_norm", "norm"),
    "@reduce": ("sum", "mean", "cumsum", "prod", "nansum", "var", "std", "var_mean", "std_mean"),
    "@round": ("round", "_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_"),
}

# Modules whose functions a by-hand exercise never lets the learner's code call.
ALWAYS_REFUSED_MODULES = ("course_utils.grading", "transformers", "diffusers")
# Handing work to code the watch cannot follow: existing pools and queues, other processes.
_ESCAPE_MODULES = ("concurrent.futures", "multiprocessing", "queue", "subprocess", "asyncio")
_ESCAPE_C = {"start_new_thread", "start_joinable_thread", "fork", "forkpty", "posix_spawn", "system", "setprofile",
             "settrace", "_set_torch_dispatch_mode", "_pop_torch_dispatch_mode", "_pop_torch_function_stack",
             "_set_torch_function_mode"}


class WatchHit(ForbiddenCall):
    """Raised by :meth:`_Watch.call` when the learner's code failed after a refused call; ``str()`` is the call."""


@dataclass(frozen=True)
class ByHand:
    """What a by-hand exercise refuses; plain data, so it travels to the learner's kernel.

    ``names``: dotted functions refused by identity (``"torch.nn.functional.conv2d"``, ``"numpy.rint"``,
    ``"numpy.ndarray.sum"``). ``modules``: module-name prefixes whose Python functions are refused (the topic's
    lesson modules; :data:`ALWAYS_REFUSED_MODULES` are added). ``ops``: ATen operator packet names or
    :data:`WHOLE_RESULT_OPS` families; ``allow_ops`` takes operators back out. ``max_numel``: the largest
    tensor storage (in elements) the learner's code may allocate, ``large`` says in words what that would be
    (``"the L×L score matrix"``). ``max_loop_iterations``: Python loop iterations allowed in the learner's code.
    ``max_numel`` and ``max_traced_bytes`` (the peak of memory ``tracemalloc`` sees, NumPy's buffers included) may
    be numbers or functions of the call's ``(args, kwargs)``, so one check can size the limit to each trial.
    ``allow``: dotted course functions the exercise lets the learner call although their module is refused
    (a shape helper such as ``"course_utils.convolution.conv_output_size"``). ``atomic_outputs``: indices into the
    learner's returned tuple of tensors that their Triton kernels must accumulate with ``tl.atomic_add`` only (every
    element reached, no plain store into it), ``atomic_what`` says in words what that tensor is.
    """

    names: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    allow_ops: tuple[str, ...] = ()
    max_numel: Any = None
    large: str = "a tensor this exercise asks you not to build"
    max_traced_bytes: Any = None
    max_loop_iterations: int | None = None
    loops: str = "Python loop"
    allow: tuple[str, ...] = ()
    refuse_modules_of_names: bool = field(default=True)
    atomic_outputs: tuple[int, ...] = ()
    atomic_what: str = "this output"

    @classmethod
    def of(cls, spec: Any) -> "ByHand | None":
        """A ``ByHand`` from itself, a dict of its fields, or an iterable of names (the older ``forbidden=``)."""
        if spec is None or isinstance(spec, ByHand):
            return spec
        if isinstance(spec, dict):
            spec = dict(spec)
            spec.pop("allowed_ops", None)  # documentation: the watch refuses operators, it enforces no allow-list
            whole = tuple(op.removeprefix("aten.") for op in spec.pop("whole_result_ops", ()))
            spec["ops"] = tuple(spec.get("ops", ())) + whole  # a grading module's BY_HAND_X = {"whole_result_ops": ...}
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})
        names = tuple(spec)
        return cls(names=names) if names else None

    def merged(self, other: "ByHand | None") -> "ByHand":
        if other is None:
            return self
        return ByHand(
            names=self.names + other.names, modules=self.modules + other.modules, ops=self.ops + other.ops,
            allow_ops=self.allow_ops + other.allow_ops, allow=self.allow + other.allow,
            max_numel=other.max_numel if other.max_numel is not None else self.max_numel,
            max_traced_bytes=other.max_traced_bytes if other.max_traced_bytes is not None else self.max_traced_bytes,
            large=other.large if (other.max_numel is not None or other.max_traced_bytes is not None) else self.large,
            max_loop_iterations=(other.max_loop_iterations if other.max_loop_iterations is not None
                                 else self.max_loop_iterations),
            loops=other.loops if other.max_loop_iterations is not None else self.loops,
            atomic_outputs=self.atomic_outputs + other.atomic_outputs,
            atomic_what=other.atomic_what if other.atomic_outputs else self.atomic_what,
        )

    def refused_ops(self) -> frozenset[str]:
        ops: set[str] = set()
        for op in self.ops:
            if op.startswith("@"):
                if op not in WHOLE_RESULT_OPS:
                    raise ValueError(f"unknown operator family {op!r}; use one of {sorted(WHOLE_RESULT_OPS)}")
                ops.update(WHOLE_RESULT_OPS[op])
            else:
                ops.add(op.split("::")[-1].split(".")[0])
        return frozenset(ops - set(self.allow_ops))

    def refused_modules(self) -> tuple[str, ...]:
        mods = list(ALWAYS_REFUSED_MODULES) + list(self.modules)
        if self.refuse_modules_of_names:  # naming course_utils.convolution.im2col refuses its whole lesson module
            for dotted in self.names:
                parts = dotted.split(".")
                if parts[0] == "course_utils" and len(parts) > 2 and parts[1] != "grading":
                    mods.append(".".join(parts[:2]))
        return tuple(dict.fromkeys(mods))


def _resolve(dotted: str) -> Any:
    """Import ``a.b.c.d`` as far as it is a module, then follow attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"cannot resolve forbidden name {dotted!r}")


def _module_of(frame) -> str:
    return frame.f_globals.get("__name__", "") or ""


def _in(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") or (p.startswith("course_utils.") and module.startswith(p + "_"))
               for p in prefixes)


def _course_frame(frame) -> bool:
    """Code of the course's own machinery (a check's wrapper around the learner's function), not the learner's."""
    return frame is not None and _module_of(frame).startswith("course_utils")


def _escapes(module: str) -> bool:
    return _in(module, _ESCAPE_MODULES)


def _library_dirs() -> tuple[str, ...]:
    import sysconfig
    from pathlib import Path

    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(str(Path(__file__).resolve().parents[1]))  # course_utils itself
    return tuple(sorted(dirs))


_LIBRARY_DIRS = _library_dirs()


def _learner_frame(frame) -> bool:
    """The learner's own code: a notebook cell or a file outside the standard library, site-packages and the course."""
    if frame is None:
        return False
    filename = frame.f_code.co_filename
    if filename.startswith("<frozen"):
        return False
    return not filename.startswith(_LIBRARY_DIRS)


def _ufunc_name(u: Any) -> str:
    return f"numpy.{getattr(u, '__name__', repr(u))}"


class _Watch:
    """The context manager behind :func:`watch`. ``hit`` is the first refused call, in words, or None."""

    def __init__(self, spec: Any):
        _load_torch()  # before the learner's code runs under the watch, so that torch's modes watch it
        self.spec = ByHand.of(spec) or ByHand()
        self.hit: str | None = None
        self.largest: tuple[int, str] | None = None
        self.loop_iterations = 0
        self._ops = self.spec.refused_ops()
        self._modules = self.spec.refused_modules()
        self._module_cache: dict[str, tuple[bool, bool]] = {}
        self._torch_funcs: dict[int, str] = {}
        self._codes: dict[Any, str] = {}
        self._cfuncs: dict[int, str] = {}
        self._methods: list[tuple[type, str, str]] = []  # (numpy.ndarray, "sum", "numpy.ndarray.sum")
        self._ufuncs: dict[str, str] = {}
        self._ufunc_methods: list[tuple[Any, str, str]] = []  # (numpy.add, "at", "numpy.add.at")
        self._dispatchers: dict[str, str] = {}  # "bincount": "numpy.bincount", patched like the ufuncs while watching
        for dotted in self.spec.names:
            obj = _resolve(dotted)
            if isinstance(obj, np.ufunc):
                self._ufuncs[obj.__name__] = dotted
                continue
            if isinstance(getattr(obj, "__self__", None), np.ufunc):  # a ufunc's method (numpy.add.at): a C call on it
                self._ufunc_methods.append((obj.__self__, obj.__name__, dotted))
                continue
            if (type(obj).__name__ == "_ArrayFunctionDispatcher" and dotted.count(".") == 1
                    and not hasattr(inspect.unwrap(obj), "__code__")):
                self._dispatchers[dotted.rpartition(".")[2]] = dotted  # NumPy C functions (numpy.bincount): no c_call
            self._torch_funcs[id(obj)] = dotted
            owner, _, attr = dotted.rpartition(".")
            if type(obj).__name__ in ("method_descriptor", "wrapper_descriptor") and isinstance(_resolve(owner), type):
                self._methods.append((_resolve(owner), attr, dotted))
            plain = inspect.unwrap(obj) if callable(obj) else obj  # decorated functions share their wrapper's code
            code = (getattr(plain, "__code__", None) or getattr(getattr(plain, "__func__", None), "__code__", None)
                    or getattr(getattr(plain, "_implementation", None), "__code__", None))  # NumPy's dispatched functions
            if code is not None:  # torch's own Python functions too: some (torch.nn.grad.*) skip the function mode
                self._codes[code] = dotted
            else:
                self._cfuncs[id(obj)] = dotted
        self._function_mode = None
        self._dispatch_mode = None
        self._previous_profile = None
        self._previous_trace = None
        self._previous_thread_profile = None
        self._threads_modes: list[Any] = []
        self._last_line: dict[int, int] = {}
        self._given: set[Any] = set()  # code objects of callables passed to the learner's function as inputs
        self._max_numel = self.spec.max_numel if not callable(self.spec.max_numel) else None
        self._max_traced = self.spec.max_traced_bytes if not callable(self.spec.max_traced_bytes) else None
        self._traced_base: int | None = None
        for dotted in self.spec.allow:
            code = getattr(inspect.unwrap(_resolve(dotted)), "__code__", None)
            if code is not None:
                self._given.add(code)

    # --------------------------------------------------------------------------- what counts as a hit
    def _refuse(self, what: str) -> None:
        if self.hit is None:
            self.hit = what

    def _module_flags(self, module: str) -> tuple[bool, bool]:
        """(refused, escapes) for a module name, computed once per name: the profiler sees every call the learner's
        code makes, and a Triton kernel under the interpreter makes hundreds of thousands (set 05's linear kernel:
        2.6 s watched, 0.25 s not, before this cache)."""
        flags = self._module_cache.get(module)
        if flags is None:
            flags = self._module_cache[module] = (_in(module, self._modules), _escapes(module))
        return flags

    def _profile(self, frame, event, arg):
        if self.hit is not None:
            return
        if event == "call":
            code = frame.f_code
            named = self._codes.get(code)
            if named:
                self._refuse(named)
                return
            if code.co_name == "<module>" or code in self._given:  # imports; callables the check handed the learner
                return
            caller = frame.f_back
            if caller is None or caller.f_code is code:
                return
            caller_module = _module_of(caller)
            if caller_module.startswith("course_utils"):  # _course_frame(caller)
                return
            if caller_module and self._module_flags(caller_module)[0]:
                return  # a refused module calling itself: already counted at its entry
            module = _module_of(frame)
            refused, escapes = self._module_flags(module) if module else (False, False)
            if refused:
                qualname = code.co_qualname if hasattr(code, "co_qualname") else code.co_name
                owner = frame.f_locals.get("self") if "<locals>" in qualname else None
                if owner is not None:  # a generated method (a dataclass's __init__): name it by its class
                    qualname = f"{type(owner).__qualname__}.{code.co_name}"
                name = f"{module}.{qualname}"
                self._refuse(name)
            elif escapes and _learner_frame(caller):
                self._refuse(f"{module}.{code.co_name} (work handed to another thread or process escapes the check; "
                             f"by-hand exercises run in the calling thread)")
        elif event == "c_call":
            named = self._cfuncs.get(id(arg))
            for ufunc, method, dotted in self._ufunc_methods:
                if getattr(arg, "__self__", None) is ufunc and getattr(arg, "__name__", "") == method:
                    named = dotted
            if named is None and self._methods:
                owner = getattr(arg, "__self__", None)
                attr = getattr(arg, "__name__", "")
                for cls, method, dotted in self._methods:
                    if attr == method and isinstance(owner, cls):
                        named = dotted
                        break
            if named:
                self._refuse(named)
            elif getattr(arg, "__name__", "") in _ESCAPE_C and _learner_frame(frame):
                self._refuse(f"{arg.__module__}.{arg.__name__} (by-hand exercises run in the calling thread, under "
                             f"the course's watch; leave the profiler, the dispatch modes and processes alone)")

    def _trace(self, frame, event, arg):
        """Global trace function: follows only the learner's own frames, counting loop back-edges."""
        if event != "call" or self.spec.max_loop_iterations is None:
            return None
        if not _learner_frame(frame) and _module_of(frame) != "__main__":
            return None
        return self._local_trace

    def _local_trace(self, frame, event, arg):
        if event == "line":
            # a loop is a jump back in the bytecode; a call written over several lines only goes back in line numbers
            key = id(frame)
            last = self._last_line.get(key)
            if last is not None and frame.f_lasti <= last:
                self.loop_iterations += 1
                limit = self.spec.max_loop_iterations
                if limit is not None and self.loop_iterations > limit:
                    self._refuse(f"a {self.spec.loops} (iteration {self.loop_iterations} at line {frame.f_lineno} "
                                 f"of your code; this exercise allows {limit})")
            self._last_line[key] = frame.f_lasti
        elif event == "return":
            self._last_line.pop(id(frame), None)
        return self._local_trace

    def _see_op(self, func, out) -> None:
        name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
        if self.hit is None and name in self._ops:
            self._refuse(f"torch's {name} operator (aten::{name}; reached through any torch function that computes "
                         f"the whole result)")
        if self._max_numel is None:
            return
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.element_size() > 0:
                try:
                    stored = t.untyped_storage().nbytes() // t.element_size()
                except Exception:  # tensors without storage (meta, sparse): their numel
                    stored = t.numel()
                if self.largest is None or stored > self.largest[0]:
                    self.largest = (stored, f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} from aten::{name}")
                if stored > self._max_numel:
                    self._refuse(f"{self.spec.large}: a tensor of shape {tuple(t.shape)} ({stored} elements stored, "
                                 f"allowed {self._max_numel}) made by aten::{name}")

    # ------------------------------------------------------------------------------- modes and hooks
    def _make_modes(self):
        watch = self
        function_mode = dispatch_mode = None
        if self._torch_funcs:
            class _FunctionMode(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    if watch.hit is None:
                        hit = watch._torch_funcs.get(id(func)) or watch._torch_funcs.get(id(getattr(func, "__func__", None)))
                        if hit:
                            watch._refuse(hit)
                    return func(*args, **(kwargs or {}))

            function_mode = _FunctionMode()
        if self._ops or self._max_numel is not None:
            class _DispatchMode(TorchDispatchMode):
                @classmethod
                def _should_skip_dynamo(cls) -> bool:  # nothing compiles under the watch; asking imports torch._dynamo
                    return False

                def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                    out = func(*args, **(kwargs or {}))
                    watch._see_op(func, out)
                    return out

            dispatch_mode = _DispatchMode()
        return function_mode, dispatch_mode

    def _thread_start(self, frame, event, arg):
        """First profile event of a thread started under the watch: install the watch there too."""
        sys.setprofile(self._profile)
        if torch is not None:
            function_mode, dispatch_mode = self._make_modes()
            for mode in (function_mode, dispatch_mode):
                if mode is not None:
                    mode.__enter__()  # left entered: the thread's mode stack dies with the thread
                    self._threads_modes.append(mode)
        self._profile(frame, event, arg)

    def _wrap_ufuncs(self, args, kwargs):
        """The learner's NumPy arrays, viewed as a subclass that reports refused ufuncs (``np.rint(x)``, ``x.sum()``)."""
        if not self._ufuncs:
            return args, kwargs
        watch = self

        class _Watched(np.ndarray):
            def __array_ufunc__(self, ufunc, method, *inputs, **kw):
                key = ufunc.__name__
                if key in watch._ufuncs:
                    watch._refuse(watch._ufuncs[key])
                plain = [i.view(np.ndarray) if isinstance(i, _Watched) else i for i in inputs]
                if "out" in kw:
                    kw["out"] = tuple(o.view(np.ndarray) if isinstance(o, _Watched) else o for o in kw["out"])
                result = getattr(ufunc, method)(*plain, **kw)
                return _rewrap(result)

        def _rewrap(x):
            if type(x) is np.ndarray:
                return x.view(_Watched)
            if isinstance(x, tuple):
                return tuple(_rewrap(v) for v in x)
            return x

        self._watched_type = _Watched
        wrap = lambda a: a.view(_Watched) if type(a) is np.ndarray else a
        return tuple(wrap(a) for a in args), {k: wrap(v) for k, v in kwargs.items()}

    def unwrap(self, result: Any) -> Any:
        """Results come back as plain arrays (the subclass is the watch's, not the learner's)."""
        watched = getattr(self, "_watched_type", None)
        if watched is None:
            return result
        if isinstance(result, watched):
            return result.view(np.ndarray)
        if isinstance(result, tuple):
            return tuple(self.unwrap(r) for r in result)
        if isinstance(result, list):
            return [self.unwrap(r) for r in result]
        return result

    def _held_ufuncs(self, fn) -> None:
        """A refused ufunc the learner's function holds under another name (``from numpy import rint as r``)."""
        names = getattr(getattr(fn, "__code__", None), "co_names", ())
        for namespace in (getattr(fn, "__globals__", {}),):
            for name in names:
                value = namespace.get(name)
                if isinstance(value, np.ufunc) and value.__name__ in self._ufuncs:
                    self._refuse(f"{self._ufuncs[value.__name__]} (held as `{name}`)")

    def _note_given(self, values) -> None:
        """Callables among the inputs (a model, a function to differentiate) may be called: the check gave them."""
        for v in values:
            if isinstance(v, (list, tuple)):
                self._note_given(v)
            elif isinstance(v, dict):
                self._note_given(v.values())
            elif isinstance(v, type) or (torch is not None and isinstance(v, torch.Tensor)) or isinstance(v, np.ndarray):
                continue
            else:  # a function, or an object whose methods the learner may call (a model, a scheduler)
                candidates = [v, getattr(v, "__func__", None)]
                if not callable(v) or not hasattr(v, "__code__"):
                    owners = [v]  # a model's submodules (a check's own layer inside an nn.Sequential) are given too
                    if torch is not None and isinstance(v, torch.nn.Module):
                        owners = list(v.modules())
                    for klass in dict.fromkeys(k for o in owners for k in type(o).__mro__):
                        if klass.__module__.startswith(("builtins", "torch", "numpy")):
                            continue
                        candidates += [m for m in vars(klass).values()]
                for obj in candidates:
                    obj = getattr(obj, "__func__", obj)
                    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
                    if code is not None:
                        self._given.add(code)

    def _refused_itself(self, fn) -> None:
        """The learner's answer *is* a refused function (``answer = grading._reference_x``), not a call from it."""
        plain = inspect.unwrap(getattr(fn, "__func__", fn))
        code = getattr(plain, "__code__", None)
        module = getattr(plain, "__module__", None) or ""
        if code is None and not inspect.isroutine(fn):  # a callable object: its class's __call__
            call = vars(type(fn)).get("__call__")  # the class that defines it, not type.__call__
            code = getattr(inspect.unwrap(call), "__code__", None) if call is not None else None
            module = type(fn).__module__ or ""
        qualname = getattr(plain, "__qualname__", "") or ""
        if code is not None and code in self._codes:
            self._refuse(self._codes[code])
        elif "<locals>" in qualname:  # a check's own wrapper around the learner's answer: no learner can name it
            return
        elif module and _in(module, self._modules) and code not in self._given:
            self._refuse(f"{module}.{getattr(plain, '__qualname__', getattr(type(fn), '__qualname__', '?'))} "
                         f"(your answer is that function itself)")

    def call(self, fn, args=(), kwargs=None):
        """``fn(*args, **kwargs)`` under the watch, with NumPy arrays watched too; returns the result."""
        self._refused_itself(fn)
        if callable(self.spec.max_numel):
            self._max_numel = int(self.spec.max_numel(tuple(args), dict(kwargs or {})))
        if callable(self.spec.max_traced_bytes):
            self._max_traced = int(self.spec.max_traced_bytes(tuple(args), dict(kwargs or {})))
        self._held_ufuncs(fn)
        self._note_given(tuple(args) + tuple((kwargs or {}).values()))
        args, kwargs = self._wrap_ufuncs(tuple(args), dict(kwargs or {}))
        writes = None
        if self.spec.atomic_outputs:
            from .triton_writes import WriteLog

            writes = WriteLog()
        try:
            with self, (writes or contextlib.nullcontext()):
                result = fn(*args, **kwargs)
        except Exception as exc:
            if self.hit is not None:  # a refused call came first: that is the answer, whatever failed after it
                raise WatchHit(self.hit) from exc
            raise
        if writes is not None and self.hit is None:
            from .triton_writes import atomic_write_problem

            for index in self.spec.atomic_outputs:
                why = atomic_write_problem(writes, result, index, self.spec.atomic_what)
                if why:
                    self._refuse(why)
        return self.unwrap(result)

    def _patch_numpy(self) -> None:
        """While watching, ``numpy.<ufunc>`` (or a refused C function such as ``numpy.bincount``, which the profiler
        does not see) looked up at call time is a stand-in that reports the call."""
        self._patched = {}
        for short, dotted in {**self._ufuncs, **self._dispatchers}.items():
            original = getattr(np, short, None)
            if isinstance(original, np.ufunc) or short in self._dispatchers:
                def stand_in(*args, _original=original, _dotted=dotted, **kwargs):
                    self._refuse(_dotted)
                    return _original(*args, **kwargs)

                self._patched[short] = original
                setattr(np, short, stand_in)

    def _unpatch_numpy(self) -> None:
        for short, original in getattr(self, "_patched", {}).items():
            setattr(np, short, original)

    def _start_tracing(self) -> None:
        if self._max_traced is None:
            return
        import tracemalloc

        self._tracing_started = not tracemalloc.is_tracing()
        if self._tracing_started:
            tracemalloc.start()
        tracemalloc.reset_peak()
        self._traced_base = tracemalloc.get_traced_memory()[0]

    def _stop_tracing(self) -> None:
        if self._traced_base is None:
            return
        import tracemalloc

        peak = tracemalloc.get_traced_memory()[1] - self._traced_base
        if self._tracing_started:
            tracemalloc.stop()
        self._traced_base = None
        if peak > self._max_traced:
            self._refuse(f"{self.spec.large}: your code held {peak / 2**20:.1f} MiB at once (the limit for these "
                         f"inputs is {self._max_traced / 2**20:.1f} MiB)")

    def __enter__(self):
        self._start_tracing()
        self._patch_numpy()
        if torch is not None:
            self._function_mode, self._dispatch_mode = self._make_modes()
            for mode in (self._function_mode, self._dispatch_mode):
                if mode is not None:
                    mode.__enter__()
        self._previous_profile = sys.getprofile()
        self._previous_thread_profile = getattr(threading, "_profile_hook", None)
        sys.setprofile(self._profile)
        threading.setprofile(self._thread_start)
        if self.spec.max_loop_iterations is not None:
            self._previous_trace = sys.gettrace()
            sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        if self.spec.max_loop_iterations is not None:
            sys.settrace(self._previous_trace)
        if sys.getprofile() != self._profile and sys.getprofile() is not None:
            self._refuse("the profiler (your code replaced the course's watch)")
        sys.setprofile(self._previous_profile)
        threading.setprofile(self._previous_thread_profile)
        self._unpatch_numpy()
        self._stop_tracing()
        for mode in (self._dispatch_mode, self._function_mode):
            if mode is not None:
                try:
                    mode.__exit__(*exc)
                except Exception:  # the learner's code popped the mode itself
                    self._refuse("torch's mode stack (your code changed it)")
        return False


def learner_line(exc: BaseException) -> str:
    """Where in the learner's own code ``exc`` was raised: ``"line 7 of `my_conv`"``, or "" when not in their code."""
    tb, where = exc.__traceback__, ""
    while tb is not None:
        if _learner_frame(tb.tb_frame):
            where = f"line {tb.tb_lineno} of `{tb.tb_frame.f_code.co_name}`"
        tb = tb.tb_next
    return where


def watch(spec: Any) -> _Watch:
    """A context manager watching the code run inside it; ``spec`` is a :class:`ByHand`, a dict or a list of names."""
    return _Watch(spec)


# The older name, kept for the grading modules and tests that construct it with a list of names.
_ForbiddenGuard = _Watch


def _readable(hit: str) -> str:
    """What the learner wrote, from the refused function's qualified name: a lazy import by its package, a
    constructor (a dataclass's generated ``__init__``, diffusers' ``inner_init`` config wrapper) by its class's path."""
    parts = hit.split(".")
    if hit.endswith("._LazyModule.__getattr__"):
        return f"an import from {parts[0]}"
    if len(parts) >= 2 and parts[-1] in ("__init__", "__new__", "inner_init"):
        return f"the constructor of {'.'.join(parts[:-1])}"
    return hit


def forbidden_message(name: str, hit: str) -> str:
    return (f"{name}: your code calls {_readable(hit)}, which this exercise asks you to replace by hand; "
            f"write the computation yourself.")
