"""Communication-efficient data parallelism: final loss and measured DP bytes of each method against synchronous
AdamW, on the reference corpus (docs/data.md: Python's pydoc topics as bytes), TP 2 x PP 2 x DP 2, same tokens.

    python scripts/bench_comm_efficient.py --out docs/results/bench_comm_efficient.md   # the measurement
    python scripts/bench_comm_efficient.py --quick --out /tmp/ce.md                    # smoke run (measures nothing)
    python scripts/bench_comm_efficient.py --tp 1 --pp 1 --dp 2                        # the cheap proxy (2 ranks)
    [--model tiny-llama] [--steps 300] [--global-batch 16] [--micro-batch 2] [--seq 128] [--powersgd-rank 4]
    [--powersgd-extra-ranks 16] [--powersgd-start-iter 20] [--onebit-freeze-iters 20] [--simulated-dp-bandwidth GBPS]
    [--hidden-size H] [--powersgd-min-compression-rate 2]      (diagnostics: another width; compress fewer matrices)
    [--lr 3e-3] [--adam-beta2 0.95] [--lr-warmup-iters 0] [--lr-decay-style constant] [--min-lr 0]
    [--powersgd-variant epfml] [--powersgd-no-error-feedback] [--optimizer sgd] [--sgd-momentum 0.9]
                                                (diagnostics: the PowerSGD authors' library's two half iterations a
                                                step; no error feedback; SGD with momentum for AdamW's row and
                                                PowerSGD's)
    [--rows AdamW,"Momentum PowerSGD"]          (1-bit Adam's scheme with PowerSGD rank --powersgd-rank on the
                                                momentum from --onebit-freeze-iters: run only when named)

Every row runs the same optimizer settings and the same learning-rate schedule (OptimizerConfig.lr_at, the rate
passed to each step as train.py does): the compressors change only the DP exchange.

Each row trains the same model from the same initialisation on the same global batches (8 gloo ranks, one thread
each, the library's own ZeroOptimizer + train_step -- what train.py runs, without its command line) and reports:
the final loss (mean of the last 10 steps' training loss; --quick: last 2), its difference from AdamW's, and the
DP gradient bytes per step as the ledger counted them (hybrid/compress/link.py: dp_gradient_bytes; mean over the
steps after the method's start), and s/step (with --simulated-dp-bandwidth, including the simulated link's sleep;
timing needs a quiet machine). The acceptance bound of issue 31 is |loss - AdamW's| <= 3 %.

Rows are functions in ROWS (name -> row(mesh, args) -> (losses, dp_bytes per step, start step)): other methods
(DiLoCo: hybrid/diloco) add theirs there; --powersgd-extra-ranks adds PowerSGD rows at other ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402

from hybrid.cliutil import (OneLineParser, atomic_output, cpu_name, float_in, nonnegative_float,  # noqa: E402
                            positive_float, positive_int)
from hybrid.testing import run_distributed  # noqa: E402

MICRO = 2  # sequences per forward/backward unless --micro-batch says otherwise


def _setup(mesh, args):
    from hybrid.data import BatchSpec
    from hybrid.pipeline import ScheduleKind, build_schedule
    from hybrid.pipeline.executor import PipelineExecutor, StageIO
    from hybrid.tp import TPContext
    from models import build_pipeline_chunks, load_config
    arch = _arch(args)
    chunks = build_pipeline_chunks(arch, TPContext(mesh.tp), mesh.coords.pp, mesh.dims.pp, 1, seed=args.seed)
    spec = BatchSpec(args.global_batch, args.micro_batch, args.seq, mesh.dims.dp)
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches)[mesh.coords.pp]
    runner = PipelineExecutor(chunks, schedule, mesh.pp,
                              StageIO((args.micro_batch, args.seq, arch.hidden_size), torch.float32), mesh.device)
    return chunks, spec, runner


def _arch(args):
    """The model: the preset, or with --hidden-size its width changed (the heads' count and the MLP's ratio to the
    width kept: head width h / heads, MLP width h x ffn / hidden of the preset), all else the preset's."""
    import dataclasses

    from models import load_config
    arch = load_config(args.model)
    if not args.hidden_size:
        return arch
    h = args.hidden_size
    return dataclasses.replace(arch, hidden_size=h, head_dim=h // arch.num_heads,
                               ffn_hidden_size=h * arch.ffn_hidden_size // arch.hidden_size)


def _opt_cfg(args):
    """Every row's schedule (the compressors' optimizers read the same rate per step)."""
    from hybrid.train_step import OptimizerConfig
    return OptimizerConfig(lr=args.lr, min_lr=args.min_lr, weight_decay=0.01, beta2=args.adam_beta2,
                           warmup_iters=args.lr_warmup_iters, decay_style=args.lr_decay_style, train_iters=args.steps,
                           optimizer=args.optimizer, sgd_momentum=args.sgd_momentum)


def _loop(mesh, args, opt, chunks, spec, runner):
    """The steps on the reference corpus: per-step losses, DP gradient bytes, seconds."""
    from hybrid.compress.link import dp_gradient_bytes
    from hybrid.data import load_corpus, micro_batches
    from hybrid.train_step import train_step
    corpus, losses, sent, secs, sched = load_corpus(), [], [], [], _opt_cfg(args)
    for it in range(args.steps):
        before, t0 = dp_gradient_bytes(mesh.ledger, mesh.dp.name), time.perf_counter()
        losses.append(train_step(chunks, micro_batches(corpus, spec, args.seed, it, mesh.coords.dp), opt, mesh,
                                 lr=sched.lr_at(it), runner=runner))
        secs.append(time.perf_counter() - t0)
        sent.append(dp_gradient_bytes(mesh.ledger, mesh.dp.name) - before)
    return losses, sent, secs


def _reduction(mesh, args, powersgd):
    from hybrid.compress.args import CompressConfig
    from hybrid.compress.reduction import build
    from hybrid.zero import ZeroConfig
    return build(CompressConfig(powersgd=powersgd, simulated_dp_bandwidth=args.simulated_dp_bandwidth), mesh,
                 ZeroConfig(stage=args.zero_stage))


def row_adamw(mesh, args):
    """Synchronous AdamW: the engine's plain reduce-scatter / all-reduce."""
    from hybrid.compress.powersgd import PowerSGDConfig
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    chunks, spec, runner = _setup(mesh, args)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=args.zero_stage), _opt_cfg(args),
                        _reduction(mesh, args, PowerSGDConfig()))
    return (*_loop(mesh, args, opt, chunks, spec, runner), 0)


