"""Round 18's outside mutation review of round 17's new code: 57 one-line bugs planted on purpose in the planner's
TP plan (planner17a), the fault points, torn-record cut, finiteness and counter checks (trust17), the new-user
refusals (newuser17), the subjects of the suite helpers' cheaper tests and the CPU Adam build-lock skip; the area's
fast tier run on each. Each test here kills a mutant that tier let live, shown failing on the mutant and passing on
HEAD. In-process, no process group.

The mutant ids (PL2-gelu-five, ...) are those of branch mutation18's report and of docs/architecture.md's tally."""

from __future__ import annotations

import dataclasses

import pytest
import torch


# --- planner17a: Workload.tp_plan (hybrid/planner/predicted_comm.py, time.py) ----------------------------------------
def _tiny_gpt2(plan):
    from hybrid.planner import ActivationProfile, Precision, Workload
    from hybrid.planner.ops import KernelProfile
    from models import PRESETS
    return Workload(PRESETS["tiny-gpt2"], global_batch=16, seq_length=128, precision=Precision.FP32,
                    activations=ActivationProfile.FP32_FLASH, kernels=KernelProfile.EAGER, tp_plan=plan)


def _shared_cpu(**fields):
    """A 2-core CPU of 8 gloo ranks (the README main job's machine) with the given gloo CPU costs."""
    from hybrid.planner.hardware import GpuKind, hardware
    return dataclasses.replace(hardware(GpuKind.CPU), gpus_per_node=8, compute_units=2, **fields)


def test_a_gelu_layer_gathers_four_inputs_under_the_projection_plan():
    """GPT-2's MLP has one up projection (GELU: c_fc), so a layer's column-parallel inputs under PROJECTION are q,
    k, v and up: 4, where SwiGLU's gate and up make Llama's 5. PL2-gelu-five (tp_gathers returning 5 whatever the
    MLP) lived through the planner's fast tier: test_planner17_tp_plan checks a Llama shard only (with PL7 and PL8
    applied together: 588 passed over test_planner*.py and the other planner files, and the slow KempnerForge /
    families tests: 3 passed)."""
    from hybrid.planner.layout import TpPlan
    from hybrid.planner.predicted_comm import tp_gathers
    shard = _tiny_gpt2(TpPlan.PROJECTION).shard(2)
    assert (tp_gathers(shard, TpPlan.BLOCK), tp_gathers(shard, TpPlan.PROJECTION)) == (2, 4)


def test_the_step_ledger_and_its_gloo_cpu_count_the_plans_extra_reductions():
    """comm_cpu_seconds prices every entry of predicted_comm.step_ledger (the ledger test_planner_runtime checks
    against the runtime's): at the main job's tp 2 x pp 2 x dp 2 without SP, a GELU layer under PROJECTION
    all-reduces 4 input gradients in the backward where BLOCK reduces 2 -- 2 more pair all-reduces (c each) a
    layer, over m = 4 micro-batches of 2 layers a stage: 16 c a step. PL7-ledger-no-plan (step_ledger not passing
    work.tp_plan to tp_ledger) lived through the planner's fast tier (no test priced a PROJECTION step's ledger)."""
    from hybrid.planner import Cluster, Layout
    from hybrid.planner.layout import TpPlan
    from hybrid.planner.time import comm_cpu_seconds
    c = 1e-3
    cluster, layout = Cluster(gpus=8, hw=_shared_cpu(collective_cpu_s=c)), Layout(tp=2, pp=2, dp=2, micro_batch=2)
    for rank in (0, 1):
        block, projection = (comm_cpu_seconds(_tiny_gpt2(p), cluster, layout, rank) for p in TpPlan)
        assert projection - block == pytest.approx(4 * 2 * 2 * c, rel=1e-9)


