"""Issue 26, round 16: the ZeRO 3 runtime's copies on the compute stream (Workload.zero3_runtime, zero3_copy_bytes).

The expected bytes come from the model's shape by hand (a Llama layer's q, k, v, o, gate, up, down matrices and two
RMSNorm weights; the embedding, the untied head and the final norm), not from the planner's Shard, and from what
torch's FSDP2 (`_fsdp_collectives.py`: copy-out at each unshard, copy-in before each reduce-scatter) and this runtime
(hybrid/zero/units.py: parameters are views of the gathered buffer, FlatUnit.add_grad copies each gradient) run."""

from __future__ import annotations

import pytest

from hybrid.planner import Cluster, Layout, Workload, ZeroStage, evaluate, hardware
from hybrid.planner.cli import main
from hybrid.planner.layout import Zero3Runtime
from hybrid.planner.model import ActivationProfile
from hybrid.planner.published import llama_model
from hybrid.planner.search import SearchSpace, search
from hybrid.planner.time import TERMS, zero3_copy_bytes

L, H, A, KV, FFN, V = 4, 256, 8, 4, 512, 1024  # layers, hidden, heads, kv-heads, FFN, vocabulary
HD = H // A
LAYER = H * A * HD + 2 * H * KV * HD + A * HD * H + 3 * H * FFN + 2 * H  # q, k, v, o; gate, up, down; 2 norms
EDGES = V * H + V * H + H  # embedding, untied head, final norm
P, G = 2, 2  # bf16 parameters, bf16 gradients (mixed precision, no fp32 reduction)


def _work(runtime: Zero3Runtime | None, global_batch: int = 16, **kw) -> Workload:
    kw.setdefault("fp32_grads", False)  # P, G above: bf16 gradients
    return Workload(llama_model(L, H, A, KV, FFN, V, 2048), global_batch=global_batch, seq_length=2048,
                    activations=ActivationProfile.BF16_FLASH, zero3_runtime=runtime, **kw)


def _z3(dp: int = 8, pp: int = 1, micro_batch: int = 1) -> Layout:
    return Layout(dp=dp, pp=pp, micro_batch=micro_batch, zero=ZeroStage.PARAMETERS)


def test_the_hand_count_is_the_models_parameter_count():
    assert L * LAYER + EDGES == _work(Zero3Runtime.HYBRID).model.num_parameters


def test_copy_bytes_per_runtime_are_what_its_code_moves():
    fsdp2 = zero3_copy_bytes(_work(Zero3Runtime.FSDP2), _z3(), L * LAYER, EDGES)
    # forward: copy-out of every gathered parameter (read + write); backward: the blocks' re-gather (not the root's,
    # which FSDP2 keeps gathered after forward) and the copy-in of every gradient (read p, write g)
    assert fsdp2 == (2 * P * (L * LAYER + EDGES), 2 * P * L * LAYER + (P + G) * (L * LAYER + EDGES))
    assert zero3_copy_bytes(_work(Zero3Runtime.HYBRID), _z3(), L * LAYER, EDGES) == (0, (P + G) * (L * LAYER + EDGES))
    for runtime in (Zero3Runtime.FSDP1, Zero3Runtime.MEGATRON_FSDP):
        assert zero3_copy_bytes(_work(runtime), _z3(), L * LAYER, EDGES) == (0, 0)
    # fp32 reduction: the copy-in writes 4 bytes a gradient
    assert zero3_copy_bytes(_work(Zero3Runtime.FSDP2, fp32_grads=True), _z3(), L * LAYER, EDGES)[1] == (
        2 * P * L * LAYER + (P + 4) * (L * LAYER + EDGES))
    # under a pipeline FSDP2 gathers and reduce-scatters once a step: m micro-batches carry one of each
    m = 16 // (4 * 1)
    f, b = zero3_copy_bytes(_work(Zero3Runtime.FSDP2), _z3(dp=4, pp=2), LAYER * 2, 0)
    assert m * f == pytest.approx(2 * P * 2 * LAYER) and m * b == pytest.approx((P + G) * 2 * LAYER)
    # nothing below ZeRO 3 or without data parallelism
    for layout in (Layout(dp=8, zero=ZeroStage.GRADIENTS), _z3(dp=1)):
        for runtime in Zero3Runtime:
            assert zero3_copy_bytes(_work(runtime), layout, L * LAYER, EDGES) == (0.0, 0.0)
    # and none unless a runtime is named: the model's default (round 16's what-if was not landed)
    assert zero3_copy_bytes(_work(None), _z3(), L * LAYER, EDGES) == (0.0, 0.0)
    assert Workload.__dataclass_fields__["zero3_runtime"].default is None


