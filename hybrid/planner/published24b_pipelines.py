"""Round 24 (planner24b, issue 26): the H100 pipelines at scale outside the band -- Nemotron-4 340B's two rows planned
with the 340B's own NeMo config, and what the GPT-3 175B and Oracle rows do and do not have.

    python -m hybrid.planner.published24b_pipelines      # the tables of docs/planner/round24-pipelines.md

**Nemotron-4 340B, as its config states (landed).** NVIDIA/NeMo-Framework-Launcher holds the 340B's pretraining
config, launcher_scripts/conf/training/nemotron/nemotron_340b.yaml: added by 80ca669d ("add dataprep script add
pretraining script", 2024-06-17, the week the 340B was released), set by 7c842fcd the same day to "actual GPU/GBS
numbers used in pretraining" -- `num_nodes: 768` (6,144 GPUs) and `global_batch_size: 2304`, the report's last stage
-- and unchanged in every setting read here until 3dd35614 (2024-12-05, Megatron-core's optimizer); read at tag
24.07 (8325688d, 2024-08-01). It states (line numbers at 24.07): t 8 (:60), p 12 (:61), **v 8** (:62), b 1 (:56),
`activations_checkpoint_granularity: selective` (:122), `overlap_p2p_comm: False` with `batch_p2p_comm: True`
(:135-136: Megatron's interleaved schedule waits on each chunk's batched send / receive), `ub_tp_comm_overlap: False`
(:156), `fp8_hybrid: True`, `fp8_amax_history_len: 1024` (:150, :153: TE's delayed scaling where fp8 is on),
`distributed_fused_adam` (:159, ZeRO 1) with `grad_sync_dtype: bf16` (:161), `dtype: bf16` (:162: apex's optimizer
states -- master copy and both moments -- in bf16) and `overlap_grad_sync: True` (:163), dropout 0 (:71).

* The production row (published16.nemotron4_340b_run, 6,144 H100, bf16: the config's `fp8: False`) is that run: it
  now plans every setting above, v 8 included (the planner picked v 3).
* NeMo 24.07's Nemotron-340B FP8 row (published_more, 128 H100, t 8 p 8 v 12, b 1, GBS 32) states only its layout.
  Its settings are the same file's: dgxc-benchmarking v24.11.1's nemotron/nemotron4-340b-synth.yaml (35a9aec) is this
  config with that row's layout (t 8 p 8 v 12, b 1) and the same settings line for line (selective :138, blocking
  p2p :151-152, `ub_tp_comm_overlap: False` :172, `grad_sync_dtype: bf16` :185, `dtype: bf16` :186,
  `overlap_grad_sync: True` :187), and its FP8 128-GPU column publishes 3.16 s a step where NeMo's row gives
  32 x 4096 / (326 x 128) = 3.14 s. The planner's picks (4-byte optimizer states) cannot fit the layout at dp 2
  without recomputing the MLP (selective-op: 87.0 GB without), which is the row's -22.2 %.

Nothing else changes: no constant, no planner term (Workload.optimizer_dtype_bytes, PipelineP2P.BLOCKING,
Recompute.SELECTIVE, Fp8Scaling.DELAYED and overlap_grad_reduce are rounds 12 / 23b's, already set on the DGXC
340B tables from the same YAML).

**Not landed, printed as what-ifs:** (1) NCCL's latency per virtual-stage hand-off (the per-chunk p2p cost the
brief asks about) charged rank-busy on every interleaved check row; (2) TE 1.x's delayed scaling (the only FP8
recipe Transformer Engine had in 2024: Float8CurrentScaling came in TE 2.2) on NeMo 24.07's other rows, whose
table states no config.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from hybrid.planner.layout import PipelineP2P, Recompute, ZeroStage
from hybrid.planner.ops import Fp8Scaling
from hybrid.planner.published import PublishedRun

BAND = 0.15  # issue 26's band
LAUNCHER_340B = ("NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/training/nemotron/nemotron_340b.yaml at tag "
                 "24.07 (8325688d; settings unchanged since 7c842fcd, 2024-06-17, 'actual GPU/GBS numbers used in "
                 "pretraining'): v 8 :62, selective :122, overlap_p2p_comm False / batch_p2p_comm True :135-136, "
                 "ub_tp_comm_overlap False :156, fp8_hybrid amax 1024 :150/:153, distributed_fused_adam "
                 "grad_sync_dtype bf16 / dtype bf16 / overlap_grad_sync :159-163")
DGXC_340B_YAML = ("dgxc-benchmarking v24.11.1 (35a9aec) nemotron/nemotron4-340b-synth.yaml: the same settings at "
                  "t8 p8 v12 b1 (:138, :151-152, :172, :185-187); its FP8 128-GPU column 3.16 s a step")
PRODUCTION_VP = 8  # nemotron_340b.yaml:62, virtual_pipeline_model_parallel_size
# NCCL's model of one network step, Simple protocol (src/graph/tuning.cc at v2.25.1-1, published23_dp's constants):
# baseLat 8.4 us + hwLat[NET][RING][SIMPLE] 14 us. A pipeline hand-off is one such step (a send / receive pair).
NCCL_NET_STEP_S = (8.4 + 14.0) * 1e-6


def as_stated(run: PublishedRun, vp: int | None = None) -> PublishedRun:
    """The 340B row with nemotron_340b.yaml's settings (module doc): bf16 optimizer states and gradients, the overlapped
    reduce-scatter, blocking pipeline messages, selective recomputation, ZeRO 1, delayed FP8 scaling where FP8; `vp`
    the config's chunks a rank where the row does not state its own."""
    work = replace(run.workload, optimizer_dtype_bytes=2, fp32_grads=False, overlap_grad_reduce=True,
                   p2p=PipelineP2P.BLOCKING,
                   fp8_scaling=Fp8Scaling.DELAYED if run.workload.fp8 else run.workload.fp8_scaling)
    space = replace(run.space, recompute=(Recompute.SELECTIVE,), zero=(ZeroStage.OPTIMIZER,),
                    **({"v": (vp,)} if vp else {}))
    return replace(run, workload=work, space=space)