def test_the_shared_core_stage_cpu_counts_the_plans_extra_reductions():
    """The shared-core bound's per-stage CPU seconds (time._stage_cpu: compute + TP collectives' CPU + messages)
    of one micro-batch: 2 layers a stage at tp 2 without SP, the backward pays 2 more pair all-reduces a layer
    under PROJECTION (4 c), the forward the same. PL8-stage-cpu-no-plan (_stage_cpu's tp_ledger without
    ctx.work.tp_plan) lived through the planner's fast tier (test_calibrate_cpu's shared-core tests plan BLOCK)."""
    from hybrid.planner import Cluster, Layout
    from hybrid.planner.layout import TpPlan
    from hybrid.planner.time import _stages
    c = 1e-3
    cluster, layout = Cluster(gpus=8, hw=_shared_cpu(collective_cpu_s=c)), Layout(tp=2, pp=2, dp=2, micro_batch=2)
    block, projection = (_stages(_tiny_gpt2(p), cluster, layout).cpu for p in TpPlan)
    assert projection.forward == pytest.approx(block.forward, rel=1e-12)
    assert [p - b for p, b in zip(projection.backward, block.backward)] == pytest.approx([4 * c, 4 * c], rel=1e-9)


# --- trust17: the one fault hook (hybrid/fault_hook.py) ------------------------------------------------------------
def test_a_crash_fault_fires_on_its_own_rank_only_and_iteration_0_means_every_save(monkeypatch):
    """crash:point=P,rank=R fires in the process whose RANK is R, not in rank 0's; a fault without iteration=
    fires in the save of every iteration. TR1-rank-zero (crash_point reading RANK as 0) and TR2-iteration-exact
    (iteration 0 matching only a save of iteration 0) lived through the trust fast tier (its kill tests arm every
    rank, test_checkpoint_kill's rank / iteration cases are slow launches): with the other trust survivors applied
    together (TR8-TR14), 376 passed over test_trust*.py and test_checkpoint_kill's fast tier. Slow: TR1 fails
    test_checkpoint_kill's rank-1 kill launch (rank 1 not killed); TR2 and the others pass its slow tests (8)."""
    from hybrid.fault_hook import SimulatedCrash, crash_point
    monkeypatch.setenv("HYBRID_FAULT", "crash:point=after_data,rank=1")
    monkeypatch.setenv("RANK", "0")
    crash_point("after_data", 4)  # rank 0: not this fault's rank
    monkeypatch.setenv("RANK", "1")
    for iteration in (3, 4):  # no iteration=: every save
        with pytest.raises(SimulatedCrash):
            crash_point("after_data", iteration)


# --- trust17: the torn metrics record (hybrid/metrics/writer.drop_torn_record) ---------------------------------------
@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
def test_only_the_bytes_after_the_last_newline_are_cut_at_any_read_size(tmp_path, chunk):
    """Three whole records and a torn one: the cut keeps all three, whatever size the backwards scan reads; a
    file with no newline at all (not a file a run wrote) is left as it is. TR4-first-newline (rfind -> find: the
    chunk's first newline, cutting whole records) lived through test_trust17_kill_writers, whose file holds one
    whole record before the torn one; TR6-no-newline-cut (0 <= at: a file without a newline cut to nothing) too --
    the two together: 382 passed over test_trust*.py, test_checkpoint_kill and test_data_metrics' fast tier."""
    from hybrid.metrics.writer import drop_torn_record
    whole = "".join(f'{{"iteration": {i}, "lm_loss": {5 - i}.0}}\n' for i in (1, 2, 3))
    path = tmp_path / "m.jsonl"
    path.write_text(whole + '{"iteration": 4, "lm_lo')
    drop_torn_record(str(path), chunk)
    assert path.read_text() == whole
    drop_torn_record(str(path), chunk)  # nothing torn: nothing cut
    assert path.read_text() == whole
    path.write_text('{"iteration": 1, "lm_lo')
    drop_torn_record(str(path), chunk)
    assert path.read_text() == '{"iteration": 1, "lm_lo'


