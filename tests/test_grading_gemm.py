"""Tests of course_utils.grading.gemm: every check of problem set 05 is fed the solution, a right answer
written differently, each named mistake, the production shortcut and a hard-coded answer.

The kernel exercises' wrong answers are one test kernel with a ``MISTAKE`` switch and one launcher
with launcher-level mistakes, run under the Triton interpreter on the CPU. The checks only call launchers.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _grading_helpers import fails_with, gpu_compiler, pasted, stub
from course_utils import gemm as G
from course_utils import gemm_models as GM
from course_utils.checks import ForbiddenCall, NotAttempted
from course_utils.grading import gemm as GG
from course_utils.grading.gemm import _reference_grouped_tile_n, _reference_smem_address

import triton  # noqa: E402  (after course_utils.gemm chose the interpreter on a CPU)
import triton.language as tl  # noqa: E402

SEEDS = (3, 4)  # tests pin seeds so that they are reproducible; the checks themselves default to fresh ones


def fails_on_every_seed(check, fn, fragment):
    for seed in SEEDS:
        fails_with(lambda f: check(f, seed=seed), fn, fragment)


def kernel_fails(check, fn, fragment):
    """A kernel's named mistake on the first pinned seed: each launch runs under Triton's interpreter (seconds), and
    the check's own trials already vary the shapes (ragged edges included) within one seed."""
    fails_with(lambda f: check(f, seed=SEEDS[0]), fn, fragment)


def forbidden(check, fn, fragment=""):
    with pytest.raises(ForbiddenCall, match=fragment):
        check(fn, seed=SEEDS[0])


# ================================================================ ex. 2 and 5: kernels and launchers
@triton.jit
def linear_kernel(x_ptr, w_ptr, c_ptr, bias_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  MISTAKE: tl.constexpr = "", EPILOGUE: tl.constexpr = ""):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if MISTAKE == "fp16 accumulator":
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if MISTAKE == "bias rows":
        bias = tl.load(bias_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    elif EPILOGUE != "":
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    steps = K // BLOCK_K if MISTAKE == "drop remainder" else tl.cdiv(K, BLOCK_K)
    for s in range(0, steps):
        kk = s * BLOCK_K + offs_k
        if MISTAKE == "swap x strides":
            x_off = offs_m[:, None] * stride_xk + kk[None, :] * stride_xm
        elif MISTAKE == "contiguous":
            x_off = offs_m[:, None] * K + kk[None, :]
        else:
            x_off = offs_m[:, None] * stride_xm + kk[None, :] * stride_xk
        if MISTAKE == "swap w strides":  # the lesson's (K, N) pointer formula applied to a (N, K) matrix
            w_off = kk[:, None] * stride_wn + offs_n[None, :] * stride_wk
        elif MISTAKE == "contiguous":
            w_off = kk[:, None] + offs_n[None, :] * K
        else:
            w_off = kk[:, None] * stride_wk + offs_n[None, :] * stride_wn
        k_idx = offs_k if MISTAKE == "k mask offs_k" else kk     # the hint the old problem set gave
        k_bound = K + BLOCK_K if MISTAKE == "no k mask" else K
        x = tl.load(x_ptr + x_off, mask=(offs_m[:, None] < M) & (k_idx[None, :] < k_bound), other=0.0)
        w = tl.load(w_ptr + w_off, mask=(k_idx[:, None] < k_bound) & (offs_n[None, :] < N), other=0.0)
        if MISTAKE == "fp16 accumulator":
            acc = (acc.to(tl.float32) + tl.dot(x.to(tl.float16), w.to(tl.float16), out_dtype=tl.float32)).to(tl.float16)
        else:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        if MISTAKE == "bias in loop":
            acc += bias
    acc = acc.to(tl.float32)
    if EPILOGUE != "":
        if MISTAKE == "activation first":
            acc = tl.where(acc > 0, acc, 0.1 * acc) + bias
        elif MISTAKE == "relu":
            acc = tl.maximum(acc + bias, 0.0)
        elif MISTAKE == "slope 0.01":
            acc = acc + bias
            acc = tl.where(acc > 0, acc, 0.01 * acc)
        elif MISTAKE == "no bias" or MISTAKE == "bias in loop":
            acc = tl.where(acc > 0, acc, 0.1 * acc)
        elif MISTAKE == "no activation":
            acc = acc + bias
        else:
            acc = acc + bias
            acc = tl.where(acc > 0, acc, 0.1 * acc)
    if MISTAKE == "store mask axes":
        mask = (offs_m[:, None] < N) & (offs_n[None, :] < M)
    elif MISTAKE == "no store mask":
        mask = (offs_m[:, None] < M + BLOCK_M) & (offs_n[None, :] < N + BLOCK_N)  # always true: stores whole tiles
    else:
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc, mask=mask)


