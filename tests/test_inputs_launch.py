"""The few input and fault checks that need real processes: a bad flag under torchrun is printed once and is
torchrun's root cause; `python -m hybrid.train` runs one process from outside a checkout; a 2-rank job whose
rank 1 is stopped (SIGSTOP) or killed (SIGKILL) -- injected through the test-only HYBRID_FAULT hook -- ends
within the distributed timeout with one line naming rank 1."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from hybrid import testing
from hybrid.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--seq-length", "32", "--micro-batch-size", "2", "--log-interval", "1",
        "--eval-iters", "1"]  # a run's end-of-run validation and test: one batch each (none read)


def _env(**extra) -> dict:
    """Changes to this process's environment (None: unset), for hybrid.testing.environment / start / run."""
    return {"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None, "HYBRID_FAULT": None,
            "TORCHELASTIC_ERROR_FILE": None, "OMP_NUM_THREADS": "1", **extra}


# the file's three jobs under the real torchrun agent (its failure summary is their subject), started at once: each
# is mostly waiting -- the agent's start-up and rendezvous, a failed rank's teardown -- and the waits overlap
# instead of adding up (~8 s of the file's wall time). Each job has its own directory, port and fork service.
AGENT_JOBS = {
    "bad-flag": (["-m", "hybrid.train", "--lr", "inf"], None),
    # rank 1 raises inside a checkpoint save while rank 0 waits for it in the save's all-gather
    "exception-on-rank-1": (["-m", "hybrid.train", "--distributed-timeout-minutes", "0.2", *TINY, "--train-iters",
                             "4", "--save", "ckpt", "--save-interval", "2"], "crash:point=after_data,rank=1"),
    # rank 1's gradients are NaN from iteration 2: the NaN guard stops every rank (the NaN reaches both through
    # the gradient all-reduce) with exit code 65 -- one of them is the failure, the other stops by itself
    "nan-guard-stop": (["-m", "hybrid.train", "--distributed-timeout-minutes", "0.2", *TINY, "--train-iters", "8",
                        "--max-skipped-steps", "2"], "nan:rank=1,iterations=2-9"),
}