# --- trust17: train_tokenizer's crash points (hybrid/data/train_tokenizer.train) -----------------------------------
def test_the_tokenizers_first_renamed_point_has_exactly_one_final_file(tmp_path, monkeypatch):
    """crash:point=tokenizer_first_renamed sits after the first of the three renames (docs/operations.md's table
    of crash points: one file in place, the other two not) -- the state test_trust17_kill_writers reads. In this
    process (SimulatedCrash, no signal): tokenizer_config.json alone is final. TR8-second-rename (the point after
    the second rename: two final) lived through the trust fast tier (tokenizer.json is absent either way)."""
    from hybrid.data.train_tokenizer import train
    from hybrid.fault_hook import SimulatedCrash
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog " * 20)
    monkeypatch.setenv("HYBRID_FAULT", "crash:point=tokenizer_first_renamed")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SimulatedCrash):
        train([str(tmp_path / "text.txt")], 300, str(tmp_path / "tok"))
    finals = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    assert set((tmp_path / "tok").iterdir()) & {tmp_path / "tok" / n for n in finals} == \
        {tmp_path / "tok" / "tokenizer_config.json"}


# --- trust17: finite compression / DiLoCo tensors after a DCP read (hybrid/checkpoint/core._check_finite) -----------
class _Gathered:
    """A group stand-in whose all_gather_object answers every rank's verdict (in-process: no process group)."""

    def __init__(self, others: list) -> None:
        self.others = others

    def all_gather_object(self, obj):
        return [obj, *self.others]


def _refused(own: dict, others: list, monkeypatch) -> str:
    from types import SimpleNamespace
    from hybrid.checkpoint import core, safe_read, store
    monkeypatch.setattr(safe_read, "read_metadata", lambda d: SimpleNamespace(storage_data={}))
    try:
        core._check_finite(own, "/ckpt/iter_0000005", _Gathered(others))
    except store.CorruptCheckpoint as e:
        return str(e)
    return ""


def test_an_inf_or_a_nan_diloco_tensor_is_refused_and_every_rank_refuses_a_peers_verdict(monkeypatch):
    """An inf error feedback is as fatal as a NaN one (every later step adds it in); DiLoCo's outer state ("diloco."
    owners: anchor, outer momentum) is checked like compression's; and a rank whose own tensors are finite refuses
    too when a peer found one that is not (the verdict is gathered: a rank raising alone would leave the others in
    the next collective). TR9-nan-only (isnan: inf loaded), TR10-no-diloco (CHECKED_FINITE without "diloco.") and
    TR11-no-gather (the rank's own verdict only) lived through test_trust17_compress_state (a NaN PowerSGD error
    feedback on one rank)."""
    clean = {"compress/": {"error": torch.zeros(4)}, "diloco.": {"anchor": torch.zeros(4)}}
    assert _refused(clean, [None], monkeypatch) == ""
    inf = {"compress/": {"error": torch.tensor([0.0, float("inf")])}}
    assert "compress/error holds NaN or inf" in _refused(inf, [None], monkeypatch)
    nan = {"diloco.": {"anchor": torch.tensor([float("nan")])}}
    assert "diloco.anchor holds NaN or inf" in _refused(nan, [None], monkeypatch)
    assert "diloco.momentum holds NaN or inf" in _refused(clean, [None, "diloco.momentum"], monkeypatch)


# --- trust17: state.json's compression counters (hybrid/checkpoint/store._check_counters) --------------------------
@pytest.mark.parametrize("value,named", [({"iter": 5, "dp": 2, "tp": 1, "pp": 1, "rank": 2, "extra": 1},
                                          "compress/powersgd"),
                                         ({"iter": 5, "dp": 2, "tp": True, "pp": 1, "rank": 2},
                                          "compress/powersgd.tp")], ids=["extra-key", "bool"])
def test_a_counter_object_with_another_key_or_a_boolean_is_refused(tmp_path, value, named):
    """Exactly the owner's fields, each an integer -- JSON's true is not one (Python's bool is an int).
    TR13-subset-keys (extra keys accepted) and TR14-isinstance (true taken as 1) lived through
    test_trust17_compress_state."""
    import json
    from hybrid.checkpoint import store
    d = tmp_path / "iter_0000005"
    d.mkdir()
    (d / "state.json").write_text(json.dumps({"iteration": 5, "consumed_samples": 40, "model": "tiny-gpt2",
                                              "contents": "model", "format": store.FORMAT,
                                              "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0},
                                              "compress/powersgd": value}))
    with pytest.raises(store.CorruptCheckpoint) as e:
        store.read_state(str(d))
    assert str(e.value).startswith(f"{d}/state.json: {named} is "), e.value


