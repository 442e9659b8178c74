"""Why PowerSGD r = 4 trails synchronous AdamW (issue 31): the measurements of docs/comm-efficient.md ("Why r = 4
misses"), on the bench's DP 2 proxy (scripts/bench_comm_efficient.py --tp 1 --pp 1 --dp 2: tiny-llama, the
reference corpus, the same tokens, seed 3, lr 3e-3 constant, Adam betas (0.9, 0.95), weight decay 0.01).

    python -m hybrid.compress.diagnose --start 240 --stats --adam --json d240.json   # the curve, per group errors
    python -m hybrid.compress.diagnose --adamw --adam --json adamw.json              # AdamW's Adam statistics
    python -m hybrid.compress.diagnose --start 60 --only mlp                          # compress one group only
    python -m hybrid.compress.diagnose --start 60 --freeze-variance 60                # lever: Adam's v frozen
    python -m hybrid.compress.diagnose --start 60 --ef21                              # lever: EF21, not EF
    python -m hybrid.compress.diagnose --start 60 --error-reset 8                     # lever: CSER's reset

Per step after the start and per parameter group (embedding, attention q/k/v/o, MLP, LM head) of the matrices
compressed, `--stats` records (the DP means below are extra all-reduces tagged `diagnose.*`, outside the DP
gradient bytes):

    err   = ||mean_i M'_i - M~|| / ||mean_i M'_i||      the rank-r approximation's relative error (M' = g + e)
    ef    = ||e_0|| / ||mean_i g_i||                      rank 0's error-feedback buffer against the true mean
    cos   = <M~, mean_i g_i> / (||M~|| ||mean_i g_i||)     how well what is applied points along the gradient
    scale = ||M~|| / ||mean_i g_i||
    best  = ||mean M' - its best rank-r approximation|| / ||mean M'||   (the SVD's tail: what any rank-r method
    best_g  the same of mean_i g_i                                       must leave out)

`--adam` records, every second step and per group, the RMS of Adam's normalised update m / (sqrt(v) + eps) and the
RMS of m and of sqrt(v) (bias corrections left out: equal in both runs compared).

`--only G[,G]` compresses only those groups' matrices and sends the rest whole (their error feedback is then
M'_i - mean M', zero in the DP mean, as the hook's for 1-D tensors). The three levers (`--freeze-variance`,
`--ef21`, `--error-reset`) are diagnostics here: none closed the gap (docs/comm-efficient.md), so none is a
train.py flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import torch

from hybrid.cliutil import OneLineParser, atomic_output, check_output_file, int_in
from hybrid.comm import Group
from hybrid.compress import powersgd as psgd
from hybrid.compress.reduction import PowerSGDReduction

GROUPS = ("embed", "attn", "mlp", "head")


def group_of(name: str) -> str:
    """The parameter group of a llama parameter name: embed, attn, mlp, head, or norm (1-D, never compressed)."""
    for key, group in (("embed_tokens", "embed"), ("lm_head", "head"), ("self_attn", "attn"), ("mlp", "mlp")):
        if key in name:
            return group
    return "norm"


def reduce_bucket_ef21(state: psgd.PowerSGDState, index: int, buffer: torch.Tensor, tensors: list[torch.Tensor],
                       group: Group) -> None:
    """EF21 (Richtarik, Sokolov, Fatkhullin 2021, arXiv 2106.05203) with PowerSGD as its compressor, instead of
    error feedback: the applied gradient is a running estimate H, moved each step by the compressed change

        H <- H + PowerSGD(mean_i g_i - H)      (the hook's math on M_i = g_i - H, no error feedback)

    PowerSGD's factors depend on the M_i only through their sum, so a shared H gives EF21's mean estimate exactly
    (its per-worker estimates differ, their mean does not). H is kept in the error slot; its first value is the
    exact mean (one uncompressed all-reduce at the first compressed step)."""
    est = state.error.get(index)
    if est is None:
        group.all_reduce(buffer, tag="powersgd.uncompressed")
        state.error[index] = buffer.div_(group.size).detach().clone()
        return
    buffer.sub_(est)
    cfg = state.cfg
    state.cfg, saved = dataclasses.replace(cfg, error_feedback=False), state.error.pop(index)
    try:
        psgd.reduce_bucket(state, index, buffer, tensors, group)
    finally:
        state.cfg, state.error[index] = cfg, saved
    est.copy_(buffer.add_(est))


class DiagnosedPowerSGD(PowerSGDReduction):
    """PowerSGDReduction with the measurements above and the `--only` selection; with neither and no lever its
    reduce is the parent's, operation for operation (tests/test_powersgd_diagnose.py: the same losses bit for bit)."""

    def __init__(self, cfg, layout, only: frozenset[str] | None = None, stats: bool = False,
                 ef21: bool = False, reset: int = 0) -> None:
        super().__init__(cfg, layout)
        self.only, self.stats, self.ef21, self.reset = only, stats, ef21, reset
        self.records: dict[int, dict[str, list[float]]] = {}

    def reduce(self, unit, group: Group) -> bool:
        if not self.state.compressing or group.size == 1 or id(unit) not in self.index:
            return False
        idx, buf = self.index[id(unit)], unit.flat_grad[:unit.numel]
        names = [self.names[id(p)] for p in unit.params]
        tensors = [unit.grad_view(unit.flat_grad, p) for p in unit.params]
        if self.only is not None:  # a 1-D view: all-reduced whole by the hook's own rule
            tensors = [t if group_of(n) in self.only else t.view(-1) for t, n in zip(tensors, names)]
        if self.reset and (self.state.iter - self.state.cfg.start_iter) % self.reset == self.reset - 1:
            self._reset(idx, buf, group)
            return True
        before = self._means(buf, idx, group) if self.stats else None
        reducer = reduce_bucket_ef21 if self.ef21 else psgd.REDUCERS[self.state.cfg.variant]
        reducer(self.state, idx, buf, tensors, group)
        if before is not None:
            self._record(unit, names, buf, self.state.error[idx], *before)
        buf.mul_(group.size)
        return True

    def _reset(self, idx, buf, group) -> None:
        """CSER's error reset: M' = g + e all-reduced whole (4 n m bytes), so mean_i e_i restarts at 0 (each rank
        keeps e_i = M'_i - mean M', as the hook's uncompressed tensors); the factors wait for the next step."""
        if idx in self.state.error:
            buf.add_(self.state.error[idx])
        sent = buf.detach().clone()
        group.all_reduce(buf, tag="powersgd.uncompressed")
        self.state.error[idx] = sent - buf.div_(group.size)
        buf.mul_(group.size)

    def _means(self, buf, idx, group):
        """mean_i g_i and mean_i M'_i (M' = g + e), before the reduction overwrites g."""
        g = buf.detach().clone()
        m = g + self.state.error[idx] if idx in self.state.error else g.clone()
        group.all_reduce(g, tag="diagnose.g")
        group.all_reduce(m, tag="diagnose.m")
        return g.div_(group.size), m.div_(group.size)

    def _record(self, unit, names, out, err, g, m) -> None:
        per = self.records.setdefault(self.state.iter, {})
        for j, (p, n) in enumerate(zip(unit.params, names)):
            k = group_of(n)
            if not psgd.matrix_rank(tuple(p.shape), self.state.cfg) or (self.only is not None and k not in self.only):
                continue
            s = slice(unit.offsets[j], unit.offsets[j] + p.numel())
            d = per.setdefault(k, [0.0] * 8)
            r = psgd.matrix_rank(tuple(p.shape), self.state.cfg)
            for i, v in enumerate(((m[s] - out[s]).square().sum(), m[s].square().sum(), g[s].square().sum(),
                                   err[s].square().sum(), (out[s] * g[s]).sum(), out[s].square().sum(),
                                   _tail(m[s].view(p.shape[0], -1), r), _tail(g[s].view(p.shape[0], -1), r))):
                d[i] += float(v)


def _tail(matrix: torch.Tensor, r: int) -> torch.Tensor:
    """|M - M_r|^2 for M_r the best rank-r approximation (Eckart-Young: the energy beyond the r-th singular value)."""
    return torch.linalg.svdvals(matrix)[r:].square().sum()


def summarise(records: dict) -> dict[int, dict[str, dict[str, float]]]:
    """Per step and group: err, ef, cos, scale (the module docstring) from the recorded sums."""
    out = {}
    for step, per in records.items():
        out[int(step)] = {k: {"err": (d[0] / d[1]) ** 0.5, "ef": (d[3] / d[2]) ** 0.5,
                              "cos": d[4] / (d[5] * d[2]) ** 0.5, "scale": (d[5] / d[2]) ** 0.5,
                              "best": (d[6] / d[1]) ** 0.5, "best_g": (d[7] / d[2]) ** 0.5}
                          for k, d in per.items()}
    return out


def freeze_variance(optimizer: torch.optim.AdamW, at: int) -> None:
    """Lever (1-bit Adam's, Tang et al. 2021, arXiv 2102.02888 Sec. 3: error compensation fails for Adam because v
    is nonlinear in the gradient; freeze v after a warm-up and the update is linear again): from optimizer step
    `at` on, torch's AdamW update with v and its bias correction held at their values after `at` steps."""
    fused, frozen_bc2 = optimizer.step, {}

    @torch.no_grad()
    def step(closure=None):
        if not optimizer.state or int(next(iter(optimizer.state.values()))["step"]) < at:
            return fused()
        for g in optimizer.param_groups:
            lr, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
            for p in g["params"]:
                st = optimizer.state[p]
                scale = getattr(optimizer, "grad_scale", None)  # the engine's: fused AdamW divides by it
                grad = p.grad / scale if scale is not None else p.grad
                st["step"] += 1
                t = float(st["step"])
                bc2 = frozen_bc2.setdefault(id(p), 1 - b2 ** (t - 1))
                p.mul_(1 - lr * wd)
                st["exp_avg"].lerp_(grad, 1 - b1)
                p.addcdiv_(st["exp_avg"], (st["exp_avg_sq"].sqrt() / bc2 ** 0.5).add_(eps), value=-lr / (1 - b1 ** t))
    optimizer.step = step


def adam_stats(engine, names: dict[int, str]) -> dict[str, list[float]]:
    """Per group: sum of (m / (sqrt v + eps))^2, count, sum m^2, sum v."""
    out: dict[str, list[float]] = {}
    for u in engine.units:
        for view, seg in zip(u.views, u.segments):
            st = engine.optimizer.state.get(view)
            if st:
                m, v = st["exp_avg"], st["exp_avg_sq"]
                d = out.setdefault(group_of(names[id(seg.param)]), [0.0, 0, 0.0, 0.0])
                d[0] += float((m / (v.sqrt() + 1e-8)).square().sum())
                d[1] += m.numel()
                d[2] += float(m.square().sum())
                d[3] += float(v.sum())
    return out


def _rank(rank: int, world: int, args: argparse.Namespace) -> dict:
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.pipeline import ScheduleKind, build_schedule
    from hybrid.pipeline.executor import PipelineExecutor, StageIO
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from hybrid.zero.state import param_names
    from models import build_pipeline_chunks, load_config
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=1, pp=1))
    arch = load_config("tiny-llama")
    chunks = build_pipeline_chunks(arch, TPContext(mesh.tp), 0, 1, 1, seed=args.seed)
    spec = BatchSpec(args.global_batch, 2, args.seq, mesh.dims.dp)
    runner = PipelineExecutor(chunks, build_schedule(ScheduleKind.ONE_F_ONE_B, 1, spec.num_micro_batches)[0],
                              mesh.pp, StageIO((2, args.seq, arch.hidden_size), torch.float32), mesh.device)
    opt_cfg = OptimizerConfig(lr=3e-3, weight_decay=0.01, beta2=0.95, decay_style="constant", train_iters=args.steps)
    red = None
    if not args.adamw:
        cfg = psgd.PowerSGDConfig(rank=args.rank, start_iter=args.start)
        red = DiagnosedPowerSGD(cfg, (world, 1, 1), frozenset(args.only) if args.only else None, args.stats,
                                args.ef21, args.error_reset)
    opt = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=0), opt_cfg, red)
    if args.freeze_variance is not None:
        freeze_variance(opt.optimizer, args.freeze_variance)
    names, corpus, losses, adam = param_names(opt.model), load_corpus(), [], {}
    for it in range(args.steps):
        losses.append(train_step(chunks, micro_batches(corpus, spec, args.seed, it, mesh.coords.dp), opt, mesh,
                                 lr=opt_cfg.lr_at(it), runner=runner))
        if args.adam and it % 2 == 0:
            adam[it] = adam_stats(opt, names)
    return {"losses": losses, "records": getattr(red, "records", {}), "adam": adam}


