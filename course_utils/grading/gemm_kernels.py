r"""Topic 05's kernel exercises (2 and 5): checks of a learner's Triton launcher for ``out = X @ W.T``.

The learner writes a kernel and its launcher ``linear(x, w, out, block_m, block_n, block_k)`` (ex. 5:
``linear_bias_leaky(x, w, bias, out, ...)``). A check only *calls* the launcher: it never touches
the kernel, so it works when the learner's objects are a grader's remote proxies. Every trial:

* draws a problem (:func:`_draw_problem`): tiles that are mostly not square, and shapes from four
  plans -- ragged with ``K > BLOCK_K``; an edge of size 1; one past a block multiple; exact multiples;
* hands the launcher fp32 **strided views into padded buffers**: ``x`` and ``w`` are surrounded by a
  loud value (reads past an edge show), ``out`` by ``C_FILL`` (places never stored keep it, stores
  outside ``out`` land in its padding);
* compares with ``X @ W.T`` at the interpreter's tolerance (TF32's on a GPU), grown with ``K``;
  when wrong, emulates each named mistake on the host (:func:`_variants`) and names the one that matches.

``torch.matmul`` and its relatives, and the course's own launchers, are forbidden in the learner's code.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..classroom.checking import call_learner, fresh_seed
from ..errors import CheckFailed, NotAttempted
from ..tolerances import tolerance_for
from ..gemm import TIER

# Released to learners as it is (course_utils.classroom.release), because it holds no reference:
RELEASED_AS_SOURCE = ("its checks compare the learner's Triton launcher with torch's X @ W.T on the host and emulate "
                      "the named mistakes with torch: the answer, a Triton kernel, is nowhere in it")

__all__ = ["check_linear", "check_linear_bias_leaky", "FORBIDDEN_MATMUL", "C_FILL"]

C_FILL = -777.0   # what out and the memory around it hold before the launch: unstored places keep it
FILL = 1.0e3      # what the memory around x, w and bias holds: a read past an edge adds a loud value
PAD = 128         # padding after every row and column; every side drawn is at most PAD, so even a
#                   kernel with swapped strides stays inside the buffers
BLOCKS = [(32, 16, 16), (16, 32, 16), (16, 64, 32), (64, 16, 16), (32, 32, 16), (16, 32, 32)]  # (BLOCK_M, BLOCK_N, BLOCK_K); 4 not square first
FORBIDDEN_MATMUL = (
    "torch.matmul", "torch.mm", "torch.bmm", "torch.addmm", "torch.einsum", "torch.tensordot",
    "torch.nn.functional.linear", "torch.Tensor.__matmul__", "torch.Tensor.matmul", "torch.Tensor.mm",
    "course_utils.gemm.matmul_tiled", "course_utils.gemm.matmul_persistent", "course_utils.gemm.matmul_descriptor",
    "course_utils.gemm.matmul_descriptor_persistent", "course_utils.gemm.matmul_warp_specialized",
)
FORBIDDEN_EPILOGUE = ("torch.nn.functional.leaky_relu", "torch.nn.functional.relu", "torch.relu", "torch.where",
                      "torch.Tensor.__add__", "torch.Tensor.__iadd__", "torch.Tensor.add", "torch.Tensor.add_")


# ---------------------------------------------------------------- inputs
def _padded(rng, rows: int, cols: int, fill: float = FILL):
    """A (rows, cols) fp32 view into a (rows + PAD, cols + PAD) buffer holding ``fill`` around it."""
    buf = torch.full((rows + PAD, cols + PAD), fill, dtype=torch.float32)
    buf[:rows, :cols] = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32))
    return buf, buf[:rows, :cols]


def _draw_problem(rng, trial: int):
    """``(m, n, k, (block_m, block_n, block_k))``; the plan cycles with the trial so that any 3 trials see 3 kinds."""
    bm, bn, bk = BLOCKS[int(rng.integers(len(BLOCKS)))]
    plan = trial % 4
    if plan == 0:    # ragged, K > BLOCK_K with a short last step, M != N, and a grid with its axes swapped misses tiles
        bm, bn, bk = BLOCKS[int(rng.integers(4))]                     # tiles that are not square
        for _ in range(50):
            m, n = int(rng.integers(17, 80)), int(rng.integers(17, 80))
            if m != n and (_cdiv(n, bn) * bm < m or _cdiv(m, bm) * bn < n):
                break
        k = int(rng.integers(1, 4)) * bk + int(rng.integers(1, bk))
    elif plan == 1:  # an edge of size 1
        m, n, k = int(rng.integers(2, 60)), int(rng.integers(2, 60)), int(rng.integers(bk + 1, 3 * bk))
        which = int(rng.integers(3))
        m, n, k = (1 if which == 0 else m), (1 if which == 1 else n), (1 if which == 2 else k)
    elif plan == 2:  # one past a block multiple on every side
        m, n, k = bm * int(rng.integers(1, 3)) + 1, bn * int(rng.integers(1, 3)) + 1, bk * int(rng.integers(1, 4)) + 1
    else:            # exact multiples
        m, n, k = bm * int(rng.integers(1, 3)), bn * int(rng.integers(1, 3)), bk * int(rng.integers(1, 4))
    return m, n, k, (bm, bn, bk)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- emulated mistakes
def _read(buf: torch.Tensor, rows: int, cols: int, stride_r: int, stride_c: int) -> torch.Tensor:
    """``buf.flat[r*stride_r + c*stride_c]`` for r < rows, c < cols: what a kernel with these strides reads."""
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    return buf.reshape(-1)[r * stride_r + c * stride_c]


def _low_precision_linear(x, w, block_k, dtype):
    """X @ W^T accumulated in ``dtype``: each K step's product added to a rounded accumulator."""
    acc = torch.zeros((x.shape[0], w.shape[0]), dtype=dtype)
    for p in range(0, x.shape[1], block_k):
        part = x[:, p:p + block_k].to(dtype).float() @ w[:, p:p + block_k].to(dtype).float().T
        acc = (acc.float() + part).to(dtype)
    return acc.float()


