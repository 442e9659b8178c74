"""Checkpoints (hybrid/checkpoint): exact resume, resharding to any layout, atomicity and corruption,
asynchronous saves, and the train.py flags.

References are independent of the checkpoint code: the uninterrupted run (exact resume), and tensors
gathered by a separate path -- parameters with the ZeRO engine's own gather and ShardSpec's gather_full,
Adam moments by all-gathering each flat unit over DP, cutting it at the unit's parameter offsets and
gathering over TP -- on the saving and on the loading layout (resharding). Everything must be
bit-identical (torch.equal): a checkpoint copies values, it computes nothing. fp32 throughout, except the
bf16/fp16 resume cases (compute-dtype parameters over fp32 master weights and the fp16 loss scaler).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist

from hybrid import testing
from hybrid.checkpoint import core, store
from hybrid.checkpoint.faults import ENV as CRASH_ENV, SimulatedCrash
from hybrid.data import BatchSpec, load_corpus, micro_batches
from hybrid.mesh import Mesh, ParallelDims
from hybrid.pipeline import ScheduleKind, build_schedule
from hybrid.pipeline.executor import PipelineExecutor, StageIO
from hybrid.testing import run_distributed
from hybrid.tp import ParallelRNG, TPContext, gather_full, spec_of
from hybrid.train_step import LocalForwardBackward, OptimizerConfig, train_step
from hybrid.zero import Precision, ZeroConfig, ZeroOptimizer
from models import build_pipeline_chunks, load_config
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

FP32 = Precision.FP32
GLOBAL, MICRO, SEQ, N = 8, 2, 16, 2  # N steps before and after the save
# train.py's optimizer defaults (hybrid/train/loop.py builds OptimizerConfig from these flags)
OPT = OptimizerConfig(lr=1e-3, min_lr=1e-4, weight_decay=0.01, beta1=0.9, beta2=0.95, warmup_iters=1,
                      decay_style="cosine", train_iters=2 * N, clip_grad=1.0)
# resharding model: 259 vocabulary rows (padded at tp 2 and 4), tied embeddings (across pipeline stages),
# 2 kv-heads (replicated at tp 4)
RESHARD_MODEL = ("tiny-llama", 259)


def model_cfg(name: str, vocab: int | None = None):
    cfg = load_config(name)
    return dataclasses.replace(cfg, vocab_size=vocab, tie_embeddings=True) if vocab else cfg


class Run:
    """One model + ZeroOptimizer + runner at a layout, trained as train.py trains."""

    def __init__(self, mesh: Mesh, model: tuple[str, int | None], zero: ZeroConfig, seed: int = 5, v: int = 1):
        self.mesh, self.cfg, self.model_name = mesh, model_cfg(*model), model[0]
        self.rng = ParallelRNG(seed, mesh.coords.tp, mesh.coords.pp)
        tp = TPContext(mesh.tp, rng=self.rng)
        self.model = build_pipeline_chunks(self.cfg, tp, mesh.coords.pp, mesh.dims.pp, v, seed=seed)
        self.spec = BatchSpec(GLOBAL, MICRO, SEQ, mesh.dims.dp)
        if v > 1:
            self.runner = None  # interleaved chunks: loaded and inspected, not trained here
        elif mesh.dims.pp == 1:
            self.runner = LocalForwardBackward(self.model[0], mesh.device)
        else:
            schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, mesh.dims.pp, self.spec.num_micro_batches)
            self.runner = PipelineExecutor(self.model, schedule[mesh.coords.pp], mesh.pp,
                                           StageIO((MICRO, SEQ, self.cfg.hidden_size), zero.precision.dtype), mesh.device)
        self.opt = ZeroOptimizer(self.model, mesh, zero, OPT)
        self.names = core.param_names(self.model)

    def train(self, start: int, stop: int, corpus) -> list[float]:
        return [train_step(self.model, micro_batches(corpus, self.spec, 3, it, self.mesh.coords.dp), self.opt,
                           self.mesh, lr=OPT.lr_at(it), runner=self.runner) for it in range(start, stop)]

    def save(self, root: str, iteration: int, asynchronous: bool = False) -> core.PendingSave:
        state = dict(self.info(), iteration=iteration, consumed_samples=iteration * GLOBAL)
        return core.start_save(self.opt, self.names, self.rng, root, iteration, state, asynchronous=asynchronous)

    def info(self) -> dict:
        """What train.py records of the run (hybrid/train/loop.run_info)."""
        d = self.mesh.dims
        return {"model": self.model_name,
                "layout": {"tp": d.tp, "pp": d.pp, "dp": d.dp, "zero": self.opt.cfg.stage}}

    def load(self, directory: str, rng: bool = True) -> dict:
        return core.load(self.opt, self.names, self.rng, directory, rng_too=rng)


MASTER = "master"


def full_state(run: Run) -> dict[str, dict[str, torch.Tensor]]:
    """name -> {param (the compute dtype's), master (fp32), exp_avg, exp_avg_sq}: full tensors gathered without the checkpoint code (see the
    module docstring). Every rank returns its pipeline stage's parameters. Each parameter's four local tensors
    (one shape: its TP shard) are stacked and gathered over TP at once, the split dimension moved up by the stack's
    -- gather_full on each kind alone gives the same full tensors with four times the gathers."""
    opt, mesh = run.opt, run.mesh
    named = {id(p): (n.split(".", 1)[1], p) for n, p in run.model.named_parameters()}
    local: dict[str, dict[str, torch.Tensor]] = {name: {} for name, _ in named.values()}
    with opt.gathered():
        for name, p in named.values():
            local[name]["param"] = p.detach().float().clone()
    for kind in (MASTER, *core.MOMENTS):
        for u in opt.units:
            shard = torch.zeros(u.shard_numel)
            for v, s in zip(u.views, u.segments):  # v: this rank's fp32 master slice of one parameter
                st = opt.optimizer.state.get(v)
                if kind == MASTER:
                    shard[s.lo:s.hi] = v.detach().float().cpu()
                elif st:
                    shard[s.lo:s.hi] = st[kind].float().cpu()
            flat = torch.cat(mesh.dp.all_gather(shard, dim=0).chunk(opt.dp.size)) if opt.cfg.sharded else shard
            for p, off in zip(u.params, u.offsets):
                local[named[id(p)][0]][kind] = flat[off:off + p.numel()].view(p.shape)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in named.values():
        kinds = ("param", MASTER, *core.MOMENTS)
        spec = spec_of(p)
        stacked_spec = spec if spec.dim is None else dataclasses.replace(spec, dim=spec.dim % p.dim() + 1)
        full = gather_full(torch.stack([local[name][k] for k in kinds]), stacked_spec, mesh.tp)
        out[name] = {k: full[i].clone() for i, k in enumerate(kinds)}
    return out


def local_state(run: Run) -> dict[str, dict[str, torch.Tensor]]:
    """unit -> {shard (this rank's compute-dtype parameters; flat: all of them at ZeRO 0-2), master (fp32), each
    view's Adam moments}: this rank's own copies, nothing gathered. The exact-resume check compares two runs at one
    layout rank by rank, and every full tensor is put together from these pieces, so equal pieces on every rank are
    equal full tensors (the padding included: zeros in both runs). full_state's gathers (a TP gather per parameter
    and kind, ~95 a case on each rank) are the resharding check's reference, where the layouts differ."""
    opt = run.opt
    opt.wait_params()  # ZeRO 1-2: the post-step all-gather into flat may still be in flight
    out: dict[str, dict[str, torch.Tensor]] = {}
    for u in opt.units:
        kinds = {"shard": u.shard.clone(), MASTER: u.master.clone()}
        if opt.cfg.stage < 3:
            kinds["flat"] = u.flat.clone()
        for i, v in enumerate(u.views):
            for kind, t in opt.optimizer.state.get(v, {}).items():
                if kind in core.MOMENTS:
                    kinds[f"{kind}.{i}"] = t.clone()
        out[u.name] = kinds
    assert any(k.startswith(core.MOMENTS[0]) for kinds in out.values() for k in kinds), "no Adam moments yet"
    return out


def adam_step(run: Run) -> int:
    return core.adam_step(run.opt)


# --- (1) exact resume at tp2 x pp2 x dp2 ----------------------------------------------------------------
RESUME_CASES = [(m, z, off, FP32) for m in ("tiny-gpt2", "tiny-llama")
                for z, off in ((0, False), (1, False), (3, False), (3, True))]
# mixed precision: bf16 / fp16 compute parameters over fp32 master weights (ZeRO 1: full compute copies on every
# rank; ZeRO 3: sharded), the fp16 loss scaler included
RESUME_CASES += [("tiny-llama", z, False, p) for p in (Precision.BF16, Precision.FP16) for z in (1, 3)]
# fp16: a scale of 2^14 doubled after every good step (window 1) overflows at the 4th step of this run
# (2^17), so the scaler doubles before the save and halves (a skipped step) after it; a loader that did not
# restore it would start again at 2^14 and skip nothing
FP16_SCALER = {"initial_loss_scale": 2.0**14, "loss_scale_window": 1}


def case_name(m: str, z: int, off: bool, precision: Precision) -> str:
    return f"{m}-z{z}{'-offload' if off else ''}{'' if precision is FP32 else '-' + precision.value}"


def zero_cfg(stage: int, offload: bool, precision: Precision = Precision.FP32) -> ZeroConfig:
    """train.py's defaults: --cpu-adam auto (DeepSpeed's CPU Adam where it builds) when offloading."""
    scaler = FP16_SCALER if precision is Precision.FP16 else {}
    return ZeroConfig(stage=stage, offload_optimizer=offload, offload_params=offload and stage == 3,
                      precision=precision, **scaler)


def _resume_phase(rank, world, root, phase, cases=tuple(RESUME_CASES)):
    mesh = Mesh.build(ParallelDims.from_world(world, tp=2, pp=2))
    corpus = load_corpus()
    out = {}
    for m, z, off, precision in cases:
        key = case_name(m, z, off, precision)
        run = Run(mesh, (m, None), zero_cfg(z, off, precision))
        if phase == "straight":  # 2N steps, saving after N (the save must not perturb the run)
            losses = run.train(0, N, corpus)
            run.save(os.path.join(root, key), N).finish()
            losses += run.train(N, 2 * N, corpus)
        else:  # fresh processes: load after N, train N
            state = run.load(store.final_path(os.path.join(root, key), N))
            assert state["iteration"] == N
            losses = run.train(N, 2 * N, corpus)
        out[key] = (losses, local_state(run), adam_step(run), core.scaler_state(run.opt))
    return out



# --- (2) resharding: save at each layout, load at every other ---------------------------------------------
LAYOUTS = [(2, 2, 2, 1), (1, 2, 4, 2), (2, 1, 4, 3), (4, 2, 1, 0), (1, 1, 1, 0)]  # (tp, pp, dp, zero)


def lname(layout) -> str:
    return "tp{}pp{}dp{}z{}".format(*layout)


def _reshard_save(run_: Run, root: str, corpus) -> dict:
    run_.train(0, N, corpus)
    run_.save(os.path.join(root, "reshard", lname(_layout(run_))), N).finish()
    return {"state": full_state(run_), "step": adam_step(run_)}


def _layout(run_: Run):
    d = run_.mesh.dims
    return d.tp, d.pp, d.dp, run_.opt.cfg.stage


def matrix_zero(stage: int) -> ZeroConfig:
    """The matrix's ZeRO 3 layout runs offloaded (parameters and optimizer on the host; train.py's CPU Adam)."""
    return zero_cfg(stage, offload=stage == 3)


def _reshard_load(mesh: Mesh, z: int, root: str, v: int = 1) -> dict:
    out = {}
    for src in LAYOUTS:
        run_ = Run(mesh, RESHARD_MODEL, matrix_zero(z), v=v)
        st = run_.load(store.final_path(os.path.join(root, "reshard", lname(src)), N), rng=False)
        out[lname(src)] = {"state": full_state(run_), "step": adam_step(run_), "json": st}
    return out


# --- (4) asynchronous saves ---------------------------------------------------------------------------
def _async_saves(mesh: Mesh, root: str, corpus) -> dict:
    """Save asynchronously, then change every parameter and moment before the save completes: the
    checkpoint must hold the values of the moment of the call. Then 6 back-to-back saves."""
    from hybrid.checkpoint.args import CheckpointConfig
    from hybrid.checkpoint.run import RunCheckpoints
    run_ = Run(mesh, RESHARD_MODEL, ZeroConfig(stage=1))
    run_.train(0, N, corpus)
    before = full_state(run_)
    ck = RunCheckpoints(CheckpointConfig(save=os.path.join(root, "async"), async_save=True), mesh, run_.model,
                        run_.opt, run_.rng, run_.info())
    ck.save(N, N * GLOBAL)
    with torch.no_grad():
        for u in run_.opt.units:
            u.master.add_(1.0)
            for v in u.views:
                for k in core.MOMENTS:
                    run_.opt.optimizer.state[v][k].add_(1.0)
    run_.opt.sync_params_from_master()
    for i in range(N + 1, N + 7):
        ck.save(i, i * GLOBAL)
    ck.finish(N + 6, (N + 6) * GLOBAL)
    return {"before": before, "iterations": store.complete_iterations(os.path.join(root, "async")),
            "latest": store.read_latest(os.path.join(root, "async"))}


def _async_check(mesh: Mesh, root: str) -> dict:
    run_ = Run(mesh, RESHARD_MODEL, ZeroConfig(stage=1))
    run_.load(store.final_path(os.path.join(root, "async"), N), rng=False)
    return full_state(run_)


def _world8(rank, world, root, phase):
    corpus = load_corpus()
    out = {"resume": _resume_phase(rank, world, root, phase)}
    for tp, pp, dp, z in LAYOUTS:
        if tp * pp * dp != world:
            continue
        mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
        if phase == "straight":
            out[lname((tp, pp, dp, z))] = _reshard_save(Run(mesh, RESHARD_MODEL, matrix_zero(z)), root, corpus)
            if (tp, pp, dp, z) == LAYOUTS[0]:
                out["async"] = _async_saves(mesh, root, corpus)
        else:
            out[lname((tp, pp, dp, z))] = _reshard_load(mesh, z, root)
            if (tp, pp, dp, z) == LAYOUTS[0]:
                out["async"] = _async_check(mesh, root)
    if phase == "resumed":  # one more target: interleaved virtual stages (pp 2 x v 2, one layer per chunk)
        mesh = Mesh.build(ParallelDims.from_world(world, tp=2, pp=2))
        out[INTERLEAVED] = _reshard_load(mesh, 1, root, v=2)
    return out


INTERLEAVED = "tp2pp2v2dp2z1"


def _world1(rank, world, root):
    """(1, 1, 1, 0): save, and load every world-8 checkpoint; then the fault cases (one process)."""
    corpus = load_corpus()
    mesh = Mesh.build(ParallelDims.from_world(1))
    out = {lname(LAYOUTS[-1]): _reshard_save(Run(mesh, RESHARD_MODEL, ZeroConfig(stage=0)), root, corpus)}
    out["load"] = _reshard_load(mesh, 0, root)
    out["faults"] = _faults(mesh, root, corpus)
    return out


@pytest.fixture(scope="module")
def spawns(tmp_path_factory):
    """Three spawns shared by every case: 8 ranks save, 1 rank saves and loads, 8 fresh ranks load."""
    root = str(tmp_path_factory.mktemp("ckpt"))
    straight = run_distributed(_world8, 8, args=(root, "straight"), timeout=900)
    single = run_distributed(_world1, 1, args=(root,), timeout=900)[0]
    resumed = run_distributed(_world8, 8, args=(root, "resumed"), timeout=900)
    return {"straight": straight, "single": single, "resumed": resumed}


@pytest.mark.parametrize("case", [case_name(*c) for c in RESUME_CASES])
@pytest.mark.slow
def test_resume_after_save_is_bit_identical_to_the_uninterrupted_run(spawns, case):
    """Per-step losses, compute-dtype parameters, fp32 master weights, both moments, the Adam step and the
    loss scaler (scale, good steps, skipped steps) after the resume equal the uninterrupted run's (every rank's own
    pieces of them: local_state)."""
    for rank in range(8):
        a, b = spawns["straight"][rank]["resume"][case], spawns["resumed"][rank]["resume"][case]
        assert a[0][N:] == b[0], f"rank {rank}: losses after the resume differ"
        assert a[3] == b[3], f"rank {rank}: loss scaler {a[3]} (uninterrupted) vs {b[3]} (resumed)"
        if case.endswith("-fp16"):  # the scaler moved on both sides of the save (see FP16_SCALER)
            assert a[3]["skipped_steps"] == 1 and a[3]["loss_scale"] == 2.0**16, a[3]
        skipped = a[3]["skipped_steps"]
        assert a[2] == b[2] == 2 * N - skipped  # a skipped fp16 step does not advance AdamW
        for name in a[1]:
            for kind in a[1][name]:
                assert torch.equal(a[1][name][kind], b[1][name][kind]), f"rank {rank}: {name} {kind}"


def _merged(per_rank: list[dict]) -> dict:
    """name -> kind -> tensor over all ranks (each pipeline stage has its own names; replicas must agree)."""
    out: dict = {}
    for st in per_rank:
        for name, kinds in st.items():
            for kind, t in kinds.items():
                have = out.setdefault(name, {}).setdefault(kind, t)
                assert torch.equal(have, t), f"ranks disagree on {name} {kind}"
    return out


def _saved(spawns, layout) -> tuple[dict, int]:
    if layout == LAYOUTS[-1]:
        r = spawns["single"][lname(layout)]
        return _merged([r["state"]]), r["step"]
    rs = [spawns["straight"][rank][lname(layout)] for rank in range(8)]
    return _merged([r["state"] for r in rs]), rs[0]["step"]


def _loaded(spawns, target, source) -> list[dict]:
    if target == LAYOUTS[-1]:
        return [spawns["single"]["load"][lname(source)]]
    key = target if target == INTERLEAVED else lname(target)
    return [spawns["resumed"][rank][key][lname(source)] for rank in range(8)]


@pytest.mark.parametrize("target", LAYOUTS + [INTERLEAVED], ids=lambda t: t if isinstance(t, str) else lname(t))
@pytest.mark.parametrize("source", LAYOUTS, ids=lname)  # ZeRO 3 offloaded (matrix_zero)
@pytest.mark.slow
def test_a_checkpoint_loads_at_any_layout_with_identical_parameters_moments_and_step(spawns, source, target):
    want, step = _saved(spawns, source)
    assert step == N
    got = _loaded(spawns, target, source)
    full = _merged([g["state"] for g in got])
    assert sorted(full) == sorted(want)
    for name in want:
        for kind in ("param", *core.MOMENTS):
            assert torch.equal(full[name][kind], want[name][kind]), f"{name} {kind}"
            assert full[name][kind].abs().sum() > 0  # the moments are not the zeros of a fresh optimizer
    for g in got:
        assert g["step"] == N
        assert g["json"]["iteration"] == N and g["json"]["consumed_samples"] == N * GLOBAL
        assert g["json"]["scaler"] == {"loss_scale": 1.0, "good_steps": 0, "skipped_steps": 0}


@pytest.mark.slow
def test_async_save_keeps_the_values_of_the_call_and_back_to_back_saves_complete(spawns):
    saved = spawns["straight"][0]["async"]
    assert saved["iterations"] == list(range(N, N + 7)) and saved["latest"] == N + 6
    before = _merged([spawns["straight"][r]["async"]["before"] for r in range(8)])
    after = _merged([spawns["resumed"][r]["async"] for r in range(8)])
    for name in before:
        for kind in before[name]:
            assert torch.equal(after[name][kind], before[name][kind]), f"{name} {kind}"


# --- (3) faults -----------------------------------------------------------------------------------------
def _faults(mesh: Mesh, root: str, corpus) -> dict:
    """A crash at each point of a save leaves `latest` on the previous checkpoint; the next save cleans up;
    a truncated or bit-flipped file is named on load and the run falls back to the previous checkpoint."""
    from hybrid.checkpoint.args import CheckpointConfig
    from hybrid.checkpoint.run import RunCheckpoints
    d = os.path.join(root, "faults")
    run_ = Run(mesh, ("tiny-gpt2", None), ZeroConfig(stage=0))
    run_.train(0, 1, corpus)
    run_.save(d, 1).finish()
    run_.train(1, 2, corpus)
    out = {}
    for point in ("after_data", "before_rename"):
        os.environ[CRASH_ENV] = f"crash:point={point}"  # the one test-only hook, HYBRID_FAULT
        try:
            run_.save(d, 2).finish()
            out[point] = "no crash"
        except SimulatedCrash:
            out[point] = (store.read_latest(d), store.candidates(d), sorted(os.listdir(d)))
        finally:
            del os.environ[CRASH_ENV]
    run_.save(d, 2).finish()
    out["after"] = (store.read_latest(d), sorted(os.listdir(d)))
    data = os.path.join(store.final_path(d, 2), "__0_0.distcp")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) - 1)
    out["truncated"] = core.verify(store.final_path(d, 2))
    fresh = Run(mesh, ("tiny-gpt2", None), ZeroConfig(stage=0))
    out["resumed"] = RunCheckpoints(CheckpointConfig(load=d), mesh, fresh.model, fresh.opt, fresh.rng,
                                    fresh.info()).resume()
    data = os.path.join(store.final_path(d, 1), "__0_0.distcp")
    with open(data, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    out["flipped"] = core.verify(store.final_path(d, 1))
    return out


@pytest.mark.slow
def test_a_crash_during_a_save_leaves_latest_on_the_previous_checkpoint(spawns):
    f = spawns["single"]["faults"]
    latest, cands, listing = f["after_data"]
    assert latest == 1 and cands == [1] and "iter_0000002.tmp" in listing and "iter_0000002" not in listing
    latest, cands, listing = f["before_rename"]
    assert latest == 1 and cands == [1] and "iter_0000002.tmp" in listing
    latest, listing = f["after"]
    assert latest == 2 and listing == ["iter_0000001", "iter_0000002", "latest"]  # the leftover .tmp is gone


@pytest.mark.slow
def test_a_truncated_or_flipped_file_is_named_and_load_falls_back_to_the_previous_checkpoint(spawns):
    f = spawns["single"]["faults"]
    assert "__0_0.distcp" in f["truncated"] and "truncated" in f["truncated"] and "\n" not in f["truncated"]
    assert f["resumed"] == (1, GLOBAL)
    assert "__0_0.distcp" in f["flipped"] and "sha256" in f["flipped"]


# --- (5) through train.py -------------------------------------------------------------------------------
# train.py as `torchrun --nproc-per-node 2` would run it, its ranks forked from hybrid.testing's forkserver
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--seq-length", "32", "--micro-batch-size", "2", "--log-interval", "1", "--zero-stage", "1", "--train-iters",
         "6", "--eval-iters", "1"]  # the end's validation and test: one batch each (none read)
