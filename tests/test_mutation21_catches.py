"""Round 21's outside mutation review of round 20's new code: one-line bugs planted on purpose in torch's async TP
pricing, KempnerForge's gathered logits, selective-op's early stop and hidden dropout, the attention-dropout cost,
selective-op's FLOP count, --compile with CP / MoE recomputation and TP's eager Functions, `hybrid convert`'s
progress, preprocess --workers, 1-bit Adam's warm-up lines, newuser20's fixes, the straggler line, the reset flags'
no-document warning and the docs-link checker; the area's fast tier run on each. Each test here kills a mutant that
tier let live, shown failing on the mutant and passing on HEAD. In-process, no process group, but for one slow
test (the no-document line's wiring in train.py's loop needs a resumed 2-rank run).

The mutant ids (B2-gathered-only-with-sp, ...) are those of branch mutation21's report and of docs/architecture.md's
tally."""

from __future__ import annotations

import json
import os

import pytest

from hybrid.planner import predicted_comm
from hybrid.planner.layout import Cluster, Layout, Workload

DATA = os.path.join(os.path.dirname(__file__), "..", "docs", "results", "data")


# --- B: KempnerForge's gathered logits (hybrid/planner/predicted_comm.py, time.py) -------------------------------
def _kempner_like(gathered: bool) -> Workload:
    from models.config import load_config
    return Workload(load_config("tiny-llama"), global_batch=4, seq_length=32, gathered_logits=gathered,
                    fp32_grads=False)


def test_gathered_logits_replace_the_loss_all_reduces_without_sequence_parallelism_too():
    """The head's gather is the TP head plan's (ColwiseParallel with Replicate() outputs), not SP's: at t 2 without
    SP the last stage still all-gathers b s V_p logits instead of the vocab-parallel loss's all-reduces.
    B2-gathered-only-with-sp (`if gathered_logits and sp:`) lived through the planner20 files' fast tier and
    test_planner19_dropout_whatif / test_planner_noac: every KempnerForge row runs SP, and the ledger test asks
    with SP only."""
    from hybrid.planner.model import ActivationProfile, Shard
    from hybrid.planner.published import LLAMA3_8B, llama_model
    cfg = llama_model(*LLAMA3_8B, 4096)
    shard = Shard(cfg, 2, cfg.vocab_size, ActivationProfile.BF16_FLASH)
    plain = predicted_comm.tp_ledger(shard, 1, 64, 1, False, True, False)
    gathered = predicted_comm.tp_ledger(shard, 1, 64, 1, False, True, False, gathered_logits=True)
    assert "all_gather@tp" not in plain["forward"]  # no SP: the layer's outputs are all-reduced
    assert gathered["forward"]["all_gather@tp"] == {"calls": 1, "bytes": 64 * cfg.vocab_size * 2}
    assert gathered["forward"]["all_reduce@tp"]["calls"] == plain["forward"]["all_reduce@tp"]["calls"] - \
        predicted_comm.CE_ALL_REDUCES


def test_step_ledger_gathers_the_logits_on_the_last_pipeline_rank():
    """predicted_comm.step_ledger (what a rank records in a step, compared with the run's CommLedger) passes the
    workload's gathered_logits: the last pipeline rank's TP traffic holds the logits' all-gather. B6-stepledger-
    drops-flag lived through the planner20 files' fast tier (only time.py's pricing was checked)."""
    lay = Layout(tp=2, pp=2, micro_batch=1)
    plain, gathered = (predicted_comm.step_ledger(_kempner_like(g), lay, 1) for g in (False, True))
    assert "all_gather@tp" not in plain and "all_reduce@tp" in plain
    work = _kempner_like(True)
    # 4 micro-batches of 1 x 32 tokens, V_p logits each, in the activations' dtype
    assert gathered["all_gather@tp"]["bytes"] == 4 * 32 * work.padded_vocab(2) * work.precision.activation_bytes
    assert predicted_comm.step_ledger(_kempner_like(True), lay, 0) == predicted_comm.step_ledger(
        _kempner_like(False), lay, 0)  # the first stage has no head


