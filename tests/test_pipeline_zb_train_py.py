"""The zero-bubble schedules through train.py, as users run them: the flags (bad combinations are one line naming
the flag, before any process group) and checkpoints across schedules.

Checkpoints: a checkpoint holds each parameter by its global name (hybrid/checkpoint/core.py), so where the
stages sit does not matter. Reference: one 1F1B run of 6 steps saving at 3 and 6. A ZBV run of 3 steps resumed
under 1F1B for 3 more, and the 1F1B step-3 checkpoint resumed under ZBV (and under ZB-H1), must end with the
reference's step-6 checkpoint exactly: every weight and Adam moment torch.equal (read back with torch's own
dcp_to_torch_save, not our loader). The runs use train.py's defaults: the NaN guard and the hang watchdog on.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hybrid import testing
from hybrid.checkpoint import store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = [os.path.join(ROOT, "scripts", "train.py"), "--pipeline-model-parallel-size", "2", "--seq-length", "32",
         "--micro-batch-size", "2", "--global-batch-size", "8", "--log-interval", "1", "--zero-stage", "1",
         "--train-iters", "6", "--save-interval", "3",
         "--eval-iters", "1"]  # the end's validation and test: one batch each (none read)


@pytest.mark.parametrize("argv, world, message", [
    (["--pipeline-schedule", "zbv", "--virtual-pipeline-model-parallel-size", "3"], 2,
     "--pipeline-schedule zbv holds exactly 2 chunks a rank"),
    (["--pipeline-schedule", "zbv", "--pipeline-model-parallel-size", "4"], 4,
     "--pipeline-schedule zbv cuts the model into 2 x --pipeline-model-parallel-size = 8 stages, more than its 4 "
     "layers; use --pipeline-model-parallel-size 2"),  # the sizes zbv runs at that divide the ranks (round 19)
    (["--pipeline-schedule", "zbh1", "--virtual-pipeline-model-parallel-size", "2"], 2,
     "--pipeline-schedule zbh1 runs one chunk a rank"),
    (["--pipeline-schedule", "zbh1"], 1, "--pipeline-schedule zbh1 needs --pipeline-model-parallel-size >= 2"),
    (["--pipeline-schedule", "zbv", "--compile"], 2, "--pipeline-schedule zbv does not run with --compile"),
])
def test_bad_zero_bubble_flags_are_one_line_before_any_process_group(argv, world, message, monkeypatch):
    from hybrid.train.main import validate
    monkeypatch.setenv("WORLD_SIZE", str(world))
    pp = [] if "--pipeline-model-parallel-size" in argv or world == 1 else ["--pipeline-model-parallel-size", "2"]
    with pytest.raises(SystemExit) as e:
        validate(argv + pp)
    text = str(e.value.code)
    assert text.startswith("train.py: error: ") and message in text and "\n" not in text, text
    assert not dist.is_initialized()


def test_zbv_plan_holds_two_chunks_a_rank(monkeypatch):
    from hybrid.train.main import validate
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    monkeypatch.setenv("MASTER_PORT", "29500")
    run, _, _ = validate(["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "zbv"])
    plan = run.parallel.pipeline
    assert plan.v == 2 and len(plan.stages) == 4


def _train(argvs: list[list[str]], cwd) -> list[str]:
    """`torchrun --nproc-per-node 2 scripts/train.py TRAIN ARGV` for each ARGV, all at once (hybrid.testing's
    launch_together, the ranks forked from its forkserver: their start-up, rendezvous and checkpoint barriers
    overlap instead of adding up); each job's stdout, its ranks' joined in rank order as torchrun joins them."""
    env = {"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, "OMP_NUM_THREADS": "1"}
    jobs = testing.launch_together([dict(argv=TRAIN + argv, world=2, env=env, cwd=str(cwd), timeout=600,
                                         kill_stopped=False, teardown_after=0.0, entry=testing.python_main)
                                    for argv in argvs])
    for argv, ranks in zip(argvs, jobs):
        assert all(r.exited is not None and r.returncode == 0 for r in ranks), \
            (argv, "".join(r.stderr for r in ranks)[-3000:])
    return ["".join(r.stdout for r in ranks) for ranks in jobs]


def _state(ckpt: str, iteration: int, tmp_path) -> dict[str, torch.Tensor]:
    out = str(tmp_path / f"{os.path.basename(ckpt)}-{iteration}.pt")
    dcp_to_torch_save(store.final_path(ckpt, iteration), out)
    state = torch.load(out, weights_only=False)
    return {k: v for k, v in state.items() if k.startswith(("model/", "optim."))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two rounds of jobs run together: the 1F1B reference and ZBV's first 3 steps (independent), then what
    resumes from their checkpoints -- ZBV's under 1F1B, and the reference's step 3 under ZBV and under ZB-H1
    (each job its own checkpoint folder; none reads what another of its round writes)."""
    tmp = tmp_path_factory.mktemp("zb_ckpt")
    ref, zbv = str(tmp / "ref"), str(tmp / "zbv")  # zbv: ZBV for 3 steps, then 1F1B from its checkpoint
    logs = dict(zip(["ref", "zbv"], _train([
        ["--pipeline-schedule", "1f1b", "--save", ref],
        ["--pipeline-schedule", "zbv", "--save", zbv, "--exit-interval", "3", "--timeline", str(tmp / "zbv.json")]],
        tmp)))
    back = {kind: str(tmp / f"1f1b->{kind}") for kind in ("zbv", "zbh1")}  # 1F1B's step 3 under zero bubble
    logs.update(zip(["zbv->1f1b", "1f1b->zbv", "1f1b->zbh1"], _train(
        [["--pipeline-schedule", "1f1b", "--save", zbv, "--load", zbv]]
        + [["--pipeline-schedule", kind, "--save", back[kind], "--load", ref, "--ckpt-step", "3"] for kind in back],
        tmp)))
    return tmp, ref, zbv, back, logs


