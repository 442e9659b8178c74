"""Round 19's outside mutation review of round 18's new code: one-line bugs planted on purpose in `hybrid plan`
without torch (cli SUBCOMMANDS, hybrid/lazy.py and the torch-free modules), the planner's LazyTape, the Triton
attention kernel and its fit, Workload.sp_copies / float8_tp_gathers, inputs18's fixes and the subjects of the
suite's cheaper tests; the area's fast tier run on each. Each test here kills a mutant that tier let live, shown
failing on the mutant and passing on HEAD. In-process (one fresh interpreter without torch), no process group.

The mutant ids (A5-commtype-attention, ...) are those of branch mutation19's report and of docs/architecture.md's
tally."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- A: the torch-free modules (hybrid/cp/__init__.py, compress/volume.py, planner/profile.py); F1: models/config.py --
def test_the_packages_torch_free_names_load_no_torch():
    """`from hybrid.cp import CommType` and `from models import Recompute` are the torch-free enums (the planner's
    names): the package's lazy table must point CommType at hybrid.cp.comm_type, not at attention.py, which
    re-exports the same object but imports torch. A5-commtype-attention (_LAZY["CommType"] = "hybrid.cp.attention")
    lived through test_startup18_torch_free, test_cli_subcommands, test_inputs18_plan_inputs, test_calibrate,
    test_cp_planner and test_cp_attention (145 passed): the object is the same, only the import differs. A fresh
    interpreter that never loads torch: ~0.1 s of CPU on HEAD."""
    code = ("import sys\nfrom hybrid.cp import CommType\nfrom models import Recompute\n"
            "print(CommType.P2P.value, Recompute.FULL.value, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["p2p", "full", "False"]


def test_default_rope_reads_no_transformers_config():
    """A preset's default RoPE is computed from its own fields (theta^(-2i/d)); only a scaled RoPE asks
    transformers (ModelConfig.hf builds a preset's transformers config: imports transformers, ~1.2 s of CPU in
    each rank, what round 18's suite cuts took out of the ranks). F1-rope-reads-hf (rope_inv_freq testing
    `self.hf is not None` before the rope type) lived through test_cp_models, test_cp_memory and test_moe_convert,
    all tiers: their ranks' configs carry no preset name, so `hf` builds nothing there and their "no transformers
    in the ranks" assertions hold; a preset's run (train.py --model tiny-llama) imported transformers on every
    rank."""
    import torch

    from models import PRESETS
    cfg = dataclasses.replace(PRESETS["tiny-llama"], hf_config=None)
    assert cfg.name == "tiny-llama" and cfg.rope_type == "default"
    inv_freq, scale = cfg.rope_inv_freq()
    d = cfg.head_dim
    expected = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0) and scale == 1.0
    assert cfg.hf_config is None  # no transformers config was built for it


def test_powersgd_compresses_a_matrix_exactly_when_torchs_hook_does():
    """compress/volume.matrix_rank is torch's `_should_compress` (compress when (n + m) r x rate < n m, strictly)
    at r = min(n, m, rank), which the planner prices and the runtime sends. At the boundary (8 x 8 at r 2, rate 2:
    64 = 64) torch sends the matrix whole. A8-rank-le (`<=`) lived through test_compress_powersgd,
    test_compress_onebit, test_planner_slowlink*.py and test_compress_*.py (95 passed): their shapes never sit on
    the boundary."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from hybrid.compress.volume import PowerSGDConfig, matrix_rank
    boundary = 0
    for rate in (1.0, 2.0, 3.0):
        for rank in (1, 2, 4):
            cfg = PowerSGDConfig(rank=rank, min_compression_rate=rate)
            for n in range(1, 13):
                for m in range(1, 13):
                    r = min(n, m, rank)
                    boundary += (n + m) * r * rate == n * m
                    assert (matrix_rank((n, m), cfg) > 0) == _should_compress(n, m, r, rate)[0], (n, m, rank, rate)
    assert boundary > 0  # the grid holds shapes on the boundary


