"""Round 17's outside mutation review of round 16's new code: ~50 one-line bugs planted on purpose in MoE with
context parallelism, DiLoCo with ZeRO-3 / CP / MoE, the trust fixes, the planner's ZeRO 3 copies term and the
families report, the area's fast tier run on each; each test here kills a mutant that tier let live (or killed only
in a multi-rank launch), shown failing on the mutant and passing on HEAD. In-process, no process group.

The mutant ids (PF1-ways-no-cp, ...) are those of branch mutation17's report and of docs/architecture.md's tally."""

from __future__ import annotations

import pytest
import torch


# --- planner16b's families report (hybrid/planner/families.py) -------------------------------------------------------
def _family_row(error, role=None, gpus=8, tp=1, pp=1, cp=1, zero=3, card="A100", seq=2048, fp8=False,
                family="MosaicML llm-foundry (Composer, FSDP1)"):
    from hybrid.planner.families import FamilyRow
    from hybrid.planner.published import Role
    return FamilyRow("r", family, card, gpus, tp, pp, cp, gpus // (tp * pp * cp), zero, role or Role.CHECK, error,
                     "" if error is not None else "does not fit", seq, fp8)


def test_families_a_cp_row_counts_cp_as_a_way_and_divides_its_dp_by_cp():
    """A CP row (DGXC's cp 2 rows) is a 4-way layout at tp, pp, cp, dp > 1 and a 3-way one at dp 1, and plan_row
    gives it dp = gpus / (tp pp cp). PF1-ways-no-cp (cp left out of `ways`: the CP rows counted one way short, in
    the 2/3/4-way slices) and PF4-dp-no-cp (dp = gpus / (tp pp): cp x too large in the misses' lines) lived through
    test_planner16_families' fast tier."""
    from hybrid.planner.families import all_published_runs, plan_row
    from hybrid.planner.published_more import Result
    assert _family_row(0.0, gpus=128, tp=8, pp=4, cp=2).ways == 4
    assert _family_row(0.0, gpus=64, tp=8, pp=4, cp=2).ways == 3
    run = next(r for r in all_published_runs() if getattr(r, "cp", 1) > 1)
    row = plan_row(run, evaluate=lambda r: Result(r, rejected="over memory"))  # the layout the row states
    assert row.cp == run.cp > 1 and row.dp * row.tp * row.pp * row.cp == run.gpus


def test_families_slices_hold_their_bounds_inclusive():
    """Issue 26's kinds at their edges: pipelines at exactly 2,000 and 3,400 GPUs are in the first slice (1,999
    and 3,401 not); an FSDP slice takes pp 1 only; H100 bf16 at s = 4096 is in "s <= 4096", not in "FP8 or
    s > 4096". PF2-pipe-low-strict (2,000 left out), PF3-fsdp-any-pp (pipelined ZeRO 3 rows counted as FSDP) and
    PF7-seq-strict (s = 4096 moved to the long-sequence slice: every 4k torchtitan row) lived through
    test_planner16_families' fast tier."""
    from hybrid.planner.families import SLICES
    by = dict(SLICES)
    first = by["Megatron / DeepSpeed / NeMo pipelines at 2,000-3,400 GPUs"]
    meg = "Megatron-LM (Narayanan 2021, Korthikanti 2022)"
    assert [first(_family_row(0.0, gpus=g, tp=1, pp=2, zero=1, family=meg)) for g in (1998, 2000, 3400, 3402)] == \
        [False, True, True, False]
    fsdp_a100 = by["FSDP (ZeRO 3) at 8-64 GPUs, no TP, A100 (80 and 40 GB)"]
    assert fsdp_a100(_family_row(0.0, gpus=8)) and not fsdp_a100(_family_row(0.0, gpus=8, pp=2))
    short, long_ = by["... of which bf16 at s <= 4096"], by["... of which FP8 or s > 4096"]
    h100 = dict(gpus=16, card="H100", family="torchtitan (FSDP2, DTensor TP / PP)")
    assert short(_family_row(0.0, seq=4096, **h100)) and not long_(_family_row(0.0, seq=4096, **h100))
    assert long_(_family_row(0.0, seq=8192, **h100)) and long_(_family_row(0.0, seq=4096, fp8=True, **h100))


def test_families_stats_count_rejected_check_rows_only_and_misses_both_signs():
    """A FIT row the planner rejects is not a rejected check row (stats' last cell counts the check rows'
    "published layouts predicted not to fit"); the misses list a pessimistic row (-30 %) as well as an optimistic
    one. PF5-rejected-all (FIT rows counted) and PF6-miss-signed (only + errors beyond the band listed) lived
    through test_planner16_families' fast tier."""
    from hybrid.planner.families import misses, stats
    from hybrid.planner.published import Role
    assert stats([_family_row(0.10), _family_row(None, role=Role.FIT)]).endswith("| 1 of 1 | 0")
    rows = [_family_row(-0.30), _family_row(0.30), _family_row(0.05)]
    assert len(misses(rows, lambda r: True).splitlines()) == 2 and "-30.0 %" in misses(rows, lambda r: True)