@pytest.mark.slow  # five train.py runs under torchrun
def test_a_zbv_checkpoint_resumed_under_1f1b_ends_bit_identical_to_the_1f1b_run(runs):
    tmp, ref, zbv, _, logs = runs
    assert "(zbv, v 2, layers [1, 1, 1, 1])" in logs["zbv"]
    assert f"checkpoint: resumed from {store.final_path(zbv, 3)}" in logs["zbv->1f1b"]
    want, got = _state(ref, 6, tmp), _state(zbv, 6, tmp)
    assert sorted(got) == sorted(want) and len(want) > 0
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.slow  # five train.py runs under torchrun
@pytest.mark.parametrize("kind", ["zbv", "zbh1"])
def test_a_1f1b_checkpoint_resumed_under_zero_bubble_ends_bit_identical(runs, kind):
    tmp, ref, _, back, logs = runs
    assert f"checkpoint: resumed from {store.final_path(ref, 3)}" in logs[f"1f1b->{kind}"]
    want, got = _state(ref, 6, tmp), _state(back[kind], 6, tmp)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    # the validation at the end runs forward-only through the schedule's placement (the V for zbv): same loss
    validation = [ln for ln in logs["ref"].splitlines() if "validation loss at iteration 6" in ln]
    assert validation and validation == [ln for ln in logs[f"1f1b->{kind}"].splitlines()
                                          if "validation loss at iteration 6" in ln]


@pytest.mark.slow  # five train.py runs under torchrun
def test_the_timeline_shows_b_and_w(runs):
    import json
    tmp = runs[0]
    with open(tmp / "zbv.json") as f:
        names = {e["name"][0] for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e["cat"] != "wait"}
    assert {"F", "B", "W"} <= names


# --- composition with context parallelism and MoE (expert parallelism), through train.py ----------------------
# pp 2 on 4 ranks, 3 steps: ZB-H1 must log 1F1B's losses and gradient norms exactly, ZBV its losses exactly and its
# norms to 1e-12 (the V groups the layers into ranks differently, so the norm's cross-rank sum may differ in its
# last bit; see tests/test_pipeline_zb_training.py). Ring attention's collectives and the MoE all-to-alls are on
# the input path, so they run in B; the expert and router weight gradients are left to W like any other weight.
COMPOSED = {
    "llama-cp2": ["--model", "tiny-llama", "--context-parallel-size", "2"],
    "mixtral-ep2": ["--model", "tiny-mixtral", "--expert-model-parallel-size", "2", "--moe-aux-loss-coeff", "0.01"],
}