def _powersgd_cfg(args):
    """The PowerSGD row's config: the run's rank, start and minimum compression rate."""
    from hybrid.compress.powersgd import PowerSGDConfig
    return PowerSGDConfig(rank=args.powersgd_rank, start_iter=args.powersgd_start_iter,
                          min_compression_rate=args.powersgd_min_compression_rate, variant=args.powersgd_variant,
                          error_feedback=not args.powersgd_no_error_feedback)


def row_powersgd(mesh, args):
    """PowerSGD rank r after --powersgd-start-iter plain steps (hybrid/compress/powersgd.py)."""
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    chunks, spec, runner = _setup(mesh, args)
    cfg = _powersgd_cfg(args)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=args.zero_stage), _opt_cfg(args), _reduction(mesh, args, cfg))
    return (*_loop(mesh, args, opt, chunks, spec, runner), args.powersgd_start_iter)


def row_onebit(mesh, args):
    """1-bit Adam after --onebit-freeze-iters Adam steps (hybrid/compress/onebit.py; ZeRO 0 only)."""
    from hybrid.compress.args import CompressConfig
    from hybrid.compress.reduction import build
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    chunks, spec, runner = _setup(mesh, args)
    cfg = CompressConfig(onebit_freeze_iters=args.onebit_freeze_iters,
                         simulated_dp_bandwidth=args.simulated_dp_bandwidth)
    zero = ZeroConfig(stage=0)
    opt = ZeroOptimizer(chunks, mesh, zero, _opt_cfg(args), build(cfg, mesh, zero))
    return (*_loop(mesh, args, opt, chunks, spec, runner), args.onebit_freeze_iters)