ENV = {"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, CRASH_ENV: None, "OMP_NUM_THREADS": "1"}


def _train(argv, cwd) -> str:
    out = testing.torchrun(TRAIN + argv, 2, env=ENV, cwd=str(cwd), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _losses(stdout: str) -> dict[int, str]:
    return {int(ln.split()[1].split("/")[0]): ln.split("lm loss ")[1].split()[0]
            for ln in stdout.splitlines() if ln.startswith(" iteration")}


@pytest.mark.slow
def test_train_py_saves_and_a_resumed_run_logs_the_same_losses(tmp_path, capsys):
    save = str(tmp_path / "ckpt")
    first = _train(["--save", save, "--save-interval", "3", "--async-save", "--save-keep", "2"], tmp_path)
    assert store.complete_iterations(save) == [3, 6] and store.read_latest(save) == 6
    second = _train(["--load", save, "--ckpt-step", "3"], tmp_path)
    assert f"checkpoint: resumed from {store.final_path(save, 3)}" in second
    a, b = _losses(first), _losses(second)
    assert sorted(b) == [4, 5, 6] and all(a[i] == b[i] for i in b), (a, b)
    from hybrid.cli import main as hybrid_cli
    capsys.readouterr()
    hybrid_cli(["checkpoint", "inspect", save])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{save}: latest -> iter_0000006" and len(lines) == 3
    assert "iter_0000006 (latest): iteration 6 | consumed samples 24 |" in lines[2]  # 6 x (micro 2 x dp 2)
    assert "tp 1 x pp 1 x dp 2, ZeRO 1" in lines[2] and lines[2].endswith("ok: every checksum matches")
    hybrid_cli(["checkpoint", "inspect", store.final_path(save, 6), "--tensor-model-parallel-size", "2",
                "--pipeline-model-parallel-size", "2", "--world-size", "8"])
    assert capsys.readouterr().out.splitlines()[1] == ("    at tp 2 x pp 2 on 8 ranks: loadable (dp 2; vocabulary 256 "
                                                       "rows, padded to 256 at tp 2)")
    with open(os.path.join(store.final_path(save, 3), "state.json"), "a") as f:
        f.write(" ")
    with pytest.raises(SystemExit) as bad:  # exit status 1: `inspect DIR && torchrun ... --load DIR` stops
        hybrid_cli(["checkpoint", "inspect", store.final_path(save, 3)])
    assert bad.value.code == 1 and "CORRUPT: " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--save-interval", "0", "--save", "{d}/c"], "--save-interval must be a positive number of iterations, got 0"),
    (["--save-interval", "5"], "--save-interval needs --save DIR"),
    (["--save", "{f}"], "--save '{f}' exists and is not a directory"),
    (["--load", "{d}/empty"], "is an empty directory: no checkpoint"),
    (["--ckpt-step", "3"], "--ckpt-step / --no-load-optim / --no-load-rng need --load DIR"),
    (["--save-keep", "0", "--save", "{d}/c"], "--save-keep must be at least 1, got 0"),
    (["--load", "{d}/partial"], "holds no complete checkpoint (only unfinished saves)"),
    (["--load", "{d}/done", "--ckpt-step", "7"], "--ckpt-step 7: '{d}/done' has no complete checkpoint of that "
                                                 "iteration (it has 3)"),
])
def test_bad_checkpoint_flags_are_one_line_before_any_process_group(tmp_path, argv, message, capsys):
    from hybrid.train.main import validate
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "partial" / "iter_0000003.tmp").mkdir(parents=True)
    (tmp_path / "done" / "iter_0000003").mkdir(parents=True)
    (tmp_path / "done" / "iter_0000003" / store.MANIFEST).write_text("{}")
    fill = {"d": str(tmp_path), "f": str(tmp_path / "file")}
    with pytest.raises(SystemExit) as e:
        validate([a.format(**fill) for a in argv])
    text = str(e.value.code)
    assert text.startswith("train.py: error: ") and message.format(**fill) in text and "\n" not in text
    assert not dist.is_initialized()


