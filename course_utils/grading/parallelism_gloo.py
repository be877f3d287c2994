"""Topic 09's exercise 7 on real processes: the learner's ZeRO-2 Adam step on gloo ranks, against torch.optim.Adam.

:func:`run_zero2_on_gloo` runs the learner's ``zero2_adam_step`` on ``world`` processes of
``course_utils.parallelism.Cluster`` with :class:`GlooComm` (the real collectives) and returns the largest
difference from ``torch.optim.Adam`` run in one process on the averaged gradient. The graded check,
``check_zero2_adam_step``, plays the other ranks in one process (the grading module ``parallelism_zero``).
"""
from __future__ import annotations

import math
import sys
from typing import Callable

import torch

from ..classroom.released import SimulatedPeers

# Released to learners as it is (course_utils.classroom.release), because it holds no reference:
RELEASED_AS_SOURCE = ("it compares the learner's function on gloo ranks with torch.optim.Adam in one process: the answer, "
                      "a sharded Adam step, is nowhere in it")

__all__ = ["GlooComm", "run_zero2_on_gloo"]


class GlooComm:
    """The collectives of the current torch.distributed process group, in the shape the exercise expects."""

    def __init__(self):
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.reduce_scatter = dist.reduce_scatter_tensor       # (output (S,), input (world*S,)), summed
        self.all_gather = dist.all_gather_into_tensor           # (output (world*S,), input (S,))


def run_zero2_on_gloo(fn: Callable, *, world: int = 2, n: int = 1001, steps: int = 3) -> float:
    """Run the learner's ``fn`` on ``world`` real gloo processes for ``steps`` steps of a quadratic loss and return
    the largest difference from ``torch.optim.Adam`` run in this process on the averaged gradient (float64)."""
    from ..classroom.checking import NotAttempted, call_learner
    from ..parallelism import Cluster, WorkerError

    # a stub fails here, before the launch: one call on two ranks' worth of zeros, played by SimulatedPeers
    zeros = torch.zeros(4, dtype=torch.float64)
    call_learner("zero2_adam_step", fn, (zeros, zeros.clone(), zeros[:2].clone(), zeros[:2].clone(), 1, 0.05, (0.9, 0.999),
                                         1e-8, SimulatedPeers(0, 2, torch.zeros(2, 4, dtype=torch.float64),
                                                              torch.zeros(2, 2, dtype=torch.float64))))
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is not None and module.__name__.split(".")[0] not in ("__main__", "course_utils", "torch", "builtins"):
        import cloudpickle

        cloudpickle.register_pickle_by_value(module)  # fn travels to the workers by value (a test module, say)
    try:
        with Cluster(world) as cluster:
            results = cluster.run(_gloo_job, fn, n, steps)
    except WorkerError as exc:
        if "NotImplementedError" in str(exc):
            raise NotAttempted("zero2_adam_step: not attempted yet; replace `raise NotImplementedError` with your code "
                               "and run this cell again.") from None
        raise
    target = torch.randn(world, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    param = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([param], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * ((param - target) ** 2).sum(-1)).mean().backward()         # the mean over ranks of each rank's loss
        opt.step()
    return max((got - param.detach()).abs().max().item() for got in results)


def _gloo_job(fn, n, steps):
    comm = GlooComm()
    size = math.ceil(n / comm.world)
    target = torch.randn(comm.world, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64)[comm.rank]
    param = torch.zeros(n, dtype=torch.float64)
    m, v = torch.zeros(size, dtype=torch.float64), torch.zeros(size, dtype=torch.float64)
    for step in range(1, steps + 1):
        grad = param - target                                           # this rank's loss 0.5 |param - target_r|^2
        param, m, v = fn(param, grad, m, v, step, 0.05, (0.9, 0.999), 1e-8, comm)
    return param
