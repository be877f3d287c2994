"""Calls into a learner's kernel from a grading process that the learner's code never touches.

Used by :mod:`course_utils.grader`. The grader executes the learner's cells in a Jupyter kernel,
but runs the course's pristine check cells in its own process, where every learner name the check
uses is a :class:`RemoteObject`: calling it sends the arguments to the kernel, the kernel calls the
learner's object and sends back what it returned. The comparison with the reference, the named
mistakes and the verdict all happen in the grading process, so no patch of ``course_utils``,
``numpy``, ``torch``, ``builtins`` or IPython inside the learner's kernel can change a verdict.

Protocol, one request at a time, through files in a private folder:

* grader -> kernel: the request pickled with ``cloudpickle`` (the grader is trusted, so the kernel may
  unpickle it; check-made lambdas and modules travel by value);
* kernel -> grader: **data only**: a JSON tree plus an ``.npz`` of arrays, read with
  ``allow_pickle=False``. Anything that is not data (an instance of the learner's class, a generator)
  stays in the kernel and comes back as a handle, another :class:`RemoteObject`.

Arguments the learner's code changed in place (arrays and tensors, inside lists and dicts too, and
``.grad`` fields) are copied back into the grader's objects, so checks can detect in-place mutation or
read kernels' outputs. By-hand watches (``call_learner(..., forbidden=..., by_hand=...)``) run in the
kernel, around the learner's call: that part runs where the learner's code runs, so a learner who
deliberately sabotages the kernel's own interpreter could hide such a call; the correctness verdict
cannot be influenced that way.
"""
from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["RemoteObject", "RemoteDriver", "RemoteError", "RemoteNotImplemented", "RemoteTimeout", "RemoteDead", "remote_error", "encode", "decode", "serve", "MAX_DEPTH"]


def _torch():
    """torch if this process has imported it, else None. A learner's kernel that never imported torch holds no tensor,
    so its side of the protocol does not pay torch's import (about 1.4 s per grading on the 2-core machine); a
    grading process that receives a tensor imports it in :func:`decode`."""
    return sys.modules.get("torch")


MAX_DEPTH = 20
_HANDLES: dict[int, Any] = {}  # kernel side: objects that cannot travel as data


# ------------------------------------------------------------------------------------------ errors
class RemoteError(Exception):
    """The learner's code raised in the kernel. ``type_name`` and ``message`` say what."""

    def __init__(self, type_name: str, message: str, line: str = ""):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.line = type_name, message, line


class RemoteNotImplemented(RemoteError, NotImplementedError):
    """The learner's object still raises ``NotImplementedError`` (the untouched stub)."""


class RemoteTimeout(RemoteError):
    """The learner's code ran past the time limit and the kernel was interrupted."""

    fatal = True  # checks.call_learner lets it through: the exercise is "timed out", not "failed"


class RemoteDead(RemoteError):
    """The kernel died (a crash, ``os._exit``, out of memory)."""

    fatal = True


def remote_error(type_name: str, message: str, line: str = "") -> RemoteError:
    if type_name in ("NotImplementedError", "NotAttempted"):
        return RemoteNotImplemented(type_name, message)
    return RemoteError(type_name, message, line)


# ------------------------------------------------------------------------ data encoding (kernel side)
_TORCH_VIEWS = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def encode(obj: Any, arrays: list[np.ndarray], depth: int = 0) -> dict:
    """A JSON-able tree for ``obj``; arrays go to ``arrays``; non-data objects become handles."""
    torch = _torch()
    if depth > MAX_DEPTH:
        return _handle(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"t": "py", "v": obj}
    if obj is Ellipsis:
        return {"t": "ellipsis"}
    if isinstance(obj, complex):
        return {"t": "complex", "re": obj.real, "im": obj.imag}
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        arrays.append(np.ascontiguousarray(obj))
        return {"t": "nd", "i": len(arrays) - 1}
    if isinstance(obj, np.generic) and not isinstance(obj, np.object_):
        arrays.append(np.asarray(obj))
        return {"t": "npscalar", "i": len(arrays) - 1}
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        data = t.contiguous().view(getattr(torch, _TORCH_VIEWS[dtype])) if dtype in _TORCH_VIEWS else t.contiguous()
        arrays.append(data.numpy())
        out = {"t": "tensor", "i": len(arrays) - 1, "dtype": dtype, "rg": bool(obj.requires_grad), "device": str(obj.device),
               "stride": list(t.stride())}
        if obj.grad is not None:
            out["grad"] = encode(obj.grad, arrays, depth + 1)
        return out
    if torch is not None and isinstance(obj, torch.dtype):
        return {"t": "tdtype", "v": str(obj).replace("torch.", "")}
    if isinstance(obj, np.dtype):
        return {"t": "npdtype", "v": obj.str}
    if isinstance(obj, (tuple, list)) and type(obj) in (tuple, list) or (torch is not None and isinstance(obj, torch.Size)):
        return {"t": "list" if isinstance(obj, list) else "tuple", "v": [encode(x, arrays, depth + 1) for x in obj]}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple travels as a plain tuple
        return {"t": "tuple", "v": [encode(x, arrays, depth + 1) for x in obj]}
    if type(obj) is dict:
        return {"t": "dict", "v": [[encode(k, arrays, depth + 1), encode(v, arrays, depth + 1)] for k, v in obj.items()]}
    return _handle(obj)


