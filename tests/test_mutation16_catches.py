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
    was caught only by test_planner_runtime's 8-rank launch. This is the same comparison in-process, in ~0.1 s."""
    from hybrid.measured_memory import SavedActivationLedger
    from hybrid.pipeline import ScheduleKind
    from hybrid.planner import Cluster, Layout, hardware, plan_memory
    from hybrid.planner.layout import Recompute, Workload, ZeroStage
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