@triton.jit
def linear_kernel_transposed_tile(x_ptr, w_ptr, c_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Right, written differently: W's tile loaded as (BLOCK_N, BLOCK_K), transposed in registers; pointers advanced."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk   # (BLOCK_N, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_left in range(K, 0, -BLOCK_K):
        x = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < k_left), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_n[:, None] < N) & (offs_k[None, :] < k_left), other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def kernel_stub(x_ptr, w_ptr, c_ptr, bias_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MISTAKE: tl.constexpr = "",
                EPILOGUE: tl.constexpr = ""):
    raise NotImplementedError("Exercise not attempted yet: replace this line with your code.")


def launcher(mistake="", epilogue="", kernel=linear_kernel, launch=""):
    """A launcher ``(x, w, [bias,] out, block_m, block_n, block_k)`` with a kernel mistake and/or a launcher mistake."""
    def run(x, w, *rest, block_m=32, block_n=32, block_k=16):
        *bias, out = rest
        (m, k), n = x.shape, w.shape[0]
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        if launch == "grid swapped":
            grid = grid[::-1]
        elif launch == "grid 32":
            grid = (triton.cdiv(m, 32), triton.cdiv(n, 32))
        sc = (n, 1) if launch == "contiguous out" else out.stride()
        sw = w.stride()[::-1] if launch == "w strides swapped" else w.stride()
        kernel[grid](x, w, out, bias[0] if bias else x, m, n, k, *x.stride(), *sw, *sc,
                     BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, MISTAKE=mistake, EPILOGUE=epilogue)
        return out
    return run


def transposed_tile_launcher(x, w, out, block_m=32, block_n=32, block_k=16):
    grid = (triton.cdiv(x.shape[0], block_m), triton.cdiv(w.shape[0], block_n))
    linear_kernel_transposed_tile[grid](x, w, out, x.shape[0], w.shape[0], x.shape[1], *x.stride(), *w.stride(), *out.stride(),
                                        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)


def test_check_linear_passes_the_solution_and_a_right_answer_written_differently(capsys):
    GG.check_linear(launcher())
    assert "✅" in capsys.readouterr().out
    GG.check_linear(transposed_tile_launcher, trials=4, quiet=True)


def test_check_linear_not_attempted():
    with pytest.raises(NotAttempted):
        GG.check_linear(stub)
    with pytest.raises(NotAttempted):  # the launcher is written, the kernel is still the stub
        GG.check_linear(launcher(kernel=kernel_stub))


@pytest.mark.parametrize("mistake,launch,fragment", [
    ("drop remainder", "", "K remainder was dropped"),
    ("no k mask", "", "(k0 + offs_k) < K"),
    ("k mask offs_k", "", "(k0 + offs_k) < K"),
    ("swap x strides", "", "X's strides are swapped"),
    ("swap w strides", "", "W's strides are swapped"),
    ("", "w strides swapped", "W's strides are swapped"),
    ("contiguous", "", "assumed contiguous inputs"),
    ("", "contiguous out", "out was treated as contiguous"),
    ("", "grid swapped", "grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))"),
    ("", "grid 32", "grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))"),
    ("store mask axes", "", "store mask is on the wrong axes"),
    ("no store mask", "", "stored outside it"),
    ("fp16 accumulator", "", "accumulator is in low precision"),
])
def test_check_linear_names_mistakes(mistake, launch, fragment):
    kernel_fails(GG.check_linear, launcher(mistake, launch=launch), fragment)


def test_check_linear_compound_mistake_fails():
    kernel_fails(GG.check_linear, launcher("no k mask", launch="grid swapped"), "linear kernel")


def test_check_linear_forbids_shortcuts():
    def matmul_op(x, w, out, **blocks):
        out.copy_(x @ w.T)

    def f_linear(x, w, out, **blocks):
        out.copy_(torch.nn.functional.linear(x, w))

    def library(x, w, out, **blocks):
        out.copy_(G.matmul_tiled(x.contiguous(), w.T.contiguous()))

    forbidden(GG.check_linear, matmul_op, "matmul")
    forbidden(GG.check_linear, f_linear, "linear")
    forbidden(GG.check_linear, library, "course_utils.gemm.matmul_tiled")


