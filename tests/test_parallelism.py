"""Tests of the lesson-09 library (course_utils.parallelism*): the pure pieces in this process, and every parallel
run on four real torchrun workers (gloo) against its single-process reference, outputs and gradients."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course_utils import parallelism as par
from course_utils import parallelism_comm as pcomm
from course_utils import parallelism_data as pdata
from course_utils import parallelism_moe as pmoe
from course_utils import parallelism_pipeline as ppipe
from course_utils import parallelism_tensor as ptp
from course_utils.checks import assert_close
from course_utils.parallelism_data import zero_bytes_per_gpu  # lesson 08's formula, re-exported

P = 4


@pytest.fixture(scope="module")
def cluster():
    with par.Cluster(P) as c:
        yield c


# ---------------------------------------------------------------- pure pieces
def test_ring_chunks_cover_the_vector_in_order():
    for n, world in ((10, 3), (4, 4), (7, 1), (1001, 4)):
        chunks = par.ring_chunks(n, world)
        assert chunks[0].start == 0 and chunks[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
        assert max(c.stop - c.start for c in chunks) - min(c.stop - c.start for c in chunks) <= 1


def test_byte_formulas():
    assert par.all_reduce_bytes_per_rank(4096, 4) == 6144
    assert par.reduce_scatter_bytes_per_rank(4096, 4) * 2 == par.all_reduce_bytes_per_rank(4096, 4)
    assert par.all_reduce_bytes_per_rank(100, 1) == 0


def test_multinode_command_names_nodes_and_endpoint():
    cmd = par.multinode_command(2, 8, "10.0.0.1:29500")
    assert "--nnodes 2" in cmd and "--nproc-per-node 8" in cmd and "--rdzv-endpoint 10.0.0.1:29500" in cmd


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 8), (4, 2), (5, 7)])
def test_schedules_run_every_micro_batch_forward_before_backward(p, m):
    for order in (ppipe.gpipe_order, ppipe.one_f_one_b_order):
        for rank in range(p):
            ops = order(p, m, rank)
            assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            assert all(ops.index(("F", i)) < ops.index(("B", i)) for i in range(m))
    for rank in range(p):  # 1F1B's in-flight micro-batches (eq. 8)
        live, peak = 0, 0
        for kind, _ in ppipe.one_f_one_b_order(p, m, rank):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(p - rank, m)


def test_bubble_formula():
    assert ppipe.bubble_fraction_predicted(4, 1) == 0.75
    assert ppipe.bubble_fraction_predicted(1, 5) == 0.0
    assert abs(ppipe.bubble_fraction_predicted(4, 8) - 3 / 11) < 1e-15


def test_router_capacity_and_load_balancing():
    assert pmoe.expert_capacity(64, 8, 2, 1.25) == 20 and pmoe.expert_capacity(10, 3, 1, 1.0) == 4
    logits = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    expert, gate, keep = pmoe.top_k_route(logits, 2, 5)
    assert torch.allclose(gate.sum(-1), torch.ones(50))
    for e in range(6):
        assert int(((expert == e) & keep).sum()) <= 5
    _, gate1, keep_all = pmoe.top_k_route(logits, 1, 50)
    assert keep_all.all() and torch.allclose(gate1[:, 0], logits.softmax(-1).max(-1).values)
    uniform = torch.full((8, 4), 0.25)
    assert abs(pmoe.load_balancing_loss(uniform, torch.arange(8) % 4, 4).item() - 1.0) < 1e-6
    assert pmoe.load_balancing_loss(uniform, torch.zeros(8, dtype=torch.long), 4).item() == pytest.approx(1.0)
    skewed = torch.tensor([[0.7, 0.1, 0.1, 0.1]] * 8)
    assert pmoe.load_balancing_loss(skewed, torch.zeros(8, dtype=torch.long), 4).item() == pytest.approx(2.8)


def test_moe_dense_equals_a_loop_over_tokens():
    experts, router = pmoe.make_experts(3), pmoe.make_router(3)
    x = pmoe.make_moe_tokens(0)
    cap = pmoe.expert_capacity(x.shape[0], 3, 2, 1.0)
    expert, gate, keep = pmoe.top_k_route(router(x), 2, cap)
    want = torch.stack([sum((gate[t, j] * experts[int(expert[t, j])](x[t]) for j in range(2) if keep[t, j]),
                            torch.zeros(x.shape[1])) for t in range(x.shape[0])])
    assert_close(pmoe.moe_dense(x, router, experts, 2, cap).detach(), want.detach(), name="moe_dense")


# ---------------------------------------------------------------- real processes
def _raise_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("deliberate")
    return dist.get_rank()


def test_cluster_reports_a_rank_that_raised(cluster):
    with pytest.raises(par.WorkerError, match="deliberate"):
        cluster.run(_raise_on_rank_one)
    assert cluster.run(dist.get_rank) == list(range(P))  # and keeps serving


def _ring_job(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(dist.get_rank()))
    got, sent = par.ring_all_reduce(x)
    return x, got, sent


@pytest.mark.parametrize("n", [4096, 1001, 3])
def test_ring_all_reduce_equals_the_sum_and_sends_eq3_bytes(cluster, n):
    results = cluster.run(_ring_job, n)
    total = sum(x for x, _, _ in results)
    for _, got, _ in results:
        assert_close(got, total, n=P, name="ring")
    sent = sum(s for _, _, s in results)
    assert sent == pytest.approx(P * par.all_reduce_bytes_per_rank(4 * n, P))
    if n % P == 0:
        assert all(s == par.all_reduce_bytes_per_rank(4 * n, P) for _, _, s in results)


def test_ddp_equals_one_process_on_the_whole_batch(cluster):
    ref = pdata.full_batch_gradients(pdata.make_dp_mlp(0), *pdata.make_dp_batch(0))
    n_params = sum(r.numel() for r in ref)
    for cap_mb, buckets in ((25, 1), (0.002, 3)):
        results = cluster.run(pdata.ddp_gradients_on_rank, 0, cap_mb)
        for r in results:
            for got, want in zip(r["grads"], ref):
                assert_close(got, want, n=pdata.BATCH, name="DDP gradient")
            assert sum(r["bucket_bytes"]) == 4 * n_params and len(r["bucket_bytes"]) == buckets


def test_fsdp_bytes_match_zero3_and_weights_match_one_process(cluster):
    results = cluster.run(pdata.fsdp_step_on_rank, 0, 2)
    n_params = sum(q.numel() for q in pdata.make_dp_mlp(0).parameters())
    want = zero_bytes_per_gpu(n_params, "fp32_adam", P, 3)
    for r in results:
        assert {k: r[k] for k in want} == want
    for got, ref in zip(results[0]["full_weights"], pdata.adamw_reference(0, 2)):
        assert_close(got, ref, n=pdata.BATCH, name="FSDP weights")


@pytest.mark.parametrize("job,block,sharded", [
    (ptp.tp_mlp_on_rank, ptp.MLPBlock, {"w1_grad": ("fc1_weight_grad", 0), "b1_grad": ("fc1_bias_grad", 0),
                                        "w2_grad": ("fc2_weight_grad", 1)}),
    (ptp.tp_attention_on_rank, ptp.AttentionBlock, {"w_proj_grad": ("proj_weight_grad", 1)}),
])
def test_tensor_parallel_blocks_equal_the_unsharded_block(cluster, job, block, sharded):
    ref = ptp.reference_grads(block(seed=0))
    counted = cluster.run(par.count_all_reduces, job, 0)
    assert [c for _, c in counted] == [2] * P  # one all-reduce forward, one backward, per block
    results = [r for r, _ in counted]
    for r in results:
        assert_close(r["out"], ref["out"], n=4 * ptp.HIDDEN, name="output")
        assert_close(r["x_grad"], ref["x_grad"], n=4 * ptp.HIDDEN, name="input gradient")
    for mine, (theirs, dim) in sharded.items():
        assert_close(torch.cat([r[mine] for r in results], dim), ref[theirs], n=ptp.BATCH * ptp.TOKENS, name=mine)
    if job is ptp.tp_attention_on_rank:
        rows = [ptp.head_rows(ptp.HIDDEN, ptp.HEADS, r, P) for r in range(P)]
        got = torch.zeros_like(ref["qkv_weight_grad"])
        for r, res in enumerate(results):
            got[rows[r]] = res["w_qkv_grad"]
        assert_close(got, ref["qkv_weight_grad"], n=ptp.BATCH * ptp.TOKENS, name="W_qkv gradient")


def test_dtensor_parallelize_module_equals_the_unsharded_mlp(cluster):
    ref = ptp.reference_grads(ptp.MLPBlock(seed=0))
    for r in cluster.run(ptp.dtensor_mlp_on_rank, 0):
        assert_close(r["out"], ref["out"], n=4 * ptp.HIDDEN, name="output")
        assert_close(r["x_grad"], ref["x_grad"], n=4 * ptp.HIDDEN, name="input gradient")
        for name in ("fc1_weight_grad", "fc1_bias_grad", "fc2_weight_grad", "fc2_bias_grad"):
            assert_close(r[name], ref[name], n=ptp.BATCH * ptp.TOKENS, name=name)
        assert r["local_fc1_shape"] == (4 * ptp.HIDDEN // P, ptp.HIDDEN)


@pytest.mark.parametrize("order,m", [("gpipe", 1), ("gpipe", 4), ("1f1b", 4), ("1f1b", 2)])
def test_hand_written_pipeline_schedules_equal_one_process(cluster, order, m):
    ref = ppipe.pipeline_reference_grads(P)
    results = cluster.run(ppipe.run_schedule_on_rank, order, m, 0, 0.004, 0.008)
    for got, want in zip([g for r in results for g in r["grads"]], ref):
        assert_close(got, want, n=ppipe.BATCH, name=f"{order} gradient")
    peaks = [r["peak_stored"] for r in results]
    assert peaks == ([m] * P if order == "gpipe" else [min(P - r, m) for r in range(P)])
    assert 0 <= ppipe.measured_bubble([r["events"] for r in results]) < 1


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_torch_pipelining_runs_on_gloo_and_equals_one_process(cluster, schedule):
    ref = ppipe.pipeline_reference_grads(P)
    results = cluster.run(ppipe.pipelining_on_rank, schedule, 8)
    for got, want in zip([g for r in results for g in r], ref):
        assert_close(got, want, n=ppipe.BATCH, name=f"pipelining {schedule}")


@pytest.mark.parametrize("k,factor", [(1, 1.0), (2, 1.25), (2, 0.5)])
def test_expert_parallel_all_to_all_equals_the_dense_layer(cluster, k, factor):
    results = cluster.run(pmoe.expert_parallel_on_rank, k, factor, 0)
    ref = pmoe.moe_reference_grads(P, k, factor, 0)
    for rank, r in enumerate(results):
        assert_close(r["y"], r["dense"], n=2 * pmoe.DIM, name="expert parallel")
        assert_close(r["x_grad"], ref["x_grads"][rank], n=4 * pmoe.DIM, name="input gradient")
        assert_close(r["router_grad"], ref["router_grad"], n=4 * pmoe.TOKENS_PER_RANK, name="router gradient")
        for got, want in zip(r["expert_grads"], ref["expert_grads"][rank]):
            assert_close(got, want, n=4 * pmoe.TOKENS_PER_RANK, name=f"expert {rank} gradient")
    sent = torch.tensor([r["sent"] for r in results])
    received = torch.tensor([r["received"] for r in results])
    assert torch.equal(sent.t(), received)  # what rank i sends to j is what j receives from i


# ---------------------------------------------------------------- communication measurements (parallelism_comm)
def test_fit_alpha_beta_recovers_a_known_model():
    sizes = [4.0 ** k for k in range(3, 12)]
    times = [20e-6 + b / 2e9 for b in sizes]                             # alpha 20 us, beta 2 GB/s
    alpha, beta = pcomm.fit_alpha_beta(sizes, times)
    assert alpha == pytest.approx(20e-6, rel=1e-6) and beta == pytest.approx(2e9, rel=1e-6)


def test_collective_bytes_count_ddp_and_fsdp_traffic(cluster):
    counted = cluster.run(pcomm.fsdp_and_ddp_bytes_on_rank, 0)
    n_bytes = 4 * counted[0]["params"]
    for r in counted:                                                    # every rank sends the same
        assert r["ddp"]["sent"]["all_reduce"] == par.all_reduce_bytes_per_rank(n_bytes, P)
        assert r["fsdp"]["sent"]["reduce_scatter"] == par.reduce_scatter_bytes_per_rank(n_bytes, P)
        assert r["fsdp"]["sent"]["all_gather"] == 2 * r["fsdp"]["sent"]["reduce_scatter"]   # ZeRO-3: 1.5x in all
        assert r["fsdp"]["counts"] == {"all_gather": 6, "reduce_scatter": 3}                # 3 Linear layers


def test_dp_tp_mesh_equals_one_process(cluster):
    ref = ptp.reference_grads(ptp.MLPBlock(seed=3), seed=3)
    runs = cluster.run(pcomm.dp_tp_2d_on_rank, 3)
    assert sorted(r["coords"] for r in runs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in runs:
        lo, hi = r["rows"]
        assert_close(r["out"], ref["out"][lo:hi], n=4 * ptp.HIDDEN, name="2-D mesh output")
        for name in ("fc1_weight_grad", "fc1_bias_grad", "fc2_weight_grad", "fc2_bias_grad"):
            assert_close(r[name], ref[name], n=ptp.BATCH * ptp.TOKENS * 4 * ptp.HIDDEN, name=name)


def test_overlap_measurement_returns_every_timing(cluster):
    out = cluster.run(pcomm.overlap_on_rank, 2, 64, 2, 16)[0]
    assert set(out) == {"backward", "all_reduce", "sequential", "ddp_one_bucket", "ddp_overlapped", "parameters"}
    assert all(len(v) == 2 and min(v) > 0 for k, v in out.items() if k != "parameters")
    assert out["parameters"] == 2 * (64 * 64 + 64)
