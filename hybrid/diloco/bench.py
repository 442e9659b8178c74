"""DiLoCo's convergence row, the companion of scripts/bench_comm_efficient.py (run apart; scripts/plot_comm_efficient.py
--diloco draws its --json beside that bench's): DiLoCo H = 8 against synchronous AdamW, the same
tokens, on tp2 x pp2 x dp2 (8 CPU ranks, gloo), the reference corpus (docs/data.md: Python's pydoc topics as bytes,
the tiny-* presets' data) and the README quick start's shapes (tiny-gpt2, global batch 16, micro-batch 2, seq 128,
train.py's AdamW defaults: lr 1e-3, 10 warm-up steps, cosine to 1e-4, clip 1.0).

    python -m hybrid.diloco.bench            # 200 steps, the quick start's length (minutes on 8 ranks: the lead's)
    python -m hybrid.diloco.bench --quick    # 16 steps, seq 32: a smoke run, measures nothing
    python -m hybrid.diloco.bench --streaming   # and a Streaming DiLoCo row (4 fragments, tau 1, alpha 0.5)

Each row (`rows()`, a list of dicts):
* final_loss: the mean lm loss of the final weights (every replica's after the last sync: steps are a multiple of H;
  Streaming DiLoCo's replicas are never equal -- alpha mixes their own weights in, and the last fragment is still
  in flight at the end -- so its held-out loss is the mean of each replica's loss on its own held-out rows)
  over EVAL held-out global batches (rows drawn with another seed), through the training pipeline at lr 0;
* train_loss: the mean training loss of the last 8 steps (each replica's own on its rows, averaged);
* dp_bytes: rank 0's bytes across data parallelism over the whole run, the ledger's convention (hybrid/comm.py):
  gradient reduction on the DP group for synchronous AdamW; for DiLoCo the outer all-reduce ("diloco") -- 4 x
  rank 0's parameters every H steps -- plus nothing inside the replica (each replica is one DP rank here);
* dp_bytes_per_step: dp_bytes / steps.
Logged losses ("dp:metrics") are not counted. The issue's target: DiLoCo's final loss within 3 % of synchronous
AdamW's at 200 steps, with H x fewer DP bytes.
"""

from __future__ import annotations

import json

import torch

from hybrid.cliutil import OneLineParser, atomic_output
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.diloco.args import DiLoCoConfig
from hybrid.diloco.run import LocalUpdates
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import TPContext
from hybrid.train_step import OptimizerConfig, train_step
from hybrid.zero import ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config

MODEL, GLOBAL, MICRO, SEED, DATA_SEED, EVAL_SEED, EVAL = "tiny-gpt2", 16, 2, 1234, 1234, 4321, 4
H = 8
DILOCO = DiLoCoConfig(inner_steps=H, outer_lr=0.7, outer_momentum=0.9)  # the paper's outer Nesterov
# --streaming: Streaming DiLoCo at the same H, 4 fragments, each all-reduce in flight for one inner step and
# landing mixed with alpha 0.5 (the paper's values for tau and alpha)
STREAMING = DiLoCoConfig(inner_steps=H, outer_lr=0.7, outer_momentum=0.9, fragments=4, fragment_sync_delay=1,
                         fragment_update_alpha=0.5)