def test_check_linear_rejects_a_hard_coded_answer():
    gen = torch.Generator().manual_seed(0)
    fixed = torch.randn(100, 100, generator=gen)

    def hard_coded(x, w, out, **blocks):
        out.copy_(fixed[:out.shape[0], :out.shape[1]])

    kernel_fails(GG.check_linear, hard_coded, "compare that tile by hand")


def test_check_bias_leaky_passes_the_solution(capsys):
    GG.check_linear_bias_leaky(launcher(epilogue="leaky"))
    assert "✅" in capsys.readouterr().out


def test_check_bias_leaky_not_attempted():
    with pytest.raises(NotAttempted):
        GG.check_linear_bias_leaky(stub)
    with pytest.raises(NotAttempted):
        GG.check_linear_bias_leaky(launcher(epilogue="leaky", kernel=kernel_stub))


@pytest.mark.parametrize("mistake,fragment", [
    ("bias in loop", "inside the K loop"),
    ("activation first", "before the bias"),
    ("relu", "plain ReLU"),
    ("slope 0.01", "slope is 0.1"),
    ("no bias", "bias is missing"),
    ("no activation", "activation is missing"),
    ("bias rows", "wrong axis"),
    ("no k mask", "(k0 + offs_k) < K"),
    ("store mask axes", "store mask is on the wrong axes"),
])
def test_check_bias_leaky_names_mistakes(mistake, fragment):
    kernel_fails(GG.check_linear_bias_leaky, launcher(mistake, epilogue="leaky"), fragment)


def test_check_bias_leaky_forbids_an_epilogue_outside_the_kernel():
    plain = launcher()

    def unfused(x, w, bias, out, **blocks):
        plain(x, w, out, **blocks)
        out.copy_(torch.nn.functional.leaky_relu(out + bias, 0.1))

    forbidden(GG.check_linear_bias_leaky, unfused, "leaky_relu|__add__|add")


# ================================================================ ex. 1: grouped order along N
def grouped_n_loops(pid, num_pid_m, num_pid_n, group_n):
    """Right, written differently: walk the order once and look each pid up."""
    order = []
    for first_n in range(0, num_pid_n, group_n):
        for m in range(num_pid_m):
            for n in range(first_n, min(first_n + group_n, num_pid_n)):
                order.append((m, n))
    table = np.array(order)
    return table[pid, 0], table[pid, 1]