def _covered(m, n, rows, cols, ref):
    """``ref`` where row < rows and column < cols, ``C_FILL`` elsewhere (places no program stored)."""
    keep = (torch.arange(m)[:, None] < rows) & (torch.arange(n)[None, :] < cols)
    return torch.where(keep, ref, torch.full((), C_FILL))


def _variants(x_buf, x, w_buf, w, blocks, epilogue: Callable) -> list[tuple[str, torch.Tensor, str]]:
    """Plausible wrong launchers/kernels for ``epilogue(X @ W^T)``, emulated on the host: (hint, out, dtype for tolerance)."""
    (m, k), n = x.shape, w.shape[0]
    bm, bn, bk = blocks
    ldx, ldw = x.stride(0), w.stride(0)
    k_floor, k_ceil = k // bk * bk, _cdiv(k, bk) * bk
    ref = epilogue(x @ w.T)
    flat = torch.full(((m + PAD) * (n + PAD),), C_FILL)
    flat[(torch.arange(m)[:, None] * n + torch.arange(n)[None, :]).reshape(-1)] = ref.reshape(-1)
    acc = ("the accumulator is in low precision ({}): create it with tl.zeros(..., dtype=tl.float32) and "
           "convert only when storing.")
    return [
        ("the K remainder was dropped: loop over tl.cdiv(K, BLOCK_K) steps, not K // BLOCK_K, and mask the last, short step.",
         epilogue(x[:, :k_floor] @ w[:, :k_floor].T), "triton_interpreter"),
        ("the last K step read past K (values from beyond each row leaked in): mask the K axis with the running index, "
         "(k0 + offs_k) < K, in both loads (offs_k < K alone is true once K > BLOCK_K), other=0.0.",
         epilogue(_read(x_buf, m, k_ceil, ldx, 1) @ _read(w_buf, n, k_ceil, ldw, 1).T), "triton_interpreter"),
        ("X's strides are swapped: the row offset multiplies stride_xm = x.stride(0) and the K offset stride_xk = x.stride(1).",
         epilogue(_read(x_buf, m, k, 1, ldx) @ w.T), "triton_interpreter"),
        ("W's strides are swapped: W is stored (N, K), so element (k, n) of its tile is at offs_n * w.stride(0) + offs_k * w.stride(1).",
         epilogue(x @ _read(w_buf, k, n, ldw, 1)), "triton_interpreter"),
        ("the kernel assumed contiguous inputs: pass x.stride() and w.stride() from the launcher and use them.",
         epilogue(_read(x_buf, m, k, k, 1) @ _read(w_buf, n, k, k, 1).T), "triton_interpreter"),
        ("out was treated as contiguous: it is a strided view, so pass out.stride(0) and out.stride(1) as stride_cm, stride_cn.",
         flat.reshape(m + PAD, n + PAD)[:m, :n], "triton_interpreter"),
        ("the grid does not match the kernel (axes swapped, or tiles counted with other block sizes): program_id(0) runs "
         "along M, so grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n)) with the block sizes passed in.",
         _covered(m, n, _cdiv(n, bn) * bm, _cdiv(m, bm) * bn, ref), "triton_interpreter"),
        ("the store mask is on the wrong axes: rows (offs_m) compare with M and columns (offs_n) with N "
         "(if it is right, the grid misses tiles: grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))).",
         _covered(m, n, n, m, ref), "triton_interpreter"),
        (acc.format("fp16"), epilogue(_low_precision_linear(x, w, bk, torch.float16)), "float16"),
        (acc.format("bf16"), epilogue(_low_precision_linear(x, w, bk, torch.bfloat16)), "bfloat16"),
    ]