@pytest.fixture(scope="module")
def agent_jobs(tmp_path_factory, signal_jobs) -> dict:
    """name -> (its working directory, subprocess.run's result) of each AGENT_JOBS job: `torchrun
    --nproc-per-node 2 ARGV` run as a pip user would, from a directory that is not the checkout -- the real
    torchrun, its 2 workers forks of hybrid.testing's forkserver (hybrid.testing.agent_run). Run while
    `signal_jobs` wait out their collective timeout (started first: the fixture is asked for here)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str):
        argv, fault = AGENT_JOBS[name]
        cwd = tmp_path_factory.mktemp(name)
        return cwd, testing.agent_run(["--nproc-per-node", "2"], argv, env=_env(HYBRID_FAULT=fault), cwd=str(cwd),
                                      timeout=300)
    with ThreadPoolExecutor(len(AGENT_JOBS)) as pool:
        return dict(zip(AGENT_JOBS, pool.map(one, AGENT_JOBS)))


@pytest.mark.slow
def test_bad_flag_under_torchrun_prints_once_and_is_the_root_cause(agent_jobs):
    """Run as a pip user would: `torchrun -m hybrid.train` from a directory that is not the checkout."""
    cwd, out = agent_jobs["bad-flag"]
    line = "train.py: error: --lr must be a finite number, got inf"
    assert out.returncode != 0
    printed = [ln for ln in out.stderr.splitlines() if ln.startswith("train.py: error:")]
    assert printed == [line], "rank 0 prints the error once; rank 1 is silent"
    root_cause = out.stderr.split("Root Cause")[1]
    assert f"traceback : {line}" in root_cause, "torchrun's summary names the root cause"
    assert "To enable traceback" not in out.stderr
    assert not os.listdir(cwd), "nothing left behind"


@pytest.mark.slow
def test_python_m_hybrid_train_runs_one_process_without_torchrun(tmp_path):
    """`python -m hybrid.train` in a directory outside the checkout (a fork of hybrid.testing's forkserver)."""
    out = testing.run(["-m", "hybrid.train", "--train-iters", "2"] + TINY, cwd=str(tmp_path), env=_env(),
                      timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "on 1 cpu ranks" in out.stdout and "done: final lm loss" in out.stdout


def _launch_two_ranks(tmp_path, fault: str, timeout_min: float) -> list[testing.Forked]:
    """Two ranks of `python -m hybrid.train` with env:// rendezvous (rank 0 hosts the store), as a launcher would;
    each a fork of hybrid.testing's forkserver."""
    port, procs = free_port(), []
    for rank in range(2):
        env = _env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HYBRID_FAULT=fault)
        procs.append(testing.start(["-m", "hybrid.train", "--train-iters", "1000", "--distributed-timeout-minutes",
                                    str(timeout_min)] + TINY, env=env, cwd=str(tmp_path)))
    return procs


TIMEOUT_S, WINDOW_S = 6.0, 3.0  # the collective timeout (--distributed-timeout-minutes 0.1); the post-mortem window


def _watch(jobs: dict, ended: dict, seconds: float = 150) -> None:
    """Note when each job's rank 0 exits (time.time(), as the fault's t=), polling 20 times a second."""
    deadline = time.monotonic() + seconds
    while len(ended) < len(jobs) and time.monotonic() < deadline:
        for sig, procs in jobs.items():
            if sig not in ended and procs[0].poll() is not None:
                ended[sig] = time.time()
        time.sleep(0.05)


def _end(jobs: dict) -> None:
    """Every rank still there (a stopped one continued first) killed and reaped."""
    for procs in jobs.values():
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
            p.wait()


@pytest.fixture(scope="module")
def signal_jobs(tmp_path_factory):
    """Two 2-rank jobs at once (one start-up cost): in each, rank 1 stops (SIGSTOP) or dies (SIGKILL) at iteration
    3; a thread notes when each rank 0 exits. Their wait -- the collective timeout, then the post-mortem -- is wall
    clock with no CPU: it runs while the agent jobs (which ask for this fixture, so it starts first) run."""
    import threading
    jobs = {}
    for sig in ("SIGSTOP", "SIGKILL"):
        cwd = tmp_path_factory.mktemp(sig)
        jobs[sig] = _launch_two_ranks(cwd, f"signal:rank=1,iteration=3,signal={sig}", TIMEOUT_S / 60)
    ended: dict[str, float] = {}
    watcher = threading.Thread(target=_watch, args=(jobs, ended), daemon=True)
    watcher.start()
    try:
        yield jobs, ended, watcher
    finally:
        _end(jobs)


# ends within the timeout + window + 10 s, with no machine to itself: the 6 s collective timeout and the 3 s
# post-mortem window are wall-clock waits, which load does not lengthen (nor the 0.6 s heartbeat the window
# watches: 5x inside it); the CPU between the fault and the exit is milliseconds
@pytest.mark.slow
def test_stalled_and_killed_ranks_end_their_jobs_within_the_timeout_naming_them(signal_jobs):
    """Rank 1 stops (SIGSTOP) or dies (SIGKILL) at iteration 3 (signal_jobs). Rank 0 waits in its next all-reduce:
    for SIGKILL gloo reports the closed connection at once, for SIGSTOP the collective times out after
    --distributed-timeout-minutes (6 s). Then the heartbeat post-mortem (liveness.py: at most max(3 s, 3 beats) =
    3 s) names rank 1. Bound: timeout + window + 10 s of slack for a loaded machine, measured from the moment of
    the fault."""
    jobs, ended, watcher = signal_jobs
    watcher.join()
    _end(jobs)
    for sig, procs in jobs.items():
        out0, out1 = (p.stdout() + p.stderr() for p in procs)
        fault = re.search(rf"inject: {sig} to rank 1 at iteration 3, t=([\d.]+)", out1)
        assert fault, out1[-2000:]
        assert sig in ended and procs[0].returncode != 0, out0[-2000:]
        errors = [ln for ln in out0.splitlines() if "error:" in ln]
        assert len(errors) == 1 and errors[0].startswith("train.py: error: rank 1 of 2 stopped responding"), \
            out0[-2000:]
        assert "Traceback" not in out0
        assert ended[sig] - float(fault.group(1)) < TIMEOUT_S + WINDOW_S + 10.0, sig


def test_an_install_ships_the_training_entry_point():
    """pyproject's package list (include hybrid*, models*) holds hybrid.train and its __main__, so `python -m
    hybrid.train` works from a pip install as it does above from a directory outside the checkout."""
    import tomllib

    from setuptools import find_packages
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(ROOT, include=include)
    assert {"hybrid", "hybrid.train", "hybrid.planner", "hybrid.zero", "models"} <= set(packages)
    assert os.path.isfile(os.path.join(ROOT, "hybrid", "train", "__main__.py"))


@pytest.mark.slow  # the real torchrun (its root-cause summary is the subject): 2 jobs of 2 forked ranks
@pytest.mark.parametrize("job, rank, code, cause", [
    ("exception-on-rank-1", "1", 1, "SimulatedCrash"),
    ("nan-guard-stop", "[01]", 65, "train.py: error: nan-guard: 2 consecutive steps skipped"),
], ids=["exception-on-rank-1", "nan-guard-stop"])
def test_torchrun_names_the_rank_that_failed_and_the_others_exit_by_themselves(agent_jobs, job, rank, code, cause):
    """Real torchrun (2 workers): its summary's root cause is the rank that failed, with its exit code and error;
    the other rank stops by itself (exit 0, one line naming the failed rank), so torchrun sends no SIGTERM and
    lists no other failure (liveness.end_after_failure)."""
    _, out = agent_jobs[job]
    assert out.returncode != 0
    summary = out.stderr.split("Root Cause (first observed failure):")[1]
    assert re.search(rf"rank +: {rank} \(local_rank: {rank}\)\n +exitcode +: {code} ", summary), summary
    assert cause in summary, summary
    assert "closing signal SIGTERM" not in out.stderr and "(SIGTERM)" not in out.stderr, out.stderr[-3000:]
    assert "<NO_OTHER_FAILURES>" in out.stderr, out.stderr[-3000:]
    if code == 1:
        assert "train.py: rank 0: stopped: rank 1 failed first" in out.stderr


def test_a_rendezvous_the_other_ranks_never_join_is_one_line(tmp_path):
    """RANK 0 of a WORLD_SIZE 2 job whose rank 1 never starts: after --distributed-timeout-minutes, one line naming
    the rendezvous, how many joined and the fix -- not torch's DistStoreError traceback."""
    env = _env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    # the wait is the timeout itself (rank 1 never comes), so 1.2 s proves what 3 s did, 1.8 s sooner
    out = testing.run(["-m", "hybrid.train", "--model", "tiny-gpt2", "--train-iters", "2",
                       "--distributed-timeout-minutes", "0.02", "--watchdog-timeout", "1"] + TINY, env=env,
                      cwd=str(tmp_path), timeout=120)  # the watchdog nested below it: no start-up warning
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-3000:]
    assert "the 2 ranks did not all join the rendezvous at 127.0.0.1:" in lines[0], lines[0]
    assert "1/2 clients joined" in lines[0] and "--distributed-timeout-minutes" in lines[0], lines[0]