def test_every_tp_ledger_the_time_model_reads_carries_gathered_logits(monkeypatch):
    """time.py reads tp_ledger twice: the collectives' seconds (_tp_cost) and, where ranks share a CPU's cores, each
    stage's CPU (_stage_cpu: a collective's calls and bytes cost CPU). Both must be told gathered_logits.
    B5-stagecpu-drops-flag lived through the planner20 files' fast tier (their rows are GPU rows, which never price
    stage CPU). Spied on a shared-core CPU (4 ranks on 2 cores), tp 2 x pp 2."""
    from hybrid.planner import evaluate
    from hybrid.planner import time as ptime
    from hybrid.planner.hardware import hardware
    told, real = [], ptime.tp_ledger

    def spy(*args, **kw):
        told.append((args[5], kw.get("gathered_logits", args[11] if len(args) > 11 else False)))
        return real(*args, **kw)
    monkeypatch.setattr(ptime, "tp_ledger", spy)
    cluster = Cluster(gpus=4, hw=hardware("cpu").with_overrides(compute_units=2))
    assert ptime._shares_cores(cluster)
    evaluate(_kempner_like(True), cluster, Layout(tp=2, pp=2, micro_batch=1))
    assert sum(last for last, _ in told) >= 2 and all(g is True for _, g in told), told


# --- N: newuser20's fixes (hybrid/planner/cli.py, models/config.py, models/hf_io.py, planner/calibrate.py) -------
@pytest.mark.parametrize("name", ["plot.png", "plot.svg", "plot.pdf"])
def test_plot_over_an_empty_file_replaces_it(name, tmp_path):
    """--plot over an existing file that is not an image of its format is refused, but an empty file is replaced (a
    `touch`ed name, a plot interrupted before its first byte: nothing to lose). N5-plot-empty-svg-refused and
    N7-plot-empty-png-refused (`not head or` dropped) lived through test_newuser20_inputs (its cases have text)."""
    from hybrid.planner.cli import check_replaces_an_image
    path = tmp_path / name
    path.write_bytes(b"")
    check_replaces_an_image(str(path))
    path.write_bytes(b"not an image\n")
    with pytest.raises(ValueError, match=f"--plot '{path}' exists and is not a"):
        check_replaces_an_image(str(path))


def test_a_config_naming_a_causal_lm_beside_a_task_head_is_a_causal_lm(tmp_path):
    """A config.json is refused only when every class it names is a task head: one naming LlamaForCausalLM as well
    (a checkpoint exported for both uses) describes a causal LM. N8-taskhead-any (`any` for `all`) lived through
    test_newuser20_inputs (its refused case names one class)."""
    from models.config import load_config
    llama = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}
    (tmp_path / "config.json").write_text(json.dumps(
        {**llama, "architectures": ["LlamaForSequenceClassification", "LlamaForCausalLM"]}))
    assert load_config(str(tmp_path)).num_layers == 2


