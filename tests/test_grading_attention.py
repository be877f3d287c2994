"""Tests of course_utils.grading.attention: every check of the topic 06 problem set.

For each check: the solution passes, a right answer written differently passes, a stub is "not attempted",
each named mistake fails with its hint, the production shortcut and the course's own function fail as
forbidden, and a hard-coded answer (a lookup of one run's outputs) fails on fresh inputs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from _grading_helpers import fails_with, gpu_compiler, stub
from course_utils import attention as at
from course_utils import attention_io as aio
from course_utils.checks import CheckFailed, ForbiddenCall, NotAttempted
from course_utils.grading import attention as ga


def forbidden(check, fn, fragment):
    with pytest.raises(ForbiddenCall) as info:
        check(fn)
    assert fragment in str(info.value), str(info.value)


def lookup(check, solution):
    """A hard-coded answer: whatever the solution returned on one seeded run, replayed by input shape."""
    table = {}

    def record(*args):
        out = solution(*args)
        table[tuple(np.shape(a) if isinstance(a, np.ndarray) else a for a in args)] = out
        return out

    check(record, seed=123, quiet=True)

    def replay(*args):
        key = tuple(np.shape(a) if isinstance(a, np.ndarray) else a for a in args)
        return table.get(key, next(iter(table.values())))

    return replay


def assert_hard_coded_fails(check, solution):
    replay = lookup(check, solution)
    with pytest.raises(CheckFailed):
        for seed in range(5):  # a lookup may hit a repeated small input once; five fresh runs cannot all pass
            check(replay, seed=1000 + seed, quiet=True)


# ---------------------------------------------------------------- exercise 1
def merge_solution(m1, l1, acc1, m2, l2, acc2):
    m = np.maximum(m1, m2)
    a1, a2 = np.exp(m1 - m), np.exp(m2 - m)
    return m, a1 * l1 + a2 * l2, a1[:, None] * acc1 + a2[:, None] * acc2


def merge_via_logs(m1, l1, acc1, m2, l2, acc2):  # right, written differently: log-domain weights
    lse1, lse2 = m1 + np.log(l1), m2 + np.log(l2)
    m = np.where(m1 > m2, m1, m2)
    w1, w2 = np.exp(lse1 - m) / l1, np.exp(lse2 - m) / l2
    return m, w1 * l1 + w2 * l2, w1[:, None] * acc1 + w2[:, None] * acc2


def test_merge_softmax_states():
    check = ga.check_merge_softmax_states
    check(merge_solution, quiet=True)
    check(merge_via_logs, trials=12, quiet=True)
    with pytest.raises(NotAttempted):
        check(stub)
    fails_with(check, lambda m1, l1, a1, m2, l2, a2: (np.maximum(m1, m2),) + merge_solution(m1, l1, a1, m2, l2, a2)[1:2]
               + (a1 + a2,), "forgot to rescale the accumulator")
    fails_with(check, lambda m1, l1, a1, m2, l2, a2: (np.maximum(m1, m2), l1 + l2, a1 + a2), "without rescaling")
    fails_with(check, lambda *s: (lambda m, l, a: (m, l, a / l[:, None]))(*merge_solution(*s)), "unnormalised")

    def inverted(m1, l1, a1, m2, l2, a2):
        m = np.maximum(m1, m2)
        b1, b2 = np.exp(m - m1), np.exp(m - m2)
        return m, b1 * l1 + b2 * l2, b1[:, None] * a1 + b2[:, None] * a2

    fails_with(check, inverted, "inverted")
    fails_with(check, lambda m1, l1, a1, m2, l2, a2: (np.minimum(m1, m2),) + merge_solution(m1, l1, a1, m2, l2, a2)[1:],
               "not the smaller")
    forbidden(check, lambda *s: at.merge_states(*s), "course_utils.attention.merge_states")
    assert_hard_coded_fails(check, merge_solution)


# ---------------------------------------------------------------- exercise 2
def causal_solution(q, k, v):
    n, d = q.shape
    s = q @ k.T / math.sqrt(d)
    s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) @ v


def causal_loops(q, k, v):  # right, written differently: one row at a time, finite fill
    out = np.zeros_like(v)
    for i in range(q.shape[0]):
        s = (k[:i + 1] @ q[i]) * np.float32(1 / math.sqrt(q.shape[1]))
        w = np.exp(s - s.max())
        out[i] = (w / w.sum()) @ v[:i + 1]
    return out


def causal(q, k, v, *, diag=0, scale=True, axis=-1, fill=-np.inf, shift="row"):
    s = q @ k.T / np.float32(math.sqrt(q.shape[1]) if scale else 1.0)
    s = np.where(np.tril(np.ones(s.shape, bool), k=diag), s, np.float32(fill))
    with np.errstate(all="ignore"):  # NaN rows, overflowing exp: as a learner's would
        e = np.exp(s - {"row": s.max(axis, keepdims=True), "global": s.max(), "none": 0}[shift])
        return e / e.sum(axis, keepdims=True) @ v


def test_causal_attention():
    check = ga.check_causal_attention
    check(causal_solution, quiet=True)
    check(causal_loops, trials=9, quiet=True)
    with pytest.raises(NotAttempted):
        check(stub)
    fails_with(check, lambda q, k, v: causal(q, k, v, shift="none"), "Subtract each row's max")
    fails_with(check, lambda q, k, v: causal(q, k, v, shift="global"), "one max for the whole matrix")
    fails_with(check, lambda q, k, v: causal(q, k, v, diag=-1), "off by one")  # NaN in row 0
    fails_with(check, lambda q, k, v: causal(q, k, v, diag=-1, fill=-1e9), "off by one")
    fails_with(check, lambda q, k, v: causal(q, k, v, diag=1), "off by one")
    fails_with(check, lambda q, k, v: causal(q, k, v, scale=False), "missing 1/sqrt(d)")
    fails_with(check, lambda q, k, v: causal(q, k, v, axis=0), "wrong axis")
    fails_with(check, lambda q, k, v: causal(q, k, v, diag=q.shape[0]), "no causal mask")
    fails_with(check, lambda q, k, v: causal(q, k, v, diag=q.shape[0], scale=False), "two things are missing")
    fails_with(check, lambda q, k, v: causal_solution(q, k, v).astype(np.float64), "dtype")

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)), is_causal=True).numpy()

    def torch_softmax(q, k, v):
        s = torch.from_numpy(q @ k.T / math.sqrt(q.shape[1])).masked_fill(~torch.ones(len(q), len(q)).tril().bool(), -math.inf)
        return (torch.softmax(s, -1) @ torch.from_numpy(v)).numpy()

    forbidden(check, sdpa, "scaled_dot_product_attention")
    forbidden(check, torch_softmax, "softmax")
    forbidden(check, lambda q, k, v: at.attention_naive(q, k, v, causal=True), "course_utils.attention.attention_naive")
    assert_hard_coded_fails(check, causal_solution)


def test_causal_attention_inputs_overflow_without_the_max():
    seen = []
    ga.check_causal_attention(lambda q, k, v: seen.append((q, k)) or causal_solution(q, k, v), trials=6, quiet=True)
    assert sorted({len(q) for q, _ in seen} & {1, 2}) == [1, 2]  # lengths 1 and 2 are drawn
    for q, k in seen:
        assert q.dtype == np.float32 and (q @ k.T / math.sqrt(q.shape[1])).max() > ga.FP32_EXP_OVERFLOW


# ---------------------------------------------------------------- exercise 4
def forward_solution(q, k, v, block_n):
    tau = 1 / math.sqrt(q.shape[1])
    m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros_like(q)
    for j in range(0, k.shape[0], block_n):
        s = tau * q @ k[j:j + block_n].T
        m_new = np.maximum(m, s.max(-1))
        alpha, p = np.exp(m - m_new), np.exp(s - m_new[:, None])
        l, acc, m = alpha * l + p.sum(-1), alpha[:, None] * acc + p @ v[j:j + block_n], m_new
    return acc / l[:, None], m + np.log(l)


def forward_by_merging(q, k, v, block_n):  # right, written differently: merge per-block states, base-2 inside
    tau = 1 / math.sqrt(q.shape[1])
    state = None
    for j in range(0, k.shape[0], block_n):
        s2 = tau * math.log2(math.e) * (q @ k[j:j + block_n].T)  # base-2 scores
        m = s2.max(-1)
        e = np.exp2(s2 - m[:, None])
        new = (m, e.sum(-1), e @ v[j:j + block_n])
        if state is None:
            state = new
        else:
            mm = np.maximum(state[0], m)
            a, b = np.exp2(state[0] - mm), np.exp2(m - mm)
            state = (mm, a * state[1] + b * new[1], a[:, None] * state[2] + b[:, None] * new[2])
    m, l, acc = state
    return acc / l[:, None], (m + np.log2(l)) * math.log(2)


def forward(q, k, v, block_n, *, rescale=True, lse="running", scale=True, running_max=True):
    tau = 1 / math.sqrt(q.shape[1]) if scale else 1.0
    m, l, acc = np.full(q.shape[0], -np.inf), np.zeros(q.shape[0]), np.zeros_like(q)
    with np.errstate(all="ignore"):
        for j in range(0, k.shape[0], block_n):
            s = tau * q @ k[j:j + block_n].T
            m_new = np.maximum(m, s.max(-1)) if running_max else np.zeros(q.shape[0])
            alpha, p = np.exp(m - m_new) if running_max else 1.0, np.exp(s - m_new[:, None])
            l = alpha * l + p.sum(-1)
            acc = (alpha[:, None] if rescale and running_max else 1.0) * acc + p @ v[j:j + block_n]
            m = m_new
            last = s.max(-1) + np.log(np.exp(s - s.max(-1)[:, None]).sum(-1))
        out = {"running": m + np.log(l), "last": last, "nomax": np.log(l), "max": m}[lse]
        return acc / l[:, None], out


def test_flash_forward_lse():
    check = ga.check_flash_forward_lse
    check(forward_solution, quiet=True)
    check(forward_by_merging, trials=10, quiet=True)
    with pytest.raises(NotAttempted):
        check(stub)
    fails_with(check, lambda *a: forward(*a, running_max=False), "exp overflowed")
    fails_with(check, lambda *a: forward(*a, rescale=False), "rescale the accumulator")
    fails_with(check, lambda *a: forward(*a, lse="last"), "wrong block")
    fails_with(check, lambda *a: forward(*a, lse="nomax"), "misses the max")
    fails_with(check, lambda *a: forward(*a, scale=False), "missing 1/sqrt(d)")
    fails_with(check, lambda *a: forward(*a, lse="max"), "not the running max m alone")
    fails_with(check, lambda *a: forward(*a, rescale=False, lse="last"), "two slips")
    forbidden(check, lambda q, k, v, b: at.flash_attention_forward_numpy(q[None], k[None], v[None], block_n=b)[0][0],
              "flash_attention_forward_numpy")

    def sdpa_and_logsumexp(q, k, v, b):
        qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
        return (F.scaled_dot_product_attention(qt, kt, vt).numpy(),
                torch.logsumexp(qt @ kt.T / math.sqrt(q.shape[1]), -1).numpy())

    forbidden(check, sdpa_and_logsumexp, "scaled_dot_product_attention")
    assert_hard_coded_fails(check, forward_solution)


# ---------------------------------------------------------------- exercise 5
def backward_solution(q, k, v, o, lse, do, block):
    tau = 1 / math.sqrt(q.shape[1])
    delta = (do * o).sum(-1)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for j in range(0, k.shape[0], block):
        for i in range(0, q.shape[0], block):
            p = np.exp(tau * q[i:i + block] @ k[j:j + block].T - lse[i:i + block, None])
            dv[j:j + block] += p.T @ do[i:i + block]
            ds = p * (do[i:i + block] @ v[j:j + block].T - delta[i:i + block, None])
            dq[i:i + block] += tau * ds @ k[j:j + block]
            dk[j:j + block] += tau * ds.T @ q[i:i + block]
    return dq, dk, dv


def backward_query_outer(q, k, v, o, lse, do, block, *, delta=True, tau_grad=True, tau_p=True, pt=True):
    """Right (with defaults), written differently: query blocks outside, key blocks inside."""
    tau = 1 / math.sqrt(q.shape[1])
    dlt = (do * o).sum(-1) if delta else np.zeros(q.shape[0])
    g = tau if tau_grad else 1.0
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for i in range(0, q.shape[0], block):
        for j in range(0, k.shape[0], block):
            p = np.exp((tau if tau_p else 1.0) * q[i:i + block] @ k[j:j + block].T - lse[i:i + block, None])
            if pt:
                dv[j:j + block] += p.T @ do[i:i + block]
            else:
                dv[i:i + block] += p @ do[j:j + block]
            ds = p * (do[i:i + block] @ v[j:j + block].T - dlt[i:i + block, None])
            dq[i:i + block] += g * ds @ k[j:j + block]
            dk[j:j + block] += g * ds.T @ q[i:i + block]
    return dq, dk, dv


def test_flash_backward_tiles():
    check = ga.check_flash_backward_tiles
    check(backward_solution, quiet=True)
    check(backward_query_outer, trials=8, quiet=True)
    with pytest.raises(NotAttempted):
        check(stub)
    fails_with(check, lambda *a: backward_query_outer(*a, delta=False), "delta")
    fails_with(check, lambda *a: backward_query_outer(*a, tau_grad=False), "dQ and dK")
    fails_with(check, lambda *a: backward_query_outer(*a, tau_p=False), "recomputing P")
    fails_with(check, lambda *a: backward_query_outer(*a, pt=False), "not P dO")
    fails_with(check, lambda *a: backward_query_outer(*a, delta=False, tau_grad=False), "two slips")
    forbidden(check, lambda q, k, v, o, lse, do, b: at.attention_backward_naive(q, k, v, do), "attention_backward_naive")
    forbidden(check, lambda q, k, v, o, lse, do, b: at.flash_attention_backward_tiles(q, k, v, o, lse, do),
              "flash_attention_backward_tiles")
    assert_hard_coded_fails(check, backward_solution)


# ---------------------------------------------------------------- exercise 6: one tile of the dK/dV kernel
from course_utils.grading import attention_backward as gab  # noqa: E402


def dkdv_tile_solution(k, v, q, o, do, lse):
    tau = 1 / math.sqrt(q.shape[1])
    p = np.exp(tau * q @ k.T - lse[:, None])                # (bm, bn)
    ds = p * (do @ v.T - (do * o).sum(-1)[:, None])          # (bm, bn)
    return tau * ds.T @ q, p.T @ do


def dkdv_tile_transposed_layout(k, v, q, o, do, lse):  # right, written differently: the kernel's P^T tiles
    tau = 1 / math.sqrt(q.shape[1])
    delta = np.einsum("md,md->m", do, o)
    pt = np.exp(tau * k @ q.T - lse[None, :])               # (bn, bm)
    dst = pt * (v @ do.T - delta[None, :])
    return (dst @ q) * tau, pt @ do


def dkdv_tile_torch_autograd(k, v, q, o, do, lse):  # the shortcut: differentiate the tile's share with autograd
    kt, vt = (torch.from_numpy(x).requires_grad_() for x in (k, v))
    qt, dot = torch.from_numpy(q), torch.from_numpy(do)
    p = torch.exp(qt @ kt.T / math.sqrt(q.shape[1]) - torch.from_numpy(lse)[:, None])
    dk, dv = torch.autograd.grad((p @ vt * dot).sum(), (kt, vt))
    return dk.numpy(), dv.numpy()


def test_dkdv_tile():
    check = gab.check_dkdv_tile
    check(dkdv_tile_solution, quiet=True)
    check(dkdv_tile_transposed_layout, trials=8, quiet=True)
    with pytest.raises(NotAttempted):
        check(stub)
    g = pasted(gab)._tile_grads  # the check refuses course_utils.grading: the test pastes the helper, as a learner could
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, delta="none"), "dropped delta")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, delta="tile"), "over ALL keys")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, scale=math.sqrt(q.shape[1])),
               "missing the 1/sqrt(d)")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, scale=1 / math.sqrt(q.shape[1])), "twice")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, dk_t=False), "not dS Q")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, dv_t=False), "not P dO")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, lse_axis=1), "query rows")
    fails_with(check, lambda k, v, q, o, do, lse: g(k, v, q, o, do, lse, delta="none", scale=math.sqrt(q.shape[1])),
               "two slips")
    forbidden(check, dkdv_tile_torch_autograd, "torch.autograd.grad")
    assert_hard_coded_fails(check, dkdv_tile_solution)


def test_dkdv_tile_inputs_need_the_prepass():
    """The tile is one of several key blocks, so its rows of P sum to less than 1 (and the tile's own
    rowsum(P * dP) is not delta); tiles are square and not."""
    seen = []
    pasted_reference = pasted(gab)._reference_dkdv_tile  # the check refuses course_utils.grading; pasted code is the learner's
    gab.check_dkdv_tile(lambda *a: (seen.append(a), pasted_reference(*a))[1], seed=7, trials=4, quiet=True)
    for k, v, q, o, do, lse in seen:
        p = np.exp(q @ k.T / math.sqrt(q.shape[1]) - lse[:, None])
        assert (p.sum(-1) < 1 - 1e-6).all()
        assert not np.allclose((p * (do @ v.T)).sum(-1), (do * o).sum(-1))
    assert {a[2].shape[0] == a[0].shape[0] for a in seen} == {True, False}


# ---------------------------------------------------------------- structure: ex4 and ex5 never hold an (L, L) array
def flash_forward_untiled(q, k, v, block_n):      # right values, but the whole score matrix at once
    s = q @ k.T / math.sqrt(q.shape[1])
    m = s.max(-1)
    e = np.exp(s - m[:, None])
    return e @ v / e.sum(-1)[:, None], m + np.log(e.sum(-1))


def flash_backward_untiled(q, k, v, o, lse, do, block):
    tau = 1 / math.sqrt(q.shape[1])
    p = np.exp(tau * q @ k.T - lse[:, None])
    ds = p * (do @ v.T - (do * o).sum(-1)[:, None])
    return tau * ds @ k, tau * ds.T @ q, p.T @ do


def test_the_full_score_matrix_is_refused():
    from _grading_helpers import fails
    assert "the full (L, L) score matrix" in fails(ga.check_flash_forward_lse, flash_forward_untiled, "MiB")
    assert "one (block, block) tile at a time" in fails(ga.check_flash_backward_tiles, flash_backward_untiled, "MiB")


# ---------------------------------------------------------------- exercise 3: the sliding-window tile count
import course_utils.grading.attention_kernels as gk  # noqa: E402
from _grading_helpers import SEED, each_mistake_is_named, fails, passes, rejects_recorded_answers  # noqa: E402
from _grading_helpers import forbidden as forbidden_named  # noqa: E402
from _grading_helpers import not_attempted, pasted  # noqa: E402


def window_count(seqlen, block_m, block_n, window):
    total = 0
    for i in range(-(-seqlen // block_m)):
        first, last = i * block_m, min((i + 1) * block_m, seqlen) - 1
        total += last // block_n - max(0, first - window + 1) // block_n + 1
    return total


def window_count_by_key_blocks(seqlen, block_m, block_n, window):   # right, written differently: per key block
    n_q = -(-seqlen // block_m)
    total = 0
    for j in range(-(-seqlen // block_n)):
        first_key, last_key = j * block_n, min((j + 1) * block_n, seqlen) - 1
        # query blocks whose rows [i*bm, min((i+1)*bm, L) - 1] see some key of this block
        lo = first_key // block_m                                       # rows >= first_key
        hi = min(n_q - 1, (last_key + window - 1) // block_m)           # rows < last_key + window
        total += max(0, hi - lo + 1)
    return total


def window_count_by_mask(seqlen, block_m, block_n, window):
    i, j = np.arange(seqlen)[:, None], np.arange(seqlen)[None, :]
    keep = (j <= i) & (j > i - window)
    return int(np.add.reduceat(np.add.reduceat(keep, np.arange(0, seqlen, block_m), 0), np.arange(0, seqlen, block_n), 1).astype(bool).sum())


def test_blocks_visited_window():
    passes(gk.check_blocks_visited_window, window_count)
    passes(gk.check_blocks_visited_window, window_count_by_key_blocks)
    not_attempted(gk.check_blocks_visited_window, stub)
    rejects_recorded_answers(gk.check_blocks_visited_window, window_count)
    forbidden_named(gk.check_blocks_visited_window, lambda *a: gk._reference_blocks_visited_window(*a), "_reference_blocks_visited_window")
    forbidden_named(gk.check_blocks_visited_window, lambda L, bm, bn, w: aio.causal_blocks_visited(L, bm, bn), "causal_blocks_visited")
    assert window_count_by_mask(300, 32, 16, 40) == window_count(300, 32, 16, 40)
    fails(gk.check_blocks_visited_window, window_count_by_mask, "do not build a mask")


def test_blocks_visited_window_mistakes(monkeypatch):
    each_mistake_is_named(gk, gk.check_blocks_visited_window, window_count, monkeypatch, trials=6)


# ---------------------------------------------------------------- exercises 7 and 8: the solution's Triton kernels
from course_utils.env import import_triton  # noqa: E402

triton, _tl = import_triton()   # the interpreter on a CPU, as setup() chooses
if triton is None:  # pragma: no cover - macOS, Windows, Arm Linux
    pytest.skip("Triton is not installed", allow_module_level=True)


def solution_module(tmp_path_factory, replace=()):
    """The Triton cells of solutions/06 (ex. 7 and 8), written to a module file."""
    from _grading_helpers import solution_cells_module

    return solution_cells_module(tmp_path_factory, "06_flash_attention", ("ex7_swa_alibi", "ex8_flash_backward_atomic"),
                                 "import math\nimport torch\nimport triton\nimport triton.language as tl", replace)


@pytest.fixture(scope="module")
def sol(tmp_path_factory):
    return solution_module(tmp_path_factory)


SKIP_FROM = "lo = tl.maximum(start_m * BLOCK_M - window + 1, 0) // BLOCK_N * BLOCK_N"
DQ_ATOMIC = 'tl.atomic_add(dq_ptr + q_at, tl.dot(ds, k, input_precision="ieee") * scale, mask=m_ok[:, None])'


@pytest.fixture(scope="module")
def other(tmp_path_factory):   # right, written differently: the first key block one block early, exp2 in both kernels
    return solution_module(tmp_path_factory, replace=(
        (SKIP_FROM, "lo = tl.maximum((start_m * BLOCK_M - window + 1) // BLOCK_N - 1, 0) * BLOCK_N"),
        ("p = tl.exp(s - m_safe[:, None])", "p = tl.exp2((s - m_safe[:, None]) * 1.4426950408889634)"),
        ("tl.exp(s - lse[:, None])", "tl.exp2((s - lse[:, None]) * 1.4426950408889634)")))


@pytest.fixture(scope="module")
def masking(tmp_path_factory):   # loads every key block up to the diagonal and masks the window: values right
    return solution_module(tmp_path_factory, replace=((SKIP_FROM, "lo = 0"),))


@pytest.fixture(scope="module")
def dq_stored(tmp_path_factory):   # dQ by a plain read-modify-write: right under the interpreter, a race on a GPU
    return solution_module(tmp_path_factory, replace=((DQ_ATOMIC, "tl.store(dq_ptr + q_at, tl.load(dq_ptr + q_at, "
                                                       "mask=m_ok[:, None], other=0.0) + tl.dot(ds, k, "
                                                       "input_precision=\"ieee\") * scale, mask=m_ok[:, None])"),))


@pytest.fixture(scope="module")
def dq_dead_atomic(tmp_path_factory):   # an atomic_add that adds nothing, and the real dQ stored
    return solution_module(tmp_path_factory, replace=((DQ_ATOMIC, "tl.atomic_add(dq_ptr + q_at, 0.0 * q, "
                                                       "mask=m_ok[:, None])\n        tl.store(dq_ptr + q_at, "
                                                       "tl.load(dq_ptr + q_at, mask=m_ok[:, None], other=0.0) + "
                                                       "tl.dot(ds, k, input_precision=\"ieee\") * scale, "
                                                       "mask=m_ok[:, None])"),))


@pytest.fixture(scope="module")
def dq_copied(tmp_path_factory):   # dQ accumulated in a scratch buffer, copied into the result by the launcher
    return solution_module(tmp_path_factory, replace=(
        ("dq = torch.zeros_like(q)                                               # atomics add into it",
         "scratch = torch.zeros_like(q)"),
        ("q, k, v, do, lse, delta, dq, dk, dv, n,", "q, k, v, do, lse, delta, scratch, dk, dv, n,"),
        ("    return dq, dk, dv\n", "    return scratch.clone(), dk, dv\n")))


def test_swa_alibi_right_answers(sol, other):
    gk.check_swa_alibi_attention(sol.swa_alibi_attention, seed=SEED, trials=3)
    gk.check_swa_alibi_attention(other.swa_alibi_attention, seed=SEED + 1, trials=2)
    not_attempted(gk.check_swa_alibi_attention, stub)


def test_flash_backward_atomic_right_answers(sol, other):
    gk.check_flash_backward_atomic(sol.flash_backward_atomic, seed=SEED, trials=3)
    gk.check_flash_backward_atomic(other.flash_backward_atomic, seed=SEED + 1, trials=2)
    not_attempted(gk.check_flash_backward_atomic, stub)


def test_swa_kernel_that_masks_instead_of_skipping_fails(masking):
    message = fails(gk.check_swa_alibi_attention, masking.swa_alibi_attention, "only masks them", trials=1)
    assert "skip them" in message and "NaN" in message


def test_the_skip_probe_separates_skipping_from_masking(sol, masking):
    for seed in range(3):
        q, k, v, slopes, window, bm, bn, first = gk._skip_inputs(np.random.default_rng(seed))
        assert torch.isnan(k[:, :bn]).all() and first >= 2 * bn + window
        assert torch.isfinite(sol.swa_alibi_attention(q, k, v, slopes, window, bm, bn)[:, first:]).all()
        assert torch.isnan(masking.swa_alibi_attention(q, k, v, slopes, window, bm, bn)[:, first:]).all()


@pytest.mark.parametrize("variant,fragment", [("dq_stored", "a plain store (tl.store or an atomic exchange) into dQ"),
                                              ("dq_dead_atomic", "a plain store"),
                                              ("dq_copied", "tl.atomic_add on only 0 of the")])
def test_dq_not_accumulated_by_atomics_is_refused(variant, fragment, request):
    module = request.getfixturevalue(variant)
    message = forbidden_named(gk.check_flash_backward_atomic, module.flash_backward_atomic, fragment)
    assert "dQ" in message


def test_the_write_log_judges_addresses():
    from course_utils.classroom.triton_writes import WriteLog, atomic_write_problem

    dq, log = torch.zeros(4), WriteLog()
    assert atomic_write_problem(log, (dq,), 0, "dQ") is None                 # nothing interpreted (a GPU): nothing to measure
    every = np.array([dq.data_ptr() + 4 * i for i in range(4)], dtype=np.uint64)
    log.note("add", every, np.array([True, True, True, False]))  # masked lanes write nothing
    assert "on only 3 of the 4 elements" in atomic_write_problem(log, (dq,), 0, "dQ")
    log.note("add", every, None)
    assert atomic_write_problem(log, (dq,), 0, "dQ") is None
    log.note("store", every[2:3], None)
    assert "at its element 2" in atomic_write_problem(log, (dq,), 0, "dQ")


def test_flash_backward_atomic_order_changes_the_bits_of_dq_only(sol):
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 64, 16, generator=gen) for _ in range(4))
    s = q.double() @ k.double().transpose(-1, -2) / 4
    o, lse = (torch.softmax(s, -1) @ v.double()).float(), torch.logsumexp(s, -1).float()
    a, b = sol.flash_backward_atomic(q, k, v, o, lse, do, 16, 16), sol.flash_backward_atomic(q, k, v, o, lse, do, 16, 16, reverse=True)
    assert not torch.equal(a[0], b[0]) and torch.allclose(a[0], b[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


def test_flash_backward_atomic_mistakes_are_named(monkeypatch):
    each_mistake_is_named(gk, gk.check_flash_backward_atomic, gk._reference_flash_backward_atomic, monkeypatch, trials=3)


def test_swa_alibi_mistakes_are_named(monkeypatch):
    # two comparisons (the values, then the skip probe): the named mistakes are the first one's, fed unwatched
    captured, original = [], gk.check_function

    def spy(fn, ref, make_inputs, **kw):
        captured.append(list(kw.get("mistakes", ())))
        kw.pop("forbidden", None)
        kw.pop("by_hand", None)
        return original(fn, ref, make_inputs, **kw)

    monkeypatch.setattr(gk, "check_function", spy)
    nan_safe = lambda q, k, v, s, w, bm, bn: gk._swa_alibi(q, k.nan_to_num(), v.nan_to_num(), s, w)  # noqa: E731
    gk.check_swa_alibi_attention(nan_safe, trials=1, seed=SEED, quiet=True)
    assert len(captured) == 2 and len(captured[0]) == 7 and not captured[1]
    for mistake in captured[0]:
        fails(gk.check_swa_alibi_attention, mistake.fn, mistake.hint, trials=3)


def swa_by_softmax(q, k, v, slopes, window, block_m, block_n):
    return gk._swa_alibi(q, k, v, slopes, window)


def swa_by_sdpa(q, k, v, slopes, window, block_m, block_n):
    n = q.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    bias = (-slopes[:, None, None] * (i - j)).masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def backward_by_autograd(q, k, v, o, lse, do, block_m, block_n, reverse=False):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    p = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) - lse[..., None])
    return torch.autograd.grad(p @ v, (q, k, v), do)


def backward_by_course(q, k, v, o, lse, do, block_m, block_n, reverse=False):
    from course_utils.attention_triton_backward import flash_attention_backward_triton
    return tuple(t[0] for t in flash_attention_backward_triton(q[None], k[None], v[None], o[None], lse[None], do[None]))


@pytest.mark.parametrize("check,fn,name", [
    (gk.check_swa_alibi_attention, swa_by_softmax, "_swa_alibi"),
    (gk.check_swa_alibi_attention, swa_by_sdpa, "scaled_dot_product_attention"),
    (gk.check_swa_alibi_attention, lambda q, k, v, s, w, bm, bn: at.softmax_safe(q.numpy()), "course_utils.attention.softmax_safe"),
    (gk.check_flash_backward_atomic, backward_by_autograd, "torch."),
    (gk.check_flash_backward_atomic, backward_by_course, "flash_attention_backward_triton"),
    (gk.check_flash_backward_atomic, gk._reference_flash_backward_atomic, "_reference_flash_backward_atomic"),
])
def test_triton_exercise_shortcuts_are_refused(check, fn, name):
    forbidden_named(check, fn, name)


def swa_broadcast(q, k, v, slopes, window, block_m, block_n):   # right, in plain torch without a matmul
    n = q.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    s = (q[:, :, None, :].double() * k[:, None, :, :].double()).sum(-1) / math.sqrt(q.shape[-1]) - slopes.double()[:, None, None] * (i - j)
    keep = (j <= i) & (j > i - window)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    pv = (p / p.sum(-1, keepdim=True))[..., None] * v.double()[:, None, :, :]        # (H, L, L, D)
    return pv.where(keep[..., None], 0.0).sum(-2).float()   # only the window's values: no 0 * NaN from far keys


def test_triton_exercise_hard_coded_answers_fail(sol):
    rejects_recorded_answers(gk.check_swa_alibi_attention, swa_broadcast)
    rejects_recorded_answers(gk.check_flash_backward_atomic, sol.flash_backward_atomic)


@pytest.mark.slow
def test_solution_kernels_compile_for_sm90_without_spills(sol):
    gc = gpu_compiler()
    common = {"HEAD_DIM": 32, "BLOCK_M": 32, "BLOCK_N": 32}
    swa = gc.compile_for(sol.swa_alibi_kernel, arch=90, constexprs=common, signature={
        **{p: "*fp32" for p in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "slopes_ptr")}, "seqlen": "i32", "window": "i32",
        "scale": "fp32", "stride_h": "i32", "stride_l": "i32", **{c: "constexpr" for c in common}})
    bwd = gc.compile_for(sol.flash_backward_atomic_kernel, arch=90, constexprs={**common, "REVERSE": False}, signature={
        **{p: "*fp32" for p in ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "lse_ptr", "delta_ptr", "dq_ptr", "dk_ptr", "dv_ptr")},
        "seqlen": "i32", "scale": "fp32", "stride_h": "i32", "stride_l": "i32", **{c: "constexpr" for c in (*common, "REVERSE")}})
    for compiled in (swa, bwd):
        assert not compiled.spills, compiled.summary()
    assert "atom" in bwd.ptx or "red." in bwd.ptx     # the dQ adds are atomics (red.global.add.f32)


# ---------------------------------------------------------------- by hand at the operator level (issue 23)
def swa_by_log_softmax(q, k, v, slopes, window, block_m, block_n):
    """Right values with no named function: scores by broadcasting, softmax as log_softmax().exp()."""
    n = q.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    s = (q[:, :, None, :] * k[:, None, :, :]).sum(-1) / math.sqrt(q.shape[-1]) - slopes[:, None, None] * (i - j)
    s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    return (s.log_softmax(-1).exp()[..., None] * v[:, None, :, :]).sum(-2)


def backward_by_inner(q, k, v, o, lse, do, block_m, block_n, reverse=False):
    """Right values with torch.inner as the matmul (not a named function: it reaches aten::mm/bmm)."""
    tau = 1 / math.sqrt(q.shape[-1])
    p = torch.exp(tau * torch.inner(q[0], k[0]) - lse[0][:, None])[None]
    ds = p * (torch.inner(do[0], v[0])[None] - (do * o).sum(-1)[..., None])
    return (tau * torch.inner(ds[0], k[0].T)[None], tau * torch.inner(ds[0].T, q[0].T)[None], torch.inner(p[0].T, do[0].T)[None])


@pytest.mark.parametrize("check,fn,fragment", [(gk.check_swa_alibi_attention, swa_by_log_softmax, "aten::_log_softmax"),
                                               (gk.check_flash_backward_atomic, backward_by_inner, "aten::")])
def test_whole_result_operators_are_refused_whatever_path_reaches_them(check, fn, fragment):
    message = forbidden_named(check, fn, fragment)
    assert "operator" in message


def test_operator_shortcut_values_are_right():
    """The refused shortcuts above compute the right values: the refusal, not a wrong value, is what fails them."""
    make = gk._swa_inputs_maker()
    q, k, v, slopes, window, bm, bn = make(np.random.default_rng(0))
    want = gk._reference_swa_alibi_attention(q, k, v, slopes, window, bm, bn)
    assert torch.allclose(swa_by_log_softmax(q, k, v, slopes, window, bm, bn), want, atol=1e-5)