def rows_340b() -> list[tuple[PublishedRun, PublishedRun]]:
    """(as planned now, with the planner's picks as before round 24) for the two rows this round sets."""
    from hybrid.planner.published16 import nemotron4_340b_run
    from hybrid.planner.published_more import (NEMO_2407_ROWS, NEMO_2407_SOURCE, _layout_name, _nemo, _nemo_models,
                                               nemo_runs)
    m, g, gbs, b, s, t, p, c, v, tok = next(r for r in NEMO_2407_ROWS if r[0] == "Nemotron-340B")
    stated_nemo = next(r for r in nemo_runs() if "Nemotron-340B" in r.name)
    picks_nemo = _nemo(stated_nemo.name, NEMO_2407_SOURCE, _nemo_models()[m], g, gbs, b, s, t, p, c, v, tok)
    assert picks_nemo.name == f"NeMo 24.07 {m} FP8, {_layout_name(g, t, p, c, v, b, gbs)}"
    return [(stated_nemo, picks_nemo), (nemotron4_340b_run(), nemotron4_340b_run(stated=False))]


def _terms(result) -> str:
    return " ".join(f"{k} {v * 1e3:.0f}" for k, v in result.plan.time.terms if abs(v) >= 5e-4)


def rows_340b_table() -> str:
    """Each 340B row with the planner's picks and as stated: layout, memory, error, the step's terms in ms."""
    from hybrid.planner.published_more import evaluate
    lines = ["| row | planned | layout | memory | error | step's terms, ms |", "|---|---|---|---|---|---|"]
    for stated, picks in rows_340b():
        for what, run in (("planner's picks (before)", picks), ("as stated (after)", stated)):
            r = evaluate(run)
            lines.append(f"| {run.name} | {what} | {r.layout} | {r.memory_gb:.1f} GB | {100 * r.error:+.1f} % | "
                         f"{_terms(r)} |")
    return "\n".join(lines)


def interleaved_runs() -> list[tuple[PublishedRun, object]]:
    """Every published H100 / A100 pipeline row whose plan interleaves (v > 1), with its Result."""
    from hybrid.planner.families import all_published_runs
    from hybrid.planner.published_more import evaluate
    out = []
    for run in all_published_runs():
        r = evaluate(run)
        if r.plan is not None and hasattr(r.plan, "layout") and getattr(r.plan.layout, "v", 1) > 1:
            out.append((run, r))
    return out