def test_a_checkpoint_missing_another_tensor_is_not_called_a_backbone(tmp_path):
    """Only a missing `lm_head.` tensor is said to be a backbone saved alone; a checkpoint missing any other tensor
    (the final norm here) keeps the mismatch line. N9-lmhead-key-broad (the lm_head test dropped) lived through
    test_newuser20_inputs (its case is the backbone)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from models.config import load_config
    from models.hf_io import check_checkpoint
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=64, max_position_embeddings=32,
                                 tie_word_embeddings=False)).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        check_checkpoint(load_config(str(tmp_path)), tmp_path)
    assert "norm" in str(e.value) and str(e.value).endswith("the checkpoint does not match --model"), str(e.value)
    assert "language-model head" not in str(e.value)


def test_calibrate_with_backend_gloo_mixes_a_gpu_preset_on_a_cpu(tmp_path, monkeypatch):
    """`--backend gloo` is the documented way to time this CPU with a GPU preset's node links (gpu_check.py's
    --dry-run): the GPU-preset refusal must not fire. N10-calibrate-backend-ignored (`args.backend is None`
    dropped) lived through test_newuser20_inputs (its case has no --backend). The ranks are never started: the
    spawn is replaced by a sentinel."""
    import torch

    from hybrid.cli import main
    from hybrid.planner import calibrate

    class Spawned(Exception):
        pass

    def spawn():
        raise Spawned
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(calibrate, "ranks_leave_ctrl_c_to_this_process", spawn)
    with pytest.raises(Spawned):
        main(["calibrate", "--ranks", "1", "--base", "h200", "--backend", "gloo", "--out", str(tmp_path / "p.json")])


def test_calibrate_keeps_a_users_ds_accelerator(monkeypatch):
    """DS_ACCELERATOR=cpu is set for the ranks only where the user set none: a user's own value (another
    accelerator plug-in) is theirs. N11-ds-env-overrides-user (the environment test dropped) lived through
    test_newuser20_inputs."""
    import torch

    from hybrid.planner import calibrate
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    assert calibrate._quiet_deepspeed() == {"DS_ACCELERATOR": "cpu"}
    monkeypatch.setenv("DS_ACCELERATOR", "xpu")
    assert calibrate._quiet_deepspeed() == {}


def test_a_cpu_profile_without_the_gpu_kernel_overhead_is_not_called_older(tmp_path):
    """A gloo calibration measures no per-kernel overhead (calibrate.py writes kernel_overhead_s 0 on a CPU), so a
    profile without the field loses nothing and is not said to be older. N15-cpu-costs-all (kernel_overhead_s among
    CPU_COSTS) lived through test_newuser20_inputs (its profile lacks two CPU costs and warns either way)."""
    from hybrid.planner.profile import missing_cpu_costs
    with open(os.path.join(DATA, "mainjob_r19_run1.hw8.json")) as f:
        prof = json.load(f)
    assert prof["hardware"]["kernel_overhead_s"] == 0.0
    from hybrid.planner.calibrate import EDGE_FIXED_FIELDS
    for k in (f for pair in EDGE_FIXED_FIELDS.values() for f in pair):  # round 25's CPU costs, which this round-19
        prof["hardware"][k] = 0.0  # profile predates: present, as in a new one
    del prof["hardware"]["kernel_overhead_s"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    assert missing_cpu_costs(str(path)) == []


# --- C: selective-op's early stop and the attention-dropout cost (hybrid/planner/time.py) ------------------------
def test_megatrons_formula_counts_selective_ops_rerun_as_torch_runs_it():
    """--flops-formula megatron adds selective-op's rerun matmuls (Shard.selective_op_rerun_gemms) as the exact
    count does: a GPT-2 on the PyTorch stack without hidden dropout stops before c_proj (k and o only), with
    dropout 0.1 reruns it. C5-stepflops-megatron-no-stop (the megatron branch told stops_early False) lived through
    the planner20 files' fast tier (test_planner20_selective_op asks the EXACT formula)."""
    from dataclasses import replace

    from hybrid.planner.layout import Recompute
    from hybrid.planner.ops import KernelProfile
    from hybrid.planner.time import FlopsFormula, step_flops
    from models.config import load_config
    cfg = load_config("tiny-gpt2")
    h, f, batch, s = cfg.hidden_size, cfg.ffn_hidden_size, 4, 32
    for dropout, rerun in ((0.0, 2 * h * h), (0.1, 2 * h * h + f * h)):
        work = Workload(replace(cfg, dropout=dropout), global_batch=batch, seq_length=s, kernels=KernelProfile.EAGER,
                        fp32_grads=False)
        extra = (step_flops(work, Layout(micro_batch=1, recompute=Recompute.SELECTIVE_OP), FlopsFormula.MEGATRON)
                 - step_flops(work, Layout(micro_batch=1), FlopsFormula.MEGATRON))
        assert extra == pytest.approx(batch * s * cfg.num_layers * 2 * rerun, rel=1e-12), dropout