@pytest.mark.slow
def test_sigterm_with_exit_signal_handler_finishes_the_step_saves_and_exits_zero(tmp_path):
    import signal
    import time
    save = str(tmp_path / "ckpt")
    env = dict(ENV, PYTHONUNBUFFERED="1")  # one process, no launcher: `python scripts/train.py`, a fork of it
    proc = testing.start([os.path.join(ROOT, "scripts", "train.py"), "--seq-length", "32", "--micro-batch-size", "2",
                          "--log-interval", "1", "--train-iters", "100000", "--save", save, "--exit-signal-handler"],
                         env=env, cwd=str(tmp_path))
    deadline = time.monotonic() + 300
    while " iteration      2/" not in proc.stdout() and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 0
    text = proc.stdout() + proc.stderr()
    line = next(ln for ln in text.splitlines() if "SIGTERM: saved iteration" in ln)
    k = int(line.split("iteration ")[1].split(";")[0])
    assert k >= 2 and store.read_latest(save) == k and store.complete_iterations(save) == [k]
    assert store.read_state(store.final_path(save, k))["consumed_samples"] == 2 * k
    # resuming it with another model, or after its only checkpoint is damaged: one line, before any step
    base = [os.path.join(ROOT, "scripts", "train.py"), "--seq-length", "32", "--load", save]
    other = testing.run(base + ["--model", "tiny-llama"], cwd=str(tmp_path), env=env, timeout=300)
    assert other.returncode != 0 and other.stderr.strip().splitlines()[-1] == (
        f"train.py: error: --load {store.final_path(save, k)} holds another model: its arch is \"gpt2\", --model "
        f"tiny-llama has \"llama\"; give the --model it was saved with (its config is compared, not its path: "
        f"saved as 'tiny-gpt2')")
    with open(os.path.join(store.final_path(save, k), ".metadata"), "r+b") as f:
        f.truncate(10)
    bad = testing.run(base, cwd=str(tmp_path), env=env, timeout=300)
    assert bad.returncode != 0 and " iteration" not in bad.stdout
    # refused before any process group (hybrid/checkpoint/args.py), naming the damaged file
    newest = os.path.join(store.final_path(save, k), ".metadata")
    assert bad.stderr.strip().splitlines()[-1].startswith(
        f"train.py: error: --load {save!r}: no intact checkpoint (the newest: {newest}: 10 bytes, the manifest says ")
    assert bad.stderr.strip().splitlines()[-1].endswith(f"(truncated?)); see `hybrid checkpoint inspect {save}`")


