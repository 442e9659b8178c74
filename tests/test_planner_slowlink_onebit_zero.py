"""The planner's 1-bit Adam bytes at ZeRO 1 and 2 (hybrid/planner/slowlink.py) against the ledger of real runs.

At ZeRO 1-2 the runtime (hybrid/compress/reduction.py: OneBitAdamReduction, server chunk = ZeRO shard) sends
more than ZeRO 0's signs and scales: the engine's all-gather of the updated parameters every step (b L) and, once,
at the freeze step, the all-gather that makes each worker's momentum whole (4 L); before the freeze, ZeRO AdamW's
reduce-scatter once a step (not per micro-batch) on units padded to 8 n. One spawn of 2 CPU ranks (dp 2,
tiny-gpt2: a tied-table unit and the rest, 2 micro-batches a rank) runs STEPS steps freezing after FREEZE at ZeRO 0,
1 and 2 in fp32 and at ZeRO 1 in bf16 (b = 2), records each step's DP ledger (the compressor's tagged calls
included), and the test compares every step, op by op, with the planner's `run_bytes` difference -- computed from
the model's shapes and the planner's unit model, not from the runtime's objects.
"""

from __future__ import annotations

import pytest
import torch

from hybrid.compress.onebit import padded_length
from hybrid.planner import Cluster, Layout, hardware, slowlink
from hybrid.planner.layout import Workload, ZeroStage
from hybrid.planner.model import ActivationProfile
from hybrid.planner.slowlink import Method, MethodConfig
from hybrid.precision import Precision
from hybrid.testing import run_distributed
from models import load_config

MODEL, GLOBAL, MICRO, SEQ = "tiny-gpt2", 8, 2, 32
STEPS, FREEZE = 4, 2  # warm-up steps 0-1, the freeze step 2 (momentum made whole), a steady step 3
CASES = [(0, Precision.FP32), (1, Precision.FP32), (2, Precision.FP32), (1, Precision.BF16)]


def _train(mesh, zero: int, precision: Precision) -> list[dict[str, int]]:
    """STEPS steps of 1-bit Adam through the engine; each step's DP bytes by "op@dp"."""
    from hybrid.compress.reduction import OneBitAdamReduction
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.tp import TPContext
    from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks
    from tests.test_planner_slowlink import _dp_bytes
    chunks = build_pipeline_chunks(load_config(MODEL), TPContext(mesh.tp), 0, 1, 1, seed=7)
    spec, corpus = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp), load_corpus()
    reduction = OneBitAdamReduction(FREEZE, (mesh.dims.dp, 1, 1))
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=zero, precision=precision), OptimizerConfig(lr=1e-3),
                        reduction)
    runner, sent = LocalForwardBackward(chunks[0], mesh.device), []
    for it in range(STEPS):
        mesh.ledger.reset()
        train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, None, runner=runner)
        sent.append(_dp_bytes(mesh.ledger.summary()))
    return sent


def _measure(rank: int, world: int) -> dict:
    from hybrid.comm import CommLedger
    from hybrid.mesh import Mesh, ParallelDims
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world), ledger=CommLedger())
    return {case: _train(mesh, *case) for case in CASES}


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    return run_distributed(_measure, 2, timeout=600)


def _work(precision: Precision) -> Workload:
    return Workload(load_config(MODEL), global_batch=GLOBAL, seq_length=SEQ, precision=precision.planned,
                    activations=ActivationProfile.FP32_FLASH, fp32_grads=False)  # _train's ZeroConfig: b = 2 in bf16


def _predicted_steps(zero: int, precision: Precision) -> list[dict[str, int]]:
    """The planner's bytes of each step: run_bytes(it + 1) - run_bytes(it)."""
    work, layout = _work(precision), Layout(tp=1, pp=1, dp=2, micro_batch=MICRO, zero=ZeroStage(zero))
    method = MethodConfig(Method.ONEBIT, onebit_freeze_iters=FREEZE)
    runs = [slowlink.run_bytes(work, layout, method, 0, k) for k in range(STEPS + 1)]
    return [{k: v - runs[it].get(k, 0) for k, v in runs[it + 1].items() if v - runs[it].get(k, 0)}
            for it in range(STEPS)]