def test_the_rerun_pass_prices_the_gemms_the_early_stop_leaves():
    """The backward's rerun GEMMs under selective-op are Shard.selective_op_rerun_gemms with time.py's early stop: a
    GPT-2 layer without hidden dropout on the PyTorch stack reruns k and o, not c_proj (flash keeps the attention
    core: no core GEMM). C11-rerun-stop-flag-dropped (_rerun told stops False) lived through the planner20 files'
    fast tier: their selective-op rows are SwiGLU models, whose count is odd (nothing to stop before), and the
    step's FLOPs (test_the_step_prices_that_rerun) are counted apart from its seconds."""
    from hybrid.planner import time as ptime
    from hybrid.planner.hardware import hardware
    from hybrid.planner.layout import Recompute
    from hybrid.planner.model import ActivationProfile
    from hybrid.planner.ops import KernelProfile
    from models.config import load_config
    work = Workload(load_config("tiny-gpt2"), global_batch=8, seq_length=32, kernels=KernelProfile.EAGER,
                    activations=ActivationProfile.BF16_FLASH, fp32_grads=False)
    cluster = Cluster(gpus=8, hw=hardware("h100-80g"))
    ctx, (_, plain) = (ptime._context(work, cluster, Layout(dp=8)),
                       ptime.layer_passes(ptime._context(work, cluster, Layout(dp=8))))
    _, rerun = ptime.layer_passes(ptime._context(work, cluster, Layout(dp=8, recompute=Recompute.SELECTIVE_OP)))
    assert ctx.flash and ptime.recompute_stops_early(work, Layout(dp=8, recompute=Recompute.SELECTIVE_OP))
    k_and_o = ctx.shard.selective_op_rerun_gemms(1, 32, True)
    assert len(k_and_o) == 2
    assert rerun.gemm - plain.gemm == pytest.approx(ctx.gemm_seconds(k_and_o), rel=1e-9)

def test_the_attention_dropout_cost_follows_the_attention_dropout_not_the_hidden():
    """hardware.ATTENTION_DROPOUT_COST is the cost of dropout inside the attention kernel: a Megatron-stack model
    with attention dropout and none on the hidden states pays it, one with hidden dropout only does not.
    C9-dropcost-hidden (keyed on cfg.dropout) lived through the planner20 files' fast tier: their rows set both or
    neither."""
    from dataclasses import replace

    from hybrid.planner.hardware import HOPPER_ATTENTION_DROPOUT, hardware
    from hybrid.planner.ops import Stack
    from hybrid.planner.time import _context
    from models.config import load_config
    cfg = load_config("tiny-gpt2")
    cluster, lay = Cluster(gpus=8, hw=hardware("h100-80g")), Layout(dp=8, micro_batch=1)
    for attention, hidden, cost in ((0.1, 0.0, HOPPER_ATTENTION_DROPOUT), (0.0, 0.1, 1.0)):
        work = Workload(replace(cfg, attention_dropout=attention, dropout=hidden), global_batch=8, seq_length=32,
                        stack=Stack.MEGATRON, fp32_grads=False)
        assert _context(work, cluster, lay).attention_dropout_cost() == cost, (attention, hidden)


# --- N8: ZeRO at dp 1 priced as ZeRO 0 (hybrid/metrics/split.py) --------------------------------------------------
def test_only_zero_at_one_dp_rank_without_offload_is_priced_as_zero_0():
    """zero_at_dp1 rewrites ZeRO 1-3 at dp 1 only: at dp 2 the stage partitions (kept), and offload needs its stage
    (left to the planner's own words). N16-zero-dp1-offload (the offload test dropped) and N17-zero-dp1-dp2
    (`dp > 2`) lived through test_newuser20_inputs (its case is ZeRO 3 at dp 1, no offload)."""
    from hybrid.metrics.split import zero_at_dp1
    from hybrid.planner.layout import Offload, ZeroStage
    for kept in (Layout(dp=2, zero=ZeroStage.GRADIENTS),
                 Layout(dp=1, zero=ZeroStage.PARAMETERS, offload=Offload.OPTIMIZER)):
        assert zero_at_dp1(kept) == (kept, "")
    assert zero_at_dp1(Layout(dp=1, zero=ZeroStage.GRADIENTS)) == (
        Layout(dp=1), "ZeRO 2 at dp 1 partitions nothing: priced as ZeRO 0")


