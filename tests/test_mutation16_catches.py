"""Round 16's outside mutation review: ~30 load-bearing features broken once on purpose (one small, realistic bug
each, in the areas earlier rounds covered least: CP, MoE, zero-bubble, DiLoCo, compression, checkpoint resharding,
the data position, the planner's terms, fault handling, the fp16 loss scale), the covering tests run; each test
here kills a mutant those tests let live or killed only in a slow or multi-rank test, shown failing on the mutant
and passing on HEAD. In-process, no process group.

The mutant ids (REC-full-sp, ...) are those of branch mutation16's report, which lists every mutant, the tests
run and whether they killed it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from hybrid.comm import CommLedger, Group
from hybrid.planner import Cluster, Layout, Workload, ZeroStage, hardware
from hybrid.planner.reference import gpt_model


# --- REC-full-sp: the planner's activations under sequence parallelism, against the runtime's saved tensors ---------
@dataclass
class _Rank0TP(Group):
    """TP rank 0 of `ranks` without processes, for memory only: the collectives return tensors of the shapes,
    dtypes and storage layout the real ones return (Group.all_gather's gathered buffer moved back along `dim`,
    reduce_scatter's own output buffer) holding rank 0's values -- what is saved for backward is then what a real
    rank saves, byte for byte; the numbers themselves are not a real run's."""

    @property
    def rank(self) -> int:
        return 0

    def all_reduce(self, t: torch.Tensor, op=None, tag: str = "") -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        moved = t.movedim(dim, 0).contiguous()
        return torch.cat([moved] * self.size).movedim(0, dim)

    def reduce_scatter(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        moved = t.movedim(dim, 0).contiguous()
        return moved[:moved.shape[0] // self.size].clone().movedim(0, dim)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_saved_activations_under_sequence_parallelism_equal_the_plan_for_every_recomputation(name, tp):
    """The peak bytes one micro-batch's forward and backward save (SavedActivationLedger, the rerun's re-saves
    included) on TP rank 0 of tp ranks with sequence parallelism equal plan_memory's activations (FP32_FLASH),
    byte for byte, for no, selective, op-level selective and full recomputation. Full recomputation keeps each
    layer's input, sequence-split (2sbh/t, Korthikanti et al.); the mutant keeping it whole (sbh x 4 bytes, no / t)
    was caught by test_planner_runtime's 8-rank launch and, indirectly, by test_planner_morerows (a published
    layout search ranked differently), by no direct check in-process. This is the runtime comparison in-process,
    ~0.1 s a case."""
    from hybrid.measured_memory import SavedActivationLedger
    from hybrid.pipeline import ScheduleKind
    from hybrid.planner import plan_memory
    from hybrid.planner.layout import Recompute
    from hybrid.planner.model import ActivationProfile, Precision
    from hybrid.tp import TPContext
    from hybrid.train_step import LocalForwardBackward
    from models import Recompute as ModelRecompute
    from models import build_pipeline_chunks, load_config, shift_labels
    B, S = 2, 32
    cfg = load_config(name)
    work = Workload(cfg, global_batch=B, seq_length=S, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH)
    x = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    for recompute in (Recompute.NONE, Recompute.SELECTIVE, Recompute.SELECTIVE_OP, Recompute.FULL):
        group = _Rank0TP(name="tp", ranks=tuple(range(tp)), pg=None, ledger=CommLedger())
        chunks = build_pipeline_chunks(cfg, TPContext(group, sequence_parallel=True), 0, 1, seed=0,
                                       recompute=ModelRecompute(recompute.value))
        saved = SavedActivationLedger(params=chunks.parameters(), recomputation=True)
        with saved:
            LocalForwardBackward(chunks[0], torch.device("cpu")).forward_backward([(x, shift_labels(x))])
        layout = Layout(tp=tp, pp=1, dp=1, micro_batch=B, sequence_parallel=True, zero=ZeroStage.NONE,
                        recompute=recompute)
        plan = plan_memory(work, Cluster(gpus=tp, hw=hardware("cpu")), layout, schedule=ScheduleKind.ONE_F_ONE_B)
        assert saved.peak_bytes == plan.ranks[0].activations, recompute


# --- PS-rate-boundary: which gradients PowerSGD compresses, at the rate's exact boundary too ----------------------
def test_powersgd_compresses_exactly_the_matrices_torchs_hook_does_at_the_boundary_too():
    """matrix_rank against torch's own `_should_compress` (the hook's decision, called as the hook calls it: with
    r = min(n, m, rank)) for every n x m up to 40 x 40, ranks 1-4 and rates 1, 2 (the default) and 3. Shapes on
    the boundary r (n + m) rate = n m (16 x 16 at rank 4, rate 2) are all-reduced whole: the mutant compressing
    them (`<=` for `<`) lived through the PowerSGD tests, none of whose shapes sits on it."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from hybrid.compress.powersgd import PowerSGDConfig, matrix_rank
    boundary = 0
    for rank in (1, 2, 3, 4):
        for rate in (1.0, 2.0, 3.0):
            cfg = PowerSGDConfig(rank=rank, min_compression_rate=rate)
            for n in range(1, 41):
                for m in range(1, 41):
                    r = min(n, m, rank)
                    want = r if _should_compress(n, m, r, rate)[0] else 0
                    assert matrix_rank((n, m), cfg) == want, (n, m, rank, rate)
                    boundary += (n + m) * r * rate == n * m
    assert boundary > 0  # the grid holds shapes on the boundary


# --- DATA-resume-pos: the data position a checkpoint records ------------------------------------------------------
def test_each_checkpoint_records_the_samples_consumed_through_its_iteration(tmp_path):
    """train.py (one process, tiny-llama, the synthetic corpus) saving after every iteration: the checkpoint of
    iteration i records consumed_samples = i x the global batch (a constant batch: what Megatron's
    consumed_train_samples counts), the position the resumed run reads its next batch from. The mutant recording
    the position before the step's batch (one batch behind: a resume rereads it) passed every fast test; only the
    slow train.py resume tests (test_checkpoint, test_cp_training, test_resume_headline) compare a resumed run's
    losses. One fork of this process, ~6 s of CPU (measured under load ~25)."""
    from pathlib import Path

    from hybrid import testing
    from hybrid.checkpoint import store
    G = 4
    save = str(tmp_path / "ckpt")
    argv = [str(Path(__file__).resolve().parents[1] / "scripts" / "train.py"), "--model", "tiny-llama",
            "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", str(G), "--train-iters", "2",
            "--log-interval", "1", "--eval-iters", "0", "--save", save, "--save-interval", "1"]
    out = testing.run(argv, env={"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, "OMP_NUM_THREADS": "1"},
                      cwd=str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert store.complete_iterations(save) == [1, 2]
    for i in (1, 2):
        assert store.read_state(store.final_path(save, i))["consumed_samples"] == i * G, i


# --- DL-inflight-f0: a checkpoint taken with fragment 0's outer all-reduce in flight lands it after the load -------
class _Done:
    def wait(self) -> None:
        pass


class _OneReplica:
    """The cross-replica group of a run with one replica: the average of the deltas is this rank's own."""

    size = 1

    def all_reduce_async(self, t: torch.Tensor, tag: str = "") -> _Done:
        return _Done()


class _Masters:
    """What DiLoCo and its checkpoint state read of a ZeroOptimizer: its master segments (one view a unit here),
    the hooks around writing them, and a geometry with no shared (tied) pieces."""

    device = torch.device("cpu")

    def __init__(self, views: list[torch.Tensor]):
        from types import SimpleNamespace
        self.units = [SimpleNamespace(views=[v], shard_range=(0, 0), params=[], offsets=[], segments=[]) for v in views]
        self.mesh = SimpleNamespace(tp=SimpleNamespace(rank=0))
        self.model = torch.nn.Module()

    def wait_params(self) -> None:
        pass

    def before_param_writes(self) -> None:
        pass

    def sync_params_from_master(self) -> None:
        pass


def test_a_checkpoint_with_fragment_0_in_flight_resumes_as_the_uninterrupted_run():
    """Streaming DiLoCo, H = 4, K = 2 fragments, tau = 1, Nesterov mu = 0.9, one replica (the average is the
    replica's own delta): fragment 0 is posted after step 1 and lands after step 2. A checkpoint after step 1 holds
    its delta as "pending" and "inflight" = 0 (hybrid/diloco/state.py); a run rebuilt from that state (theta, the
    momentum, the pending delta and the weights copied in, as DCP fills them; then load_state_dict) must apply it
    at step 2 and follow the uninterrupted run bit for bit through two rounds. The mutant landing only a fragment
    > 0 (`> 0` for `>= 0`) dropped fragment 0's outer step; every mid-flight resume test is slow
    (test_diloco_checkpoint)."""
    from hybrid.diloco import state
    from hybrid.diloco.args import DiLoCoConfig
    from hybrid.diloco.outer import DiLoCo
    cfg = DiLoCoConfig(inner_steps=4, outer_lr=0.7, outer_momentum=0.9, fragments=2, fragment_sync_delay=1)
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(3, 4, generator=gen), torch.randn(5, generator=gen)]
    steps = [[0.1 * torch.randn(t.shape, generator=gen) for t in start] for _ in range(8)]  # the inner steps' moves

    def run(d: DiLoCo, weights: list[torch.Tensor], first: int, last: int) -> None:
        for it in range(first, last):
            for w, s in zip(weights, steps[it]):
                w.add_(s)
            d.after_step(it)

    straight = [t.clone() for t in start]
    a = DiLoCo(cfg, _Masters(straight), _OneReplica())
    run(a, straight, 0, 8)
    first = [t.clone() for t in start]
    b = DiLoCo(cfg, _Masters(first), _OneReplica())
    run(b, first, 0, 2)
    assert b.inflight is not None and b.inflight.f == 0  # fragment 0 in flight at the save
    b.complete()  # what state_dict does first
    resumed = [t.clone() for t in first]
    c = DiLoCo(cfg, _Masters(resumed), _OneReplica())
    for i in range(len(start)):
        c.anchors[i].copy_(b.anchors[i])
        c.momentum(i).copy_(b.momentum(i))
        c.pending[i].copy_(b.pending[i])
    state.load_state_dict(c, {"inflight": b.inflight.f})
    run(c, resumed, 2, 8)
    for w, want in zip(resumed, straight):
        assert torch.equal(w, want)


# --- FP16-goodreset: an overflow restarts the loss scale's growth window -------------------------------------------
def test_fp16_loss_scale_follows_torchs_dynamic_scaler_through_overflows():
    """The engine's dynamic loss scale (ZeroOptimizer._update_loss_scale: halve on overflow, double after
    --loss-scale-window good steps) against torch's GradScaler kernel (torch._amp_update_scale_, backoff 0.5,
    growth 2, growth interval = the window), step by step over a sequence with overflows inside a window: after
    an overflow the count of good steps starts again, as torch's growth tracker, Megatron's DynamicGradScaler and
    DeepSpeed's last_overflow_iter do. The mutant keeping the count across the overflow (doubling early) passed
    test_zero's fp16 cases, whose overflows do not fall inside a window. The scale stays far above
    --min-loss-scale here (torch has none)."""
    from types import SimpleNamespace

    from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
    window = 3
    cfg = ZeroConfig(precision=Precision.FP16, loss_scale_window=window, initial_loss_scale=2.0 ** 16)
    engine = SimpleNamespace(cfg=cfg, loss_scale=cfg.initial_loss_scale, good_steps=0, skipped_steps=0)
    scale, tracker = torch.tensor([cfg.initial_loss_scale]), torch.zeros(1, dtype=torch.int32)
    overflows = "..x.....x.x...x..."  # x: the step's gradients overflowed
    for i, o in enumerate(overflows):
        ZeroOptimizer._update_loss_scale(engine, o == "x")
        torch._amp_update_scale_(scale, tracker, torch.tensor([float(o == "x")]), 2.0, 0.5, window)
        assert engine.loss_scale == scale.item(), (i, overflows[:i + 1])
    assert engine.skipped_steps == overflows.count("x")


# --- FT-straggler-peers: a straggler is slow against the ranks of its own pipeline stage ---------------------------
def test_a_pipeline_stage_that_is_slower_as_a_whole_names_no_straggler_but_a_slow_rank_in_it_is_named():
    """slow_ranks on a table of 4 ranks, pp 2 x dp 2: the last stage's forward takes twice the first's on both of
    its ranks (it holds the head and the loss) -- no straggler, its peers (the other rank of that stage) are as
    slow. Then one first-stage rank's forward doubles: it alone is named, against its stage peer. The mutant taking
    every other rank as peers named both last-stage ranks; it passed every test: test_step_split reads only the
    time split, and test_fault_nodes' straggler runs (slow) have one pipeline stage."""
    from types import SimpleNamespace

    from hybrid.fault.straggler import COLUMNS, slow_ranks
    from hybrid.mesh import ParallelDims
    dims = ParallelDims.from_world(4, pp=2)
    mesh = SimpleNamespace(dims=dims)
    stage = [dims.coords(r).pp for r in range(4)]
    assert sorted(stage) == [0, 0, 1, 1]
    col = {name: 1 + i for i, name in enumerate(COLUMNS)}

    def table(forward: list[float]) -> torch.Tensor:
        t = torch.zeros(4, 5, 1 + len(COLUMNS), dtype=torch.float64)  # 5 steps, seconds
        for r in range(4):
            t[r, :, col["forward"]] = forward[r]
            t[r, :, col["backward"]] = 0.2
            t[r, :, 0] = forward[r] + 0.2
        return t

    balanced = [0.1 if s == 0 else 0.2 for s in stage]
    assert slow_ranks(table(balanced), mesh, 1.5, 1, 5) == ["straggler: none (iterations 1-5, factor 1.5)"]
    slow = stage.index(0)
    lines = slow_ranks(table([f * 2 if r == slow else f for r, f in enumerate(balanced)]), mesh, 1.5, 1, 5)
    assert len(lines) == 1 and lines[0].startswith(f"straggler: rank {slow} is slower than its peer in forward")


# --- PL-pp-sp: a pipeline message sharing the DP ring's link is the SP-split one the runtime sends -----------------
@pytest.mark.parametrize("sp", [False, True], ids=["no-sp", "sp"])
def test_a_pipeline_send_on_the_dp_link_is_priced_at_the_message_the_runtime_sends(sp):
    """GPT-3 2.7B-sized, 32 A100s (4 nodes), tp 2 x pp 2 x dp 8: the pipeline crosses nodes and so does the DP
    ring, so each pipeline send competes with the ring on the NICs (time._pp_send_on_dp_link). Its seconds are
    p2p_seconds of one send@pp message of step_ledger -- the ledger test_planner_runtime checks against the
    runtime's CommLedger: b s h / t bytes under SP. The mutant pricing the whole b s h under SP lived through every
    fast planner test (they price this term only without SP, or on one node)."""
    from hybrid.planner.hardware import p2p_seconds
    from hybrid.planner.layout import pipeline_crosses_nodes
    from hybrid.planner.predicted_comm import step_ledger
    from hybrid.planner.time import _context, _pp_send_on_dp_link
    work = Workload(gpt_model(32, 2560, 32, 51200, 2048), global_batch=64, seq_length=2048, fp32_grads=False)
    cluster = Cluster(gpus=32, hw=hardware("a100-80g"))
    layout = Layout(tp=2, pp=2, dp=8, micro_batch=1, sequence_parallel=sp)
    ctx = _context(work, cluster, layout)
    crosses = pipeline_crosses_nodes(cluster, layout)
    assert crosses and ctx.dp_group.spans_nodes
    send = step_ledger(work, layout, 0)["send@pp"]
    message = send["bytes"] / send["calls"]
    assert message == 2048 * 2560 * 2 / (2 if sp else 1)  # b s h bf16, / t under SP
    assert _pp_send_on_dp_link(ctx) == pytest.approx(p2p_seconds(ctx.cluster.hw, message, True), rel=1e-12)


# --- Z3-offload-host: offloading moves model-state bytes to the host, it never drops them ---------------------------
@pytest.mark.parametrize("zero", [ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS])
def test_offloaded_states_move_to_the_host_byte_for_byte(zero):
    """The ZeRO paper's mixed-precision states, 2 + 2 + K (K = 12) bytes a parameter, each divided by Nd from its
    stage on; ZeRO-Offload / ZeRO-Infinity move the optimizer states (and at ZeRO 3 the bf16 parameters) to the
    host: device + host stays the stage's total, the host holds exactly the moved parts. Pure arithmetic on
    model_states; the mutant dropping the parameters from the host (params offloaded, counted nowhere) lived
    through the fast planner and ZeRO tests run on it; only the headline case of test_planner_runtime (8 ranks)
    caught it."""
    from hybrid.planner.layout import Offload
    from hybrid.planner.model import Precision
    from hybrid.planner.predicted_memory import model_states
    psi, nd = 1_000_000.0, 8
    params = 2 * psi / (nd if zero >= ZeroStage.PARAMETERS else 1)
    grads = 2 * psi / (nd if zero >= ZeroStage.GRADIENTS else 1)
    optimizer = 12 * psi / nd
    plain = model_states(psi, zero, nd, Offload.NONE, Precision.MIXED)
    assert (plain.params, plain.grads, plain.optimizer, plain.host) == (params, grads, optimizer, 0.0)
    moved = model_states(psi, zero, nd, Offload.OPTIMIZER, Precision.MIXED)
    assert (moved.params, moved.grads, moved.optimizer, moved.host) == (params, grads, 0.0, optimizer)
    if zero is ZeroStage.PARAMETERS:
        both = model_states(psi, zero, nd, Offload.OPTIMIZER_AND_PARAMS, Precision.MIXED)
        assert (both.params, both.grads, both.optimizer, both.host) == (0.0, grads, 0.0, optimizer + params)


# --- PL-opt-zero1 / PL-offload-pcie: the optimizer step's partition, and what offload moves over PCIe --------------
@pytest.mark.parametrize("zero", [ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS])
def test_the_optimizer_step_prices_the_ranks_partition_and_offload_moves_gradients_out_and_parameters_back(zero):
    """From ZeRO 1 on each of Nd ranks steps Psi / Nd parameters: the step costs what ZeRO 0 costs for Psi / Nd
    (the same passes, kernels and calibrated CPU terms). Offloaded (ZeRO-Offload, Ren et al. 2021, Sec. 4.1), the
    partition's bf16 gradients go to the host and its updated bf16 parameters come back -- 2 + 2 bytes a parameter
    over PCIe -- and the host Adam steps it, the node's CPUs shared by its GPUs. The mutants pricing ZeRO 1's step
    on the whole model and counting only the gradients over PCIe lived through the fast planner tests."""
    from hybrid.planner.hardware import GB
    from hybrid.planner.layout import Offload
    from hybrid.planner.time import _context, _optimizer_seconds
    work = Workload(gpt_model(24, 2048, 16, 51200, 2048), global_batch=64, seq_length=2048, fp32_grads=False)
    cluster, psi, nd = Cluster(gpus=8, hw=hardware("a100-80g")), 1.3e9, 8
    whole = _optimizer_seconds(_context(work, cluster, Layout(dp=nd, zero=ZeroStage.NONE)), psi / nd)
    assert _optimizer_seconds(_context(work, cluster, Layout(dp=nd, zero=zero)), psi) == pytest.approx(whole, rel=1e-12)
    hw = _context(work, cluster, Layout(dp=nd, zero=zero)).cluster.hw
    part = psi / nd
    want = (2 + 2) * part / (hw.pcie_gbps * GB) + part * min(hw.gpus_per_node, cluster.gpus) / hw.cpu_adam_params_per_s
    offloaded = _context(work, cluster, Layout(dp=nd, zero=zero, offload=Offload.OPTIMIZER))
    assert _optimizer_seconds(offloaded, psi) == pytest.approx(want, rel=1e-12)


# --- Z3-host-gpus: a node's host holds the offloaded states of the GPUs it has --------------------------------------
@pytest.mark.parametrize("gpus", [2, 8, 16])
def test_host_memory_per_node_is_the_offloaded_states_of_the_gpus_on_that_node(gpus):
    """ZeRO 3 with optimizer and parameters offloaded, dp = every GPU, on A100 nodes of 8: each rank's host
    share is RankMemory.states.host, and one node holds the shares of its GPUs -- all of them on a 2-GPU cluster
    (one node, 2 GPUs), 8 a node from 8 GPUs on. The mutant multiplying by the node's 8 slots whatever the
    cluster's size priced a 2-GPU run's host at four times its need; it lived through the fast planner tests run
    on it, test_planner_runtime and test_zero included."""
    from hybrid.planner import plan_memory
    from hybrid.planner.layout import Offload
    work = Workload(gpt_model(24, 2048, 16, 51200, 2048), global_batch=gpus, seq_length=2048, fp32_grads=False)
    cluster = Cluster(gpus=gpus, hw=hardware("a100-80g"))
    layout = Layout(dp=gpus, micro_batch=1, zero=ZeroStage.PARAMETERS, offload=Offload.OPTIMIZER_AND_PARAMS)
    mem = plan_memory(work, cluster, layout)
    per_rank = mem.ranks[0].states.host
    assert per_rank > 0 and mem.host_per_node == pytest.approx(per_rank * min(gpus, 8), rel=1e-12)


# --- FP16-min: the loss scale never halves below --min-loss-scale --------------------------------------------------
def test_fp16_loss_scale_stops_halving_at_the_minimum_and_grows_from_there():
    """Five overflows in a row from 2^4 with --min-loss-scale 2 and a window of 2: 8, 4, 2, 2, 2 (DeepSpeed's
    DynamicLossScaler: max(scale / 2, min_scale); Megatron's DynamicGradScaler likewise), then two good steps
    double it to 4. The step count of skips is every overflow's. A scale halved past the minimum (towards 0 on a
    model that keeps overflowing) would be the mutant dropping the max()."""
    from types import SimpleNamespace

    from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
    cfg = ZeroConfig(precision=Precision.FP16, loss_scale_window=2, initial_loss_scale=16.0, min_loss_scale=2.0)
    engine = SimpleNamespace(cfg=cfg, loss_scale=cfg.initial_loss_scale, good_steps=0, skipped_steps=0)
    seen = []
    for overflow in (True,) * 5 + (False,) * 2:
        ZeroOptimizer._update_loss_scale(engine, overflow)
        seen.append(engine.loss_scale)
    assert seen == [8.0, 4.0, 2.0, 2.0, 2.0, 2.0, 4.0] and engine.skipped_steps == 5


# --- MOE-auxscale-m: the balancing losses' gradients are averaged over the micro-batches, as the LM loss ----------
@pytest.mark.parametrize("balancing", ["aux_loss", "seq_aux_loss", "hf_aux_loss"])
def test_moe_gradients_of_two_micro_batches_are_the_mean_of_each_ones_step(balancing):
    """tiny-mixtral, one process, coefficient 0.1 and z-loss 0.01: train_step over micro-batches A and B gives the
    mean of the gradients train_step gives on A alone and on B alone -- gradient accumulation averages the whole
    loss, LM and balancing terms alike (train_step's set_aux_grad_scale: loss scale / micro-batches, Megatron's
    MoEAuxLossAutoScaler). The mutant scaling the aux gradients by the loss scale alone (m times too large at m
    micro-batches) was caught only by test_moe_parallel's 8-rank Mixtral training. fp32: the two sides add the same
    terms in another order, a few ulps (rtol 1e-5 of gradients ~1e-2, atol 1e-7)."""
    from hybrid.dp import GradAverager
    from hybrid.mesh import Mesh
    from hybrid.moe.config import LoadBalancing, MoEConfig
    from hybrid.moe.layer import ExpertContext
    from hybrid.tp import TPContext
    from hybrid.train_step import train_step
    from models import build_model, load_config, shift_labels
    cfg = load_config("tiny-mixtral")
    moe = MoEConfig(load_balancing=LoadBalancing(balancing), aux_loss_coeff=0.1, z_loss_coeff=0.01)
    ids = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(0))
    batches = [(x, shift_labels(x)) for x in ids.split(2)]

    def grads(micro_batches: list) -> dict[str, torch.Tensor]:
        mesh = Mesh.single()
        model = build_model(cfg, TPContext(mesh.tp), seed=0, moe=ExpertContext(moe))
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        train_step(model, micro_batches, opt, mesh, GradAverager(model.parameters(), mesh.dp))
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    both, a, b = grads(batches), grads(batches[:1]), grads(batches[1:])
    assert any("gate" in n for n in both)  # the routers' gradients, which the balancing losses reach
    for n, g in both.items():
        torch.testing.assert_close(g, (a[n] + b[n]) / 2, rtol=1e-5, atol=1e-7, msg=n)


# --- CK-twin-moments: a tied weight held twice on one rank takes the loaded moments in both copies ----------------
def test_both_copies_of_a_tied_embedding_on_one_rank_take_the_loaded_adam_moments():
    """tiny-gpt2 in two interleaved chunks on one rank (tests/test_checkpoint.py's Run at v 2, Mesh.single): the
    tied wte sits in chunk 0 (embedding) and chunk 1 (head), one checkpoint piece, read into the first copy; load
    copies it into the second (hybrid/zero/state.py: the twins). Random master weights and moments handed to a
    fresh optimizer, as a same-layout DCP load fills the pieces: the twin's weights *and* both Adam moments equal
    the kept copy's -- else the two copies step apart from the first step after a resume. The mutant copying the
    weights only lived through every test run on it, test_checkpoint's slow any-layout load included."""
    from hybrid.mesh import Mesh
    from hybrid.stateful import Shards
    from hybrid.zero import state as zero_state
    from tests.test_checkpoint import Run, zero_cfg
    saved = Run(Mesh.single(), ("tiny-gpt2", None), zero_cfg(1, False), v=2)
    sd = saved.opt.state_dict(optimizer=True, names=saved.names)
    gen = torch.Generator().manual_seed(0)
    for v in sd.values():
        if isinstance(v, Shards):
            for t in v.tensors:
                t.copy_(torch.rand(t.shape, generator=gen) + 0.5)
    sd["adam_step"] = 3
    run = Run(Mesh.single(), ("tiny-gpt2", None), zero_cfg(1, False), v=2)
    fresh = run.opt.state_dict(optimizer=True, names=run.names)
    for k, v in fresh.items():
        if isinstance(v, Shards):
            for dst, src in zip(v.tensors, sd[k].tensors):
                dst.copy_(src)
        else:
            fresh[k] = sd[k]
    run.opt.load_state_dict(fresh)
    twins = zero_state._one_per_box(zero_state.optimizer_chunks(run.opt, run.names))[1]
    assert [t.name for t, _ in twins] == ["wte.weight"]
    for twin, kept in twins:
        for kind in (zero_state.MODEL, *zero_state.MOMENTS):
            assert torch.equal(zero_state._view(run.opt, twin, kind), zero_state._view(run.opt, kept, kind)), kind