def test_families_reference_rows_error_is_predicted_over_published(monkeypatch):
    """shared/reference's Narayanan rows take the same sign as every other row: predicted / published - 1,
    positive when the planner is optimistic. PF8-naray-flip (published / predicted - 1) lived through
    test_planner16_families' fast tier. The reference's planning is replaced by a stub plan (in-process, no search)."""
    from types import SimpleNamespace
    from hybrid.planner import families, reference
    row = reference.megatron_rows()[0]
    plan = SimpleNamespace(tflops_per_gpu=1.25 * row.tflops_per_gpu, layout=SimpleNamespace(zero=1))
    monkeypatch.setattr(reference, "megatron_rows", lambda: [row])
    monkeypatch.setattr(reference, "predict_published", lambda r: plan)
    (got,) = families.narayanan_reference_rows()
    assert got.error == pytest.approx(0.25)


# --- trust16's state.json owner values (hybrid/checkpoint/store.py) ---------------------------------------------------
def _state_dir(tmp_path, **extra) -> str:
    """A checkpoint folder iter_0000002 holding only a state.json with the fields read_state requires (a model-only
    save: no scaler), plus `extra`."""
    import json
    import os
    d = tmp_path / "iter_0000002"
    d.mkdir(exist_ok=True)
    state = {"iteration": 2, "consumed_samples": 8, "model": "tiny-gpt2", "contents": "model",
             "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0}, **extra}
    (d / "state.json").write_text(json.dumps(state))
    return os.fspath(d)


@pytest.mark.parametrize("value, ok", [(-1, True), (0, True), (3, True), (-2, False), (True, False), (1.0, False)])
def test_diloco_inflight_in_state_json_is_minus_one_or_a_fragment(tmp_path, value, ok):
    """DiLoCo's fragment in flight is -1 (none) or a fragment index; -2 (or a bool, a float) is refused by name.
    TR11-inflight-lt (the bound moved to -2: a forged -2 read as a fragment index, Python's second-from-last
    fragment) lived through test_trust16_readers, test_trust16_writers, test_trust and test_checkpoint_kill (355
    passed on the mutant): their only case is the string "x"."""
    from hybrid.checkpoint import store
    d = _state_dir(tmp_path, **{"diloco.inflight": value})
    if ok:
        assert store.read_state(d)["diloco.inflight"] == value
    else:
        with pytest.raises(store.CorruptCheckpoint, match="diloco.inflight is .*expected an integer >= -1"):
            store.read_state(d)


# --- MoE x CP with TP + SP: the routing counts over the tp_cp group (hybrid/moe/layer.py) ----------------------------
def _tp_sp_layer(mc, tp_group, cp, tp_cp):
    """test_cpmoe16_units' block (4 experts, top 2, h 8, seeded) at tp 2 with sequence parallelism, its TP group,
    CP group and TP x CP group stand-ins (groups that add the other ranks' values)."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from hybrid.moe.layer import ExpertContext, MoELayer
    from hybrid.tp.sharding import REPLICATED
    from test_cpmoe16_units import E, H, K
    cfg = SimpleNamespace(num_experts=E, hidden_size=H, moe_ffn_hidden_size=16, moe_top_k=K,
                          moe_router_pre_softmax=True, moe_norm_topk_prob=True, moe_shared_expert_gate=False)
    tp = SimpleNamespace(size=2, sequence_parallel=True, replicated_spec=lambda: REPLICATED, group=tp_group)
    torch.manual_seed(0)
    layer = MoELayer(cfg, tp, ExpertContext(mc, cp=cp, tp_cp=tp_cp), F.silu).train()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return layer


@pytest.mark.parametrize("kind", ["aux_loss", "seq_aux_loss"])
def test_tp_sp_x_cp_counts_are_summed_once_over_tp_cp_and_the_shares_sum_to_the_whole(kind):
    """tp 2 (SP) x cp 2: each of the 4 ranks holds a quarter of every sequence; its balancing-loss share takes the
    counts of all four quarters, in one all-reduce over Mesh.tp_cp, and the 4 shares sum to the unsharded block's
    loss (as test_cpmoe16_units checks at tp 1, where tp_cp is never used). MC4-tpcp-as-tp (the TP group in place
    of tp_cp: only the TP peer's counts) lived through test_cpmoe16_units; only test_cpmoe16_parallel's 4-rank
    launch caught it. Bound: fp32 sums in another order, 1e-6 relative (test_cpmoe16_units')."""
    from hybrid.moe.config import LoadBalancing, MoEConfig
    from test_cpmoe16_units import E, H, _Adds, _counts, _layer
    mc = MoEConfig(load_balancing=LoadBalancing(kind), aux_loss_coeff=0.1)
    x = torch.randn(2, 8, H, generator=torch.Generator().manual_seed(4))
    full = _layer(mc)
    full(x)
    per_seq = kind == "seq_aux_loss"
    zeros = torch.zeros((2, E) if per_seq else E)
    tp_group, cp, tp_cp = _Adds(zeros.clone()), _Adds(zeros.clone()), _Adds(zeros.clone(), size=4)
    layer = _tp_sp_layer(mc, tp_group, cp, tp_cp)
    quarters = [torch.tensor([0, 7]), torch.tensor([1, 6]), torch.tensor([2, 5]), torch.tensor([3, 4])]
    for j, idx in enumerate(quarters):  # rank j = tp + 2 cp: its TP peer j ^ 1, its CP peer j ^ 2
        tp_cp.other = sum(_counts(layer, x[:, quarters[i]], per_seq) for i in range(4) if i != j)
        tp_group.other = _counts(layer, x[:, quarters[j ^ 1]], per_seq)
        cp.other = _counts(layer, x[:, quarters[j ^ 2]], per_seq)
        layer(x[:, idx])
    assert full.stat_aux > 0 and abs(layer.stat_aux - full.stat_aux) < 1e-6 * full.stat_aux
    assert (tp_cp.calls, tp_group.calls, cp.calls) == (4, 0, 0)


def test_expert_context_takes_the_meshs_tp_cp_group():
    """train.loop.expert_context hands the MoE block the mesh's CP and TP x CP groups. MC9-no-tpcp-ctx (tp_cp left
    None in train.py's runs: the counts summed over TP, then over CP -- the same values, integer counts summed
    exactly, but two all-reduces a MoE layer in place of one) lived through the fast and slow tiers:
    test_cpmoe16_parallel's ledger count builds its own ExpertContext (run: 3 passed on the mutant), and
    test_cpmoe16_train runs train.py at tp 1, where tp_cp is None anyway."""
    from types import SimpleNamespace

    from hybrid.moe.config import MoEConfig
    from hybrid.train.loop import expert_context
    mesh = SimpleNamespace(ep=None, etp=None, cp=object(), tp_cp=object())
    ctx = expert_context(SimpleNamespace(moe=MoEConfig()), mesh)
    assert ctx.cp is mesh.cp and ctx.tp_cp is mesh.tp_cp


# --- trust16: convert reads every .safetensors file of SRC (hybrid/convert/common.py) ---------------------------------
def test_a_tensor_outside_the_file_its_index_names_is_refused(tmp_path):
    """The index names b.safetensors for tensor w, but w is in a.safetensors only (b holds another tensor): DCP's
    reader, which reads every file of the folder, would take a's w silently. TR3-one-copy-owner (only a tensor seen
    twice refused, the owner test dropped) lived through test_trust16_readers, test_trust16_writers, test_trust
    and test_convert (382 passed on the mutant), whose stray file always repeats a tensor of the checkpoint."""
    from safetensors.torch import save_file

    from hybrid.convert.common import check_one_copy_each
    save_file({"w": torch.ones(2)}, str(tmp_path / "a.safetensors"))
    save_file({"v": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    owner = {"w": "b.safetensors", "v": "b.safetensors"}
    with pytest.raises(ValueError, match="tensor w is in a.safetensors and in b.safetensors"):
        check_one_copy_each(str(tmp_path), owner)
    check_one_copy_each(str(tmp_path), {"w": "a.safetensors", "v": "b.safetensors"})  # as the index says: taken


# --- diloco16: the outer state on the memory ledger (hybrid/diloco/outer.py) ------------------------------------------
@pytest.mark.parametrize("tau, copies", [(0, 2), (1, 3)])
def test_diloco_outer_state_bytes_count_the_in_flight_delta_buffers(tau, copies):
    """DiLoCo.state_bytes: theta and the outer momentum, fp32 copies of the rank's master segments, plus with an
    overlapped sync (tau > 0) each fragment's flat delta buffer -- 3 copies. DL7-state-bytes-no-flat (the buffers
    left out) lived through test_diloco16_compose's outer-state, streaming and overlap tests (3 passed on the
    mutant): the only test reading the bytes checks them at tau 0. A stand-in ZeRO optimizer of two segments (16
    floats), no process group."""
    from types import SimpleNamespace

    from hybrid.comm import Group
    from hybrid.diloco.args import DiLoCoConfig
    from hybrid.diloco.outer import DiLoCo
    views = [torch.zeros(6), torch.zeros(10)]
    zero = SimpleNamespace(units=[SimpleNamespace(views=views)], wait_params=lambda: None,
                           cfg=SimpleNamespace(offload_optimizer=False))
    cfg = DiLoCoConfig(inner_steps=4, fragments=2, fragment_sync_delay=tau)
    outer = DiLoCo(cfg, zero, Group.solo("diloco"))
    assert outer.state_bytes() == copies * 4 * 16
    assert outer.state_ledger().bytes() == copies * 4 * 16