# --- V: `hybrid convert`'s progress lines (hybrid/convert/common.py, safetensors_out.py, to_hybrid.py) ------------
def test_size_text_switches_unit_at_the_unit():
    """Powers of 1000, as --max-shard-size's 5GB: 1000 bytes is 1.0 kB, 10^9 is 1.00 GB. V5-size-gt (`n > scale`)
    lived through test_inputs20_convert_progress (no size there is a power of 1000)."""
    from hybrid.convert.common import size_text
    assert [size_text(n) for n in (999, 1000, 10**6, 10**9, 28 * 10**9)] == [
        "999 B", "1.0 kB", "1.0 MB", "1.00 GB", "28.00 GB"]


def test_a_bf16_exports_progress_counts_the_bytes_it_writes(tmp_path):
    """write_sharded's lines count the bytes written in the target dtype: a bf16 export of 3 fp32 tensors ends at
    its total (2 bytes an element), not twice it. V4-bytes-fp32 (written counted at fp32) lived through
    test_inputs20_convert_progress (its exports are fp32, where the two agree). In-process, no model."""
    import torch

    from hybrid.convert.safetensors_out import write_sharded
    shapes = {"a": (10, 50), "b": (50,), "c": (20, 50)}
    lines: list[str] = []
    write_sharded(str(tmp_path), shapes, ((k, torch.ones(s)) for k, s in shapes.items()), torch.bfloat16, 10**9,
                  lines.append)
    assert lines[-1] == "tensor 3/3 (c) -> model.safetensors (file 1/1), 3.1 kB of 3.1 kB", lines


def test_reading_a_transformers_folder_names_its_float32_bytes(tmp_path):
    """_read_hf_folder's line per file gives the bytes its tensors take as float32 (4 bytes an element, what it
    loads into). V6-read-size-bf16 (2 bytes an element) lived through test_inputs20_convert_progress (its pattern
    takes any kB figure)."""
    import re

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hybrid.convert.common import read_config
    from hybrid.convert.to_hybrid import _read_hf_folder
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                                         max_position_embeddings=32, tie_word_embeddings=False))
    model.save_pretrained(tmp_path)
    lines: list[str] = []
    tensors = _read_hf_folder(str(tmp_path), read_config(str(tmp_path), "SRC"), lines.append)
    kb = sum(t.numel() for t in tensors.values()) * 4 / 1000
    assert len(lines) == 1 and re.fullmatch(rf"reading model\.safetensors \(file 1/1\): {len(tensors)} tensors, "
                                            rf"{kb:.1f} kB as float32", lines[0]), (lines, kb)


# --- E: --compile with selective-op; TP's Functions run eagerly (hybrid/train/args.py, hybrid/tp/) ---------------
def test_compiled_selective_op_refuses_attention_dropout_too():
    """The traced checkpoint cannot replay either dropout stream: attention dropout alone is refused as hidden
    dropout is. E4-attn-dropout-dropped lived through test_compose20_compile / test_compile_recompute /
    test_compile (and test_inputs.py's case gives --hidden-dropout)."""
    from hybrid.train.args import parse_args, run_config
    args = parse_args(["--model", "tiny-llama", "--seq-length", "32", "--compile", "--recompute-granularity",
                       "selective-op", "--attention-dropout", "0.1"])
    with pytest.raises(ValueError, match="^--compile with --recompute-granularity selective-op needs "
                                         "--hidden-dropout 0 and --attention-dropout 0"):
        run_config(args, 1)


class _TwoRanks:
    """A TP group's face to TP's Functions, of size 2, whose collectives are the identity: what dynamo sees of
    the call is the same, no process group is needed."""

    size, rank, name = 2, 0, "tp"

    def all_reduce(self, t):
        return t

    def all_reduce_async(self, t):
        return None


def _breaks_at_apply_eagerly(f, *args) -> None:
    """torch.compile (dynamo's capture-only `eager` backend) of f: same result as eager, and every graph break at
    mappings.apply_eagerly."""
    import torch
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    got, want = torch.compile(f, backend="eager")(*args), f(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))
    breaks = dict(counters["graph_break"])
    assert breaks and all("apply_eagerly" in reason for reason in breaks), breaks