def row_onebit_powersgd(mesh, args):
    """1-bit Adam's scheme with PowerSGD rank --powersgd-rank on the momentum instead of signs, after
    --onebit-freeze-iters Adam steps (hybrid/compress/momentum.py; train.py's --optimizer onebit-adam
    --onebit-compressor powersgd; ZeRO 0)."""
    from hybrid.compress.args import CompressConfig
    from hybrid.compress.powersgd import PowerSGDConfig
    from hybrid.compress.reduction import build
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    chunks, spec, runner = _setup(mesh, args)
    psgd = PowerSGDConfig(rank=args.powersgd_rank, start_iter=args.onebit_freeze_iters,
                          min_compression_rate=args.powersgd_min_compression_rate,
                          error_feedback=not args.powersgd_no_error_feedback)
    cfg = CompressConfig(onebit_freeze_iters=args.onebit_freeze_iters, onebit_powersgd=psgd,
                         simulated_dp_bandwidth=args.simulated_dp_bandwidth)
    zero = ZeroConfig(stage=0)
    opt = ZeroOptimizer(chunks, mesh, zero, _opt_cfg(args), build(cfg, mesh, zero))
    return (*_loop(mesh, args, opt, chunks, spec, runner), args.onebit_freeze_iters)


ROWS: dict[str, Callable] = {"AdamW (synchronous)": row_adamw, "PowerSGD": row_powersgd, "1-bit Adam": row_onebit,
                             "Momentum PowerSGD (1-bit Adam's scheme)": row_onebit_powersgd}
OPT_IN = (row_onebit_powersgd,)  # run only when --rows names them: the default table (the acceptance rows) unchanged


def _rows(args) -> dict[str, tuple[Callable, object]]:
    """The rows this run measures: ROWS (those in OPT_IN only when --rows names them), plus a PowerSGD row per
    --powersgd-extra-ranks rank after PowerSGD's
    (name -> (row, its args))."""
    out = {}
    for name, row in ROWS.items():
        if args.rows and name.split(" (")[0] not in args.rows or not args.rows and row in OPT_IN:
            continue
        out[name] = (row, args)
        if row is row_powersgd:
            for r in args.powersgd_extra_ranks:
                out[f"PowerSGD r {r}"] = (row, argparse.Namespace(**{**vars(args), "powersgd_rank": r}))
    return out


def _rank(rank, world, name, args):
    from hybrid.mesh import Mesh, ParallelDims
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=args.tp, pp=args.pp))
    row, row_args = _rows(args)[name]
    losses, sent, secs, start = row(mesh, row_args)
    return {"losses": losses, "sent": sent, "secs": secs, "start": start, "last": mesh.coords.pp == args.pp - 1,
            "replica0": mesh.coords.dp == 0}


def measure(args) -> dict[str, dict]:
    out = {}
    for name in _rows(args):
        res = run_distributed(_rank, args.tp * args.pp * args.dp, args=(name, args), timeout=3600)
        losses = next(r["losses"] for r in res if r["last"])  # the loss as the last pipeline stage has it
        r0 = res[0]
        # one replica's DP gradient bytes: every (tp, pp) rank of DP rank 0, each its collectives' size S
        sent = [sum(step) for step in zip(*(r["sent"] for r in res if r["replica0"]))]
        after = sent[r0["start"]:] or sent
        tail = 2 if args.quick else 10
        out[name] = {"final": statistics.fmean(losses[-tail:]), "bytes": statistics.fmean(after),
                     "secs": statistics.median(r0["secs"]), "start": r0["start"], "curve": losses}
    return out


def _min_rate(args) -> str:
    rate = args.powersgd_min_compression_rate
    return "" if rate == 2 else f", min compression rate {rate:g} (matrices with n m <= {rate:g} r (n + m) whole)"


def _variant(args) -> str:
    """The PowerSGD diagnostics and the optimizer, when not the defaults, for the table's header."""
    out = ""
    if args.powersgd_variant != "torch":
        out += f", PowerSGD variant {args.powersgd_variant} (two half power iterations a step, the authors' library)"
    if args.powersgd_no_error_feedback:
        out += ", PowerSGD without error feedback"
    if args.optimizer == "sgd":
        out += (f"; optimizer SGD, momentum {args.sgd_momentum} (the 'AdamW' row is synchronous SGD; 1-bit Adam stays "
                f"Adam)")
    return out


