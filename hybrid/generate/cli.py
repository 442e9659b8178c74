"""`hybrid generate` on the command line: every input checked before any process group, then the job started as
training starts (hybrid/launch.py: the launcher's environment, the device, the process group with
`--distributed-timeout-minutes` on start-up and every collective, a heartbeat naming a lost rank), the tp x pp mesh
built, the model loaded and decoded (decode.py).

    hybrid generate exported/ --prompt "Once upon a time"                      # one process
    torchrun --nproc-per-node 4 -m hybrid.cli generate ckpt/ --prompt "..." --pipeline-model-parallel-size 2
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import timedelta

from hybrid.cliutil import HelpFormatter, fail, float_in, int_in, is_rank_zero, outlive_rank_zero, plural
from hybrid.generate import decode
from hybrid.generate.decode import SamplingConfig, find_codec, generate, load_model, prompt_ids, read_source
from hybrid.launch import DEFAULT_TIMEOUT_MINUTES, MAX_TIMEOUT_MINUTES, check_launch, distributed, env_world


@dataclass(frozen=True)
class Layout:
    """How generate spreads the model: world = tp x pp (no data parallelism: one prompt).

    Attributes:
        tp: tensor-parallel size.
        pp: pipeline stages.
        stages: each stage's global layer ids (hybrid.partition.partition_layers).
    """

    tp: int
    pp: int
    stages: list[tuple[int, ...]]

    def describe(self) -> str:
        return f"tp {self.tp}" + (f" x pp {self.pp} (layers {[len(s) for s in self.stages]})" if self.pp > 1 else "")


def _check_layout(args: argparse.Namespace, world: int, cfg) -> Layout:
    """The layout (default tp: every launched process / pp); one line naming the flag when it cannot run."""
    from hybrid.mesh import ParallelDims, validate_model_dims
    from hybrid.partition import parse_layers_per_stage, partition_layers
    pp = args.pipeline_model_parallel_size
    validate_model_dims(ParallelDims(tp=1, pp=pp), cfg.num_heads, cfg.num_kv_heads, cfg.num_layers)
    manual = parse_layers_per_stage(args.pipeline_layers_per_stage) if args.pipeline_layers_per_stage else None
    if manual is not None and pp == 1:  # train.py's words (hybrid/train/args.py _check_one_stage); no virtual stages
        raise ValueError(f"--pipeline-layers-per-stage splits the layers over the pipeline's stages, and there is one "
                         f"(--pipeline-model-parallel-size 1, holding all {cfg.num_layers} layers): give "
                         f"--pipeline-model-parallel-size N or drop --pipeline-layers-per-stage")
    if manual is None and cfg.num_layers % pp:  # the uniform split's own message names train.py's --pipeline-partition
        q, r = divmod(cfg.num_layers, pp)
        counts = ",".join(map(str, [q] * (pp - r) + [q + 1] * r))
        raise ValueError(f"--pipeline-model-parallel-size {pp} does not divide the {cfg.num_layers} layers; give "
                         f"the layers per stage, e.g. --pipeline-layers-per-stage {counts}")
    stages = partition_layers(cfg.num_layers, pp, 1, layers_per_stage=manual)  # uniform unless given
    tp = args.tensor_model_parallel_size or max(1, world // pp)
    if tp * pp != world:
        launched = "1 was" if world == 1 else f"{world} were"
        flags = f"--tensor-model-parallel-size {tp}" + (f" x --pipeline-model-parallel-size {pp}" if pp > 1 else "")
        raise ValueError(f"{flags} needs {tp * pp} processes, but {launched} launched; "
                         f"use torchrun --nproc-per-node {tp * pp}")
    validate_model_dims(ParallelDims(tp=tp, pp=pp), cfg.num_heads, cfg.num_kv_heads, cfg.num_layers)
    return Layout(tp, pp, stages)


def check_guessed_bytes(args: argparse.Namespace, cfg, codec, state: dict | None, folder: str = "") -> None:
    """A train.py run that read an indexed dataset (--data-path PREFIX) and recorded no tokenizer (the tokenizer
    flags are optional there: the ids are in the .bin) left a checkpoint whose ids are the preprocessing
    tokenizer's. Read as UTF-8 bytes (find_codec's last resort), a --prompt became other tokens and every id >= 256
    the model generated was dropped from the text: a blank answer, silently. Refused when the model's vocabulary is
    larger than bytes' 256 and a --data-path entry is not a text file here (text and ByteLevel data are bytes); for a
    transformers folder, when its export's hybrid_tokens.json says "ids" (README's byte-level export says "bytes")."""
    if args.prompt is None or not codec.guessed or cfg.vocab_size <= 256:
        return
    if state is None:  # a transformers folder: what its export recorded (hybrid/convert/tokenizer_out.py)
        from hybrid.convert.tokenizer_out import TOKENS_FILE, export_tokens
        if export_tokens(folder) == "ids":
            raise ValueError(f"--prompt: SRC's {TOKENS_FILE} says its tokens are the ids of an indexed dataset whose "
                             f"tokenizer the run did not record (no tokenizer in SRC), and its vocabulary of "
                             f"{cfg.vocab_size} is not UTF-8 bytes' 256; give --tokenizer (the tokenizer the data "
                             f"was preprocessed with) or --prompt-ids")
        return
    from hybrid.data.args import not_text_files
    indexed = not_text_files(state.get("args", {}).get("data_path"))
    if indexed:
        raise ValueError(f"--prompt: SRC's run read --data-path {indexed[0]} (token ids of the tokenizer it was "
                         f"preprocessed with) and recorded no tokenizer, and its vocabulary of {cfg.vocab_size} is "
                         f"not UTF-8 bytes' 256; give --tokenizer (that tokenizer's folder or tokenizer.json) or "
                         f"--prompt-ids")


def _validate(args: argparse.Namespace):
    """Every check, before any process group: (world, layout, sampling, codec, prompt, (cfg, folder, state))."""
    if (args.prompt is None) == (args.prompt_ids is None):
        raise ValueError("give one of --prompt TEXT or --prompt-ids 1,2,3")
    sampling = SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    world = env_world()
    check_launch(world)
    source = read_source(args.src, args.model)
    cfg, folder, state = source
    layout = _check_layout(args, world, cfg)
    codec = find_codec(args.tokenizer, folder, state)
    if codec.vocab_size > cfg.vocab_size and not codec.guessed:  # as train.py; --prompt-ids decoded wrong
        raise ValueError(f"tokenizer {codec.source}: vocabulary {codec.vocab_size} exceeds the model's "
                         f"{cfg.vocab_size}; give the tokenizer the model was trained with (--tokenizer)")
    check_guessed_bytes(args, cfg, codec, state, folder)
    ids = prompt_ids(args, cfg, codec)
    room = cfg.max_position_embeddings - ids.shape[1]  # prompt_ids leaves at least one position
    if args.max_new_tokens > room:  # decode.generate would stop at the context, short of what was asked
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: the {ids.shape[1]}-token prompt leaves "
                         f"{room} of the model's {cfg.max_position_embeddings} positions; use --max-new-tokens "
                         f"{room} or less, or a shorter prompt")
    return world, layout, sampling, codec, ids, source


def run(args: argparse.Namespace) -> None:
    try:
        world, layout, sampling, codec, ids, (cfg, folder, state) = _validate(args)
    except ValueError as e:
        error = fail(f"hybrid generate: error: {e}")
        if not is_rank_zero():
            outlive_rank_zero(error)  # rank 0 prints the one line before torchrun stops the job
        raise error from None
    from hybrid.mesh import Mesh, ParallelDims
    timeout = timedelta(minutes=args.distributed_timeout_minutes)
    with distributed(world, timeout) as device:  # the same start-up, timeout and liveness as training
        mesh = Mesh.build(ParallelDims(tp=layout.tp, pp=layout.pp), device=device, timeout=timeout)
        model = load_model(cfg, folder, state is not None, mesh.tp, mesh.pp, layout.stages, mesh.world).to(device)
        out = generate(model, ids.to(device), args.max_new_tokens, cfg.max_position_embeddings, cfg.vocab_size,
                       sampling, mesh.tp, pp=mesh.pp, hidden=cfg.hidden_size).cpu()
    if is_rank_zero():
        new = out[0, ids.shape[1]:].tolist()
        print(f"generate: {plural(len(new), 'new token')} ({sampling.describe()}): {','.join(map(str, new))}")
        print(f"tokenizer: {codec.source}; {layout.describe()} on {device.type}, KV cache")
        print(codec.decode(out[0].tolist()))


# transformers' generate() names, which a user of it types first (round 15: "see --help"): what to give here
BEAMS = "beam search is not implemented: decoding is greedy, or sampled with --temperature T > 0; drop the flag"
GENERATE_HINTS = {
    "--max-length": "--max-length: give --max-new-tokens N (the tokens after the prompt)",
    "--do-sample": "--do-sample: give --temperature T > 0 to sample (0, the default, is greedy)",
    "--num-beams": f"--num-beams: {BEAMS}",
    "--num-return-sequences": "--num-return-sequences: one sequence a run; rerun with another --seed",
    "--repetition-penalty": "--repetition-penalty: not implemented (logits are filtered by --top-k and --top-p "
                            "only); drop the flag",
    "--iteration": "--iteration: give SRC as the checkpoint's iter_NNNNNNN directory (SRC alone: the one `latest` "
                   "names)",
    "--load": "--load: give the checkpoint as SRC (hybrid generate DIR --prompt ...)",
}
# round 16's new-user pass: more of transformers' and other tools' names ("see --help", or --prompt-file -> "did you
# mean --prompt-ids?")
_FP32 = "decoding runs in fp32 (the weights, bf16 or not, are read into fp32 parameters); drop the flag"
_FILE = "give the file's text as --prompt \"$(cat FILE)\" (or its token ids as --prompt-ids)"
_STOP = "decoding does not stop at a token: it runs --max-new-tokens tokens; drop the flag"
_DEVICE = "the device is chosen: each rank's GPU (LOCAL_RANK's) where CUDA is present, else the CPU; drop the flag"
GENERATE_HINTS.update({flag: f"{flag}: {what}" for flags, what in (
    (("--bf16", "--fp16", "--dtype", "--torch-dtype"), _FP32),
    (("--prompt-file", "--input", "--input-file"), _FILE),
    (("--eos-token-id", "--stop", "--stop-token"), _STOP),
    (("--device",), _DEVICE),
    (("--stream",), "the tokens are printed when decoding ends (their ids, then the text); drop the flag"),
) for flag in flags})


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("generate", help="greedy or sampled generation from a hybrid checkpoint or "
                              "transformers folder (any TP x PP under torchrun)", description=decode.__doc__,
                              formatter_class=HelpFormatter, hints=GENERATE_HINTS)
    p.add_argument("src", metavar="SRC", help="a hybrid checkpoint directory or a transformers model folder")
    p.add_argument("--prompt", default=None, help="prompt text (through SRC's tokenizer, else UTF-8 bytes)")
    p.add_argument("--prompt-ids", default=None, metavar="IDS", help="prompt as comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int_in(1), default=32, metavar="N", help="tokens to generate")
    p.add_argument("--temperature", type=float_in(0.0), default=0.0, metavar="T",
                   help="0: greedy; > 0: sample from softmax(logits / T)")
    p.add_argument("--top-k", type=int_in(0), default=0, metavar="K", help="sample among the K most likely (0: off)")
    p.add_argument("--top-p", type=float_in(0.0, 1.0, low_open=True), default=1.0, metavar="P",
                   help="sample from the smallest set of tokens holding probability P (1: off)")
    p.add_argument("--seed", type=int_in(0), default=0, metavar="N", help="seed of the sampling generator")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="a tokenizer folder or tokenizer.json (default: SRC's, the run's, else UTF-8 bytes)")
    p.add_argument("--tensor-model-parallel-size", type=int_in(1), default=None, metavar="N",
                   help="TP size (default: the number of processes torchrun launched / the PP size)")
    p.add_argument("--pipeline-model-parallel-size", type=int_in(1), default=1, metavar="N",
                   help="pipeline stages (world = TP x PP); the layers split uniformly unless "
                        "--pipeline-layers-per-stage")
    p.add_argument("--pipeline-layers-per-stage", default=None, metavar="COUNTS",
                   help="layers on each stage, e.g. 1,2 (as train.py's flag)")
    p.add_argument("--model", default=None, metavar="CONFIG", help="hybrid SRC: the model config, if not recorded")
    p.add_argument("--distributed-timeout-minutes", type=float_in(0.0, MAX_TIMEOUT_MINUTES, low_open=True),
                   default=DEFAULT_TIMEOUT_MINUTES, metavar="X",
                   help="bound on process-group start-up and on every collective, as train.py's: a rank that dies "
                        "or stalls ends the job after this long, naming the lost rank")
    p.set_defaults(func=run)
    return p