def handoff_what_if(cost_s: float = NCCL_NET_STEP_S) -> list[tuple[str, int, float, float]]:
    """(row, v, error now, error with `cost_s` rank-busy a hand-off) on every interleaved row: NCCL's latency of a
    pipeline send / receive paid by the stage on each edge in its forward and backward (causes._handoff_cost) --
    on top of the planner's message, which already carries Hardware.inter_latency_s (30 us) and its bytes."""
    from hybrid.planner.causes import _handoff_cost
    from hybrid.planner.published_more import evaluate
    rows = interleaved_runs()
    with _handoff_cost(cost_s):
        after = [evaluate(run).error for run, _ in rows]
    return [(run.name, r.plan.layout.v, r.error, e) for (run, r), e in zip(rows, after, strict=True)]


def handoff_table(rows: list[tuple[str, int, float, float]]) -> str:
    lines = ["| interleaved rows | n | signed mean now | with NCCL's hand-off latency | largest move | "
             "within ±15 % now -> with |", "|---|---|---|---|---|---|"]
    groups = (("GPT-3 175B at v 12 (1 layer a chunk: DGXC 24.11.1, MLPerf v3.x)", lambda n, v: "175B" in n and v == 12),
              ("every other interleaved row", lambda n, v: not ("175B" in n and v == 12)),
              ("all interleaved rows", lambda n, v: True))
    for what, keep in groups:
        sel = [r for r in rows if keep(r[0], r[1])]
        now, new = [r[2] for r in sel], [r[3] for r in sel]
        move = max((abs(b - a) for a, b in zip(now, new)), default=0.0)
        lines.append(f"| {what} | {len(sel)} | {100 * statistics.fmean(now):+.2f} % | "
                     f"{100 * statistics.fmean(new):+.2f} % | {100 * move:.2f} points | "
                     f"{sum(abs(e) <= BAND for e in now)} -> {sum(abs(e) <= BAND for e in new)} |")
    return "\n".join(lines)


def nemo2407_delayed_what_if() -> str:
    """NeMo 24.07's rows (published_more) planned with TE's delayed scaling (TE 1.x's only FP8 recipe) and the
    overlapped gradient reduce-scatter the launcher configs state (`overlap_grad_sync: True` in every one read)."""
    from hybrid.planner.published_more import evaluate, nemo_runs
    lines = ["| row | now | delayed scaling | + overlapped reduce-scatter |", "|---|---|---|---|"]
    for run in (r for r in nemo_runs() if r.name.startswith("NeMo 24.07")):
        d = replace(run, workload=replace(run.workload, fp8_scaling=Fp8Scaling.DELAYED))
        both = replace(d, workload=replace(d.workload, overlap_grad_reduce=True))
        errs = [evaluate(x).error for x in (run, d, both)]
        lines.append(f"| {run.name} | " + " | ".join(f"{100 * e:+.1f} %" for e in errs) + " |")
    return "\n".join(lines)


def probe_table() -> str:
    """The hand-off cost at round 13's probe (causes.HANDOFF_PROBE_S, 0.283 ms: the median of the values that zero
    the GPT-3 rows -- tuned to check rows, so a what-if only): the summary and every row it moves across the band,
    and MLPerf v3.1's v 12 rows (the same layout as DGXC 24.11.1's GPT-3)."""
    from hybrid.planner.causes import HANDOFF_PROBE_S
    rows = handoff_what_if(HANDOFF_PROBE_S)
    lines = ["| row | v | error now -> at 0.283 ms a hand-off |", "|---|---|---|"]
    lines += [f"| {n} | {v} | {100 * a:+.1f} -> {100 * b:+.1f} % |" for n, v, a, b in rows
              if (abs(a) <= BAND) != (abs(b) <= BAND) or n.startswith("MLPerf v3.1")]
    return handoff_table(rows).replace("with NCCL's hand-off latency", "at 0.283 ms a hand-off") + "\n\n" + "\n".join(
        lines)


def report() -> str:
    return "\n\n".join([rows_340b_table(), handoff_table(handoff_what_if()), probe_table(),
                         nemo2407_delayed_what_if()])


def main() -> None:
    print(report())


if __name__ == "__main__":
    main()