# --- the geometry, against brute force ---------------------------------------------------------------
def test_a_flat_range_is_at_most_three_contiguous_rectangles_covering_exactly_it():
    from hybrid.checkpoint.shards import flat_rectangles
    for rows, cols in ((1, 1), (3, 1), (4, 5), (7, 3)):
        n = rows * cols
        for f0 in range(n + 1):
            for f1 in range(f0, n + 1):
                mark = torch.zeros(rows, cols, dtype=torch.int32)
                rects = flat_rectangles(f0, f1, cols)
                assert len(rects) <= 3
                pos = f0
                for r, c, nr, nc in rects:  # in flat order, each contiguous: starts where the previous ended
                    assert r * cols + c == pos and (nr == 1 or (c == 0 and nc == cols))
                    mark[r:r + nr, c:c + nc] += 1
                    pos += nr * nc
                want = torch.zeros(n, dtype=torch.int32)
                want[f0:f1] = 1
                assert pos == f1 and torch.equal(mark.flatten(), want)


def test_placeholder_boxes_tile_what_the_local_chunks_leave():
    from hybrid.checkpoint.shards import complement
    gen = torch.Generator().manual_seed(0)
    for shape in ((10,), (6, 7), (5, 1)):
        for _ in range(20):
            mark = torch.zeros(shape, dtype=torch.int32)
            boxes = []
            for _ in range(3):  # up to 3 disjoint random boxes
                off = [int(torch.randint(0, s, (1,), generator=gen)) for s in shape]
                size = [int(torch.randint(1, s - o + 1, (1,), generator=gen)) for s, o in zip(shape, off)]
                region = tuple(slice(o, o + z) for o, z in zip(off, size))
                if mark[region].sum() == 0:
                    mark[region] += 1
                    boxes.append((tuple(off), tuple(size)))
            for off, size in complement(shape, boxes):
                mark[tuple(slice(o, o + z) for o, z in zip(off, size))] += 1
            assert torch.equal(mark, torch.ones(shape, dtype=torch.int32))