def test_a_profile_with_a_zero_inter_node_latency_is_refused(tmp_path):
    """A measured latency is never 0 -- intra-node's nor inter-node's (profile._check_field: the dataclass allows
    0 for the planner's what-ifs, a profile never did); a hand-edited 0 planned every inter-node collective
    without its latency term. A10-inter-latency-zero (the stricter rule applied to intra_latency_s alone) lived
    through test_inputs15_hardware (which sets intra_latency_s 0 only), test_calibrate, test_calibrate_edgepass,
    test_inputs18_plan_inputs and the planner's fast tier."""
    import json

    from hybrid.planner.profile import load_hardware
    with open(os.path.join(ROOT, "hybrid", "planner", "data", "h200_calibrated.json"), encoding="utf-8") as f:
        profile = json.load(f)
    for key in ("intra_latency_s", "inter_latency_s"):
        bad = json.loads(json.dumps(profile))
        bad["hardware"][key] = 0
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=rf"hardware\.{key} must be a finite number > 0, got 0"):
            load_hardware(str(path))



def test_calibrate_replaces_a_profile_of_any_format_version(tmp_path):
    """--out naming an existing profile is replaced, as re-calibrating is meant to -- an older format's too
    (hybrid-hardware-profile/0: the loader refuses to plan on it and says to re-run calibrate, which must then
    write over it); a file that is no profile is refused before the minute of measuring.
    A11-old-format-refused (profile.check_replaces_a_profile accepting only the current FORMAT) lived through
    test_inputs15_hardware, test_calibrate, test_calibrate_edgepass and test_inputs18_plan_inputs (48 passed):
    they replace current-format profiles only -- the loader's own advice then led to a refusal."""
    import json

    from hybrid.planner.profile import FORMAT, check_replaces_a_profile
    for version in (FORMAT, FORMAT.split("/")[0] + "/0"):
        path = tmp_path / "hw.json"
        path.write_text(json.dumps({"format": version, "hardware": {}}))
        check_replaces_a_profile(str(path))  # replaced: no error
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"format": "something-else/1"}))
    with pytest.raises(ValueError, match="exists and is not a hardware profile"):
        check_replaces_a_profile(str(results))


# --- B: the planner's LazyTape (hybrid/pipeline/simulate.py) ----------------------------------------------------------
def test_the_tape_refuses_costs_of_another_stage_count_as_simulate_does():
    """LazyTape.makespan reads each stage's costs by index: costs of more stages than the tape's pp x v would be
    read in part and a makespan returned for a pipeline the costs do not describe (fewer: an IndexError, not the
    line naming Costs' field). simulate refuses both (Costs.check_stages); so must the tape.
    B10-no-stage-check (the check dropped from makespan) lived through test_pipeline18_tape: every tape there is
    timed with its own stage count."""
    from hybrid.pipeline import Costs, ScheduleKind, build_schedule, simulate
    from hybrid.pipeline.simulate import LazyTape
    lists = build_schedule(ScheduleKind.ONE_F_ONE_B, 2, 4, 1)
    tape = LazyTape(lists)
    for stages in (3, 1):
        costs = Costs(stage_forward=(1.0,) * stages, stage_backward=(2.0,) * stages)
        with pytest.raises(ValueError, match=r"one entry per global stage \(pp \* v = 2\), got " + str(stages)):
            simulate(lists, costs)
        with pytest.raises(ValueError, match=r"one entry per global stage \(pp \* v = 2\), got " + str(stages)):
            tape.makespan(costs)


# --- C: AttentionKernel.TRITON (hybrid/planner/hardware.py) -----------------------------------------------------------
def test_triton_runs_at_its_share_on_a_device_without_a_kernel_table():
    """A device built by hand (Hardware.flash_rates None: no kernel benchmark table) runs FlashAttention-2 at its
    flash_efficiency flat, and the Triton kernel at TRITON_FLASH2_SHARE of that, as on a card with a table (the
    share is of FlashAttention-2's rate on every card). C3-flat-no-share (the table-less branch returning
    flash_efficiency for TRITON too) lived through test_planner18_triton, test_planner17_triton,
    test_planner_attnkernel and test_planner_fit: every Triton row there is on a preset with a table."""
    import dataclasses

    from hybrid.planner.hardware import TRITON_FLASH2_SHARE, AttentionKernel, GpuKind, hardware
    for kind in (GpuKind.H100_80G, GpuKind.A100_80G):
        hw = dataclasses.replace(hardware(kind), flash_rates=None)
        assert AttentionKernel.FLASH2.efficiency(hw) == hw.flash_efficiency
        assert AttentionKernel.TRITON.efficiency(hw) == pytest.approx(TRITON_FLASH2_SHARE * hw.flash_efficiency,
                                                                      rel=1e-12)
        with pytest.raises(ValueError, match="flash1 has no published rate"):
            AttentionKernel.FLASH1.efficiency(hw)


