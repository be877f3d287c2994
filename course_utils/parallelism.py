r"""Real processes for lesson 09 (``notebooks/09_parallelism.ipynb``): a torchrun cluster you hand functions to.

:class:`Cluster` starts ``p`` worker processes with ``torchrun`` (``python -m torch.distributed.run``) on
the gloo backend, once, and then runs functions you give it on every rank: each call pickles the function
with ``cloudpickle`` (so a function written in a notebook cell travels by value) into a job file in a temp
folder; every worker runs it inside its process group and writes its result back. The start-up (about
five seconds of importing torch per process on a loaded 2-core CPU) is paid once per lesson, not once per
demo. The workers' entry point is :mod:`course_utils.parallelism_workers`.

Also here: the collectives the lesson derives, as library copies (:func:`ring_all_reduce`, eq. 1-2 of
the lesson), and the byte counts of eq. 3. The other parts of the lesson live in
``parallelism_data`` (data parallelism, FSDP), ``parallelism_tensor`` (tensor parallelism),
``parallelism_pipeline`` (pipeline schedules) and ``parallelism_moe`` (mixture of experts).
"""
from __future__ import annotations

import atexit
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent  # the folder that holds course_utils/


def free_port() -> int:
    """A TCP port nobody listens on right now (for torchrun's ``--master-port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, port: int, folder: str | Path, owner_pid: int | None = None) -> list[str]:
    """The command :class:`Cluster` runs: this interpreter's torchrun with the course's worker module."""
    owner = [] if owner_pid is None else ["--owner-pid", str(owner_pid)]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
            str(port), "--monitor-interval", "0.1", "-m", "course_utils.parallelism_workers", "--dir", str(folder), *owner]


def multinode_command(nnodes: int, nproc_per_node: int, endpoint: str, job_id: str = "lesson09") -> str:
    """The same launch on ``nnodes`` machines: run this line on every node (torchrun's c10d rendezvous)."""
    return (f"torchrun --nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-backend c10d "
            f"--rdzv-endpoint {endpoint} --rdzv-id {job_id} -m course_utils.parallelism_workers --dir <shared folder>")


class WorkerError(RuntimeError):
    """A function raised on a rank; the message holds that rank's traceback."""


class Cluster:
    """``nproc`` torchrun workers on gloo that run the functions you pass to :meth:`run`, on every rank.

    Use it as a context manager (``with Cluster(4) as cluster:``) or call :meth:`close`. ``run(fn, *args)``
    returns the list of per-rank return values (tensors, numbers, dicts: anything picklable).
    """

    def __init__(self, nproc: int = 4, *, timeout: float = 180.0):
        self.nproc, self.timeout, self._next = nproc, timeout, 0
        self.folder = Path(tempfile.mkdtemp(prefix="l2k_cluster_"))
        self.log_path = self.folder / "torchrun.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        env.pop("MPLBACKEND", None)
        self.command = torchrun_command(nproc, free_port(), self.folder, os.getpid())
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        atexit.register(self.close)
        self._wait_for([self.folder / f"ready{r}" for r in range(nproc)], "start")

    def _wait_for(self, paths: list[Path], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not all(p.exists() for p in paths):
            if self.proc.poll() is not None:
                raise WorkerError(f"torchrun exited during {what} (code {self.proc.returncode}):\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.close(kill=True)
                raise WorkerError(f"the workers did not finish {what} within {self.timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.005)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text()[-chars:] if self.log_path.exists() else ""

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results in rank order."""
        import cloudpickle

        k, self._next = self._next, self._next + 1
        module = sys.modules.get(getattr(fn, "__module__", None) or "")
        if module is not None and module.__name__.split(".")[0] not in ("__main__", "course_utils", "torch", "builtins"):
            cloudpickle.register_pickle_by_value(module)  # e.g. a test module the workers cannot import
        tmp = self.folder / f"job{k}.tmp"
        with open(tmp, "wb") as f:
            cloudpickle.dump((fn, args, kwargs), f)
        os.replace(tmp, self.folder / f"job{k}.pkl")
        paths = [self.folder / f"result{k}_{r}.pkl" for r in range(self.nproc)]
        self._wait_for(paths, f"job {k} ({getattr(fn, '__name__', 'function')})")
        results = []
        for path in paths:
            with open(path, "rb") as f:
                status, value = pickle.load(f)
            if status != "ok":
                raise WorkerError(f"rank {paths.index(path)} raised in {getattr(fn, '__name__', 'function')}:\n{value}")
            results.append(value)
        return results

    def close(self, kill: bool = False) -> None:
        """Stop the workers (they finish the job they are in); ``kill=True`` ends torchrun at once."""
        if self.proc.poll() is None and not kill:
            with open(self.folder / "stop.tmp", "w") as f:
                f.write("stop")
            os.replace(self.folder / "stop.tmp", self.folder / "stop")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill = True
        if kill and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def count_all_reduces(fn: Callable, *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn`` on this rank with ``dist.all_reduce`` counted: ``(result, number of all-reduce calls)``."""
    original, calls = dist.all_reduce, []

    def counted(*a, **kw):
        calls.append(1)
        return original(*a, **kw)

    dist.all_reduce = counted
    try:
        return fn(*args, **kwargs), len(calls)
    finally:
        dist.all_reduce = original


# ---------------------------------------------------------------- collectives (section 2)
def ring_chunks(n: int, world: int) -> list[slice]:
    """The ``world`` contiguous chunks a ring all-reduce cuts a vector of ``n`` elements into (torch.tensor_split's)."""
    bounds = [i * n // world for i in range(world + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(world)]


def ring_all_reduce(x: torch.Tensor, group=None) -> tuple[torch.Tensor, int]:
    r"""Sum ``x`` over all ranks with a ring of send/recv (eq. 1-2); returns ``(sum, bytes this rank sent)``.

    Reduce-scatter: at step ``s`` (0 .. p-2) rank ``r`` sends chunk ``(r - s) mod p`` to rank ``r+1`` and adds the
    chunk ``(r - s - 1) mod p`` it receives from rank ``r-1``; afterwards rank ``r`` holds the full sum of chunk
    ``(r + 1) mod p``. All-gather: at step ``s`` rank ``r`` sends chunk ``(r + 1 - s) mod p`` and overwrites chunk
    ``(r - s) mod p`` with what it receives. Each rank sends ``2 (p-1)/p · N`` elements (eq. 3).
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    out = x.detach().clone().reshape(-1)  # (N,)
    chunks = ring_chunks(out.numel(), world)
    right, left = (rank + 1) % world, (rank - 1) % world
    sent = 0
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(world - 1):
            send_c = (rank - s) % world if phase == "reduce-scatter" else (rank + 1 - s) % world
            recv_c = (rank - s - 1) % world if phase == "reduce-scatter" else (rank - s) % world
            buf = torch.empty_like(out[chunks[recv_c]])
            request = dist.isend(out[chunks[send_c]].contiguous(), _global(right, group), group=group)
            dist.recv(buf, _global(left, group), group=group)
            request.wait()
            sent += out[chunks[send_c]].numel() * out.element_size()
            if phase == "reduce-scatter":
                out[chunks[recv_c]] += buf
            else:
                out[chunks[recv_c]] = buf
    return out.reshape(x.shape), sent


def _global(rank: int, group) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def all_reduce_bytes_per_rank(n_bytes: float, world: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``n_bytes`` (eq. 3): reduce-scatter plus all-gather."""
    return 2 * (world - 1) / world * n_bytes


def reduce_scatter_bytes_per_rank(n_bytes: float, world: int) -> float:
    """Bytes each rank sends in a ring reduce-scatter (or all-gather) of ``n_bytes``: half an all-reduce."""
    return (world - 1) / world * n_bytes


__all__ = ["Cluster", "WorkerError", "free_port", "torchrun_command", "multinode_command", "count_all_reduces", "ring_chunks",
           "ring_all_reduce", "all_reduce_bytes_per_rank", "reduce_scatter_bytes_per_rank"]