# --- (6) `hybrid checkpoint inspect --world-size`: loadable at a layout? ---------------------------------
# a Llama whose sizes trip each rule: 12 heads, 4 kv-heads, FFN 100, 4 layers, a 259-row vocabulary
ODD_MODEL = {"model_type": "llama", "hidden_size": 96, "num_attention_heads": 12, "num_key_value_heads": 4,
             "intermediate_size": 100, "num_hidden_layers": 4, "vocab_size": 259}


@pytest.fixture
def odd_checkpoint(tmp_path):
    """A complete checkpoint directory of ODD_MODEL (no tensors -- DCP's metadata of an empty state dict: inspect
    reads state.json, the metadata and the checksums)."""
    import json
    import pickle

    from torch.distributed.checkpoint.metadata import Metadata
    config = tmp_path / "config.json"
    config.write_text(json.dumps(ODD_MODEL))
    root = str(tmp_path / "ckpt")
    os.makedirs(store.tmp_path(root, 3))
    with open(os.path.join(store.tmp_path(root, 3), ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata={}, storage_data={}), f)
    state = {"iteration": 3, "consumed_samples": 24, "model": str(config), "adam_step": 3,
             "scaler": {"loss_scale": 1.0, "good_steps": 0, "skipped_steps": 0},
             "layout": {"tp": 2, "pp": 1, "dp": 2, "zero": 1},
             "args": {"global_batch_size": 8, "micro_batch_size": 2, "seq_length": 32}}
    store.finalize(root, 3, {}, state)
    return root, state