# --- C: the MosaicML joint fit (hybrid/planner/fit.py) ----------------------------------------------------------------
def test_the_share_moves_only_the_triton_rows_flash_rate():
    """fit.mosaicml_device plans a row at (clock, share): the share scales the flash rate of a row that ran the
    Triton kernel only -- a FlashAttention-2 row (the ">= 128 GPUs" table's 12) keeps its card's rate at any share,
    so the clock's fit on them does not depend on the share (published17_triton.fits: "the share plays no part").
    C7-share-every-kernel (the scale applied whatever the row's kernel) lived through test_planner18_triton,
    test_planner17_triton, test_planner_attnkernel and test_planner_fit's fast tier: they evaluate at the shipped
    share, where the scale is 1. No planning here."""
    from hybrid.planner.fit import mosaicml_device, mpt_h100_fit_runs
    from hybrid.planner.hardware import H100_EAGER_CLOCK, TRITON_FLASH2_SHARE, AttentionKernel
    rows = mpt_h100_fit_runs()
    flash2 = [r for r in rows if r.workload.attention_kernel is AttentionKernel.FLASH2]
    triton = [r for r in rows if r.workload.attention_kernel is AttentionKernel.TRITON]
    assert len(flash2) == 12 and triton
    for run in flash2:
        assert mosaicml_device(run, 0.7, 0.3).flash_efficiency == run.hardware().flash_efficiency
    for run in triton:
        assert mosaicml_device(run, H100_EAGER_CLOCK, 0.3).flash_efficiency == pytest.approx(
            run.hardware().flash_efficiency * 0.3 / TRITON_FLASH2_SHARE, rel=1e-12)


def test_the_joint_fit_passes_each_fit_the_others_last_value(monkeypatch):
    """fit.joint_fit alternates the two MosaicML fits, each at the other's last value, to the point where both
    agree. With the two fits replaced by contractions (clock = 0.5 + 0.2 share, share = 0.2 + 0.4 clock: one fixed
    point, clock 0.5652..., share 0.4260...) it must reach that point; no planning (the real fits are ~1,000
    plans: test_planner17_triton's slow test runs published17_triton.fits, not joint_fit).
    C9-joint-shipped-clock (the share fitted at the shipped clock each round, not at the round's clock) lived
    through every tier: nothing called joint_fit."""
    from hybrid.planner import fit
    monkeypatch.setattr(fit, "fit_h100_eager_clock", lambda share=None, iters=14: 0.5 + 0.2 * share)
    monkeypatch.setattr(fit, "fit_triton_flash2_share",
                        lambda clock=None, iters=14: 0.2 + 0.4 * (0.708 if clock is None else clock))
    clock = (0.5 + 0.2 * 0.2) / (1 - 0.2 * 0.4)  # c = 0.5 + 0.2 (0.2 + 0.4 c)
    got = fit.joint_fit(rounds=12)
    assert got == pytest.approx((clock, 0.2 + 0.4 * clock), abs=1e-9)


# --- D: Workload.float8_tp_gathers (hybrid/planner/predicted_comm.py step_ledger, time._stage_cpu) --------------------
def _fp8_llama(**kw):
    from hybrid.planner import Precision, Workload
    from models import PRESETS
    kw.setdefault("fp32_grads", False)  # bf16 gradients, as these tests were derived (Workload's default to round 23)
    return Workload(PRESETS["tiny-llama"], global_batch=16, seq_length=128, precision=Precision.MIXED, fp8=True, **kw)