def test_the_step_term_is_the_bytes_at_the_streaming_rate():
    cluster = Cluster(gpus=8, hw=hardware("h100-80g"))
    m = 16 // 8
    rate = cluster.hw.streaming_bytes_per_s
    per_micro_batch = {Zero3Runtime.FSDP2: 2 * P * (L * LAYER + EDGES) + 2 * P * L * LAYER
                       + (P + G) * (L * LAYER + EDGES),
                       Zero3Runtime.HYBRID: (P + G) * (L * LAYER + EDGES),
                       Zero3Runtime.FSDP1: 0, Zero3Runtime.MEGATRON_FSDP: 0, None: 0}
    times = {}
    for runtime, nbytes in per_micro_batch.items():
        t = evaluate(_work(runtime), cluster, _z3()).time
        assert t.term("zero3_copies") == pytest.approx(m * nbytes / rate, rel=1e-12)
        assert sum(v for _, v in t.terms) == pytest.approx(t.total, rel=1e-12)
        times[runtime] = t
    # on the critical path: the step grows by the copies (at most: a pass's DP traffic may hide part of them)
    base, copies = times[Zero3Runtime.FSDP1].total, times[Zero3Runtime.FSDP2].term("zero3_copies")
    assert base < times[Zero3Runtime.FSDP2].total <= base + copies * (1 + 1e-12)
    assert times[Zero3Runtime.FSDP1].terms == times[Zero3Runtime.MEGATRON_FSDP].terms == times[None].terms


def test_runs_the_term_does_not_touch_are_bit_identical():
    """Below ZeRO 3 the runtime is never read: the same search, plan for plan (repr), whichever runtime is named or
    none (the default); at ZeRO 3 an in-place runtime prices what the default does."""
    cluster = Cluster(gpus=8, hw=hardware("h100-80g"))
    space = SearchSpace(zero=(ZeroStage.NONE, ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS))
    plans = {r: repr(search(_work(r, global_batch=32), cluster, space, top=4).plans)
             for r in (None, *Zero3Runtime)}
    assert len(set(plans.values())) == 1
    t = evaluate(_work(Zero3Runtime.FSDP2), cluster, Layout(dp=8, zero=ZeroStage.GRADIENTS)).time
    assert t.term("zero3_copies") == 0.0


FLAGS = ["--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-80g", "--global-batch-size", "16", "--seq-length",
         "4096", "--activation-profile", "bf16-flash", "--tensor-model-parallel-size", "1",
         "--pipeline-model-parallel-size", "1", "--micro-batch-size", "1", "--zero-stage", "3", "--top", "1"]


def _explained(capsys, *extra: str) -> dict[str, float]:
    assert main(FLAGS + ["--explain", *extra]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("  ") and line.split()[0] in dict(TERMS)]
    header = next(line for line in out.splitlines() if line.startswith("why "))
    return {"header": header, **{r[0]: float(r[1]) for r in rows}}


def test_explain_shows_the_copies_for_the_runtime_named(capsys):
    default = _explained(capsys)  # no runtime named: no copies priced, as before round 16
    hybrid = _explained(capsys, "--zero3-runtime", "hybrid")
    fsdp2 = _explained(capsys, "--zero3-runtime", "fsdp2")
    fsdp1 = _explained(capsys, "--zero3-runtime", "fsdp1")
    assert "ZeRO 3 runtime" not in default["header"] and default["zero3_copies"] == 0
    assert "ZeRO 3 runtime hybrid" in hybrid["header"] and "ZeRO 3 runtime fsdp2" in fsdp2["header"], hybrid
    assert fsdp1["zero3_copies"] == 0 < hybrid["zero3_copies"] < fsdp2["zero3_copies"]


def test_bad_runtime_and_emit_args_with_another_runtime_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        main(FLAGS + ["--zero3-runtime", "deepspeed"])
    assert "--zero3-runtime" in capsys.readouterr().err
    assert main(FLAGS + ["--zero3-runtime", "fsdp2", "--emit-args"]) == 2
    err = capsys.readouterr().err
    assert "--zero3-runtime fsdp2" in err and "--emit-args" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="zero3_runtime"):
        _work("fsdp2")