@pytest.mark.parametrize("tp, pp, world, why", [
    (8, 1, 8, "--tensor-model-parallel-size 8 does not divide the 12 attention heads; use a divisor of 12"),
    (6, 1, 6, "--tensor-model-parallel-size 6 and the 4 key/value heads must divide one another"),
    (12, 1, 12, "--tensor-model-parallel-size 12 does not divide the FFN size 100; use a divisor of 100"),
    (1, 5, 5, "--pipeline-model-parallel-size 5 exceeds the 4 layers; use at most 4 stages"),
    (4, 1, 6, "world size 6 is not divisible by --tensor-model-parallel-size (4) x --pipeline-model-parallel-size "
              "(1) = 4"),
])
def test_inspect_says_why_a_checkpoint_cannot_be_loaded_at_a_layout(odd_checkpoint, tp, pp, world, why):
    """The reasons are the trainer's own (hybrid/mesh.py), word for word: train.py at that layout refuses
    with the same text."""
    from hybrid.checkpoint.inspect import Target, loadable_at
    from hybrid.train.main import validate
    root, state = odd_checkpoint
    ok, reason = loadable_at(state, Target(tp, pp, world))
    assert not ok and reason.startswith(why), reason
    os.environ["WORLD_SIZE"] = str(world)
    try:
        with pytest.raises(SystemExit) as e:
            validate(["--model", state["model"], "--tensor-model-parallel-size", str(tp),
                      "--pipeline-model-parallel-size", str(pp), "--micro-batch-size", "1"])
    finally:
        del os.environ["WORLD_SIZE"]
    assert str(e.value.code) == f"train.py: error: {reason}"