def report(rows: dict[str, dict], args) -> str:
    base = rows["AdamW (synchronous)"]
    lines = [f"# Communication-efficient DP: loss and DP bytes vs synchronous AdamW "
             f"({'--quick: measures nothing' if args.quick else 'measured'})", "",
             f"- TP {args.tp} x PP {args.pp} x DP {args.dp} (gloo, one thread per rank), {args.model}"
             f"{f' at hidden size {args.hidden_size}' if args.hidden_size else ''}, ZeRO "
             f"{args.zero_stage}, {args.steps} steps, global batch {args.global_batch} x {args.seq} tokens (micro-batch "
             f"{args.micro_batch}), lr "
             f"{args.lr} ({args.lr_warmup_iters} warm-up steps, then {args.lr_decay_style}"
             f"{'' if args.lr_decay_style == 'constant' else f' to {args.min_lr}'}), Adam betas (0.9, "
             f"{args.adam_beta2}), weight decay 0.01 -- every row; PowerSGD rank {args.powersgd_rank}"
             f"{_min_rate(args)}{_variant(args)}"
             f"; the reference "
             f"corpus (docs/data.md); simulated DP link: "
             f"{f'{args.simulated_dp_bandwidth} GB/s' if args.simulated_dp_bandwidth else 'off'}",
             f"- machine: {cpu_name()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; torch "
             f"{torch.__version__}", "",
             "| method | final loss | vs AdamW | DP bytes / step, one replica (after start) | vs AdamW "
             "| s/step (median) |",
             "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        start = f" (from step {r['start']})" if r["start"] else ""
        rel = 100 * (r["final"] / base["final"] - 1)
        lines.append(f"| {name}{start} | {r['final']:.4f} | {rel:+.2f} % | {r['bytes']:,.0f} | "
                     f"{r['bytes'] / base['bytes']:.3f}x | {r['secs']:.3f} |")
    return "\n".join(lines) + "\n"


def _check_model(p: OneLineParser, args) -> None:
    """--model, --hidden-size, --tp, --pp and --seq against the model, in this process before any rank is spawned
    (an unknown preset or a --tp not dividing the heads was each rank's traceback): train.py's rules
    (mesh.validate_model_dims, the learned positions), named by this script's flags."""
    from hybrid.mesh import ParallelDims, validate_model_dims
    from models import load_config
    try:
        heads = load_config(args.model).num_heads
    except ValueError as e:
        p.error(str(e))
    if args.hidden_size and args.hidden_size % (heads * args.tp):
        p.error(f"--hidden-size must be a multiple of the model's {heads} heads x --tp {args.tp}")
    arch = _arch(args)
    if arch.num_experts and (not args.rows or {"1-bit Adam", "Momentum PowerSGD"} & set(args.rows)):
        p.error(f"--model {args.model}: the 1-bit Adam row does not run with MoE experts (as train.py's "
                f"--optimizer onebit-adam); give --rows AdamW,PowerSGD")
    try:
        validate_model_dims(ParallelDims(tp=args.tp, pp=args.pp), arch.num_heads, arch.num_kv_heads,
                            arch.num_layers, arch.ffn_hidden_size)
    except ValueError as e:
        p.error(str(e).replace("--tensor-model-parallel-size", "--tp").replace("--pipeline-model-parallel-size",
                                                                               "--pp"))
    if args.seq > arch.max_position_embeddings:
        p.error(f"--seq {args.seq} exceeds the model's {arch.max_position_embeddings} positions; use at most "
                f"{arch.max_position_embeddings}")


def main(argv=None) -> None:
    p = OneLineParser(prog="bench_comm_efficient.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few steps: a smoke test")
    p.add_argument("--out", default=None, metavar="PATH", help="write the markdown table here")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write every row with its per-step loss curve (scripts/plot_comm_efficient.py draws it)")
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--hidden-size", type=positive_int, default=0, metavar="H",
                   help="the model's width instead of the preset's (heads kept, MLP width scaled with it): is a "
                        "gap a property of a narrow model?")
    p.add_argument("--steps", type=positive_int, default=300)
    p.add_argument("--global-batch", type=positive_int, default=16,
                   help="sequences per step over the DP replicas (each replica's G / dp, accumulated in micro-batches)")
    p.add_argument("--micro-batch", type=positive_int, default=MICRO,
                   help="sequences per forward/backward (the same mean gradient per step; a larger one runs a large "
                        "--global-batch faster on CPU)")
    p.add_argument("--seq", type=positive_int, default=128)
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--adam-beta2", type=float, default=0.95, help="every row's (train.py's default, Megatron's)")
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam",
                   help="the AdamW and PowerSGD rows' optimizer (sgd: SGD with --sgd-momentum, PowerSGD's paper's); "
                        "1-bit Adam is always Adam")
    p.add_argument("--sgd-momentum", type=float_in(0.0, 1.0, high_open=True), default=0.9)
    p.add_argument("--min-lr", type=float, default=0.0, help="the decay's floor (with --lr-decay-style linear/cosine)")
    p.add_argument("--lr-warmup-iters", type=int, default=0)
    p.add_argument("--lr-decay-style", choices=("constant", "linear", "cosine"), default="constant")
    p.add_argument("--tp", type=positive_int, default=2)
    p.add_argument("--pp", type=positive_int, default=2)
    p.add_argument("--dp", type=positive_int, default=2, help="the proxy: --tp 1 --pp 1 --dp 2")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2), default=0,
                   help="0 (default): the DP bytes are the gradients' alone; 1-2 add the parameter all-gather")
    p.add_argument("--powersgd-rank", type=positive_int, default=4)
    p.add_argument("--rows", type=lambda v: v.split(","), default=[], metavar="NAME,NAME",
                   help="only these rows (AdamW, PowerSGD, 1-bit Adam, Momentum PowerSGD: the last only when named); "
                        "AdamW is always run (the baseline)")
    p.add_argument("--powersgd-extra-ranks", type=lambda v: [positive_int(x) for x in v.split(",")], default=[],
                   metavar="R,R", help="also a PowerSGD row at each of these ranks (the rank's effect on the loss)")
    p.add_argument("--powersgd-min-compression-rate", type=float, default=2.0, metavar="RATE",
                   help="compress a matrix only when n m > RATE r (n + m) (torch's min_compression_rate, default 2; "
                        "the PowerSGD authors' library's README example uses 10): a diagnostic of the bench, "
                        "train.py keeps torch's 2")
    p.add_argument("--powersgd-variant", choices=("torch", "epfml"), default="torch",
                   help="torch (default): torch's powerSGD_hook; epfml: the PowerSGD authors' library, two half power "
                        "iterations a step with error feedback after each (num_iters_per_step 2)")
    p.add_argument("--powersgd-no-error-feedback", action="store_true",
                   help="torch's use_error_feedback=False: the residual is dropped, not carried (a diagnostic)")
    p.add_argument("--powersgd-start-iter", type=int, default=20)
    p.add_argument("--onebit-freeze-iters", type=int, default=20)
    p.add_argument("--simulated-dp-bandwidth", type=nonnegative_float, default=0.0, metavar="GBPS",
                   help="GB/s of the simulated DP link (0: off)")
    args = p.parse_args(argv)
    for flag, path in (("--out", args.out), ("--json", args.json)):
        p.check_out(flag, path)  # the parser's one line (check_output_file's ValueError was a traceback)
    if args.quick:
        args.steps, args.global_batch, args.seq, args.powersgd_start_iter, args.onebit_freeze_iters = 4, 8, 32, 2, 2
    if args.global_batch % (args.micro_batch * args.dp):
        p.error(f"--global-batch {args.global_batch} must be a multiple of --micro-batch {args.micro_batch} x --dp "
                f"{args.dp} = {args.micro_batch * args.dp}")
    if args.powersgd_start_iter < 2 or args.powersgd_start_iter >= args.steps:
        p.error(f"--powersgd-start-iter must be >= 2 and below --steps ({args.steps})")
    if args.onebit_freeze_iters < 1 or args.onebit_freeze_iters >= args.steps:
        p.error(f"--onebit-freeze-iters must be >= 1 and below --steps ({args.steps})")
    if args.rows:
        unknown = [r for r in args.rows if r not in {n.split(" (")[0] for n in ROWS}]
        if unknown:
            p.error(f"--rows: unknown row {unknown[0]!r}; rows: AdamW, PowerSGD, 1-bit Adam, Momentum PowerSGD")
        args.rows = ["AdamW"] + [r for r in args.rows if r != "AdamW"]
    _check_model(p, args)
    if not 0 <= args.lr_warmup_iters < args.steps:
        p.error(f"--lr-warmup-iters must be >= 0 and below --steps ({args.steps})")
    if not args.powersgd_min_compression_rate >= 1:
        p.error("--powersgd-min-compression-rate must be >= 1 (a compressed matrix must send fewer numbers)")
    if not 0 <= args.adam_beta2 < 1 or not 0 <= args.min_lr <= args.lr:
        p.error("--adam-beta2 must be in [0, 1) and --min-lr in [0, --lr]")
    rows = measure(args)
    text = report(rows, args)
    print(text)
    if args.json:
        with atomic_output(args.json) as tmp, open(tmp, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    if args.out:
        with atomic_output(args.out) as tmp, open(tmp, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