def _run(mesh: Mesh, cfg: DiLoCoConfig | None, steps: int, seq: int) -> dict:
    """`steps` of train.py's step on this rank (hybrid/train/loop.py's hooks), then the held-out loss."""
    model_cfg = load_config(MODEL)
    opt_cfg = OptimizerConfig(lr=1e-3, min_lr=1e-4, warmup_iters=min(10, steps // 4), train_iters=steps,
                              clip_grad=1.0)
    chunks = build_pipeline_chunks(model_cfg, TPContext(mesh.tp), mesh.coords.pp, mesh.dims.pp, 1, seed=SEED)
    spec = BatchSpec(GLOBAL, MICRO, seq, mesh.dims.dp)
    io = StageIO((MICRO, seq, model_cfg.hidden_size), torch.float32)
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, spec.num_micro_batches, 1)[mesh.coords.pp]
    runner = PipelineExecutor(chunks, schedule, mesh.pp, io, mesh.device)
    local = LocalUpdates.build(cfg, mesh)
    opt = ZeroOptimizer(chunks, local.mesh, ZeroConfig(), opt_cfg)
    local.checkpointed(opt)
    corpus, losses = load_corpus(), []
    mesh.ledger.reset()
    for it in range(steps):
        losses.append(train_step(chunks, micro_batches(corpus, spec, DATA_SEED, it, mesh.coords.dp), opt, mesh,
                                 lr=opt_cfg.lr_at(it), runner=runner))
        local.after_step(it)
    local.finish()  # Streaming DiLoCo: the last fragment's all-reduce, posted after the last step, waited for
    dp_bytes = sum(e.bytes for (_, g), e in mesh.ledger.entries.items() if g in ("dp", "diloco"))
    train_loss = sum(losses[-8:]) / len(losses[-8:])
    return {"train_loss": train_loss, "final_loss": _held_out(chunks, mesh, spec, opt, runner, corpus),
            "dp_bytes": dp_bytes, "dp_bytes_per_step": dp_bytes / steps, "losses": losses}


def _held_out(chunks, mesh: Mesh, spec: BatchSpec, opt, runner, corpus: torch.Tensor) -> float:
    """Mean loss of the current weights over EVAL global batches drawn with EVAL_SEED: train.py's step through the
    same pipeline at learning rate 0 (AdamW's update and its decoupled decay are then 0 x ...: the weights stay
    bit for bit), whose loss is that of the weights before the step. (hybrid.train.evaluate's forward-only walk
    would be the natural reader, but hybrid.train imports hybrid.diloco: no package cycle.)"""
    total = 0.0
    for k in range(EVAL):
        total += train_step(chunks, micro_batches(corpus, spec, EVAL_SEED, k, mesh.coords.dp), opt, mesh, lr=0.0,
                            runner=runner)
    return total / EVAL


def _worker(rank: int, world: int, steps: int, seq: int, streaming: bool = False) -> dict:
    torch.set_num_threads(1)
    out = {}
    methods = [("synchronous AdamW", None), (f"DiLoCo H={H}", DILOCO)]
    if streaming:
        methods.append((f"Streaming DiLoCo H={H} K=4 tau=1 alpha=0.5", STREAMING))
    for name, cfg in methods:
        mesh = Mesh.build(ParallelDims.from_world(world, tp=2, pp=2))
        out[name] = _run(mesh, cfg, steps, seq)
    return out


def rows(quick: bool = False, streaming: bool = False) -> list[dict]:
    """The rows: [{"method", "final_loss", "train_loss", "dp_bytes", "dp_bytes_per_step", "steps", "losses"}],
    synchronous AdamW first. quick: 16 steps at seq 32 (a smoke run); streaming: a third row, Streaming DiLoCo
    (STREAMING)."""
    steps, seq = (16, 32) if quick else (200, 128)
    got = run_distributed(_worker, 8, args=(steps, seq, streaming), timeout=3600)[0]
    return [{"method": name, "steps": steps, **r} for name, r in got.items()]  # "losses": the per-step curve


def main(argv: list[str] | None = None) -> None:
    p = OneLineParser(prog="python -m hybrid.diloco.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="16 steps at seq 32: checks that it runs, measures nothing")
    p.add_argument("--streaming", action="store_true",
                   help="a third row: Streaming DiLoCo, H 8, 4 fragments, tau 1, alpha 0.5 (the same tokens)")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    p.check_out("--json", args.json)  # before the minutes of training: a missing folder was a traceback after them
    table = rows(args.quick, args.streaming)
    base = table[0]
    print("| method | steps | final loss (held out) | vs synchronous | train loss (last 8) | DP bytes (rank 0) |")
    print("|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['method']} | {r['steps']} | {r['final_loss']:.4f} | "
              f"{100 * (r['final_loss'] / base['final_loss'] - 1):+.2f} % | {r['train_loss']:.4f} | "
              f"{r['dp_bytes'] / 2**20:.1f} MiB ({r['dp_bytes'] / max(base['dp_bytes'], 1):.3f}x) |")
    if args.json:
        with atomic_output(args.json) as tmp, open(tmp, "w") as f:  # whole or not at all
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