# --- the CPU Adam build-lock skip, for every op it guards (hybrid/zero/cpu_adam_build._loaded_from) ------------------
@pytest.mark.parametrize("name", ["deepspeed_shm_comm", "fused_adam"])
def test_another_op_loaded_from_its_build_takes_no_build_lock(tmp_path, monkeypatch, name):
    """cpu_adam_build(name=...) guards the first load of every DeepSpeed op of DEEPSPEED_OPS (load_op): a process
    that has that op loaded from the build constructs it without the lock another process holds. CA3-cpu-adam-only
    (the cache looked up under CPU Adam's name whatever `name`: the shared-memory collectives and FusedAdam queued
    behind every holder again) lived through test_zero17_cpu_adam_lock (CPU Adam only) and test_trust (317 passed)."""
    import fcntl
    import threading
    import types
    builder = pytest.importorskip("deepspeed.ops.op_builder.builder")
    from hybrid.zero.cpu_adam_build import cpu_adam_build
    build = tmp_path / name
    build.mkdir()
    monkeypatch.setattr("hybrid.zero.cpu_adam_build._prebuilt", lambda name="cpu_adam": False)
    monkeypatch.setitem(builder.OpBuilder._loaded_ops, name, types.SimpleNamespace(__file__=str(build / f"{name}.so")))
    monkeypatch.delitem(builder.OpBuilder._loaded_ops, "cpu_adam", raising=False)

    def body() -> None:
        with cpu_adam_build(log=lambda _: None, directory=str(build), name=name):
            pass
    with open(build / "hybrid.flock", "a") as held:  # another holder
        fcntl.flock(held, fcntl.LOCK_EX)
        t = threading.Thread(target=body, daemon=True)
        t.start()
        t.join(timeout=30)
        alive = t.is_alive()
        fcntl.flock(held, fcntl.LOCK_UN)
    t.join(timeout=30)
    assert not alive, f"{name} loaded from its build: no wait for the lock"


# --- newuser17: the run's other outputs inside a checkpoint (hybrid/checkpoint/args.enclosing_iteration) ------------
def test_an_output_through_a_link_into_an_iteration_folder_is_refused(tmp_path, monkeypatch):
    """A link hides nothing: `out` -> ck/iter_0000002/sub makes --timeline out/t.json a file of iteration 2 (which a
    later save replaces and --save-keep deletes). The walk up goes over the real path: sub, then iter_0000002.
    NU1-abspath (the walk over the path as given: out, then the run's folder) lived through the newuser fast tier
    (its outputs are plain paths; iteration_dir resolves the link only of the folder it is handed): with NU5, 1015
    passed over the 27 newuser / inputs / DiLoCo files' fast tier, 4 passed of their slow tests."""
    from hybrid.checkpoint.args import check_other_outputs, enclosing_iteration
    (tmp_path / "ck" / "iter_0000002" / "sub").mkdir(parents=True)
    (tmp_path / "ck" / "latest").write_text("2")
    (tmp_path / "out").symlink_to(tmp_path / "ck" / "iter_0000002" / "sub")
    assert enclosing_iteration(str(tmp_path / "out")) == (str(tmp_path / "ck"), 2)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"^--timeline 'out/t.json' is inside iteration 2 of the checkpoint"):
        check_other_outputs(None, {"--timeline": "out/t.json"})


# --- newuser17: a DeepSpeed JSON's keys (hybrid/zero/ds_config._check_section_keys) ---------------------------------
def test_a_data_types_key_deepspeed_ignores_is_warned_not_refused(tmp_path):
    """data_types is read by DeepSpeed with dict.get (no pydantic model forbidding extras): a key train.py does not
    read there is one DeepSpeed ignores too -- warned (unsupported), never refused as a misspelling. NU5-data-types-
    refused (DEEPSPEED_SECTION_KEYS.get(key, set()): every section checked, data_types against an empty list) lived
    through the newuser fast tier (its DeepSpeed keys are in the pydantic sections)."""
    import json
    from hybrid.zero.ds_config import read_deepspeed_config
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 1},
                              "data_types": {"grad_accum_dtype": "fp32", "params_dtype": "bf16"}}))
    assert read_deepspeed_config(str(ds)).unsupported == ["data_types.params_dtype"]