def _handle(obj: Any) -> dict:
    _HANDLES[id(obj)] = obj
    return {"t": "handle", "id": id(obj), "type": type(obj).__name__, "callable": callable(obj)}


def decode(tree: dict, arrays: dict, session: Any = None) -> Any:
    """Grader side: rebuild what :func:`encode` described. Never unpickles anything."""
    kind = tree["t"]
    if kind == "py":
        return tree["v"]
    if kind == "ellipsis":
        return Ellipsis
    if kind == "complex":
        return complex(tree["re"], tree["im"])
    if kind == "nd":
        return arrays[f"a{tree['i']}"].copy()
    if kind == "npscalar":
        return arrays[f"a{tree['i']}"][()]
    if kind in ("tensor", "tdtype"):
        import torch
    if kind == "tensor":
        data = torch.from_numpy(arrays[f"a{tree['i']}"].copy())
        if tree["dtype"] in _TORCH_VIEWS:
            data = data.view(getattr(torch, tree["dtype"]))
        stride = tree.get("stride")
        if stride and len(stride) == data.dim() and tuple(stride) != data.stride() and 0 not in stride:
            # keep the layout the learner returned (a transposed view is not contiguous), for checks that ask
            laid = torch.empty_strided(data.shape, stride, dtype=data.dtype)
            if laid.untyped_storage().nbytes() == data.numel() * data.element_size():
                data = laid.copy_(data)
        if tree["device"].startswith("cuda") and torch.cuda.is_available():
            data = data.to(tree["device"])
        if tree["rg"] and (data.is_floating_point() or data.is_complex()):
            data.requires_grad_(True)
        if "grad" in tree:
            data.grad = decode(tree["grad"], arrays, session)
        return data
    if kind == "tdtype":
        return getattr(torch, tree["v"])
    if kind == "npdtype":
        return np.dtype(tree["v"])
    if kind in ("list", "tuple"):
        items = [decode(x, arrays, session) for x in tree["v"]]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {decode(k, arrays, session): decode(v, arrays, session) for k, v in tree["v"]}
    if kind == "handle":
        return RemoteObject(session, handle=tree["id"], type_name=tree["type"], is_callable=tree["callable"])
    raise ValueError(f"unknown encoded kind {kind!r}")


def _lookup(handle: int) -> Any:
    """Kernel side: the object behind a handle (a RemoteObject pickles to a call of this)."""
    return _HANDLES[handle]


# ------------------------------------------------------------------ in-place changes (kernel side)
def _leaves(obj: Any, path: tuple = ()):
    """(path, array-or-tensor) for every array/tensor reachable through lists, tuples, dicts and modules."""
    torch = _torch()
    if isinstance(obj, np.ndarray):
        yield path, obj
    elif torch is not None and isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _leaves(x, (*path, i))
    elif isinstance(obj, dict):
        for k, x in obj.items():
            if isinstance(k, (str, int)):
                yield from _leaves(x, (*path, k))
    elif torch is not None and isinstance(obj, torch.nn.Module):
        for name, p in obj.named_parameters():
            yield (*path, "param:" + name), p
        for name, b in obj.named_buffers():
            yield (*path, "buffer:" + name), b


def _storage_bytes(t) -> Any:
    """The whole storage behind a tensor view, as uint8 (a kernel may write past the view it was given)."""
    import torch

    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),))


def _is_partial_view(t) -> bool:
    return t.untyped_storage().nbytes() > t.numel() * t.element_size()


def _snapshot(args, kwargs) -> dict:
    out = {}
    for path, x in _leaves({"args": list(args), "kwargs": dict(kwargs)}):
        if isinstance(x, np.ndarray):
            out[path] = (x.copy(), None, None)
        else:
            whole = _storage_bytes(x).clone() if _is_partial_view(x) and x.device.type == "cpu" else None
            out[path] = (x.detach().clone(), None if x.grad is None else x.grad.detach().clone(), whole)
    return out


def _changed(before, now) -> bool:
    if isinstance(now, np.ndarray):
        return before.shape != now.shape or not np.array_equal(before, now, equal_nan=True)
    import torch

    now = now.detach()
    return before.shape != now.shape or before.dtype != now.dtype or not torch.equal(before.nan_to_num(), now.nan_to_num())