PROCS = 2  # the DP 2 proxy's ranks (run_distributed below); a global batch is micro-batches of 2 on each


def parse_args(argv=None) -> argparse.Namespace:
    """The flags, each bad value one line naming it (OneLineParser: no usage block) before the two ranks start."""
    p = OneLineParser(prog="python -m hybrid.compress.diagnose", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", type=int, default=60, help="PowerSGD's start iteration")
    p.add_argument("--rank", type=int_in(1), default=4)
    p.add_argument("--steps", type=int_in(1), default=300)
    p.add_argument("--global-batch", type=int_in(1), default=16)
    p.add_argument("--seq", type=int_in(1), default=128)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--only", type=lambda v: v.split(","), default=None, metavar="G,G",
                   help=f"compress only these groups' matrices ({', '.join(GROUPS)}), the rest whole")
    p.add_argument("--stats", action="store_true", help="per group: err, ef, cos, scale each compressed step")
    p.add_argument("--adam", action="store_true", help="per group: Adam's normalised update, every second step")
    p.add_argument("--adamw", action="store_true", help="synchronous AdamW instead of PowerSGD")
    p.add_argument("--freeze-variance", type=int_in(1), default=None, metavar="N",
                   help="lever: Adam's v frozen from N (>= 1: v and its bias correction 1 - b2^N are 0 before)")
    p.add_argument("--ef21", action="store_true", help="lever: EF21 with PowerSGD instead of error feedback")
    p.add_argument("--error-reset", type=int_in(0), default=0, metavar="H",
                   help="lever: every H-th compressed step sends M' = g + e whole (CSER's error reset); 0: off")
    p.add_argument("--json", default=None, metavar="PATH")
    args = p.parse_args(argv)
    try:
        _check(args)
        if args.json is not None:
            check_output_file("--json", args.json)  # before the run, not after its minutes
    except ValueError as e:
        p.error(str(e))
    return args


