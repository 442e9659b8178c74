"""DiLoCo's flags of train.py: `add_arguments` builds them, `check` validates the flags alone, `check_layout` what
needs the layout -- all before any process group (hybrid/train/args.py calls them)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from hybrid.cliutil import check_number, divisors, one_of, plural

@dataclass(frozen=True)
class DiLoCoConfig:
    """Local updates over data-parallel replicas (hybrid/diloco/outer.py has the math).

    Attributes:
        inner_steps: H, inner optimizer steps between outer syncs (`--diloco-inner-steps`).
        outer_lr: eta, the outer Nesterov SGD's learning rate (`--diloco-outer-lr`; the paper's 0.7).
        outer_momentum: mu, its momentum (`--diloco-outer-momentum`; the paper's 0.9; 0: plain SGD).
        replicas: R, replicas over the DP ranks (`--diloco-replicas`); None: dp (every DP rank its own replica);
            R < dp: ZeRO inside each replica of dp / R ranks.
        fragments: K, Streaming DiLoCo's fragments synced in turn (`--diloco-fragments`; 1: the whole model at once).
        fragment_sync_delay: tau, inner steps between posting a fragment's outer all-reduce and applying its result
            (`--diloco-fragment-sync-delay`, torchft's `fragment_sync_delay`); the all-reduce is in flight while
            those tau inner steps run. 0: the sync blocks (posted and applied after the same step). tau < H / K.
        fragment_update_alpha: alpha, the weight of the replica's own weights when the outer result lands
            (`--diloco-fragment-update-alpha`, torchft's `fragment_update_alpha`): theta_r <- lerp(theta,
            theta_r, alpha) = (1 - alpha) theta + alpha theta_r. 0: every replica takes theta (DiLoCo's reset).
    """

    inner_steps: int
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    replicas: int | None = None
    fragments: int = 1
    fragment_sync_delay: int = 0
    fragment_update_alpha: float = 0.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("local updates (DiLoCo)")
    g.add_argument("--diloco-inner-steps", type=int, default=None, metavar="H",
                   help="DiLoCo: each DP replica takes H optimizer steps alone, then the replicas average their "
                        "weight deltas (one all-reduce of the model every H steps) and take an outer Nesterov step")
    g.add_argument("--diloco-outer-lr", type=float, default=0.7, metavar="X", help="DiLoCo's outer SGD learning rate")
    g.add_argument("--diloco-outer-momentum", type=float, default=0.9, metavar="X",
                   help="DiLoCo's outer Nesterov momentum, in [0, 1) (0: plain SGD)")
    g.add_argument("--diloco-replicas", type=int, default=None, metavar="R",
                   help="DiLoCo replicas (None: the data-parallel size, each DP rank one); fewer: ZeRO inside "
                        "each replica")
    g.add_argument("--diloco-fragments", type=int, default=1, metavar="K",
                   help="Streaming DiLoCo: sync 1/K of the model every H/K steps, in turn (K divides H)")
    g.add_argument("--diloco-fragment-sync-delay", type=int, default=0, metavar="TAU",
                   help="Streaming DiLoCo's overlap (torchft's fragment_sync_delay): a fragment's outer all-reduce "
                        "is posted after its step and its result applied TAU inner steps later, the all-reduce in "
                        "flight meanwhile (0: each sync blocks; TAU < H/K)")
    g.add_argument("--diloco-fragment-update-alpha", type=float, default=0.0, metavar="ALPHA",
                   help="Streaming DiLoCo's mixing (torchft's fragment_update_alpha): when a fragment's outer "
                        "result lands, each replica keeps (1 - ALPHA) x the outer weights + ALPHA x its own "
                        "(0: the outer weights, plain DiLoCo; in [0, 1])")


def check(args: argparse.Namespace) -> DiLoCoConfig | None:
    """The flags alone; None without --diloco-inner-steps (then every other --diloco-* flag is an error)."""
    h = args.diloco_inner_steps
    if h is None:
        given = [f"--{d.replace('_', '-')}" for d in ("diloco_replicas", "diloco_outer_lr", "diloco_outer_momentum",
                                                       "diloco_fragments", "diloco_fragment_sync_delay",
                                                       "diloco_fragment_update_alpha") if d in getattr(args, "explicit", set())]
        if given:
            raise ValueError(f"{given[0]} applies to DiLoCo: add --diloco-inner-steps H or drop it")
        return None
    check_number("--diloco-inner-steps", h, 1, integer=True)
    check_number("--diloco-outer-lr", args.diloco_outer_lr, 0, low_open=True)
    if not 0 <= args.diloco_outer_momentum < 1:
        raise ValueError(f"--diloco-outer-momentum must be in [0, 1), got {args.diloco_outer_momentum}")
    k = args.diloco_fragments
    if k < 1 or h % k:
        raise ValueError(f"--diloco-fragments {k} must be a positive divisor of --diloco-inner-steps {h}; give "
                         f"{one_of(divisors(h))}")
    tau, alpha = args.diloco_fragment_sync_delay, args.diloco_fragment_update_alpha
    if not 0 <= tau < h // k:  # torchft's rule: a fragment lands before the next one is posted (one in flight)
        per = f"--diloco-inner-steps {h} / --diloco-fragments {k}" if "diloco_fragments" in \
            getattr(args, "explicit", set()) else f"--diloco-inner-steps {h}, one fragment (--diloco-fragments 1)"
        raise ValueError(f"--diloco-fragment-sync-delay {tau} must be in [0, H / K) = [0, {h // k}) "
                         f"({per}): one fragment in flight at a time")
    if not 0 <= alpha <= 1:  # also NaN
        raise ValueError(f"--diloco-fragment-update-alpha must be in [0, 1], got {alpha}")
    r = args.diloco_replicas
    if r is not None:
        check_number("--diloco-replicas", r, 1, integer=True)
    return DiLoCoConfig(inner_steps=h, outer_lr=args.diloco_outer_lr, outer_momentum=args.diloco_outer_momentum,
                        replicas=r, fragments=k, fragment_sync_delay=tau, fragment_update_alpha=alpha)


def check_layout(cfg: DiLoCoConfig | None, dims, fp16: bool, moe=None) -> None:
    """What DiLoCo needs of the layout and the run; ValueError naming the flag and the fix. ZeRO 0-3, context
    parallelism and MoE models compose (a replica is TP x PP x CP x dp / R ranks, ZeRO inside it, its experts'
    all-to-all inside it: replicas.py). Refused: fp16 (each replica's dynamic loss scale would be its own, and the
    checkpoint keeps one scaler), an expert-parallel group wider than a replica's stage (the token all-to-all would
    cross the replicas every step) and DeepSeek-V3's expert bias (its loads are summed over every DP rank each
    step). A --train-iters (or --exit-interval) that is no multiple of H is allowed: the run ends between syncs,
    replica 0's weights are the model's, and the checkpoint keeps every replica, so a longer run continues the
    round exactly. `moe`: the MoE config (hybrid/moe/config.py), None for a dense model."""
    if cfg is None:
        return
    r = cfg.replicas or dims.dp
    if dims.dp % r:
        raise ValueError(f"--diloco-replicas {r} must divide the data-parallel size {dims.dp}: give "
                         f"{one_of(divisors(dims.dp))}, or drop it (each DP rank its own replica)")
    if fp16:
        raise ValueError("--diloco-inner-steps does not run with --fp16 (each replica's loss scale would differ) yet; "
                         "use --bf16, or drop one of them")
    if moe is None:
        return
    if moe.expert_bias:
        raise ValueError("--moe-router-enable-expert-bias does not run with --diloco-inner-steps yet (the expert "
                         "loads are summed over every DP rank each step, across the replicas); drop one of them")
    stage = dims.tp * dims.cp * (dims.dp // r)  # a replica's ranks of one pipeline stage
    ep, etp = moe.expert_parallel, moe.expert_tensor_parallel
    if stage % (ep * etp):
        # the replica counts that fit the experts: R divides dp and ep x etp divides tp x cp x dp / R
        fits = [n for n in divisors(dims.dp) if (dims.tp * dims.cp * (dims.dp // n)) % (ep * etp) == 0]
        fix = f"--diloco-replicas {one_of(fits)}" if fits else "a smaller --expert-model-parallel-size"
        raise ValueError(f"--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} must divide the "
                         f"{plural(stage, 'rank')} of a DiLoCo replica's pipeline stage (tp x cp x dp / R, R = "
                         f"{r} replicas): the token all-to-all stays inside a replica; give {fix}")


def single_replica_warning(cfg: DiLoCoConfig | None, dp: int) -> tuple[str, ...]:
    """One replica (dp 1, or --diloco-replicas 1) is taken, with this start-up warning, not refused: there is no
    other replica to average with and no communication is saved, but the outer step still acts -- Nesterov SGD on
    the replica's own H-step delta (b <- mu b + delta, theta <- theta - eta (delta + mu b)), a Lookahead-style
    optimizer (Zhang et al. 2019) -- and Charles et al. 2025 ("Scaling Laws for DiLoCo") report DiLoCo with M = 1
    replica reaching a lower evaluation loss than data-parallel training at equal tokens. So it is a method of its
    own, but rarely what a user who gave --diloco-inner-steps to cut DP traffic meant."""
    if cfg is None or (cfg.replicas or dp) > 1:
        return ()
    why = "--diloco-replicas 1" if cfg.replicas == 1 else "data-parallel size 1"
    return (f"--diloco-inner-steps {cfg.inner_steps} with one replica ({why}): nothing to average and no "
            f"communication saved; the outer Nesterov step acts on the one replica's {cfg.inner_steps}-step delta "
            f"(Lookahead-like, docs/diloco.md); for replicas, give more DP ranks or --diloco-replicas R >= 2",)


def unsharded_zero_warning(cfg: DiLoCoConfig | None, dims, zero_stage: int) -> tuple[str, ...]:
    """Round 23: ZeRO shards inside a replica (over its dp / R DP ranks x every CP rank), so at one rank a replica
    -- the default, R = dp -- a --zero-stage 1-3 shards nothing, while the start-up `zero: stage 3` line read as if
    it sharded over the DP ranks. Said once at start."""
    if cfg is None or not zero_stage:
        return ()
    r = cfg.replicas or dims.dp
    if r == 1 or dims.dp // r * dims.cp > 1:
        return ()
    fits = [n for n in divisors(dims.dp) if 1 < n < r]
    return (f"--zero-stage {zero_stage} with --diloco-inner-steps: ZeRO shards inside each replica, and each of the "
            f"{r} replicas is one rank (data-parallel size {dims.dp} / {r} replicas), so nothing is sharded; give "
            + (f"--diloco-replicas {one_of(fits)} for several ranks a replica, or " if fits else "more ranks a "
               "replica (--diloco-replicas R < dp), or ") + "drop --zero-stage",)


def check_optimizer(args: argparse.Namespace, saves: bool) -> None:
    """`--optimizer sgd` (Megatron's name; here for DiLoCo's exactness against synchronous SGD) with what it has
    been built for: the device step and no checkpoint (the checkpoint stores Adam's moments)."""
    if args.optimizer != "sgd":
        return
    if args.offload_optimizer:
        raise ValueError("--optimizer sgd does not run with --offload-optimizer (the offloaded step is Adam's); "
                         "drop one of them")
    if saves:
        raise ValueError("--optimizer sgd: checkpoints store Adam's moments, SGD's momentum is not saved yet; "
                         "drop --save / --load or use --optimizer adam")


def check_run(args: argparse.Namespace, dims, checkpoint, zero, moe=None) -> DiLoCoConfig | None:
    """Every DiLoCo check of a run (train.py's one hook: hybrid/train/args.run_config)."""
    check_optimizer(args, checkpoint.save is not None or checkpoint.load is not None)
    cfg = check(args)
    check_layout(cfg, dims, args.fp16, moe)
    if cfg is not None:  # what the checkpoint --load resumes holds, read from its state.json before any group
        from hybrid.diloco.run import resume_conflict  # (run.py imports this module)
        if why := resume_conflict(cfg, checkpoint, dims, zero.stage):
            raise ValueError(why)
    if cfg is not None and cfg.inner_steps > args.train_iters and checkpoint.save is None:
        # the first outer sync is after inner step H: the replicas would train apart and never meet, and without
        # a checkpoint no later run continues the round (check_layout's docstring)
        raise ValueError(f"--diloco-inner-steps {cfg.inner_steps} is more than --train-iters {args.train_iters}: "
                         f"the replicas would never meet (the first outer sync is after step {cfg.inner_steps}); "
                         f"give --diloco-inner-steps <= {args.train_iters}, or --save DIR to continue the round in "
                         f"a longer run")
    return cfg