def _mutations(snapshot: dict, args, kwargs) -> list:
    torch = _torch()
    out = []
    for path, x in _leaves({"args": list(args), "kwargs": dict(kwargs)}):
        if path not in snapshot:
            continue
        value, grad, whole = snapshot[path]
        if whole is not None and not torch.equal(whole, _storage_bytes(x)):
            out.append((list(path), "storage", _storage_bytes(x).clone()))   # the view and whatever lies around it
        elif _changed(value, x):
            out.append((list(path), "value", x))
        if torch is not None and isinstance(x, torch.Tensor):
            if (grad is None) != (x.grad is None) or (grad is not None and _changed(grad, x.grad)):
                out.append((list(path), "grad", x.grad))
    return out


# ------------------------------------------------------------------------------- kernel side server
def serve(base: str) -> None:
    """Kernel side: answer the request in ``base + '.in'``; write ``base + '.json'`` and ``base + '.npz'``."""
    arrays: list[np.ndarray] = []
    try:
        with open(base + ".in", "rb") as f:
            request = pickle.load(f)
        reply = _answer(request, arrays)
    except BaseException as exc:  # the learner's code may raise anything, KeyboardInterrupt included
        message = str(exc).splitlines()[0] if str(exc) else ""
        from .forbidden import learner_line

        reply = {"error": {"type": type(exc).__name__, "message": message[:500], "line": learner_line(exc)}}
    try:
        text = json.dumps(reply, allow_nan=True)
    except (TypeError, ValueError) as exc:
        arrays.clear()
        text = json.dumps({"error": {"type": "EncodingError", "message": f"the result cannot be sent: {exc}"}})
    np.savez(base + ".npz", **{f"a{i}": a for i, a in enumerate(arrays)})
    Path(base + ".json").write_text(text)


def _answer(request: dict, arrays: list) -> dict:
    op = request["op"]
    if request.get("function") is not None:  # a released driver (RemoteDriver), run here around the learner's object
        target = request["function"]
    elif "handle" in request and request["handle"] is not None:
        target = _HANDLES[request["handle"]]
    else:
        namespace = sys.modules["__main__"].__dict__
        if request["name"] not in namespace:
            return {"missing": True}
        target = namespace[request["name"]]
    if op == "resolve":
        return {"value": encode(target, arrays)}
    if op == "getattr":
        return {"value": encode(getattr(target, request["attr"]), arrays)}
    if op == "setattr":
        setattr(target, request["attr"], request["value"])
        return {"value": encode(None, arrays)}
    if op == "getitem":
        return {"value": encode(target[request["key"]], arrays)}
    if op == "len":
        return {"value": encode(len(target), arrays)}
    if op == "list":
        return {"value": encode(list(target), arrays)}
    if op == "call":
        args, kwargs = request["args"], request["kwargs"]
        snapshot = _snapshot(args, kwargs)
        hit = None
        spec = _present(request.get("forbidden"))
        if spec is not None:
            from .forbidden import watch

            guard = watch(spec)
            result = guard.call(target, args, kwargs)
            hit = guard.hit
        else:
            result = target(*args, **kwargs)
        changes = [[path, what, encode(value, arrays)] for path, what, value in _mutations(snapshot, args, kwargs)]
        return {"value": encode(result, arrays), "hit": hit, "mutated": changes}
    raise ValueError(f"unknown request {op!r}")


def _present(spec):
    """The by-hand spec minus names of grading references a sandboxed kernel does not have (nothing can call them
    there; the watch still refuses the whole ``course_utils.grading`` package by module); None when nothing is watched."""
    if not spec:  # nothing watched: the watch's module (and torch with it) is not imported
        return None
    import dataclasses

    from .forbidden import ByHand, _resolve

    spec = ByHand.of(spec)
    if spec is None:
        return None

    def kept(names):
        out = []
        for dotted in names:
            if dotted.startswith("course_utils.grading."):
                try:
                    _resolve(dotted)
                except (AttributeError, ValueError, ImportError):
                    continue
            out.append(dotted)
        return tuple(out)

    return dataclasses.replace(spec, names=kept(spec.names), allow=kept(spec.allow))