def test_onebit_adam_dp_bytes_per_step_at_zero_0_1_2_equal_the_planners(measured):
    """Every rank, every step, every op: the ledger == the planner's step; the steady step == steady_bytes;
    ZeRO 1-2 send more than ZeRO 0 after the freeze (the parameter all-gather), and the freeze step more than
    the steady one (the momentum's all-gather)."""
    for rank, got in enumerate(measured):
        for zero, precision in CASES:
            want = _predicted_steps(zero, precision)
            assert got[(zero, precision)] == want, (rank, zero, precision)
            layout = Layout(tp=1, pp=1, dp=2, micro_batch=MICRO, zero=ZeroStage(zero))
            steady = slowlink.steady_bytes(_work(precision), layout, MethodConfig(Method.ONEBIT), 0)
            assert want[-1] == steady, (zero, precision)
            assert "reduce_scatter@dp" not in steady and "all_reduce@dp" not in steady
    fp32 = {zero: _predicted_steps(zero, Precision.FP32) for zero in (0, 1, 2)}
    assert fp32[1] == fp32[2]  # ZeRO 2 reduces once a step under 1-bit Adam, as ZeRO 1
    assert fp32[1][3]["all_gather@dp"] > fp32[0][3]["all_gather@dp"]
    assert fp32[1][2]["all_gather@dp"] > fp32[1][3]["all_gather@dp"]


def test_onebit_adam_zero_1_2_bytes_follow_the_formula_from_the_parameter_count():
    """Independent arithmetic, tiny-gpt2 at dp 2 (n = 2, units padded to L = multiples of 16): the rest of the
    model and the tied table. After the freeze: all-to-all L / 8, all-gathers L / 8 + 2 n fp32 scales per unit
    + b L parameters; the freeze step + 4 L (the momentum); warm-up g L reduce-scatter + b L all-gather."""
    h, v, f, layers, pos = 64, 256, 256, 4, 256
    rest = pos * h + layers * (2 * h + 4 * (h * h + h) + 2 * h + f * h + f + h * f + h) + 2 * h
    lengths = [padded_length(rest, 2), padded_length(v * h, 2)]
    total, n = sum(lengths), 2
    assert all(length % 16 == 0 for length in lengths)
    for precision, b in ((Precision.FP32, 4), (Precision.BF16, 2)):
        work = _work(precision)
        for zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS):
            layout = Layout(tp=1, pp=1, dp=2, micro_batch=MICRO, zero=zero)
            signs = total // 8
            steady = {"all_to_all@dp": signs, "all_gather@dp": signs + 2 * 8 * n + b * total}
            assert slowlink.onebit_bytes(work, layout, 0) == steady
            first = slowlink.onebit_bytes(work, layout, 0, freeze_step=True)
            assert first == {**steady, "all_gather@dp": steady["all_gather@dp"] + 4 * total}
            assert slowlink.onebit_warmup_bytes(work, layout, 0) == {"reduce_scatter@dp": b * total,
                                                                    "all_gather@dp": b * total}


def test_onebit_adam_is_priced_at_zero_1_2_with_its_whole_momentum_and_errors():
    """The planner tries 1-bit Adam at ZeRO 0, 1 and 2 (as the runtime runs it); its own state beyond the
    planner's model states: ZeRO 0 the worker and server errors 4 (1 + 1/n) bytes a parameter; ZeRO 1-2 also the
    whole momentum over the planner's 4 / n share: 4 (1 - 1/n) + 4 + 4 / n = 8, and ZeRO 2's whole gradient
    buffer g (1 - 1/n); the step's latencies count the parameter all-gather per unit."""
    assert MethodConfig(Method.ONEBIT).zero_stages() == (ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS)
    work = _work(Precision.FP32)
    psi = sum(p for p in (torch.Size(s).numel() for s in slowlink.param_shapes(
        work, Layout(tp=1, pp=1, dp=4, micro_batch=MICRO), 0)))
    for zero, want in ((ZeroStage.NONE, 4 * psi * 1.25), (ZeroStage.OPTIMIZER, 8 * psi),
                       (ZeroStage.GRADIENTS, 8 * psi + 4 * psi * 0.75)):
        layout = Layout(tp=1, pp=1, dp=4, micro_batch=MICRO, zero=zero)
        assert slowlink.state_bytes(work, layout, MethodConfig(Method.ONEBIT)) == pytest.approx(want, rel=1e-12)
    cluster, link = Cluster(gpus=4, hw=hardware("cpu")), slowlink.SlowLink(1.0, 0.01)
    z0, z1 = (Layout(tp=1, pp=1, dp=4, micro_batch=MICRO, zero=z) for z in (ZeroStage.NONE, ZeroStage.OPTIMIZER))
    lt0, lt1 = (slowlink.link_time(work, cluster, lay, MethodConfig(Method.ONEBIT), link) for lay in (z0, z1))
    units = 2  # the tied table, the rest
    gathered = slowlink.onebit_bytes(work, z1, 0)["all_gather@dp"] - slowlink.onebit_bytes(work, z0, 0)["all_gather@dp"]
    assert lt1.cross_bytes - lt0.cross_bytes == gathered / 2  # an all-gather sends S / 2 across
    assert lt1.cross - lt0.cross == pytest.approx(units * 0.01 + gathered / 2 / 1e9, rel=1e-9)
