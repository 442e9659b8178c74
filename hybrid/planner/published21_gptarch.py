"""Round 21's GPT-architecture lean on the Megatron stack (planner21a; docs/planner/round21-gpt-arch.md):

    python -m hybrid.planner.published21_gptarch          # the three tables of the doc

1. **One container, three architectures, term by term** (`comparison_table`). NVIDIA/dgxc-benchmarking v24.11.1 ran
   GPT-3 175B, Nemotron-4 340B and Llama 3.1 70B on the same nemo:24.05 container with Megatron-core + TE. GPT-3's
   row leans +17.3 % (BF16, 128 GPUs) where Nemotron-4 340B's leans +2.0 % and Llama 3.1 70B's +5.6 %: the table
   gives each row's planned step by term, its published step, and the seconds the planner misses.
2. **The GPT-only elements of a layer, priced** (`candidates_table`): what a GPT-3 layer of Megatron-core runs that
   a Llama or Nemotron layer of the same stack does not, what the planner prices for it, and its seconds on the
   two worst GPT rows (DGXC 24.11.1 GPT-3 175B BF16 at 128 GPUs, Megatron-Core's 1.7B).
3. **fc1's bias gradient** (landed: ops._bias_grad_ops) on every row it moves (`bias_grad_table`): the rows as
   round 20 left them (`no_bias_grads`) and as shipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hybrid.planner.families import all_published_runs
from hybrid.planner.layout import Cluster
from hybrid.planner.published import PublishedRun

COMPARED = ("DGXC 24.11.1 GPT3-175B BF16, 128 H100, t4 p8 v12, b1, GBS 256",
            "DGXC 24.11.1 Nemotron4-340B BF16, 128 H100, t8 p8 v12, b1, GBS 32",
            "DGXC 24.11.1 Llama3.1-70B BF16, 128 H100, t4 p4 cp2 v5, b1, GBS 256")
PRICED_ROWS = ("DGXC 24.11.1 GPT3-175B BF16, 128 H100, t4 p8 v12, b1, GBS 256",
               "Megatron-Core 1.7B, 48 H100, t1 p1 d48")
# the userbuffers configuration of the GPT-3 recipe (nemo_megatron/gpt3_175b_hydra.yaml at 35a9aec,
# ub_tp_comm_overlap_cfg): proj_fprop and fc2_fprop `pipeline` on 24 and 20 SMs with set_sm_margin 1
H100_SMS = 132
UB_SMS = {"proj": 24, "fc2": 20}


def runs_named(names: tuple[str, ...]) -> list[PublishedRun]:
    by_name = {r.name: r for r in all_published_runs()}
    return [by_name[n] for n in names]


@contextmanager
def no_bias_grads() -> Iterator[None]:
    """Inside the block ops.layer_ops prices no bias-gradient reduction (as before round 21)."""
    from hybrid.planner import ops
    original = ops._bias_grad_ops
    ops._bias_grad_ops = lambda *args: []
    try:
        yield
    finally:
        ops._bias_grad_ops = original


def _plan(run: PublishedRun):
    """(the plan's StepTime, the error, the plan's _Context) of a published row."""
    from hybrid.planner.published_more import evaluate
    from hybrid.planner.time import _context, step_time
    result = evaluate(run)
    cluster = Cluster(gpus=run.gpus, hw=run.hardware())
    layout = result.plan.layout
    return step_time(run.workload, cluster, layout), result.error, _context(run.workload, cluster, layout)


def comparison_table() -> str:
    """Each compared row's planned step by term (% of the planned step), its published step and the miss."""
    from hybrid.planner.time import TERMS
    shown = [name for name, _ in TERMS if name not in ("executor", "zero3_copies", "tp_wait", "overlap")]
    lines = ["| row | error | planned s | published s | missed s | " + " | ".join(shown) + " |",
             "|---|---|---|---|---|" + "---|" * len(shown)]
    for run in runs_named(COMPARED):
        st, error, _ = _plan(run)
        published = st.total * (1 + error)  # error is planned / published throughput - 1
        cells = " | ".join(f"{100 * st.term(n) / st.total:.1f} %" for n in shown)
        lines.append(f"| {run.name} | {100 * error:+.1f} % | {st.total:.2f} | {published:.2f} | "
                     f"{published - st.total:.2f} | {cells} |")
    return "\n".join(lines)