def test_inspect_says_a_checkpoint_loads_at_a_layout_with_the_vocabulary_padding_and_batch_split(odd_checkpoint,
                                                                                                 capsys):
    from hybrid.checkpoint.inspect import Target, loadable_at
    from hybrid.cli import main as hybrid_cli
    root, state = odd_checkpoint
    ok, notes = loadable_at(state, Target(4, 2, 16))
    assert ok and notes == "dp 2; vocabulary 259 rows, padded to 260 at tp 4"
    ok, notes = loadable_at(state, Target(4, 2, 24))  # dp 3: the saved global batch 8 does not split
    assert ok and "the saved batch does not split at dp 3 (--global-batch-size 8 must be a multiple of " \
                  "--micro-batch-size 2 x data-parallel size 3 = 6; give --global-batch-size 6 or 12)" in notes
    capsys.readouterr()
    with pytest.raises(SystemExit) as bad:  # not loadable at the layout asked about: exit status 1
        hybrid_cli(["checkpoint", "inspect", root, "--tensor-model-parallel-size", "8", "--world-size", "8"])
    assert bad.value.code == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  iter_0000003 (latest): iteration 3 |") and lines[1].endswith("ok: every checksum matches")
    assert lines[2] == ("    at tp 8 x pp 1 on 8 ranks: NOT loadable: --tensor-model-parallel-size 8 does not divide "
                        "the 12 attention heads; use a divisor of 12")
    with pytest.raises(SystemExit) as e:
        hybrid_cli(["checkpoint", "inspect", root, "--tensor-model-parallel-size", "2"])
    assert str(e.value.code) == ("hybrid checkpoint inspect: error: --tensor-model-parallel-size needs --world-size N "
                                 "(the ranks the run would be launched on)")