def test_the_step_ledger_gathers_float8_under_float8_tp():
    """step_ledger (each rank's step as the runtime's CommLedger records it; comm_cpu_seconds prices it) passes
    the workload's gather bytes to tp_ledger: at tp 2 x pp 2 with SP, m = 4 micro-batches of 2 x 128 tokens, a
    tiny-llama stage's 2 layers all-gather 2 inputs forward and 2 output gradients backward (BLOCK), each b s h
    at 1 byte instead of 2 -- 4 micro-batches x 2 layers x 4 gathers x 2 x 128 x 64 = 524,288 fewer bytes on the
    first stage; the
    reduce-scatters unchanged. D11-ledger-no-f8 (step_ledger calling tp_ledger without work.tp_gather_bytes)
    lived through test_planner18_dtensor_sp and the planner's fast tier: they check tp_ledger with the bytes
    passed by hand, and the time terms (_tp_cost) pass them themselves."""
    from hybrid.planner import Layout
    from hybrid.planner.predicted_comm import step_ledger
    layout = Layout(tp=2, pp=2, dp=2, micro_batch=2, sequence_parallel=True)
    bf16, f8 = (step_ledger(_fp8_llama(float8_tp_gathers=g), layout, 0) for g in (False, True))
    assert bf16["all_gather@tp"]["bytes"] - f8["all_gather@tp"]["bytes"] == 4 * 2 * 4 * 2 * 128 * 64
    assert f8["all_gather@tp"]["calls"] == bf16["all_gather@tp"]["calls"]
    assert f8["reduce_scatter@tp"] == bf16["reduce_scatter@tp"]


def test_the_shared_core_stage_cpu_prices_float8_gathers():
    """time._stage_cpu (the shared-core bound: more ranks than the node's compute units) prices each TP
    collective's bytes at comm_cpu_s_per_byte, so float8 gathers cost half the per-byte CPU: an H100 node of 8 on
    2 compute units (a what-if device: fp8 needs Hopper), tiny-llama at tp 2 x pp 2 with SP, a stage's 2 layers
    x 2 all-gathers a pass each 8192 wire bytes fewer (b s h x 1 byte x (n - 1) / n). D12-stagecpu-no-f8
    (_stage_cpu's tp_ledger without ctx.work.tp_gather_bytes) lived through the planner's fast tier (no test
    plans float8 on shared cores)."""
    import dataclasses

    from hybrid.planner import Cluster, Layout
    from hybrid.planner.hardware import Collective, GpuKind, hardware, wire_bytes
    from hybrid.planner.time import _stages
    per_byte = 1e-9
    hw = dataclasses.replace(hardware(GpuKind.H100_80G), gpus_per_node=8, compute_units=2,
                             comm_cpu_s_per_byte=per_byte)
    cluster, layout = Cluster(gpus=8, hw=hw), Layout(tp=2, pp=2, dp=2, micro_batch=2, sequence_parallel=True)
    bf16, f8 = (_stages(_fp8_llama(float8_tp_gathers=g), cluster, layout).cpu for g in (False, True))
    saved = 4 * wire_bytes(Collective.ALL_GATHER, 2 * 128 * 64 * 1, 2) * per_byte
    for side in ("forward", "backward"):
        assert [a - b for a, b in zip(getattr(bf16, side), getattr(f8, side))] == pytest.approx([saved] * 2,
                                                                                                  rel=1e-6)