# ---------------------------------------------------------------- running the learner's launcher
def _on_device(buf: torch.Tensor, view: torch.Tensor, device: str):
    """The same view (same strides) into the buffer moved to ``device``."""
    if device == "cpu":
        return buf, view
    moved = buf.to(device)
    return moved, moved.as_strided(view.shape, view.stride(), view.storage_offset())


def _call_kernel_launcher(name, fn, args, blocks, **watch):
    """The learner's launcher on ``args`` with the block sizes; a stub kernel's NotImplementedError, which arrives
    wrapped in the interpreter's error, is 'not attempted'. ``watch``: call_learner's forbidden=/by_hand=."""
    try:
        call_learner(name, fn, args, dict(block_m=blocks[0], block_n=blocks[1], block_k=blocks[2]), **watch)
    except NotAttempted:
        raise
    except CheckFailed as exc:
        if "NotImplementedError" in str(exc):
            raise NotAttempted(f"{name}: not attempted yet; replace `raise NotImplementedError` in the kernel "
                               f"with your code and run this cell again.") from None
        raise


def _launch(name, fn, inputs, blocks, forbidden):
    """Call ``fn(*inputs, out, block_m=, block_n=, block_k=)``; return (out on the CPU, whether it stored outside out)."""
    device = "cpu" if TIER == "cpu" else "cuda"
    m, n = inputs[0][1].shape[0], inputs[1][1].shape[0]
    out_buf = torch.full((m + PAD, n + PAD), C_FILL, dtype=torch.float32)
    out_buf, out = _on_device(out_buf, out_buf[:m, :n], device)
    args = [_on_device(b, v, device)[1] for b, v in inputs] + [out]
    _call_kernel_launcher(name, fn, args, blocks, forbidden=forbidden)
    out_buf = out_buf.cpu()
    outside = out_buf.clone()
    outside[:m, :n] = C_FILL
    return out_buf[:m, :n].clone(), bool((outside != C_FILL).any())


def _tolerance(kind: str, k: int):
    if kind == "triton_interpreter" and TIER != "cpu":
        kind = "tfloat32"  # compiled: tl.dot on fp32 may use TF32 (10-bit mantissa products)
    return tolerance_for(kind, n=k, accumulate=kind if kind in ("float16", "bfloat16") else None)


def _trials(name, fn, trials, seed, epilogue, make_extra, forbidden, describe):
    seed = fresh_seed(seed)
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        m, n, k, blocks = _draw_problem(rng, trial)
        x_buf, x = _padded(rng, m, k)
        w_buf, w = _padded(rng, n, k)
        extra = make_extra(rng, n)  # [(buffer, view), ...] handed after x and w
        ep = epilogue(*(v for _, v in extra))
        where = (f" (trial {trial + 1} of {trials}: M={m}, N={n}, K={k}, block_m={blocks[0]}, block_n={blocks[1]}, "
                 f"block_k={blocks[2]}; reproduce with seed={seed})")
        got, wrote_outside = _launch(name, fn, [(x_buf, x), (w_buf, w), *extra], blocks, forbidden)
        want = ep(x @ w.T)
        rtol, atol = _tolerance("triton_interpreter", k)
        if torch.allclose(got, want, rtol=rtol, atol=atol):
            if wrote_outside:
                raise CheckFailed(f"{name}: out is right, but the kernel also stored outside it (past row M or column N): "
                                  f"mask the store with (offs_m < M) and (offs_n < N){where}.")
            continue
        for hint, wrong, kind in _variants(x_buf, x, w_buf, w, blocks, ep) + describe(x, w, k, blocks, *(v for _, v in extra)):
            r, a = _tolerance(kind, k)
            if kind == "triton_interpreter":  # loud values read past an edge cancel: judge at their scale
                a = max(a, r * float(wrong.abs().max()))
            if torch.allclose(got, wrong, rtol=r, atol=a):
                raise CheckFailed(f"{name}: {hint}{where}")
        if (got == C_FILL).any():
            raise CheckFailed(f"{name}: some places of out were never stored: the grid must cover every tile, "
                              f"grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n)), and the store mask keep every row < M and column < N{where}.")
        if not torch.isfinite(got).all():
            raise CheckFailed(f"{name}: out holds NaN or Inf; print one tile of it next to the reference{where}.")
        err = (got - want).abs()
        i, j = divmod(int(err.argmax()), n)
        raise CheckFailed(f"{name}: out differs from the reference by up to {err.max().item():.3g} at ({i}, {j}) "
                          f"(tile ({i // blocks[0]}, {j // blocks[1]})); compare that tile by hand with torch{where}.")
    return trials