def _metrics(case: str, kinds: list[str], tmp) -> list[list[tuple[float, float]]]:
    """Each schedule's logged (loss, gradient norm) per step, its 4-rank jobs launched together (launch_together:
    their start-up and rendezvous overlap)."""
    from hybrid.testing import launch_together
    paths = [tmp / f"{case}-{kind}.jsonl" for kind in kinds]
    jobs = launch_together([dict(argv=[*COMPOSED[case], "--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                                       kind, "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size",
                                       "8", "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0",
                                       "--metrics-file", str(path)], world=4, timeout=600)
                            for kind, path in zip(kinds, paths)])
    out = []
    for kind, path, ranks in zip(kinds, paths, jobs):
        assert all(r.returncode == 0 for r in ranks), (kind, ranks[0].stderr[-3000:])
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        out.append([(r["lm_loss"], r["grad_norm"]) for r in recs if "lm_loss" in r])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", COMPOSED)
def test_zero_bubble_composes_with_context_and_expert_parallelism(case, tmp_path):
    ref, zbh1, zbv = _metrics(case, ["1f1b", "zbh1", "zbv"], tmp_path)
    assert len(ref) == 3 and ref[-1][0] < ref[0][0], ref
    assert zbh1 == ref
    assert [loss for loss, _ in zbv] == [loss for loss, _ in ref]
    assert [norm for _, norm in zbv] == pytest.approx([norm for _, norm in ref], rel=1e-12, abs=0)


# --- the NaN guard and the hang watchdog under zero bubble, through train.py (pp 2 on 2 ranks) --------------------
# B and W are "backward" phases on the op trail the watchdog and the guard observe: a NaN gradient on rank 1 (it
# reaches .grad in W) skips the step on both ranks; a rank stalled before a pipeline send is named by its peer.
FAULT_ARGV = ["--pipeline-model-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "8",
              "--seq-length", "32", "--train-iters", "5", "--log-interval", "1", "--eval-iters", "0",
              "--watchdog-timeout", "5"]


@pytest.fixture(scope="module")
def faults() -> dict:
    """(fault, kind) -> the 2 ranks' runs: a NaN gradient on rank 1 at iteration 3, and rank 1 stalled before a
    pipeline send at iteration 3, under each kind; the four jobs launched together (their start-up, the NaN jobs'
    steps and the stalled jobs' 5 s watchdog waits overlap). The stalled tests assert the verdict and exit code,
    no time: they need no machine to itself, only that a healthy step never goes 5 s (wall clock) without an op
    (--watchdog-timeout); the two stalled jobs together passed at a load average of 10 on the 2 cores."""
    from hybrid.testing import launch_together
    cases = [(fault, kind) for fault in ("nan", "stalled") for kind in ("zbh1", "zbv")]
    env = {"nan": "nan:rank=1,iterations=3", "stalled": "hang:rank=1,op=pp.send,iteration=3,microbatch=1"}
    runs = launch_together([dict(argv=[*FAULT_ARGV, "--pipeline-schedule", kind], world=2,
                                 env={"HYBRID_FAULT": env[fault]}, timeout=600 if fault == "nan" else 120)
                            for fault, kind in cases])
    return dict(zip(cases, runs))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zbh1", "zbv"])
def test_nan_guard_skips_the_step_on_every_rank_under_zero_bubble(kind, faults):
    runs = faults["nan", kind]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    # under ZB-H1 the NaN lands in rank 1's first parameter, the tied LM head, whose gradient is summed with rank
    # 0's embedding copy before the guard looks (sync_tied_embeddings): rank 0 is non-finite too, as under 1F1B
    ranks = "[0, 1]" if kind == "zbh1" else "[1]"
    assert f"nan-guard: iteration 3: skipped the step on every rank (non-finite on ranks {ranks}; 1 consecutive)" \
        in runs[0].stdout, runs[0].stdout[-2000:]
    assert "nan-guard: iteration 3: rank 1: non-finite gradient of" in runs[1].stdout, runs[1].stdout[-2000:]
    assert runs[0].stdout.count("skipped the step on every rank") == 1, "only iteration 3 is skipped"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["zbh1", "zbv"])
def test_a_rank_stalled_before_a_pipeline_send_is_named_by_its_peer_under_zero_bubble(kind, faults):
    from hybrid.fault.watchdog import EXIT_HANG
    runs = faults["stalled", kind]
    assert [r.returncode for r in runs] == [EXIT_HANG, EXIT_HANG], runs[0].stderr[-2000:]
    (line,) = [ln for ln in runs[0].stderr.splitlines() if ln.startswith("hang verdict:")]
    assert "rank 0 waited" in line and "in pp p2p" in line and "at iteration 3 micro-batch 1" in line, line
    assert "<- rank 1" in line and "not arrived: rank 1 (" in line, line