def _layer_parts(ctx) -> dict[str, float]:
    """Seconds of one layer, one micro-batch, forward + backward, of the parts the candidates touch."""
    from hybrid.planner.ops import layer_ops
    lay, work, shard = ctx.layout, ctx.work, ctx.shard
    b, s, e = lay.micro_batch, work.seq_length, work.precision.activation_bytes
    tokens = b * s
    ops = {o.name: o for o in layer_ops(shard, s, lay.sequence_parallel, e, work.kernel_profile,
                                                  work.fc1_bias_grad_in_kernel)}

    def op_s(name: str) -> float:
        o = ops.get(name)
        return 0.0 if o is None else (ctx.hbm_seconds((o.fwd_bytes + o.bwd_bytes) * tokens)
                                      + ctx.launch_seconds(o.fwd_kernels + o.bwd_kernels))
    linears = shard.layer_linear_gemms(b, s)
    proj, fc2 = ctx.gemm_seconds(linears[1:2], work.fp8), ctx.gemm_seconds(linears[-1:], work.fp8)
    margin = (proj * (H100_SMS / (H100_SMS - UB_SMS["proj"]) - 1)
              + fc2 * (H100_SMS / (H100_SMS - UB_SMS["fc2"]) - 1)) if lay.tp > 1 else 0.0  # no TP: no userbuffers
    attention = ctx.flash_seconds(b, s) * 3.5 if ctx.flash else 0.0
    return {"layernorm": op_s("layernorm"), "gelu": op_s("gelu"), "bias-dropout-add": op_s("bias-dropout-add"),
            "fc1 bias grad": op_s("fc1 bias grad"), "sm margin": margin,
            "attention dropout": attention * (1 - 1 / ctx.attention_dropout_cost())}


def _layer_passes_per_step(ctx) -> int:
    """Layer passes (forward + backward of one layer, one micro-batch) the busiest pipeline rank runs a step."""
    lay = ctx.layout
    micro_batches = ctx.work.global_batch // (lay.micro_batch * lay.dp)
    return micro_batches * -(-ctx.work.model.num_layers // lay.pp)


CANDIDATES = (
    ("layernorm", "LayerNorm (weight and bias) where Llama has RMSNorm", "yes: one fused kernel, 2e bytes an "
     "element forward, 1.5 x backward, as RMSNorm"),
    ("gelu", "bias-GELU on f / t = 4h / t (Megatron's fused_bias_gelu: tanh GELU, torch.compile'd)",
     "yes: 2e bytes an element of f / t forward (SwiGLU: 3e of its f / t)"),
    ("bias-dropout-add", "bias-dropout-add with a hidden-dropout mask, twice a layer", "yes: 3e + 1 bytes (the "
     "bool mask) forward, 1.5 x backward"),
    ("fc1 bias grad", "fc1's bias gradient (skip_bias_add; GeLUFunction.backward returns `tmp, tmp`: autograd's "
     "sum_to)", "since round 21: e f / t bytes a token, one backward kernel (proj's / fc2's: fusable into the "
     "compiled bias-dropout-add's backward, not priced)"),
    ("attention dropout", "attention dropout 0.1 in the fused attention kernel", "yes: Hopper 1.034 x the core "
     "(round 20, cuDNN); the DGXC 24.11.1 container sets NVTE_FUSED_ATTN=0 (flash-attn 2): no H100 measurement"),
    ("sm margin", "userbuffers' proj / fc2 forward GEMMs on 108 / 112 of 132 SMs (ub_tp_comm_overlap_cfg)",
     "no (TP is priced synchronous); every recipe stating TP overlap has it, not only GPT-3"),
)


def candidates_table() -> str:
    """Each candidate's seconds a step and share of the published step on PRICED_ROWS."""
    rows = runs_named(PRICED_ROWS)
    parts = []
    for run in rows:
        st, error, ctx = _plan(run)
        n = _layer_passes_per_step(ctx)
        parts.append(({k: v * n for k, v in _layer_parts(ctx).items()}, st.total * (1 + error), st.total))
    head = " | ".join(f"{r.name}: s a step (% of the published step)" for r in rows)
    lines = [f"| candidate | in the planner | {head} |", "|---|---|" + "---|" * len(rows)]
    for key, what, priced in CANDIDATES:
        cells = " | ".join(f"{p[key]:.3f} ({100 * p[key] / pub:.1f} %)" for p, pub, _ in parts)
        lines.append(f"| {what} | {priced} | {cells} |")
    missed = " | ".join(f"{pub - planned:.3f} ({100 * (pub - planned) / pub:.1f} %)" for _, pub, planned in parts)
    lines.append(f"| **the planner misses** | | {missed} |")
    return "\n".join(lines)


def bias_grad_table() -> str:
    """Every row fc1's bias gradient moves: its error without it (round 20) and as shipped."""
    from hybrid.planner.published_more import evaluate
    runs = all_published_runs()
    with no_bias_grads():
        before = [evaluate(r).error for r in runs]
    after = [evaluate(r).error for r in runs]
    moved = [(r, b, a) for r, b, a in zip(runs, before, after) if b is not None and abs(a - b) > 1e-6]
    moved.sort(key=lambda t: t[2] - t[1])
    lines = ["| row | round 20 | with fc1's bias gradient |", "|---|---|---|"]
    lines += [f"| {r.name} | {100 * b:+.1f} % | {100 * a:+.1f} % |" for r, b, a in moved]
    return "\n".join(lines)


def main() -> None:
    print(comparison_table(), candidates_table(), bias_grad_table(), sep="\n\n")


if __name__ == "__main__":
    main()