# --- E: inputs18's MetricsWriter opening its files at the first record (hybrid/metrics/writer.py) ---------------------
def test_the_metrics_writer_opens_its_file_once_at_the_first_record(tmp_path):
    """Nothing is created before the first record (a refused resume leaves no file); the first record opens the
    file and every later one appends through that same handle -- one open file for the run, not one a record
    (a run logging every step for 100k steps would run out of file descriptors). E10-writer-reopens (_open not
    clearing the paths: every record opened the file again, and a TensorBoard writer with it) lived through
    test_inputs18_*.py (the refused resume writes no record at all)."""
    import json

    from hybrid.metrics.writer import MetricsWriter
    path = tmp_path / "m.jsonl"
    w = MetricsWriter(None, str(path), enabled=True)
    assert not path.exists()
    w.write(1, {"lm_loss": 3.0})
    first = w.file
    for it in (2, 3):
        w.write(it, {"lm_loss": 3.0 - it / 10})
        assert w.file is first
    w.close()
    assert [json.loads(line)["iteration"] for line in path.read_text().splitlines()] == [1, 2, 3]
    off = MetricsWriter(None, str(tmp_path / "rank1.jsonl"), enabled=False)  # not rank 0: nothing, ever
    off.write(1, {"lm_loss": 3.0})
    off.close()
    assert not (tmp_path / "rank1.jsonl").exists()


# --- E: inputs18's planner refusals (hybrid/planner/cli.py check_outputs) ---------------------------------------------
@pytest.mark.parametrize("flag", ["--hardware", "--plot"])
def test_a_blank_path_is_refused_as_an_empty_one(flag, capsys, monkeypatch):
    """`--hardware "$HW "` or a quoted blank is no file name either: the same one line as an empty value, before
    the search (a blank --hardware was planned as a file name ' ' -- 'cannot read a profile' at best; a blank --plot
    was written after the search). E12-empty-strip (check_outputs testing value == "" instead of a blank value)
    lived through test_inputs18_*.py, which passes "" only."""
    from hybrid.planner import cli as plan_cli
    monkeypatch.setattr(plan_cli, "search", lambda *a, **k: pytest.fail("searched with a blank " + flag))
    assert plan_cli.main(["--model", "gpt2", "--gpus", "8", "--global-batch-size", "64", flag, "  "]) == 2
    err = capsys.readouterr().err
    assert err == f"hybrid plan: error: {flag} is empty; give a value or omit the flag\n"


# --- F: the subjects of the suite's cheaper tests (hybrid/checkpoint/run.py) ------------------------------------------
@pytest.mark.parametrize("saved_dp, load_rng, restored", [(2, True, True), (1, True, False), (2, False, False)])
def test_a_resume_restores_the_rng_streams_on_the_saved_layout_only(monkeypatch, saved_dp, load_rng, restored):
    """RunCheckpoints._load asks the checkpoint core for the RNG streams (statefuls(..., rng_too=True)) when the
    layout is the saved one and --no-load-rng is not given, and says so on the resumed line otherwise; the
    optimizer state is loaded in every case here. The core is replaced by a recorder: no process group, no
    files. F5-resume-no-rng (rng always False) lived through test_explain's fast tier (its chained runs draw no
    dropout: the resumed run's losses equal the uninterrupted one's either way), test_checkpoint's and
    test_dropout's (29 passed); only test_explain's slow docs/operations.md log caught it."""
    from hybrid.checkpoint import run as ckpt_run
    from hybrid.checkpoint.args import CheckpointConfig

    asked, lines = {}, []

    class Core:
        @staticmethod
        def statefuls(opt, names, rng, optim=True, rng_too=True):
            asked.update(optim=optim, rng_too=rng_too)
            return {}

        @staticmethod
        def load_state(owners, path, pg):
            return {"iteration": 3, "consumed_samples": 24}

    layout = {"tp": 1, "pp": 1, "dp": 2, "zero": 0}
    monkeypatch.setattr(ckpt_run, "_core", lambda: Core)
    monkeypatch.setattr(ckpt_run, "_log", lines.append)
    monkeypatch.setattr(ckpt_run.store, "read_state",
                        lambda path: {"model": "tiny-gpt2", "layout": dict(layout, dp=saved_dp)})
    run = object.__new__(ckpt_run.RunCheckpoints)
    run.cfg = CheckpointConfig(load="ck", load_rng=load_rng)
    run.info, run.opt, run.names, run.rng, run.owners, run.pg = {"model": "tiny-gpt2", "layout": layout}, None, {}, \
        None, {}, None
    assert run._load("ck/iter_0000003") == (3, 24)
    assert asked == {"optim": True, "rng_too": restored}
    assert ("RNG not restored" in lines[-1]) is not restored, lines