def grouped_tile_n_solution(pid, num_pid_m, num_pid_n, group_n):
    """The problem set's solution."""
    per_group = group_n * num_pid_m
    first_n = (pid // per_group) * group_n
    size_n = np.minimum(num_pid_n - first_n, group_n)
    return (pid % per_group) // size_n, first_n + (pid % per_group) % size_n


def test_check_grouped_tile_n():
    GG.check_grouped_tile_n(grouped_tile_n_solution, quiet=True)
    forbidden(GG.check_grouped_tile_n, _reference_grouped_tile_n, "_reference_grouped_tile_n")
    GG.check_grouped_tile_n(grouped_n_loops, trials=8, quiet=True)
    with pytest.raises(NotAttempted):
        GG.check_grouped_tile_n(stub)
    fails_on_every_seed(GG.check_grouped_tile_n, lambda pid, pm, pn, g: (pid // pn, pid % pn), "row-major")
    fails_on_every_seed(GG.check_grouped_tile_n, lambda pid, pm, pn, g: GM.grouped_tile(pid, pm, pn, g), "groups along M")
    fails_on_every_seed(GG.check_grouped_tile_n, lambda pid, pm, pn, g: ((pid % (g * pm)) // g, (pid // (g * pm)) * g + (pid % (g * pm)) % g), "narrower")
    fails_on_every_seed(GG.check_grouped_tile_n, lambda pid, pm, pn, g: grouped_tile_n_solution(pid, pm, pn, g)[::-1], "swapped")
    table = {}  # a hard-coded answer: what one fixed grid gives
    fails_on_every_seed(GG.check_grouped_tile_n, lambda pid, pm, pn, g: table.setdefault("x", grouped_tile_n_solution(pid, 3, 5, 2)), "grouped order along N")


# ================================================================ ex. 3: swizzled address
def smem_address_bits(row, chunk, rows, mode):
    """Right, written differently: the XOR spelled out bit by bit."""
    per = mode // 16
    addr = (chunk // per) * rows * mode + row * mode + (chunk % per) * 16
    line = (addr >> 7) & (per - 1)
    return addr ^ (line << 4)


def test_check_smem_address():
    GG.check_smem_address(lambda r, c, rows, mode: GM.swizzle((c // (mode // 16)) * rows * mode + r * mode + (c % (mode // 16)) * 16, mode), quiet=True)
    forbidden(GG.check_smem_address, _reference_smem_address, "_reference_smem_address")
    GG.check_smem_address(smem_address_bits, trials=8, quiet=True)
    with pytest.raises(NotAttempted):
        GG.check_smem_address(stub)
    fails_on_every_seed(GG.check_smem_address, lambda r, c, rows, mode: GM.swizzle(r * 128 + c * 16, mode), "not cut into atoms")
    unswizzled = lambda r, c, rows, mode: (c // (mode // 16)) * rows * mode + r * mode + (c % (mode // 16)) * 16  # noqa: E731
    fails_on_every_seed(GG.check_smem_address, unswizzled, "swizzle is missing")
    fails_on_every_seed(GG.check_smem_address, lambda r, c, rows, mode: GM.swizzle(unswizzled(r, c, rows, mode), 128), "same mode")
    forbidden(GG.check_smem_address, lambda r, c, rows, mode: GM.smem_layout_addresses(rows, 128, mode)[r, c], "smem_layout_addresses")
    fixed = GM.smem_layout_addresses(64, 128, 128)
    fails_on_every_seed(GG.check_smem_address, lambda r, c, rows, mode: fixed[r % 64, c], "shared-memory address")


# ================================================================ ex. 4: bank-conflict passes
def passes_loops(byte_addrs, access_bytes):
    """Right, written differently: sets of words per bank."""
    banks = {}
    for a in byte_addrs:
        for w in range(int(a) // 4, int(a) // 4 + access_bytes // 4):
            banks.setdefault(w % 32, set()).add(w)
    return max(len(v) for v in banks.values())


def test_check_passes():
    GG.check_passes(passes_loops, trials=10, quiet=True)
    with pytest.raises(NotAttempted):
        GG.check_passes(stub)
    words = lambda a, acc: (np.asarray(a)[:, None] // 4 + np.arange(acc // 4)).ravel()  # noqa: E731
    fails_on_every_seed(GG.check_passes, lambda a, acc: int(np.bincount(words(a, acc) % 32).max()), "broadcast")
    fails_on_every_seed(GG.check_passes, lambda a, acc: int(np.unique(words(a, acc) % 32).size), "distinct banks")
    fails_on_every_seed(GG.check_passes, lambda a, acc: int(np.bincount(np.unique((np.asarray(a)[:, None] + 4 * np.arange(acc // 4)).ravel()) % 32).max()), "4 bytes wide")
    forbidden(GG.check_passes, lambda a, acc: GM.wavefronts(a, acc), "wavefronts")
    fails_on_every_seed(GG.check_passes, lambda a, acc: 4, "bank-conflict passes")


# ================================================================ ex. 6: roofline
def test_check_roofline():
    def written_differently(m, n, k, s, p, bw):
        seconds = max(2 * m * n * k / p, (m * k + k * n + m * n) * s / bw)
        return 2 * m * n * k / seconds

    GG.check_roofline(written_differently, trials=10, quiet=True)
    with pytest.raises(NotAttempted):
        GG.check_roofline(stub)
    gm = pasted(GM)  # the check refuses course_utils.gemm_models: mistakes built from it are pasted, as a learner could
    fails_on_every_seed(GG.check_roofline, lambda m, n, k, s, p, bw: min(p, m * n * k / gm.gemm_min_bytes(m, n, k, s) * bw), "2 FLOPs")
    fails_on_every_seed(GG.check_roofline, lambda m, n, k, s, p, bw: gm.gemm_intensity(m, n, k, s) * bw, "min(peak")
    fails_on_every_seed(GG.check_roofline, lambda m, n, k, s, p, bw: min(p, 2 * m * n * k / ((m * k + k * n) * s) * bw), "C must be written")
    forbidden(GG.check_roofline, lambda *a: GM.roofline_bound(*a)[0], "roofline_bound")
    fails_on_every_seed(GG.check_roofline, lambda *a: 1.0e12, "roofline bound")


# ================================================================ through the grader (remote proxies)
def test_named_mistakes_survive_the_grader(tmp_path):
    """Graded by `python -m course_utils grade`: the pristine checks run in the grading process and call the
    learner's launchers through remote proxies; the hints must still name the mistakes."""
    import nbformat

    from _notebook_helpers import cut_after
    from course_utils.paths import ROOT
    from course_utils.classroom.grader import grade_notebook

    nb = nbformat.read(ROOT / "solutions" / "05_gemm_triton.ipynb", as_version=4)
    edits = {
        "ex2_linear_kernel": [("(kk[None, :] < K)", "(offs_k[None, :] < K)"), ("(kk[:, None] < K)", "(offs_k[:, None] < K)")],
        "ex5_bias_leaky": [("tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)", "tl.load(bias_ptr + offs_m, mask=offs_m < M, other=0.0)"),
                           ("bias[None, :]", "bias[:, None]")],
        "ex6_roofline": [("    flops = 2 * m * n * k", "    return gemm_models.roofline_bound(m, n, k, itemsize, peak_flops, bandwidth)[0]\n    flops = 2 * m * n * k")],
    }
    for cell in nb.cells:
        for old, new in edits.get(cell.metadata.get("nbgrader", {}).get("grade_id"), []):
            assert old in cell.source
            cell.source = cell.source.replace(old, new)
    cut_after(nb, "ex6_roofline_check")  # exercise 7 (split-K, the slowest under the interpreter) is not asked about here
    path = tmp_path / "05_gemm_triton.ipynb"
    nbformat.write(nb, path)
    results = {e.name: e for e in grade_notebook(path, pristine=ROOT / "solutions" / "05_gemm_triton.ipynb").exercises}
    assert results["ex1_grouped_n"].status == "passed"
    assert results["ex2_linear_kernel"].status == "failed" and "(k0 + offs_k) < K" in results["ex2_linear_kernel"].hint
    assert results["ex5_bias_leaky"].status == "failed" and "wrong axis" in results["ex5_bias_leaky"].hint
    assert results["ex6_roofline"].status == "failed" and "roofline_bound" in results["ex6_roofline"].hint


# ================================================================ ex. 7: split-K, from the solution notebook's cells
from course_utils.grading import gemm_split_k as GS  # noqa: E402


def solution05(tmp_path_factory, replace=()):
    """The Triton cells of solutions/05 (ex. 2, 5, 7), written to a module file."""
    from _grading_helpers import solution_cells_module

    return solution_cells_module(tmp_path_factory, "05_gemm_triton", ("ex2_linear_kernel", "ex5_bias_leaky", "ex7_split_k"),
                                 "import torch\nimport triton\nimport triton.language as tl", replace)


@pytest.fixture(scope="module")
def sol05(tmp_path_factory):
    return solution05(tmp_path_factory)


CHUNK = "chunk = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k"
SPLIT_K_VARIANTS = {  # name: (replacements, expected fragment); None: a right answer written differently
    "accumulate with +=": ((("acc = tl.dot(x, w, acc, input_precision=\"ieee\")", "acc += tl.dot(x, w, input_precision=\"ieee\")"),
                            ("out.copy_(workspace.sum(dim=0))", "out.zero_()\n    for part in workspace:\n        out.add_(part)")), None),
    "even ranges": (((CHUNK, "chunk = triton.cdiv(k, split_k)"),), "whole BLOCK_K steps"),
    "whole K per split": ((("k_lo = split * chunk", "k_lo = 0 * chunk"), ("k_hi = tl.minimum(k_lo + chunk, K)", "k_hi = K")),
                          "holds the whole product"),
    "one partial": ((("out.copy_(workspace.sum(dim=0))", "out.copy_(workspace[-1])"),), "one split's partial"),
    "added to out": ((("out.copy_(workspace.sum(dim=0))", "out.add_(workspace.sum(dim=0))"),), "added to, not overwritten"),
    "no workspace": ((("    tl.store(work_ptr", "    if split < 0:\n        tl.store(work_ptr"),), "never written"),
}


@pytest.mark.parametrize("variant", SPLIT_K_VARIANTS)
def test_check_split_k_variants(tmp_path_factory, variant):
    replace, fragment = SPLIT_K_VARIANTS[variant]
    module = solution05(tmp_path_factory, replace)
    if fragment is None:
        GS.check_linear_split_k(module.linear_split_k, seed=SEEDS[0], trials=3)
    else:
        fails_with(lambda f: GS.check_linear_split_k(f, seed=SEEDS[0], trials=2), module.linear_split_k, fragment)


def test_check_split_k_solution_and_stub(sol05):
    GS.check_linear_split_k(sol05.linear_split_k, seed=SEEDS[1], trials=3)
    with pytest.raises(NotAttempted):
        GS.check_linear_split_k(stub)


def _split_ranges(k, split_k, block_k):
    """The prompt's K ranges, written here (GS.split_ranges is a grading function, which the check refuses)."""
    steps = (k + split_k - 1) // split_k
    chunk = (steps + block_k - 1) // block_k * block_k
    return [(s * chunk, min((s + 1) * chunk, k)) for s in range(split_k)]


def test_split_ranges_written_here_match_the_prompt():
    assert all(_split_ranges(k, s, b) == GS.split_ranges(k, s, b) for k in range(1, 80) for s in (2, 3, 4) for b in (16, 32))


def test_check_split_k_forbids_shortcuts():
    def by_matmul(x, w, out, workspace, block_m=32, block_n=32, block_k=16):
        for s, (a, b) in enumerate(_split_ranges(x.shape[1], workspace.shape[0], block_k)):
            workspace[s] = x[:, a:b] @ w[:, a:b].T
        out.copy_(workspace.sum(0))

    def by_course(x, w, out, workspace, block_m=32, block_n=32, block_k=16):
        out.copy_(G.matmul_tiled(x.contiguous(), w.T.contiguous()))
    forbidden(GS.check_linear_split_k, by_matmul, "matmul")
    forbidden(GS.check_linear_split_k, by_course, "course_utils.gemm.matmul_tiled")


def test_check_split_k_rejects_a_replayed_answer(sol05):
    seen = []

    def record(x, w, out, workspace, **blocks):
        sol05.linear_split_k(x, w, out, workspace, **blocks)
        seen.append((out.clone(), workspace.clone()))
    GS.check_linear_split_k(record, seed=SEEDS[0], trials=1)

    def replay(x, w, out, workspace, **blocks):
        o, wk = seen[0]
        out.copy_(o[: out.shape[0], : out.shape[1]] if o.shape == out.shape else torch.zeros_like(out))
        workspace.copy_(wk if wk.shape == workspace.shape else torch.zeros_like(workspace))
    with pytest.raises(AssertionError):
        GS.check_linear_split_k(replay, seed=SEEDS[1], trials=2)


@pytest.mark.slow
def test_solution_kernels_compile_for_sm90_without_spills(sol05):
    gc = gpu_compiler()
    blocks = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}
    ints = ("M", "N", "K", "stride_xm", "stride_xk", "stride_wn", "stride_wk", "stride_cm", "stride_cn", "chunk")
    for kernel in (sol05.linear_kernel, sol05.linear_bias_leaky_kernel, sol05.linear_split_k_kernel):
        params = kernel.fn.__code__.co_varnames[:kernel.fn.__code__.co_argcount]
        signature = {p: "constexpr" if p in blocks else "i32" if p in ints else "*fp32" for p in params}
        compiled = gc.compile_for(kernel, arch=90, signature=signature, constexprs=blocks)
        assert not compiled.spills, (kernel.fn.__name__, compiled.summary())


def test_check_split_k_refuses_the_gemm_whatever_path_reaches_it():
    """torch.inner and a conv1d used as the GEMM are not named anywhere: the operator-level watch refuses them."""
    def by_inner(x, w, out, workspace, block_m=32, block_n=32, block_k=16):
        for s, (a, b) in enumerate(_split_ranges(x.shape[1], workspace.shape[0], block_k)):
            workspace[s] = torch.inner(x[:, a:b], w[:, a:b])
        out.copy_(workspace.sum(0))

    def by_conv1d(x, w, out, workspace, block_m=32, block_n=32, block_k=16):
        for s, (a, b) in enumerate(_split_ranges(x.shape[1], workspace.shape[0], block_k)):
            workspace[s] = torch.nn.functional.conv1d(x[:, a:b].T.contiguous()[None], w[:, a:b, None].contiguous())[0].T
        out.copy_(workspace.sum(0))

    forbidden(GS.check_linear_split_k, by_inner, "aten::mm")
    forbidden(GS.check_linear_split_k, by_conv1d, "aten::")