def test_tps_functions_without_sp_run_eagerly_under_compile():
    """f (copy_to_tp), g (reduce_from_tp) and the fused entry (layers.enter_linears, _EnterLinears) without SP go
    through mappings.apply_eagerly: compiled code breaks its graph there, at nothing else (the all-reduce's ledger
    write, the op trail's lock and g's mark_dirty cannot be traced). E7-copy-traced, E8-reduce-traced and
    E9-enter-traced (each `.apply` called directly) and E11-apply-eagerly-traced (its @torch._disable_dynamo
    dropped) lived through test_compose20_compile's, test_compile_recompute's and test_compile's fast tier; only
    the 4-rank slow launch (tp2-cp2-docs) counts those breaks. Dynamo's capture-only backend, < 1 s."""
    from types import SimpleNamespace

    import torch

    from hybrid.tp import mappings
    from hybrid.tp.layers import enter_linears
    group, x = _TwoRanks(), torch.randn(3, 4)
    _breaks_at_apply_eagerly(lambda x: mappings.copy_to_tp(x * 2, group) + 1, x)
    _breaks_at_apply_eagerly(lambda x: mappings.reduce_from_tp(x * 2, group) + 1, x)
    tp = SimpleNamespace(size=2, sequence_parallel=False, group=group)
    linears = [SimpleNamespace(weight=torch.randn(n, 4), bias=torch.randn(n)) for n in (2, 3)]
    _breaks_at_apply_eagerly(lambda x: enter_linears(x * 2, linears, tp), x)


def test_quiet_reaches_a_deepspeed_conversion(tmp_path, monkeypatch):
    """`hybrid convert -q` hands its silent Progress to every direction, DeepSpeed's included. V10-ds-progress-
    quiet-lost (deepspeed_to_hybrid called without progress=) lived through test_inputs20_convert_progress (its
    sources are transformers and hybrid folders). The conversion itself is replaced: only what it is told is read."""
    import hybrid.convert
    from hybrid.cli import main
    from hybrid.convert import cli
    from hybrid.convert.detect import Format
    told = {}
    monkeypatch.setattr(cli, "detect", lambda src: Format.DEEPSPEED)
    monkeypatch.setattr(hybrid.convert, "deepspeed_to_hybrid", lambda *a, **kw: told.update(kw))
    (tmp_path / "ds").mkdir()
    main(["convert", str(tmp_path / "ds"), str(tmp_path / "out"), "--model", "tiny-llama", "-q"])
    assert told["progress"].quiet, told


# --- O: 1-bit Adam's warm-up lines (hybrid/compress/args.py) ------------------------------------------------------
def _onebit_warnings(freeze: int, iters: int, *extra: str) -> tuple[str, ...]:
    from hybrid.compress import args as compress_args
    from hybrid.train.args import parse_args
    ns = parse_args(["--model", "tiny-llama", "--optimizer", "onebit-adam", "--onebit-freeze-iters", str(freeze),
                     "--train-iters", str(iters), *extra])
    return compress_args.onebit_warnings(compress_args.check(ns, 2, resuming=False), ns)


def test_a_warm_up_of_the_whole_run_with_save_is_plain_adam(tmp_path):
    """freeze = --train-iters: the variance freezes after the last step, so the run never compresses -- the
    plain-Adam line, as for freeze > --train-iters. O1-past-run-gt (`k > n`) lived through
    test_inputs20_onebit_warmup (its case is 30 > 20); the mutant says nothing (30 of 30 is no short warm-up)."""
    save = str(tmp_path / "ck")
    assert _onebit_warnings(30, 30, "--save", save) == (
        f"--onebit-freeze-iters 30 >= --train-iters 30: this run is plain Adam (1-bit Adam compresses from step 30 "
        f"on); a run resumed from --save {save} with a larger --train-iters compresses",)


def test_the_recommended_warm_up_rounds_up_to_15_percent():
    """15 % of 30 steps is 4.5: 4 is below DeepSpeed's range (warned, 13 %) and the range offered starts at 5 (25 %
    of 30 = 7.5: up to 8). O4-floor (int for math.ceil) lived through test_inputs20_onebit_warmup (its runs of 4,
    20, 100 and 1000 steps make 15 % and 25 % whole or round the same way)."""
    (line,) = _onebit_warnings(4, 30)
    assert line.startswith("--onebit-freeze-iters 4: a warm-up of 13 % of --train-iters 30;") and line.endswith(
        "give --onebit-freeze-iters 5-8"), line
    assert _onebit_warnings(5, 30) == ()