def _check(args: argparse.Namespace) -> None:
    if args.only and set(args.only) - set(GROUPS):
        raise ValueError(f"--only: groups are {', '.join(GROUPS)}")
    if not 2 <= args.start < args.steps:
        raise ValueError(f"--start must be >= 2 and below --steps ({args.steps})")
    if args.global_batch % (2 * PROCS):
        raise ValueError(f"--global-batch {args.global_batch} must be a multiple of {2 * PROCS} (micro-batches of "
                         f"2 on each of the {PROCS} ranks)")
    if args.freeze_variance is not None and args.freeze_variance >= args.steps:
        raise ValueError(f"--freeze-variance {args.freeze_variance} is not below --steps {args.steps}: v would "
                         f"never freeze; give N < {args.steps}")
    powersgd_only = [f for f, on in (("--only", args.only), ("--stats", args.stats), ("--ef21", args.ef21),
                                      ("--error-reset", args.error_reset)) if on]
    if args.adamw and powersgd_only:  # red is None under --adamw (_rank): they would do nothing
        raise ValueError(f"{powersgd_only[0]} diagnoses PowerSGD and --adamw runs none; drop one of them")


def main(argv=None) -> dict:
    args = parse_args(argv)
    from hybrid.testing import run_distributed
    t0 = time.time()
    res = run_distributed(_rank, PROCS, args=(args,), timeout=3600)[0]
    out = {"args": vars(args), "final": statistics.fmean(res["losses"][-10:]), "losses": res["losses"],
           "stats": summarise(res["records"]), "adam": res["adam"]}
    print(f"final loss (mean of the last 10) {out['final']:.4f} ({time.time() - t0:.0f} s)", file=sys.stderr)
    if args.json:
        with atomic_output(args.json) as tmp, open(tmp, "w") as f:  # whole or not at all
            json.dump(out, f)
    return out


if __name__ == "__main__":
    main()