def check_linear(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 2: ``fn(x, w, out, block_m=, block_n=, block_k=)`` writes ``x @ w.T`` into ``out`` with a Triton kernel."""
    name = "linear kernel"
    _trials(name, fn, trials, seed, lambda: (lambda c: c), lambda rng, n: [],
            FORBIDDEN_MATMUL, lambda *a: [])
    if not quiet:
        print(f"✅ {name}: out matches X @ W.T on {trials} strided inputs (ragged, edge and block-multiple sizes).")


# ---------------------------------------------------------------- ex. 5: bias + leaky ReLU in the epilogue
SLOPE = 0.1


def _leaky(x, slope=SLOPE):
    return torch.where(x > 0, x, slope * x)


def _bias_input(rng, n):
    buf = torch.full((n + PAD,), FILL, dtype=torch.float32)
    buf[:n] = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
    return [(buf, buf[:n])]


def _bias_mistakes(x, w, k, blocks, bias):
    """(hint, out, dtype) of the epilogue's own mistakes."""
    (m, _), n = x.shape, w.shape[0]
    ref = x @ w.T
    steps = _cdiv(k, blocks[2])
    full = torch.full((m,), FILL)
    full[:min(m, n)] = bias[:min(m, n)]
    rows_loud = full[:, None]                                             # bias[offs_m], mask offs_m < M
    rows_zero = torch.where(torch.arange(m) < n, full, torch.zeros(()))[:, None]  # mask offs_m < N
    rows = [
        ("the bias was added inside the K loop (once per K step): add it once, after the loop.", _leaky(ref + steps * bias)),
        ("the activation ran before the bias: compute acc + bias first, then leaky ReLU.", _leaky(ref) + bias),
        ("the bias is missing: load bias[offs_n] (mask offs_n < N) and add it to each column.", _leaky(ref)),
        ("the activation is missing: apply tl.where(acc > 0, acc, 0.1 * acc) before storing.", ref + bias),
        ("that is a plain ReLU: leaky ReLU keeps 0.1 * x for negative x.", torch.relu(ref + bias)),
        ("the slope is 0.1 here (torch's default, 0.01, is another one).", _leaky(ref + bias, 0.01)),
        ("the bias was added along the wrong axis: there is one bias per output column, bias[offs_n][None, :], not per row.",
         _leaky(ref + rows_loud)),
        ("the bias was added along the wrong axis: there is one bias per output column, bias[offs_n][None, :], not per row.",
         _leaky(ref + rows_zero)),
    ]
    return [(hint, out, "triton_interpreter") for hint, out in rows]


def check_linear_bias_leaky(fn: Callable, *, trials: int = 3, seed: int | None = None, quiet: bool = False) -> None:
    """Exercise 5: ``fn(x, w, bias, out, block_m=, block_n=, block_k=)`` writes ``leaky_relu(x @ w.T + bias, 0.1)``
    into ``out``, the bias and activation fused into the kernel's epilogue (one bias per output column)."""
    name = "fused bias + leaky ReLU kernel"
    _trials(name, fn, trials, seed, lambda bias: (lambda c: _leaky(c + bias)), _bias_input,
            FORBIDDEN_MATMUL + FORBIDDEN_EPILOGUE, _bias_mistakes)
    if not quiet:
        print(f"✅ {name}: out matches leaky_relu(X @ W.T + bias) on {trials} strided inputs.")