# --- D: the reset flags' no-document line (hybrid/cp/data.py TokenSharding.no_documents_line) --------------------
def test_no_documents_line_looks_at_every_micro_batchs_inputs():
    """The line is for a step none of whose samples holds the eod: one micro-batch holding it is enough, and what
    counts is the inputs (where the masks and positions restart), not the labels. D1-all-samples (`all` over the
    micro-batches) and D2-labels (the labels searched) lived through test_cp20_no_documents and test_cp_data (their
    cases are one micro-batch whose labels are its inputs rolled)."""
    import torch

    from hybrid.cp.data import TokenSharding
    s = TokenSharding(reset_attention_mask=True, eod=0)
    first = (torch.tensor([[5, 6, 7, 8]]), torch.tensor([[6, 7, 8, 9]]))
    starts_a_document = (torch.tensor([[0, 6, 7, 8]]), torch.tensor([[6, 7, 8, 9]]))  # its label row has no eod
    assert s.no_documents_line([first, starts_a_document]) is None
    assert s.no_documents_line([first]).startswith("warning: --reset-attention-mask: no end-of-document token")


def test_no_documents_line_names_each_flag_that_is_on():
    """--reset-position-ids alone is named alone (and --reset-attention-mask alone, and both). D3-flag-names (the
    position flag's entry keyed on the mask flag) lived through test_cp20_no_documents and test_cp_data (their
    cases turn on the mask flag or both)."""
    import torch

    from hybrid.cp.data import TokenSharding
    step = [(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[6, 7, 8, 9]]))]
    for mask, positions, named in ((False, True, "--reset-position-ids"), (True, False, "--reset-attention-mask"),
                                   (True, True, "--reset-attention-mask and --reset-position-ids")):
        line = TokenSharding(reset_attention_mask=mask, reset_position_ids=positions, eod=0).no_documents_line(step)
        assert line.startswith(f"warning: {named}: no end-of-document token (id 0)"), line


@pytest.mark.slow
def test_a_resumed_two_rank_run_warns_once_at_its_first_iteration(tmp_path):
    """The no-document line's wiring in hybrid/train/loop.py: printed at this process's first iteration (a resumed
    run's too: its data is as new to the user) and by rank 0 only. One rank trains 1 step and saves; 2 ranks resume
    it for 1 more: one line in each. D5-loop-iter-0 (`it == 0`: a resumed run says nothing) and D6-loop-every-rank
    (the rank test dropped: one line per rank) lived through test_cp20_no_documents' slow launch (one rank, from
    iteration 0) and every fast test. Two launches of train.py (slow), each `torchrun --standalone` as
    hybrid.testing.torchrun_cli runs it: the ranks forked from the forkserver with torchrun's environment (RANK,
    WORLD_SIZE, ...), their stdout joined -- the loop's wiring is the subject, not torchrun's agent or a cold
    interpreter's imports (two agents and three ranks of ~4 s of CPU each)."""
    from hybrid import testing
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    common = ["scripts/train.py", "--model", "tiny-llama", "--seq-length", "32", "--micro-batch-size", "1",
              "--global-batch-size", "2", "--log-interval", "1", "--tokenizer-type", "ByteLevel",
              "--reset-attention-mask", "--save", str(tmp_path / "ck"), "--save-interval", "1",
              "--eval-iters", "1"]  # the end's validation and test: one batch each, not 10 (none read)
    for ranks, argv in ((1, ["--train-iters", "1"]), (2, ["--train-iters", "2", "--load", str(tmp_path / "ck")])):
        out = testing.torchrun_cli(["--standalone", "--nproc-per-node", str(ranks), *common, *argv],
                                   env={"OMP_NUM_THREADS": "1"}, cwd=root, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.count("warning: --reset-attention-mask: no end-of-document token (id 0)") == 1, (
            ranks, out.stdout[-2000:])
    assert "| iteration 1 |" in out.stdout + out.stderr, out.stdout[-2000:]  # the second launch resumed at 1
