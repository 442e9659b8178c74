"""DiLoCo inside train.py's loop (hybrid/train/loop.py), four hooks:

    local = LocalUpdates.build(run.diloco, mesh)                      # replicas' groups (collective); off: no-op
    optimizer = ZeroOptimizer(model, local.mesh, run.zero, opt_cfg)   # ZeRO / gradient sync inside the replica
    ckpt = RunCheckpoints(..., local.checkpointed(optimizer), ..., owners={..., **local.owners()})
    ... train_step(...); local.after_step(it)                         # the outer step every H steps

and its start-up line, startup_line(run), read from the RunConfig alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hybrid.checkpoint import store
from hybrid.checkpoint.args import CheckpointConfig
from hybrid.cliutil import fail, plural
from hybrid.diloco.args import DiLoCoConfig
from hybrid.diloco.outer import DiLoCo
from hybrid.diloco.replicas import ReplicaLayout
from hybrid.diloco.state import ReplicaState
from hybrid.mesh import Mesh


@dataclass
class LocalUpdates:
    """The run's DiLoCo, or nothing (cfg None): `mesh` is what the inner optimizer trains on (the run's own mesh
    without DiLoCo)."""

    cfg: DiLoCoConfig | None
    mesh: Mesh
    layout: ReplicaLayout | None = None
    outer: DiLoCo | None = None
    link_gbps: float = 0.0  # --simulated-dp-bandwidth: the cross-replica link's simulated GB/s (0: off)

    @classmethod
    def build(cls, cfg: DiLoCoConfig | None, mesh: Mesh, link_gbps: float = 0.0) -> "LocalUpdates":
        if cfg is None:
            return cls(None, mesh)
        layout = ReplicaLayout.build(mesh, cfg.replicas, own_cross=cfg.fragment_sync_delay > 0)
        return cls(cfg, layout.inner_mesh, layout, link_gbps=link_gbps)

    def checkpointed(self, zero, ckpt: CheckpointConfig | None = None):
        """Start the outer loop around `zero`; what the checkpoint should save as the optimizer (replica r > 0's
        inner state under its own keys: hybrid/diloco/state.py). `ckpt`: the run's checkpoint flags -- a --load
        checkpoint saved without DiLoCo (a synchronous run, a pretrained model: the paper's start) gives every
        replica its weights and optimizer state, and theta its weights; one saved with another number of replicas
        is one error line."""
        if self.cfg is None:
            return zero
        self.outer = DiLoCo(self.cfg, zero, self.layout.cross, self.layout.replica, self.link_gbps)
        inner = zero if self.layout.replica == 0 else ReplicaState(zero, self.layout.replica)
        if _saved_replicas(ckpt) == 0:  # no DiLoCo state in it: load the synchronous keys, theta from them
            self.outer.warm_start = True
            if isinstance(inner, ReplicaState):
                inner.warm_start = True
        elif why := resume_conflict(self.cfg, ckpt, self.mesh.dims, zero.cfg.stage):
            raise fail(f"train.py: error: {why}")  # train.py's checks said it before any process group
        return inner

    def owners(self) -> dict:
        """The outer state's owner for the checkpoint (theta and the outer momentum)."""
        return {"diloco.": self.outer} if self.outer is not None else {}

    def after_step(self, it: int) -> None:
        if self.outer is not None:
            self.outer.after_step(it)

    def finish(self) -> str:
        """At the end of the run: wait for an outer all-reduce still in flight (tau > 0), so that no collective is
        left posted when the process groups go; its result is not applied (the run ended before its step). Returns
        the simulated link's line (empty without one): the seconds the run waited for it and those hidden."""
        if self.outer is None:
            return ""
        self.outer.complete()
        o = self.outer
        return (f"diloco: simulated cross-replica link: waited {o.exposed:.3f} s, {o.hidden:.3f} s hidden behind "
                f"inner steps" if self.link_gbps else "")


def startup_line(run) -> str:
    """The `diloco:` start-up line of `run` (a RunConfig; empty without DiLoCo), from its checked config alone: R
    replicas (--diloco-replicas, or the DP size), each of dp / R DP ranks sharding its states with the run's ZeRO
    stage, or at stage 0 replicating them (round 21: "ZeRO over 2 ranks each" at --zero-stage 0). Read from `run`
    rather than the built mesh and a stage passed apart, so the line the loop prints is the one train.py's checks
    can build in one process at any world size (round 22: the loop's `describe(0)` lived; only a 4-rank launch
    with replicas of 2 DP ranks printed the line)."""
    c = run.diloco
    if c is None:
        return ""
    replicas = c.replicas or run.parallel.dims.dp
    z, stage, link = run.parallel.dims.dp // replicas, run.zero.stage, run.compress.simulated_dp_bandwidth
    inside = f" (ZeRO {stage} over {z} ranks each)" if stage else f" (plain DP over {z} ranks each)"
    return (f"diloco: {replicas} replicas{inside if z > 1 else ''} | H {c.inner_steps}"
            f" inner steps | outer Nesterov SGD lr {c.outer_lr} momentum {c.outer_momentum}"
            f"{f' | {c.fragments} fragments' if c.fragments > 1 else ''}"
            f"{f' | overlap tau {c.fragment_sync_delay}' if c.fragment_sync_delay else ''}"
            f"{f' | alpha {c.fragment_update_alpha}' if c.fragment_update_alpha else ''}"
            f"{f' | simulated cross-replica link {link:g} GB/s' if link else ''}")


def resume_conflict(cfg: DiLoCoConfig, ckpt: CheckpointConfig | None, dims, zero_stage: int) -> str:
    """Why the checkpoint --load resumes cannot continue this run's DiLoCo ("" when it can): its state.json alone
    says, so train.py's checks ask before any process group (hybrid/diloco/args.check_run; round 17: a resume at
    another --diloco-replicas started every rank's group, built the model and only then failed, per rank).
    A checkpoint saved with another number of replicas holds another number of replica states; one saved with an
    outer all-reduce in flight (tau > 0) stores the in-flight delta, one with tau = 0 does not; and one with a
    Streaming fragment in flight resumes only at its own layout (midflight_layout_change)."""
    saved = _saved_replicas(ckpt)
    if saved in (None, 0):  # nothing to load, or a synchronous checkpoint: every replica starts from it
        return ""
    replicas = cfg.replicas or dims.dp
    if saved != replicas:
        return (f"--load {ckpt.load} holds DiLoCo state of {plural(saved, 'replica')}, this run has {replicas}; "
                f"resume with --diloco-replicas {saved} (and a DP size it divides)")
    tau = _saved_args(ckpt).get("diloco_fragment_sync_delay") or 0
    if (tau > 0) != (cfg.fragment_sync_delay > 0):  # the in-flight delta is stored only when tau > 0
        return (f"--load {ckpt.load} was saved with --diloco-fragment-sync-delay {tau}, this run has "
                f"{cfg.fragment_sync_delay}; resume with one > 0 both times or 0 both times")
    why = schedule_change(_saved_state(ckpt), cfg) or midflight_layout_change(_saved_state(ckpt), cfg, dims,
                                                                               zero_stage)
    return f"--load {ckpt.load} {why}" if why else ""


SCHEDULE = (("diloco_inner_steps", "--diloco-inner-steps", None), ("diloco_fragments", "--diloco-fragments", 1),
            ("diloco_fragment_sync_delay", "--diloco-fragment-sync-delay", 0))


def schedule_change(state: dict | None, cfg: DiLoCoConfig) -> str:
    """Why a checkpoint cannot resume at another outer schedule -- --diloco-inner-steps H, --diloco-fragments K,
    --diloco-fragment-sync-delay tau -- ("" when it can). The schedule is a function of the iteration (outer.due:
    fragment f posted after the steps t with (t + 1) mod H = (f + 1) H / K mod H, applied tau steps later), so a
    resume at another one changes the round in progress: mid-round, it ends after neither H nor H' steps, and a
    fragment's all-reduce in flight may never land (at another H it can be overwritten by the next post: its
    delta lost without a word). So a change is taken only at an outer sync of the whole model: one fragment,
    nothing in flight, saved right after the sync landed (iteration = tau + a multiple of H), where every replica
    has just taken theta. From there the new schedule runs as it would from iteration 0's count: outer steps
    after the iterations it names, so the first round after the resume may be shorter than the new H."""
    if state is None:
        return ""
    args = state.get("args") or {}
    saved = {flag: args.get(key) if args.get(key) is not None else default for key, flag, default in SCHEDULE}
    now = dict(zip(saved, (cfg.inner_steps, cfg.fragments, cfg.fragment_sync_delay)))
    if saved == now or type(saved["--diloco-inner-steps"]) is not int:  # the same, or no DiLoCo state saved
        return ""
    h, k, tau = saved.values()
    it, inflight = state.get("iteration", 0), state.get("diloco.inflight", -1)
    as_saved = " ".join(f"{f} {v}" for f, v in saved.items() if v != now[f])
    if k > 1:
        return (f"was saved with --diloco-fragments {k}, whose fragments sync at different steps (one is always "
                f"mid-round); resume with {as_saved}, as saved")
    at_sync = f"an iteration that is {f'{tau} more than ' if tau else ''}a multiple of {h}"
    if inflight >= 0:
        where = f"with the outer all-reduce in flight (--diloco-fragment-sync-delay {tau})"
    elif (it - tau) % h:
        last = it - (it - tau) % h
        where = f"{plural(it - last, 'inner step')} into a round of --diloco-inner-steps {h} (the replicas apart since " \
                f"their sync at iteration {last})"
    else:
        return ""  # at a sync: every replica holds theta
    return (f"was saved at iteration {it}, {where}; resume with {as_saved}, or change the schedule from a "
            f"checkpoint saved at an outer sync ({at_sync})")


def midflight_layout_change(state: dict | None, cfg: DiLoCoConfig, dims, zero_stage: int) -> str:
    """Why a checkpoint saved with a Streaming DiLoCo fragment in flight cannot resume at this layout ("" when it
    can): the K fragments are cut over each rank's own parameter segments, so at another TP / PP / DP / ZeRO layout
    fragment f is another set of parameters and the stored delta would land on the wrong ones. K = 1 (the whole
    model) resumes anywhere the weights do."""
    if state is None or cfg.fragments == 1 or state.get("diloco.inflight", -1) < 0:
        return ""
    saved = state.get("layout", {})
    here = {"tp": dims.tp, "pp": dims.pp, "dp": dims.dp, "zero": zero_stage}
    if all(saved.get(k) == v for k, v in here.items()):
        return ""
    at = " ".join(f"{k} {saved.get(k)}" for k in here)
    return (f"was saved with fragment {state['diloco.inflight']}'s outer all-reduce in flight at {at}; the "
            f"--diloco-fragments are cut per rank, so resume it at that layout (or from a checkpoint with none in "
            f"flight)")


def _saved_state(ckpt: CheckpointConfig | None) -> dict | None:
    """state.json of the checkpoint a resume will read (--ckpt-step's, else the newest); None when there is nothing
    to load (or it is unreadable: the resume reports that)."""
    if ckpt is None or ckpt.load is None:
        return None
    tries = [ckpt.ckpt_step] if ckpt.ckpt_step is not None else store.candidates(ckpt.load)
    if not tries or not os.path.isfile(os.path.join(store.final_path(ckpt.load, tries[0]), "state.json")):
        return None
    try:
        return store.read_state(store.final_path(ckpt.load, tries[0]))
    except (OSError, ValueError, store.CorruptCheckpoint):
        return None


def _saved_args(ckpt: CheckpointConfig | None) -> dict:
    return ((_saved_state(ckpt) or {}).get("args")) or {}


def _saved_replicas(ckpt: CheckpointConfig | None) -> int | None:
    """The DiLoCo replicas of the checkpoint a resume will read: 0 when it was saved without DiLoCo, None when
    there is nothing to load."""
    state = _saved_state(ckpt)
    if state is None:
        return None
    args = state.get("args") or {}
    if args.get("diloco_inner_steps") is None:
        return 0
    return args.get("diloco_replicas") or state.get("layout", {}).get("dp")