# ------------------------------------------------------------------------------- grader side proxy
class RemoteObject:
    """A learner's object living in the kernel. Calls, attributes, items and ``len`` go over the wire."""

    def __init__(self, session, *, name: str | None = None, handle: int | None = None, type_name: str = "object",
                 is_callable: bool = True):
        object.__setattr__(self, "_session", session)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_handle", handle)
        object.__setattr__(self, "_type_name", type_name)
        object.__setattr__(self, "_is_callable", is_callable)
        object.__setattr__(self, "__name__", name or type_name)

    def _request(self, op: str, **fields):
        return self._session.request({"op": op, "name": self._name, "handle": self._handle, **fields})

    def __course_remote_call__(self, args, kwargs, forbidden=()):
        return _remote_call(self._session, {"name": self._name, "handle": self._handle}, tuple(args), dict(kwargs),
                            forbidden)

    def __call__(self, *args, **kwargs):
        result, _hit = self.__course_remote_call__(args, kwargs)
        return result

    def __getattr__(self, attr: str):
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        reply, arrays = self._request("getattr", attr=attr)
        return decode(reply["value"], arrays, self._session)

    def __setattr__(self, attr: str, value):
        self._request("setattr", attr=attr, value=value)

    def __getitem__(self, key):
        reply, arrays = self._request("getitem", key=key)
        return decode(reply["value"], arrays, self._session)

    def __len__(self):
        reply, arrays = self._request("len")
        return decode(reply["value"], arrays, self._session)

    def __iter__(self):
        reply, arrays = self._request("list")
        return iter(decode(reply["value"], arrays, self._session))

    def __reduce__(self):  # travels back to the kernel as the object it stands for
        if self._handle is not None:
            return (_lookup, (self._handle,))
        return (_main_global, (self._name,))

    def __repr__(self):
        return f"<learner's {self._type_name} {self._name or ''}>".replace(" >", ">")


class RemoteDriver:
    """``functools.partial(driver, learner_object, ...)`` run in the learner's kernel as one request, instead of one
    request per call the driver makes into the learner's object (set 02's loss scaler: about 2,200 requests and 28 s
    of a 37 s grading). Only for a driver marked ``runs_in_kernel`` in :mod:`course_utils.classroom.released`: one
    whose whole result the check compares with its reference here, so that a learner who replaced the driver in
    their kernel would still have to compute the right result from the check's fresh inputs."""

    def __init__(self, partial):
        self._partial, self._learner = partial, partial.args[0]

    def __course_remote_call__(self, args, kwargs, forbidden=()):
        return _remote_call(self._learner._session, {"function": self._partial.func, "name": None, "handle": None},
                            (*self._partial.args, *args), {**self._partial.keywords, **kwargs}, forbidden)

    @staticmethod
    def applies(fn) -> bool:
        import functools

        return (isinstance(fn, functools.partial) and bool(fn.args) and hasattr(fn.args[0], "__course_remote_call__")
                and getattr(fn.func, "runs_in_kernel", False) and fn.func.__module__ == "course_utils.classroom.released")


def _remote_call(session, target: dict, args: tuple, kwargs: dict, forbidden=()):
    """One "call" request for ``target`` (a learner's name or handle, or a released driver's function): the result
    decoded, the kernel's in-place changes copied into ``args``/``kwargs``, and the watch's hit (or None)."""
    # a ByHand (what call_learner passes) travels as itself: the request is cloudpickled; a list of names as a tuple
    spec = tuple(forbidden) if isinstance(forbidden, (list, tuple, set, frozenset)) else forbidden
    reply, arrays = session.request({"op": "call", **target, "args": args, "kwargs": kwargs, "forbidden": spec})
    _write_back(reply.get("mutated", []), args, kwargs, arrays, session)
    return decode(reply["value"], arrays, session), reply.get("hit")


def _main_global(name: str) -> Any:
    return sys.modules["__main__"].__dict__[name]


def _write_back(changes: list, args, kwargs, arrays, session) -> None:
    """Copy the kernel's in-place changes into the grader's own argument objects."""
    torch = _torch()
    root = {"args": list(args), "kwargs": dict(kwargs)}
    for path, what, tree in changes:
        target = root
        try:
            for step in path:
                if isinstance(step, str) and step.startswith(("param:", "buffer:")):
                    kind, name = step.split(":", 1)
                    target = target.get_parameter(name) if kind == "param" else target.get_buffer(name)
                else:
                    target = target[step]
        except (KeyError, IndexError, AttributeError, TypeError):
            continue
        value = decode(tree, arrays, session)
        if what == "storage":
            mine = _storage_bytes(target) if isinstance(target, torch.Tensor) else None
            if mine is not None and mine.numel() == value.numel():
                mine.copy_(value)
            continue
        if what == "grad":
            target.grad = None if value is None else value.to(target.device)
        elif isinstance(target, np.ndarray):
            if target.shape == np.shape(value) and target.flags.writeable:
                np.copyto(target, value, casting="unsafe")
        elif torch is not None and isinstance(target, torch.Tensor):
            with torch.no_grad():
                if target.shape == value.shape:
                    target.copy_(value.to(target.dtype))
                else:
                    target.data = value.detach().to(target.dtype)
