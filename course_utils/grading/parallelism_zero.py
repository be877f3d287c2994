"""Exercise 7 of the parallelism problem set (``solutions/09_parallelism.ipynb``): a ZeRO-2 Adam step per rank.

The learner writes the code one rank runs: reduce-scatter the gradients so that each rank holds the summed
gradient of its own shard of the (padded) flat parameter vector, update that shard with Adam (the optimizer
state exists only for the shard), and all-gather the updated shards into the full parameters. The collectives
come in through a ``comm`` object with ``rank``, ``world``, ``reduce_scatter(output, input)`` and
``all_gather(output, input)``, torch.distributed's ``reduce_scatter_tensor`` / ``all_gather_into_tensor``
signatures:

* :class:`GlooComm` is the real thing, for a gloo process group (the notebook runs the learner's function on
  ``course_utils.parallelism.Cluster`` processes and compares with ``torch.optim.Adam`` in one process);
* the check uses :class:`SimulatedPeers`, which plays the other ranks from data the check drew, so that it runs
  in the grader's process and calls the learner's function once per trial. The other ranks' gradients and
  updated shards are reachable only through the two collectives, so a right answer must call them.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..classroom.forbidden import ByHand
from ..classroom.checking import Mistake, check_function
from ..classroom.released import SimulatedPeers

_LESSON = ("course_utils.parallelism",)  # lesson modules refused by hand (course_utils.parallelism_* too)
BY_HAND_ZERO2_ADAM_STEP = {"modules": _LESSON,
    "allowed_ops": ("aten.add", "aten.sub", "aten.mul", "aten.div", "aten.sqrt", "aten.pow", "aten.zeros",
                    "aten.new_zeros", "aten.empty", "aten.cat", "aten.constant_pad_nd", "aten.slice", "aten.copy_",
                    "aten.clone", "aten.narrow", "aten.addcdiv", "aten.addcmul", "aten.lerp"),
    "whole_result_ops": ("aten._fused_adam_", "aten._foreach_add_", "aten._foreach_addcdiv_", "aten._foreach_lerp_"),
}


def _adam(param, grad, m, v, step, lr, betas, eps, *, correct=True, eps_inside=False, step_shift=0):
    b1, b2 = betas
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad**2
    t = step + step_shift
    m_hat, v_hat = (m / (1 - b1**t), v / (1 - b2**t)) if correct else (m, v)
    denom = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
    return param - lr * m_hat / denom, m, v


def _zero2(param, grads, m_shards, v_shards, step, lr, betas, eps, *, average=True, **adam):
    """Single-process ZeRO-2 on all ranks at once: (new params (N,), new m shards, new v shards)."""
    world, size = m_shards.shape
    n = param.numel()
    pad = world * size - n
    g = torch.nn.functional.pad(grads, (0, pad)).sum(0) / (world if average else 1)    # (world*S,)
    p = torch.nn.functional.pad(param, (0, pad))
    new_p, new_m, new_v = _adam(p, g, m_shards.reshape(-1), v_shards.reshape(-1), step, lr, betas, eps, **adam)
    return new_p[:n], new_m.reshape(world, size), new_v.reshape(world, size)


def _one_rank(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm, **kw):
    """What rank ``comm.rank`` should return, computed from the peers' data held by ``comm``."""
    world, size = comm._shards.shape
    grads = comm._grads[:, :param.numel()].clone()
    grads[comm.rank] = grad
    m = comm._m_all.clone()
    v = comm._v_all.clone()
    m[comm.rank], v[comm.rank] = exp_avg, exp_avg_sq
    new_p, new_m, new_v = _zero2(param, grads, m, v, step, lr, betas, eps, **kw)
    return new_p, new_m[comm.rank], new_v[comm.rank]


def _reference_zero2_adam_step(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm):
    return _one_rank(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm)


def _zero2_inputs(rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    world = int(rng.choice([2, 3, 4, 8]))
    n = int(rng.integers(world * 20, world * 200))
    if rng.random() < 0.7 and n % world == 0:
        n += int(rng.integers(1, world))                                 # usually not a multiple: padding matters
    size = math.ceil(n / world)
    rank = int(rng.integers(world))
    param = torch.randn(n, generator=g, dtype=torch.float64)
    grads = torch.randn(world, n, generator=g, dtype=torch.float64) * torch.rand(world, 1, generator=g, dtype=torch.float64) * 3
    m = torch.randn(world, size, generator=g, dtype=torch.float64) * 0.1
    v = torch.rand(world, size, generator=g, dtype=torch.float64) * 0.1
    step = int(rng.choice([1, int(rng.integers(2, 10)), int(rng.integers(10, 1000))]))
    lr, betas, eps = float(rng.uniform(1e-3, 0.1)), (float(rng.uniform(0.8, 0.95)), float(rng.uniform(0.9, 0.999))), \
        float(rng.choice([1e-8, 1e-3]))
    _, new_m, new_v = _zero2(param, grads, m, v, step, lr, betas, eps)
    new_p_padded, _, _ = _zero2(torch.nn.functional.pad(param, (0, world * size - n)),
                                torch.nn.functional.pad(grads, (0, world * size - n)), m, v, step, lr, betas, eps)
    comm = SimulatedPeers(rank, world, torch.nn.functional.pad(grads, (0, world * size - n)),
                          new_p_padded.reshape(world, size))
    comm._m_all, comm._v_all = m, v
    return param, grads[rank].clone(), m[rank].clone(), v[rank].clone(), step, lr, betas, eps, comm


def check_zero2_adam_step(fn: Callable, *, trials: int = 6, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 7: ``fn(param, grad, exp_avg, exp_avg_sq, step, lr, betas, eps, comm) -> (param, exp_avg, exp_avg_sq)``."""

    def variant(**kw):
        return lambda *args: _one_rank(*args, **kw)

    check_function(
        fn, _reference_zero2_adam_step, _zero2_inputs, name="zero2_adam_step", trials=trials, seed=seed, n=8,
        by_hand=ByHand.of(BY_HAND_ZERO2_ADAM_STEP),
        mistakes=[
            Mistake("sum", "reduce-scatter sums the ranks' gradients; data parallelism averages them: divide by world.",
                    variant(average=False)),
            Mistake("no_bias_correction", "Adam divides m by 1 - beta1^step and v by 1 - beta2^step (bias correction).",
                    variant(correct=False)),
            Mistake("eps_inside", "eps is added to sqrt(v_hat), outside the square root (torch.optim.Adam's convention).",
                    variant(eps_inside=True)),
            Mistake("step_plus_one", "step is already this step's number (1 for the first): bias-correct with "
                    "beta^step, not beta^(step+1).", variant(step_shift=1)),
        ],
        forbidden=("torch.optim.Adam.step", "torch.optim.adam.adam", "torch.optim.AdamW.step",
                   "course_utils.grading.parallelism_zero._reference_zero2_adam_step",
                   "course_utils.grading.parallelism_zero._zero2", "course_utils.grading.parallelism_zero._one_rank",
                   "course_utils.grading.parallelism_zero._adam"), quiet=quiet,
    )


# the ungraded demonstration on real gloo processes is released to learners as it is: see parallelism_gloo
from .parallelism_gloo import GlooComm, run_zero2_on_gloo  # noqa: E402,F401


__all__ = ["GlooComm", "check_zero2_adam_step", "run_zero2_on_gloo"]
