"""What a run says about itself before its first step: the model and where its weights came from, the data, the
schedule, what the planner predicts for the layout, and on resume what differs from the checkpoint's run and what
that changes. Rank 0 prints each line once (hybrid/train/loop.py calls `startup_lines` after the resume).

Every line is a pure function of facts -- the flags as a checkpoint records them (`run_info`'s dict: model,
layout, flags), the model config, a `DataFacts`, a `Prediction`, the saved state.json -- so each is unit-tested
without processes (tests/test_explain.py). `startup_lines` gathers the facts: it reads the resumed checkpoint's
state.json and the --load folder's safetensors index, and asks the planner for one layout.

    model: tiny-gpt2 (a preset): gpt2, 4 layers, hidden 64, 4 heads (4 kv), vocab 256, 0.23M parameters | weights: ...
    data: the default corpus (Python's pydoc topics; byte-level text, a token per byte): 1,211 documents, ...
    data: train 1,173 documents, 2,780,115 tokens -> 3,200 samples of 128 + 1 tokens, 0.15 of an epoch | ...
    schedule: 200 iterations x 16 samples x 128 tokens | lr: warm-up to 0.001 over 10 iterations, cosine ...
    planner: this layout on cpu.json: 112 ms/iter, 18,300 tokens/s, peak RSS 402 MiB per rank (...)
    resume: flags changed since the checkpoint: --train-iters 200 -> 300
    resume: lr schedule changed: ...
    resume: data order unchanged: ...
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from enum import Enum

from hybrid.cliutil import plural
from hybrid.data.gpt import epoch_plan, samples_per_dataset, split_ranges
from hybrid.data.source import DataSource, Split, SplitSizes, train_samples
from hybrid.train_step import OptimizerConfig
from models.config import ModelConfig
from models.presets import PRESETS

MIB = 2**20


# --- the model and its weights ------------------------------------------------------------------------------

class WeightsKind(Enum):
    INIT = "init"  # drawn from --seed
    TRANSFORMERS = "transformers"  # --load of a transformers folder (safetensors)
    CHECKPOINT = "checkpoint"  # --load of a hybrid checkpoint directory (a run's, or `hybrid convert`'s)


@dataclass(frozen=True)
class Weights:
    """Where step 0's weights came from.

    Attributes:
        kind: initialised, a transformers folder, or a hybrid checkpoint.
        path: the folder or the checkpoint's iteration directory (None for INIT).
        iteration: the checkpoint's iteration (CHECKPOINT only).
        tensors: tensors in the transformers folder's safetensors (TRANSFORMERS only).
        converted: the checkpoint holds weights only (`hybrid convert` output: no optimizer state, no run).
    """

    kind: WeightsKind
    path: str | None = None
    iteration: int | None = None
    tensors: int | None = None
    converted: bool = False


def model_line(model: str, cfg: ModelConfig, weights: Weights, seed: int) -> str:
    """'model: NAME (a preset | config.json in DIR): shape | weights: where from'."""
    source = "a preset" if model in PRESETS else f"config.json in {model}"
    shape = (f"{cfg.arch}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads "
             f"({cfg.num_kv_heads} kv), vocab {cfg.vocab_size}, {cfg.num_parameters / 1e6:.2f}M parameters")
    if weights.kind is WeightsKind.INIT:
        where = f"initialised at random (--seed {seed})"
    elif weights.kind is WeightsKind.TRANSFORMERS:
        where = f"loaded from the transformers folder {weights.path} ({weights.tensors} tensors)"
    elif weights.converted:
        where = (f"loaded from the converted checkpoint {weights.path} (weights only: the optimizer starts "
                 f"fresh at iteration {weights.iteration})")
    else:
        where = f"loaded from the checkpoint {weights.path} (iteration {weights.iteration})"
    return f"model: {model} ({source}): {shape} | weights: {where}"


# --- the data --------------------------------------------------------------------------------------------------

SPLIT_NAMES = {Split.TRAIN: "train", Split.VALID: "valid", Split.TEST: "test"}


@dataclass(frozen=True)
class DatasetFacts:
    """One --data-path entry.

    Attributes:
        name: its path or prefix ("the default corpus" without --data-path).
        kind: what it is ("byte-level text, a token per byte" / "indexed dataset, uint16").
        documents: documents (sequences) in it.
        tokens: tokens in it.
        weight: its blend weight (1 alone).
        split_documents, split_tokens: per split (train, valid, test), what --split gives it.
    """

    name: str
    kind: str
    documents: int
    tokens: int
    weight: float
    split_documents: tuple[int, int, int]
    split_tokens: tuple[int, int, int]


@dataclass(frozen=True)
class SplitFacts:
    """One split of the run.

    Attributes:
        split: train, valid or test.
        samples: samples the run reads from it (train: as built, hybrid/data/source.py's train_samples --
            iterations x global batch, or a resumed run's last read + 1 when larger; valid: every evaluation's;
            test: the final one's); 0 when not evaluated.
        passes: samples x seq_length / the split's tokens: how many times the run reads it over.
        empty: why the run reads nothing from it (None: it reads `samples`).
    """

    split: Split
    samples: int
    passes: float
    empty: str | None


@dataclass(frozen=True)
class DataFacts:
    datasets: tuple[DatasetFacts, ...]
    splits: tuple[SplitFacts, ...]
    split_flag: str
    seq_length: int


def dataset_kind(docs) -> str:
    if docs.prefix == "the default corpus":
        return "Python's pydoc topics as byte-level text, a token per byte"
    if getattr(docs, "byte_text", False):
        return "byte-level text, a token per byte"
    return f"indexed dataset, {docs.dtype.name}"


def data_facts(source: DataSource, sizes: SplitSizes, split: tuple[float, float, float], split_flag: str,
               eval_iters: int) -> DataFacts:
    """The facts of `source` (its datasets as opened, its splits as built for `sizes`)."""
    datasets = []
    for docs, weight in zip(source.datasets, source.weights or [1.0]):
        ranges = split_ranges(split, len(docs))
        counts = tuple(0 if r is None else max(0, r[1] - r[0]) for r in ranges)
        tokens = tuple(0 if r is None or r[1] <= r[0] else int(docs.sequence_lengths[r[0]:r[1]].sum(dtype="int64"))
                       for r in ranges)
        datasets.append(DatasetFacts(docs.prefix, dataset_kind(docs), len(docs), docs.num_tokens,
                                     weight if len(source.datasets) > 1 else 1.0, counts, tokens))
    splits = []
    for s, size in zip(Split, (sizes.train, sizes.valid, sizes.test)):
        tokens = sum(d.split_tokens[s] for d in datasets)
        empty = None
        if size == 0:
            empty = "not evaluated (--eval-iters 0)" if eval_iters == 0 else "not read"
        elif not source.has(s):
            empty = _why_empty(datasets, s, split_flag, source.seq_length)
        passes = size * source.seq_length / tokens if tokens and empty is None else 0.0
        splits.append(SplitFacts(s, size if empty is None else 0, passes, empty))
    return DataFacts(tuple(datasets), tuple(splits), split_flag, source.seq_length)


def _why_empty(datasets: tuple[DatasetFacts, ...] | list[DatasetFacts], s: Split, split_flag: str,
               seq_length: int) -> str:
    """DataSource builds no valid/test split when one dataset's share has no document, or too few tokens for
    one sample (seq_length + 1): name it."""
    what = "no validation loss" if s is Split.VALID else "no test loss at the end"
    for d in datasets:
        if d.split_documents[s] == 0:
            return (f"{d.name} has {plural(d.documents, 'document', spec=',')} and --split {split_flag} gives this "
                    f"split none: {what} (give it a larger share)")
        if d.split_tokens[s] < seq_length + 1:
            hold = "holds" if d.split_documents[s] == 1 else "hold"
            return (f"{d.name}'s {plural(d.split_documents[s], 'document', spec=',')} here {hold} "
                    f"{plural(d.split_tokens[s], 'token', spec=',')}, fewer than one sample of --seq-length "
                    f"{seq_length} + 1: {what} (a larger share or more data)")
    return what


def data_lines(facts: DataFacts) -> list[str]:
    """One line per dataset, one for the splits."""
    lines = []
    blend = len(facts.datasets) > 1
    for d in facts.datasets:
        weight = f", blend weight {d.weight:.3g}" if blend else ""
        lines.append(f"data: {d.name} ({d.kind}{weight}): {plural(d.documents, 'document', spec=',')}, "
                     f"{plural(d.tokens, 'token', spec=',')}")
    parts = []
    for s in facts.splits:
        docs = sum(d.split_documents[s.split] for d in facts.datasets)
        tokens = sum(d.split_tokens[s.split] for d in facts.datasets)
        head = f"{SPLIT_NAMES[s.split]} {plural(docs, 'document', spec=',')}, {plural(tokens, 'token', spec=',')}"
        if s.empty is not None:
            parts.append(f"{head}: empty -- {s.empty}")
            continue
        reads = (f"{s.passes:.2g} of an epoch" if s.passes < 1 else
                 f"{s.passes:.3g} epochs (the documents repeat, each pass shuffled anew)")
        parts.append(f"{head} -> {plural(s.samples, 'sample', spec=',')} of {facts.seq_length} + 1 tokens, {reads}")
    lines.append(f"data: --split {facts.split_flag}: " + " | ".join(parts))
    return lines


# --- the schedule --------------------------------------------------------------------------------------------

def schedule_of(flags: dict) -> OptimizerConfig:
    """The learning-rate schedule a run's flags (run_info's "args", a checkpoint's state.json) give."""
    return OptimizerConfig(lr=flags["lr"], min_lr=flags["min_lr"], warmup_iters=flags["lr_warmup_iters"],
                           decay_style=flags["lr_decay_style"], train_iters=flags["train_iters"],
                           decay_iters=flags.get("lr_decay_iters"))


def schedule_text(opt: OptimizerConfig) -> str:
    """'warm-up to 0.001 over 10 iterations, cosine decay to 0.0001 at iteration 100 (--lr-decay-iters ...)'."""
    warm = f"warm-up to {opt.lr:g} over {plural(opt.warmup_iters, 'iteration')}, " if opt.warmup_iters else \
        f"{opt.lr:g}, "
    if opt.decay_style == "constant":
        return warm + "then constant"
    end = opt.decay_iters or opt.train_iters
    why = f"--lr-decay-iters {end}" if opt.decay_iters else "--lr-decay-iters unset: --train-iters"
    return f"{warm}{opt.decay_style} decay to {opt.min_lr:g} at iteration {end} ({why}), then constant"


def schedule_line(flags: dict, global_batch: int, seq_length: int) -> str:
    opt = schedule_of(flags)
    note = ""
    if opt.warmup_iters >= (opt.decay_iters or opt.train_iters) and opt.decay_style != "constant":
        note = " (the warm-up outlasts the decay: the rate never reaches --lr's plateau)"
    return (f"schedule: {plural(flags['train_iters'], 'iteration')} x {plural(global_batch, 'sample')} x "
            f"{plural(seq_length, 'token')} | lr: "
            f"{schedule_text(opt)}{note}")


# --- what the planner predicts --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prediction:
    """The planner's figures for this run's layout, in the units the log lines measure.

    Attributes:
        hardware: what it was predicted for ("cpu.json", "the h200 preset").
        step_s: seconds per iteration; None when the hardware is not this machine's (the uncalibrated cpu
            preset: its rates are placeholders).
        tokens_per_s: tokens per second over all ranks (None with step_s).
        memory_bytes: the fullest rank's peak, by the log line's measure (see `memory_label`).
        memory_label: "peak RSS" (CPU: the planner's tensors + the process before the model) or "max allocated"
            (CUDA: the planner's tensors, without its workspace reserve: max_memory_allocated counts no CUDA
            context).
        tensors_bytes: the planner's tensors of that rank (model states, activations, buffers).
        baseline_bytes: the process's resident bytes before the model was built (CPU); 0 on CUDA.
        error: why there is no prediction (a layout the planner does not model); the rest is then unset.
        stages_note: what the planner priced otherwise than the run: its layers per stage against the run's, when
            they differ (it splits its own way); ZeRO 1-3 at dp 1 as ZeRO 0.
    """

    hardware: str
    step_s: float | None = None
    tokens_per_s: float | None = None
    memory_bytes: float = 0.0
    memory_label: str = "peak RSS"
    tensors_bytes: float = 0.0
    baseline_bytes: float = 0.0
    error: str | None = None
    stages_note: str = ""


def prediction_line(p: Prediction) -> str:
    if p.error is not None:
        return f"planner: no prediction for this layout on {p.hardware}: {p.error}"
    time = (f"{p.step_s * 1e3:.4g} ms/iter, {p.tokens_per_s:,.0f} tokens/s, " if p.step_s is not None else
            "no time (the cpu preset's rates are placeholders: `hybrid calibrate --out cpu.json`, then "
            "--hardware cpu.json), ")
    if p.baseline_bytes:
        memory = (f"{p.memory_label} {p.memory_bytes / MIB:,.0f} MiB on the fullest rank (its tensors "
                  f"{p.tensors_bytes / MIB:,.1f} MiB + this process before the model {p.baseline_bytes / MIB:,.0f} "
                  f"MiB)")
    else:
        memory = (f"{p.memory_label} {p.memory_bytes / MIB:,.0f} MiB on the fullest rank (its tensors; the "
                  f"planner's 2 GB CUDA reserve left out, as max_memory_allocated leaves it out)")
    note = f" ({p.stages_note})" if p.stages_note else ""
    return f"planner: this layout on {p.hardware}: {time}{memory}{note} -- compare with the iteration lines"


# --- resume ---------------------------------------------------------------------------------------------------

# flags that say how a run starts, stops, saves or logs, not what it computes: left out of the comparison
RUN_CONTROL = {"load", "save", "save_interval", "save_keep", "ckpt_step", "no_load_optim", "no_load_rng",
               "overwrite_save", "async_save", "exit_signal_handler", "exit_interval", "log_interval",
               "timing_log_interval", "tensorboard_dir", "metrics_file", "timeline", "distributed_timeout_minutes", "hardware",
               "peak_tflops", "watchdog_timeout", "straggler_factor", "auto_parallel", "data_cache_path"}
# the layout, compared as one (the layout line)
LAYOUT_FLAGS = {"tensor_model_parallel_size", "context_parallel_size", "pipeline_model_parallel_size",
                "num_layers_per_virtual_pipeline_stage", "virtual_pipeline_model_parallel_size", "pipeline_schedule", "pipeline_partition",
                "pipeline_layers_per_stage", "zero_stage", "micro_batch_size"}
SCHEDULE_FLAGS = ("lr", "min_lr", "lr_warmup_iters", "lr_decay_style", "train_iters", "lr_decay_iters")
# flags that choose which samples a step reads (with train_iters and the global batch: `data_order_line`)
DATA_FLAGS = ("seed", "data_path", "split", "seq_length")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _value(v) -> str:
    """A flag's value as typed: None is unset, a list its words."""
    return "unset" if v is None else " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def changed_flags(saved: dict, now: dict) -> dict[str, tuple]:
    """{dest: (saved value, this run's)} for the flags that differ (run control and layout left out); a flag the
    checkpoint did not record (an older version's) is left out too."""
    out = {}
    for k in sorted(set(saved) & set(now)):
        if k not in RUN_CONTROL and k not in LAYOUT_FLAGS and _json(saved[k]) != _json(now[k]):
            out[k] = (saved[k], now[k])
    return out


def _json(v):
    """A value as state.json holds it (a tuple is a list there)."""
    return list(v) if isinstance(v, tuple) else v


def schedule_of_run(args: dict, layout: dict) -> str:
    """The pipeline schedule a run recorded in state.json ran: --pipeline-schedule, or train.py's default for its
    chunks (interleaved with virtual stages, else 1F1B; hybrid/train/args.py)."""
    return args.get("pipeline_schedule") or ("interleaved" if layout.get("v", 1) > 1 else "1f1b")


def schedule_change_line(old: dict, new: dict, lay_old: dict, lay_new: dict) -> str | None:
    """The pipeline schedule, when it changed (--pipeline-schedule is a layout flag, left out of the flags line;
    1f1b -> zbh1 at the same stages changed nothing the layout line compares, and the resume said "the same flags
    and layout"). None at pp 1 (no schedule runs) or when it is the same."""
    was, now = schedule_of_run(old, lay_old), schedule_of_run(new, lay_new)
    if lay_new.get("pp", 1) == 1 or lay_old.get("pp", 1) == 1 or was == now:
        return None
    return f"resume: pipeline schedule {was} -> {now}: the order of each step's passes, its memory and its time " \
           f"are the new schedule's"


def implied_batch_line(saved_gb: int, global_batch: int, mb_old, mb_new, dp_old, dp_new) -> str:
    """--global-batch-size unset in both runs (Megatron's default: micro-batch x dp) and a resume at another dp or
    micro-batch: the global batch -- the samples each optimizer step averages -- changed with no flag changed, and
    nothing said it (round 21: docs/checkpoint.md's tp 2 x pp 2 run, 4 samples a step, resumed at dp 2 with 8).
    Names each factor that moved (round 21's review: a micro-batch 2 -> 3 at dp 1 read "dp 1 -> 1")."""
    moved = ", ".join(f"{name} {a} -> {b}" for name, a, b in (("micro-batch", mb_old, mb_new), ("dp", dp_old, dp_new))
                      if a != b)
    return (f"resume: global batch {saved_gb} -> {global_batch} samples a step (--global-batch-size unset: "
            f"micro-batch x dp, {moved}): each step averages another number of samples; "
            f"{_keep_batch(saved_gb, mb_new, dp_new)}")


def _keep_batch(saved_gb: int, micro: int, dp: int) -> str:
    """The flags that keep the saved run's global batch G at this dp: the data loader takes a G that micro-batch x dp
    divides (hybrid/data/text.py), so at G % (micro x dp) != 0 the largest micro-batch dividing G / dp goes with it
    (round 21's review: "pass --global-batch-size 2" at micro-batch 3 was refused)."""
    if saved_gb % (micro * dp) == 0:
        return f"pass --global-batch-size {saved_gb} to keep the saved run's"
    if saved_gb % dp == 0:
        fit = max(m for m in range(1, micro + 1) if (saved_gb // dp) % m == 0)
        return f"pass --global-batch-size {saved_gb} --micro-batch-size {fit} to keep the saved run's"
    return f"no global batch of {saved_gb} runs at dp {dp} (micro-batch x dp must divide it)"


def layout_text(layout: dict) -> str:
    v = f" (v {layout['v']})" if layout.get("v", 1) > 1 else ""
    cp = f" x cp {layout['cp']}" if layout.get("cp", 1) > 1 else ""
    return (f"tp {layout['tp']}{cp} x pp {layout['pp']}{v} x dp {layout['dp']}, ZeRO {layout['zero']}, stages "
            f"{[len(s) for s in layout.get('stages', [])]}")


def lr_change_line(saved_flags: dict, now_flags: dict, start: int) -> str | None:
    """Compare the two schedules at every remaining step [start, train_iters); None when no schedule flag
    changed."""
    if all(saved_flags.get(k) == now_flags.get(k) for k in SCHEDULE_FLAGS if k in saved_flags):
        return None
    new = schedule_of(now_flags)
    try:  # a checkpoint's state.json is data: its recorded flags may name no schedule (OptimizerConfig refuses)
        old = schedule_of({**now_flags, **saved_flags})
    except (ValueError, TypeError) as e:
        return (f"resume: the checkpoint's recorded lr schedule is not one hybrid runs ({e}); this run steps at its "
                f"own flags' rates: {schedule_text(new)}")
    if start >= new.train_iters:
        return None  # nothing left to run (resume_lines says so)
    differ = next((k for k in range(start, new.train_iters) if old.lr_at(k) != new.lr_at(k)), None)
    if differ is None:
        return (f"resume: lr schedule unchanged for iterations {start + 1}-{new.train_iters}: "
                f"{schedule_text(new)}")
    hint = ""
    old_end, new_end = old.decay_iters or old.train_iters, new.decay_iters or new.train_iters
    same_shape = (old.lr, old.min_lr, old.warmup_iters, old.decay_style) == \
        (new.lr, new.min_lr, new.warmup_iters, new.decay_style)
    if old_end != new_end and same_shape and old.decay_style != "constant":
        hint = (f"; to keep the saved run's schedule pass --lr-decay-iters {old_end} (the decay then ends where it "
                f"did and iterations past it run at --min-lr)")
    return (f"resume: lr schedule changed: iteration {differ + 1} runs at {new.lr_at(differ):.4g} where the saved "
            f"run's schedule gives {old.lr_at(differ):.4g} (now: {schedule_text(new)}; saved: "
            f"{schedule_text(old)}){hint}")


def train_epochs(facts: DataFacts, samples: int) -> list[tuple[int, bool]]:
    """(epochs, last shuffled alone) of each dataset's train split when the run asks for `samples`: the train
    order is a function of these and the seed (hybrid/data/gpt.py, `epoch_plan`)."""
    blend = len(facts.datasets) > 1
    need = samples_per_dataset([d.weight for d in facts.datasets], samples) if blend else [samples]
    return [epoch_plan(d.split_tokens[Split.TRAIN], facts.seq_length, n) if d.split_tokens[Split.TRAIN] else (0, False)
            for d, n in zip(facts.datasets, need)]


def data_order_line(saved_flags: dict, now_flags: dict, facts: DataFacts, global_batch: int,
                    saved_global_batch: int, consumed: int, start: int) -> str | None:
    """Whether the samples from `consumed` on are the ones the saved run would have read next. A run reads
    [consumed, consumed + (train_iters - start) G) of a train split of `train_samples` (hybrid/data/source.py):
    --train-iters x G (Megatron's sizing), or that end when it is larger -- a resume at a smaller global batch
    than the checkpoint's (round 22: the split ended at train_iters x G and the run wrapped around to samples the
    saved run read). The saved run's split is the same function of its flags and this checkpoint: its reads, from
    wherever it started, end at consumed + (its train_iters - start) x its G. The same epoch plan is the same
    order (same_order_up_to), so the run then reads the saved order's next samples. None when --train-iters is not
    past the checkpoint's iteration: the run reads no sample ("nothing left to train" says so; a range here read
    "samples 16-15 (the checkpoint's 16 + -1 iterations x 8)")."""
    if now_flags["train_iters"] <= start:
        return None
    for k in DATA_FLAGS:
        if k in saved_flags and _json(saved_flags[k]) != _json(now_flags.get(k)):
            return (f"resume: data order changed: {_flag(k)} differs from the saved run's, so the samples from "
                    f"{consumed:,} on are not the ones it would have read")
    iters = now_flags["train_iters"]
    old_samples = train_samples(saved_flags["train_iters"], saved_global_batch, start, consumed)
    new_samples = train_samples(iters, global_batch, start, consumed)  # what loop.run builds (DataSource.covering)
    end = consumed + max(iters - start, 0) * global_batch  # one past the last sample this run reads: <= new_samples
    if old_samples == new_samples:
        return None
    old, new = train_epochs(facts, old_samples), train_epochs(facts, new_samples)
    span = "; ".join(f"{e} epoch{'s' if e != 1 else ''}{', the last shuffled alone' if alone else ''}"
                     for e, alone in new)
    head, say_reads = split_text(new_samples, old_samples, iters, global_batch, end)
    reads = "; " + reads_text(consumed, end, iters - start, global_batch, old == new) if say_reads else ""
    if old == new:
        return (f"resume: data order unchanged: {head} and its shuffle still spans {span}, as the saved run's "
                f"did{reads}")
    was = "; ".join(f"{e}{', the last alone' if alone else ''}" for e, alone in old)
    return (f"resume: data order changed: {head}, so its shuffle spans {span} (was {was}) and is drawn anew: the "
            f"samples from {consumed:,} on differ from the saved run's plan"
            f"{keep_order_hint(facts, old_samples, global_batch, start, consumed)}{reads}")


def split_text(size: int, old_size: int, iters: int, global_batch: int, end: int) -> tuple[str, bool]:
    """(what the train split is now built for, whether the run's reads need saying: they are not its first
    `size`). Three cases: the reads end the split past Megatron's train_iters x G (the checkpoint read more than
    start x G, at a larger batch: built to their end); they fill it (consumed = start x G: the split's first
    `size`); they end before it (a larger batch: consumed < start x G)."""
    if end == size and size > iters * global_batch:
        return (f"the train split is now built for {size:,} samples, the end of what this run reads (--train-iters "
                f"{iters} x the global batch {global_batch} = {iters * global_batch:,}, Megatron's sizing, would end "
                f"{size - iters * global_batch:,} samples before it and wrap around to samples the saved run read; "
                f"was {old_size:,})"), True
    if end == size:
        return f"the train split is now read for {size:,} samples (was {old_size:,})", False
    return (f"the train split is now built for {size:,} samples (--train-iters {iters} x the global batch "
            f"{global_batch}, Megatron's sizing; was {old_size:,})"), True


def reads_text(consumed: int, end: int, iters: int, global_batch: int, same_order: bool) -> str:
    """The samples a resumed run reads, [consumed, end), when they are not the split's first ones; in the saved
    order they are the ones after the checkpoint's, none of them read before (the saved run read [0, consumed))."""
    text = (f"this run reads its samples {consumed:,}-{end - 1:,} (the checkpoint's {consumed:,} + {iters} "
            f"iteration{'s' if iters != 1 else ''} x {global_batch})")
    return f"{text}, the saved order's next samples: none read before" if same_order else text


def keep_order_hint(facts: DataFacts, old_samples: int, global_batch: int, start: int, consumed: int) -> str:
    """The --train-iters that keep the saved order: those whose train split (train_samples: k G, plus the
    checkpoint's surplus consumed - start G over a smaller batch) falls in the interval of sizes with the saved
    epoch plan; '' when none trains a step (k > start)."""
    surplus = max(consumed - start * global_batch, 0)
    low, high = same_order_from(facts, old_samples), same_order_up_to(facts, old_samples)
    first = max(-(-(low - surplus) // global_batch), start + 1)
    last = (high - surplus) // global_batch
    if last < first:
        return ""
    which = f"up to {last}" if first == start + 1 else f"{first} to {last}"
    return f"; --train-iters {which} keeps the saved order"


def same_order_up_to(facts: DataFacts, samples: int) -> int:
    """The most samples a run may ask for and still draw the train order a run asking for `samples` drew: the
    (epochs, last alone) plan is the same on an interval of sample counts (epochs only grow; within an epoch count
    the last epoch is shuffled alone below Megatron's 80 % and with the others above it), found by bisection."""
    plan = train_epochs(facts, samples)
    lo, hi = samples, max(2 * samples, 1)
    while train_epochs(facts, hi) == plan:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if train_epochs(facts, mid) == plan else (lo, mid)
    return lo


def same_order_from(facts: DataFacts, samples: int) -> int:
    """The fewest samples (>= 1) a run may ask for and still draw the order a run asking for `samples` drew: the
    low end of same_order_up_to's interval, by bisection on [1, samples]."""
    plan = train_epochs(facts, samples)
    if train_epochs(facts, 1) == plan:
        return 1
    lo, hi = 1, samples  # plan(lo) differs, plan(hi) is the plan
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if train_epochs(facts, mid) == plan else (mid, hi)
    return hi


def resume_lines(saved: dict, now: dict, start: int, consumed: int, facts: DataFacts | None,
                 global_batch: int) -> list[str]:
    """What differs between the checkpoint's run (`saved`: its state.json) and this one (`now`: run_info), and
    what that changes: the learning-rate schedule, the data order, the layout."""
    if saved.get("contents") == "model" or "args" not in saved:
        return [f"resume: a converted checkpoint (weights only, no run recorded): iteration {start}, a fresh "
                f"optimizer, the schedule and data order of this run's flags"]
    old, new = saved["args"], now["args"]
    lines = []
    changed = changed_flags(old, new)
    if changed:
        lines.append("resume: flags changed since the checkpoint: "
                     + ", ".join(f"{_flag(k)} {_value(a)} -> {_value(b)}" for k, (a, b) in changed.items()))
    if start >= new["train_iters"]:
        lines.append(f"resume: the checkpoint is at iteration {start} and --train-iters is {new['train_iters']}: "
                     f"nothing left to train (raise --train-iters to continue)")
    lay_old, lay_new = saved.get("layout", {}), now["layout"]
    moved = any(lay_old.get(k, 1) != lay_new.get(k, 1) for k in ("tp", "cp", "pp", "dp", "zero", "v", "stages"))
    if moved:
        lines.append(f"resume: layout changed: saved at {layout_text(lay_old)}, now {layout_text(lay_new)}: the "
                     f"checkpoint is resharded on load; losses agree with the saved layout's up to fp32 summation "
                     f"order, and dropout's per-rank streams restart unless tp, pp and dp are the same")
    if (line := schedule_change_line(old, new, lay_old, lay_new)) is not None:
        lines.append(line)
    saved_gb = old.get("global_batch_size") or old.get("micro_batch_size", 0) * lay_old.get("dp", 0) or global_batch
    # "the same samples per step" only where the global batch is the same (round 21's review: with
    # --global-batch-size unset the micro-batch moves it, and this line contradicted the global-batch line below)
    if (not moved and old.get("micro_batch_size") != new.get("micro_batch_size") and "micro_batch_size" in old
            and saved_gb == global_batch):
        lines.append(f"resume: micro-batch {old['micro_batch_size']} -> {new['micro_batch_size']}: the same samples "
                     f"per step, accumulated in other slices")
    if (line := lr_change_line(old, new, start)) is not None:
        lines.append(line)
    if saved_gb != global_batch and "global_batch_size" not in changed:
        lines.append(implied_batch_line(saved_gb, global_batch, old.get("micro_batch_size"),
                                        new.get("micro_batch_size"), lay_old.get("dp"), lay_new.get("dp")))
    if facts is not None and (line := data_order_line(old, new, facts, global_batch, saved_gb, consumed, start)):
        lines.append(line)
    if (line := powersgd_cast_line(saved, now)) is not None:
        lines.append(line)
    if not lines:
        lines.append(f"resume: the checkpoint's run had the same flags and layout: iterations {start + 1}-"
                     f"{new['train_iters']} run as the uninterrupted run would (same learning rates, same samples)")
    return lines


def grads_dtype(flags: dict) -> str:
    """The dtype a run's gradients accumulate and reduce in, from its flags as state.json records them: "fp32" with
    fp32 main gradients (hybrid/train/args.py grads_in_fp32, the run's own reading), else the compute dtype. A
    checkpoint saved before round 22 records no --grad-reduce-in-bf16: --bf16 then reduced in bf16 unless
    --accumulate-allreduce-grads-in-fp32."""
    from argparse import Namespace
    from hybrid.train.args import grads_in_fp32
    compute = "bf16" if flags.get("bf16") else "fp16" if flags.get("fp16") else "fp32"
    fp32_flag = bool(flags.get("accumulate_allreduce_grads_in_fp32"))
    if "grad_reduce_in_bf16" in flags:
        fp32_flag = grads_in_fp32(Namespace(bf16=bool(flags.get("bf16")), accumulate_allreduce_grads_in_fp32=fp32_flag,
                                            grad_reduce_in_bf16=bool(flags["grad_reduce_in_bf16"])))
    return "fp32" if fp32_flag else compute


def _gradient_powersgd(flags: dict) -> bool:
    """PowerSGD of the gradients (--powersgd-rank R; not 1-bit Adam's momentum compressor, which takes that rank)."""
    return bool(flags.get("powersgd_rank")) and flags.get("onebit_compressor", "sign") != "powersgd"


GRADS_FLAG = {"bf16": " (--grad-reduce-in-bf16)", "fp16": " (--fp16)", "fp32": ""}


def powersgd_cast_line(saved: dict, now: dict) -> str | None:
    """The cast of PowerSGD's error feedback and warm-start Q when the gradient dtype changed since the checkpoint
    (hybrid/compress/state.py: each buffer is allocated in this run's gradient dtype and the load casts into it).
    None unless both runs compress the gradients with PowerSGD and the checkpoint holds state the load reads: its
    counters' iteration past this run's --powersgd-start-iter, the loader's own test (else the state starts empty).
    Widening to fp32 is exact; narrowing rounds each value once, as the narrower run rounds its own residual every
    step (tests/test_compress23_bf16_grads.py checks both casts bit for bit)."""
    old, new = saved.get("args", {}), now["args"]
    counters = saved.get("compress/powersgd")
    if not (_gradient_powersgd(old) and _gradient_powersgd(new) and isinstance(counters, dict)):
        return None
    if not counters.get("iter", 0) > new.get("powersgd_start_iter", 0):
        return None
    was, dtype = grads_dtype(old), grads_dtype(new)
    if was == dtype:
        return None
    how = "exact" if dtype == "fp32" else f"each value rounded to {dtype} once, as this run rounds its own residual " \
                                          f"every step"
    return f"resume: PowerSGD's error feedback and warm-start Q cast from the checkpoint's {was} gradients" \
           f"{GRADS_FLAG[was]} to this run's {dtype}{GRADS_FLAG[dtype]}: {how}"


# --- gathering the facts (rank 0) -----------------------------------------------------------------------------

def weights_of(hf_load: str | None, ckpt_dir: str | None, start: int, saved: dict | None) -> Weights:
    if ckpt_dir is not None:
        return Weights(WeightsKind.CHECKPOINT, ckpt_dir, start, converted=bool(saved) and
                       saved.get("contents") == "model")
    if hf_load is not None:
        from models.hf_io import CheckpointReader
        return Weights(WeightsKind.TRANSFORMERS, hf_load, tensors=len(CheckpointReader(hf_load).files))
    return Weights(WeightsKind.INIT)


def read_saved_state(load_root: str | None, iteration: int) -> tuple[str | None, dict | None]:
    """The resumed checkpoint's directory and state.json (None, None without a hybrid --load)."""
    if load_root is None:
        return None, None
    from hybrid.checkpoint import store
    path = store.final_path(load_root, iteration)
    try:
        return path, store.read_state(path)
    except (OSError, ValueError):
        return path, None


def _run_hardware(hardware_path: str | None, precision, device) -> tuple[object, str, bool]:
    """(Hardware, its name for the line, whether its rates are this machine's): the --hardware profile, else the
    preset of this device (a GPU's nearest by name; on CPU the `cpu` preset, whose rates are placeholders)."""
    import dataclasses

    from hybrid.planner import hardware
    if hardware_path:
        from hybrid.planner.calibrate import load_hardware
        return load_hardware(hardware_path, precision), os.path.basename(hardware_path), True
    if device.type == "cuda":
        import torch
        props = torch.cuda.get_device_properties(device)
        kind = next((k for k in ("h200", "h100-80g") if k.split("-")[0] in props.name.lower()), "a100-80g")
        hw = dataclasses.replace(hardware(kind), memory_bytes=float(props.total_memory))
        return hw, f"the {kind} preset", True
    return hardware("cpu"), "the cpu preset", False


def predict(run, device, baseline_bytes: float) -> Prediction:
    """The planner's evaluation of exactly this run's layout (hybrid/metrics/split.py's run_layout), in the log's
    units: ms/iter, tokens/s, and memory by the device's measure (hybrid/metrics/peak_memory.py). `run`: the
    RunConfig (hybrid/train/config.py)."""
    from hybrid.metrics.split import run_layout, zero_at_dp1
    from hybrid.planner import Cluster, evaluate
    from hybrid.planner.layout import stage_layers

    cfg, dims, batch, plan = run.model.arch, run.parallel.dims, run.training.batch, run.parallel.pipeline
    name = os.path.basename(run.training.hardware) if run.training.hardware else f"this {device.type}"
    if dims.cp > 1:  # evaluate() prices tp x pp x dp: at cp > 1 it would call the running layout one that cannot run
        return Prediction(name, error=f"the start-up line does not price --context-parallel-size {dims.cp} yet "
                                      f"(`hybrid plan --context-parallel-size {dims.cp}` does)")
    try:
        work, layout = run_layout(run.zero, run.model.recompute, run.parallel.sequence_parallel, cfg, dims, batch,
                                  plan.v, plan.kind.splits_backward)
        layout, zero_note = zero_at_dp1(layout)
        hw, name, timed = _run_hardware(run.training.hardware, work.precision, device)
        result = evaluate(work, Cluster(gpus=dims.world, hw=hw), layout)
        experts = run_experts(run, work, Cluster(gpus=dims.world, hw=hw), layout)
    except ValueError as e:  # a model or layout the planner does not describe: its message names why
        return Prediction(name, error=str(e))
    except Exception as e:  # noqa: BLE001 -- a description of the run must never stop it
        return Prediction(name, error=f"the planner failed ({type(e).__name__}: {e})")
    peak = result.memory.peak
    tensors = peak.total - peak.workspace + (experts.extra_bytes if experts else 0.0)
    cuda = device.type == "cuda"
    step = result.time.total + (experts.seconds if experts else 0.0) if timed else None
    ours, theirs = [len(st) for st in plan.stages], list(stage_layers(cfg, dims.pp, plan.v, batch.seq_length))
    return Prediction(name, step, batch.global_batch * batch.seq_length / step if step else None,
                      tensors + (0.0 if cuda else baseline_bytes), "max allocated" if cuda else "peak RSS",
                      tensors, 0.0 if cuda else baseline_bytes,
                      stages_note="; ".join(filter(None, (
                          f"the planner's stages {theirs}, the run's {ours}" if ours != theirs else "", zero_note))))


def run_experts(run, work, cluster, layout):
    """An MoE run's experts at the run's own EP and expert-TP, priced by the planner (hybrid/planner/moe.py); None
    if dense."""
    if run.moe is None:
        return None
    from hybrid.planner.moe import IMBALANCE, expert_plan
    return expert_plan(work, cluster, layout, run.moe.expert_parallel, IMBALANCE, run.moe.expert_tensor_parallel)


def startup_lines(run, info: dict, data: DataSource, start: int, consumed: int, device,
                  baseline_bytes: float) -> list[str]:
    """Every start-up line, in order (rank 0 prints them). `run` is the RunConfig, `info` run_info's dict (what a
    checkpoint records of this run); `start`, `consumed` what the resume returned; `baseline_bytes` the process's
    resident bytes before the model was built."""
    flags, batch, d = info["args"], run.training.batch, run.data
    ckpt_dir, saved = read_saved_state(run.checkpoint.load, start)
    weights = weights_of(run.model.init_weights, ckpt_dir, start, saved)
    lines = [model_line(run.model.name, run.model.arch, weights, run.training.seed)]
    facts = data_facts(data, data.sizes, d.split, flags.get("split", ""), d.eval_iters)  # as built (and resized)
    lines += data_lines(facts)
    lines.append(schedule_line(flags, batch.global_batch, batch.seq_length))
    lines.append(prediction_line(predict(run, device, baseline_bytes)))
    if saved is not None:
        lines += resume_lines(saved, info, start, consumed, facts, batch.global_batch)
    return lines
