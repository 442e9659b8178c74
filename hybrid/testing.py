"""Run a function on N ranks in fresh processes: the multi-rank test harness (CPU + gloo by default).

    results = run_distributed(fn, world_size=4, args=(cfg,), timeout=120)

`fn(rank, world_size, *args)` runs in each spawned process after `init_process_group` on a free
local port, with one intra-op thread per rank (so 8 ranks share 2 cores without oversubscription).
Its return values come back as a list indexed by rank. A rank that raises fails the whole call with
that rank's traceback in the message; a hang fails after `timeout` seconds and every rank is killed.
`fn` must be importable by name (a module-level function). Several checks of one layout share a launch (its fork,
process-group set-up and imports) through `each_case`, each check's test reading its own result with `case_result`:

    def _all(rank, world):
        return each_case(_one, CASES, world)          # {case: _one(world, *case)}, a failure kept as CaseError
    results = run_distributed(_all, 8)                # in a module-scoped fixture
    per_rank = case_result(results, case)             # in the test of `case`: raises with the failing rank's traceback

Ranks start from a forkserver that has imported torch, hybrid and models once (PRELOAD): each rank is a fork of
that clean process -- no test state, no process group, no thread pool started -- so it skips the ~3 s of CPU each
import costs under spawn (8 ranks on 2 cores: ~12 s of wall time a launch). Each rank then takes the caller's
current environment (the forkserver's is the one of its first use), working directory and sys.path, as under
spawn. `start_method="spawn"` gives fully fresh interpreters.

End-to-end runs of the training entry point go the same way, as the command line would run them:

    runs = launch(["--tensor-model-parallel-size", "2", ...], world=4, env={"HYBRID_FAULT": "..."})
    out = torchrun(["--tensor-model-parallel-size", "2", ...], nproc=4, cwd=tmp_path)   # .returncode, .stdout

`launch` forks `world` ranks that each run `python -m hybrid.train ARGV` -- torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT, OMP_NUM_THREADS=1), stdout and stderr to files, the
exit status a shell would see -- and gives each rank's status, output and exit time (`launch_together`: several
such jobs at once, their waits overlapping); `torchrun` joins them as torchrun's own output would, tearing the job
down when a rank fails. A test whose subject is torchrun itself
(restarts, elastic membership, its error files and failure summary) runs the real one -- with its workers forked
too, where the workers' own process tree is not the subject:

    out = agent_run(["--nproc-per-node", "2", "--max-restarts", "1"], ["-m", "hybrid.train", ...], env=...)

(`fork_service` and `worker_command` for a torchrun started by hand; hybrid/testing_worker.py says how a fork
stands for its worker.)
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import pickle
import queue as queue_module
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


# imported once by the forkserver, inherited by every rank it forks; importing them starts no thread pool.
# torch._dynamo: torch imports it at the first optimizer's construction (add_param_group is wrapped by
# torch._disable_dynamo), ~1.3 s of CPU in every rank that builds one. Neither transformers nor
# torch.distributed.checkpoint (hybrid.checkpoint.core; ~0.05 s once dynamo is in): a preset run's ranks show
# they do not import them (tests/test_presets.py). hybrid.testing_preload: DeepSpeed's CPU Adam loaded once, when
# already built (~1.2 s of CPU in every rank that offloads with `--cpu-adam auto`, ~0.3 s each later construction).
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "hybrid.testing", "hybrid.mesh", "hybrid.comm", "hybrid.tp",
           "hybrid.data", "hybrid.train_step", "hybrid.zero", "hybrid.pipeline.executor", "models", "models.gpt2",
           "models.llama", "hybrid.train.main", "hybrid.testing_preload"]  # models' package imports its models lazily


class DistributedFailure(RuntimeError):
    """One or more ranks raised or timed out."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forkserver():
    """The forkserver context, its forkserver started with PRELOAD at the first call -- or, in a process that a
    forkserver forked, that same forkserver.

    A command run as a fork (`run`, `start`, `torchrun`) that launches ranks of its own -- `hybrid calibrate`, a
    benchmark script's run_distributed -- would otherwise start a second forkserver and import PRELOAD again (~5 s
    of CPU). A fork already holds all it needs: multiprocessing's forkserver sets its address in the forkserver
    process (so every fork inherits it) and hands each fork the `alive` fd and the resource tracker's. Only its
    ensure_running would start a new one, as the fork has no forkserver pid (the forkserver is not its child, and
    its owner stops it): here it only checks the resource tracker, as connect_to_new_process needs."""
    from multiprocessing import forkserver, resource_tracker
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the forkserver starts
    fs = forkserver._forkserver
    if fs._forkserver_pid is None and fs._forkserver_address is not None and fs._forkserver_alive_fd is not None:
        fs.ensure_running = resource_tracker.ensure_running  # a fork of the forkserver at _forkserver_address
    return ctx


# --- no fork outlives the process that asked for it ---------------------------------------------------------------
# A fork's parent in the kernel is the forkserver, not the process that asked for it (a pytest worker, a command run
# as a fork that launches ranks of its own, fork_service's thread for a torchrun worker), and the forkserver lives as
# long as any fork holds its `alive` pipe: a crashed pytest worker left the forkserver and two gloo ranks polling for
# 40 minutes (round 23's CI). prctl(PR_SET_PDEATHSIG) cannot tie a fork to its asker -- it fires on the death of the
# kernel parent's forking thread -- so each fork watches the asker instead: multiprocessing hands every child the
# read end of a pipe whose write end only the asker holds (`parent_process().sentinel`, for the forkserver, spawn and
# fork start methods alike; under fork, siblings forked later hold copies too), and a read there returns EOF once the
# asker has exited or been killed, whichever of its threads asked (the asker keeps that end open while the child
# runs: multiprocessing holds every running child's Process object). No poll interval and no race: a fork whose
# asker died before the watch began reads EOF at once. The forkserver then exits on its own: its `alive` pipe
# reaches EOF once the asker and every fork have closed it. A new interpreter this module starts and waits for
# (torchrun_cli's real torchrun) is a kernel child of the waiting thread, which lives until the child ends: there
# PR_SET_PDEATHSIG is the tie (`_die_with_parent`).
def _die_with_requester() -> None:
    """SIGKILL this process when the process that asked for it ends (a daemon thread blocked in one read)."""
    import multiprocessing
    parent = multiprocessing.parent_process()
    if parent is not None and parent.sentinel is not None:
        threading.Thread(target=_kill_self_at_eof, args=(parent.sentinel,), name="hybrid-requester-watch",
                         daemon=True).start()


def _kill_self_at_eof(fd: int) -> None:
    try:
        while os.read(fd, 512):  # nothing is written there: only EOF ends the read
            pass
    except OSError:  # the fd was closed under the watch: stop watching rather than guess
        return
    os.kill(os.getpid(), signal.SIGKILL)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(sig: int) -> Callable[[], None] | None:
    """A subprocess preexec_fn that has the kernel send the child `sig` when this process's calling thread ends
    (prctl(PR_SET_PDEATHSIG), through ctypes; Linux only, None elsewhere). Only for a child that thread waits for
    (subprocess.run): the signal follows the thread, not the process. A parent gone before the prctl (the child
    then has another parent) is answered at once."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)
    return preexec


def _run_child(argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run of a new interpreter that ends with this process: SIGTERM when it dies, which a torchrun
    agent answers by stopping its workers (SIGTERM to each worker's process group, SIGKILL 30 s later) and exiting."""
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=_die_with_parent(signal.SIGTERM))


def _worker(fn: Callable, rank: int, world: int, port: int, backend: str, args: tuple, queue,
            environ: dict[str, str]) -> None:
    _die_with_requester()
    os.environ.clear()  # the caller's environment at the call, not the forkserver's
    os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world)
        # plain pickle: tensors travel as bytes, not as shared memory that dies with this process
        queue.put((rank, True, pickle.dumps(fn(rank, world, *args))))
    except BaseException:  # report every failure, including assertion errors in the test body
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


PORT_TRIES = 3  # launches of one job when rank 0's store finds its port taken (EADDRINUSE)


def run_distributed(fn: Callable, world_size: int, args: tuple = (), timeout: float = 180.0,
                    backend: str = "gloo", start_method: str = "forkserver") -> list[Any]:
    """Run `fn(rank, world_size, *args)` on `world_size` new ranks; return per-rank results.

    free_port() picks a port the kernel had free, then closes it: between that and rank 0's TCPStore binding it,
    another process (a connection's ephemeral source port, a concurrent test's store) may take it. Rank 0 then
    fails inside init_process_group with EADDRINUSE, before `fn` ran, so the job is launched again on a new port
    (as torch's own tests retry on connect failures); any other failure is the test's."""
    for attempt in range(PORT_TRIES):
        try:
            return _run_once(fn, world_size, args, timeout, backend, start_method)
        except _PortTaken:
            if attempt == PORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


class _PortTaken(DistributedFailure):
    """Rank 0's store could not bind the job's port: nothing of `fn` ran."""


def _port_taken(error: str) -> bool:
    return "EADDRINUSE" in error and "init_process_group" in error


def _run_once(fn: Callable, world_size: int, args: tuple, timeout: float, backend: str,
              start_method: str) -> list[Any]:
    ctx = _forkserver() if start_method == "forkserver" else mp.get_context(start_method)
    queue = ctx.Queue()
    port = free_port()
    environ = dict(os.environ)
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, port, backend, args, queue, environ), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        deadline = time.monotonic() + timeout  # for the whole job, process start-up included
        for _ in range(world_size):
            try:
                rank, ok, value = queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue_module.Empty:  # someone hangs
                break
            if ok:
                results[rank] = pickle.loads(value)
            else:
                errors[rank] = value
            if errors:  # one failure usually leaves the others blocked in a collective
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors and len(results) == world_size else 0.1)
            if p.is_alive():
                p.kill()
    if errors:
        first = min(errors)
        kind = _PortTaken if _port_taken(errors[first]) else DistributedFailure
        raise kind(f"rank {first} of {world_size} failed:\n{errors[first]}")
    if len(results) < world_size:
        missing = sorted(set(range(world_size)) - set(results))
        raise DistributedFailure(f"ranks {missing} of {world_size} did not finish within {timeout:.0f}s")
    return [results[r] for r in range(world_size)]


def stop_forkserver(wait: float = 10.0) -> None:
    """Stop this process's forkserver, if it started one, and wait for it. It reaps the ranks it forked, so once
    waited for, their CPU time counts in this process's children (`time`, getrusage(RUSAGE_CHILDREN)): without this
    the forkserver outlives the process, orphaned, and `time pytest ...` misses every forked rank's CPU (measured:
    3.7 of 8.7 s for tests/test_harness_cases.py). Called at the end of a pytest session (tests/conftest.py).

    The forkserver exits once every holder of its `alive` fd has closed it -- this process and every fork still
    running -- so the wait is bounded: a fork a test left running (stopped, say) leaves the forkserver to exit after
    it, as before, rather than hang the session's end."""
    from multiprocessing import forkserver, util
    fs = forkserver._forkserver
    if fs._forkserver_pid is None:
        return
    os.close(fs._forkserver_alive_fd)  # its EOF asks the forkserver to stop
    deadline = time.monotonic() + wait
    with contextlib.suppress(ChildProcessError):
        while not os.waitpid(fs._forkserver_pid, os.WNOHANG)[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    if not util.is_abstract_socket_namespace(fs._forkserver_address):
        with contextlib.suppress(OSError):
            os.unlink(fs._forkserver_address)
    fs._forkserver_alive_fd = fs._forkserver_pid = fs._forkserver_address = None  # the next launch starts one


# --- several checks in one launch ---------------------------------------------------------------------------
@dataclass
class CaseError:
    """A case of a folded launch (`each_case`) that raised on this rank: its traceback."""

    traceback: str


def each_case(fn: Callable, keys, *args) -> dict:
    """{key: fn(*args, *key)} for each key (a tuple), run in order inside one launch: the checks of one layout
    share its fork, process-group set-up and imports. A case that raises gives its CaseError instead of ending
    the launch, so the other cases still report and the failure is the failing case's test's own
    (`case_result`). A rank that raised between two collectives can leave its peers waiting: run_distributed's
    timeout then fails every case of the launch, naming the rank."""
    out = {}
    for key in keys:
        try:
            out[key] = fn(*args, *key)
        except Exception:  # the case's failure, reported by its own test
            out[key] = CaseError(traceback.format_exc())
    return out


def case_result(per_rank: list[dict], key) -> list:
    """The per-rank results of one case of an `each_case` launch; a rank's CaseError fails the calling test with
    that rank's traceback."""
    for rank, results in enumerate(per_rank):
        if isinstance(results[key], CaseError):
            raise DistributedFailure(f"case {key}: rank {rank} of {len(per_rank)} failed:\n{results[key].traceback}")
    return [results[key] for results in per_rank]


# --- end-to-end runs of the training entry point ---------------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class RankRun:
    """One rank of a `launch`: its exit status (None: still running at the deadline, then SIGKILLed; -N: killed
    by signal N, as subprocess reports it), its output, and when it was seen to exit and to inject a fault."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    exited: float | None  # time.monotonic() when it was seen to exit (None: killed at the deadline)
    injected: float | None  # when its stdout first showed "inject:" (None: it injected nothing)


def train_main(argv: list[str]) -> None:
    """The rank body of `launch`: `python -m hybrid.train ARGV` (the code of scripts/train.py ARGV). Run by name,
    as the interpreter would: this module sits below the entry points and imports none (tests/test_import_graph.py)."""
    python_main(["-m", "hybrid.train", *argv])


def python_main(argv: list[str]) -> None:
    """`python -m MODULE ARGS`, `python -c CODE ARGS` or `python SCRIPT ARGS` (argv without the `python`), run as
    the interpreter runs them: as __main__, with sys.argv[0] the file ("-c" for code) and the script's folder (the
    working directory for code) first on sys.path."""
    import runpy
    if argv[:1] == ["-c"]:
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        main = type(sys)("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]  # runpy puts the module's file in argv[0]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


def _exit_status(e: SystemExit) -> int:
    """The status the interpreter gives an uncaught SystemExit (a message: printed to stderr, status 1)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def _rank(entry: Callable, argv: list[str], environ: dict[str, str], cwd: str, out: str, err: str) -> None:
    """A forked rank: the caller's environment and directory, stdout and stderr at fd level to the files, `entry`
    run as a script's main, then the interpreter's own shutdown (non-daemon threads joined, atexit handlers, streams
    flushed) and the exit status a shell would see."""
    fds = []
    for path in (out, err):
        fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
    _run_as_main(entry, argv, environ, cwd, {1: fds[0], 2: fds[1]})


def _run_as_main(entry: Callable, argv: list[str], environ: dict[str, str], cwd: str, fds: dict[int, int],
                 unbuffered: bool = False) -> None:
    """`_rank`'s body, the rank's streams on `fds` ({1: fd, 2: fd}, each moved there); `unbuffered`: as
    `python -u`."""
    _die_with_requester()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    if environ.get("OMP_NUM_THREADS", "").isdigit():  # what a new interpreter's torch would take from it
        torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, f in fds.items():
        if f != fd:
            os.dup2(f, fd)
            os.close(f)
    # the streams a new interpreter opens on a file: stdout block-buffered (write-through under PYTHONUNBUFFERED,
    # as `python -u`), stderr line-buffered
    if unbuffered or environ.get("PYTHONUNBUFFERED"):
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    else:
        sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    try:
        entry(argv)
        status = 0
    except SystemExit as e:
        status = _exit_status(e)
    except BaseException:  # an uncaught exception: the traceback on stderr, status 1
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # as the interpreter's exit: wait for non-daemon threads, then atexit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class Forked:
    """One process forked from the forkserver, running `entry(argv)` as `_rank` describes, behind a handle like
    subprocess.Popen's: pid, poll(), wait(), send_signal(), terminate(), kill(), and its output so far."""

    def __init__(self, argv: list[str], environ: dict[str, str], cwd: str | None = None,
                 entry: Callable = python_main, name: str = "proc") -> None:
        ctx = _forkserver()
        self.folder = tempfile.mkdtemp(prefix="hybrid-forked-")
        self.out, self.err = os.path.join(self.folder, f"{name}.out"), os.path.join(self.folder, f"{name}.err")
        open(self.out, "w").close()
        # not a daemon: a command may start processes of its own (calibrate's ranks); its owner reaps it
        self._proc = ctx.Process(target=_rank, args=(entry, list(argv), environ, cwd or ROOT, self.out, self.err))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs; -N when signal N ended it (as subprocess reports it)."""
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout)
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def stdout(self) -> str:
        return _read(self.out)

    def stderr(self) -> str:
        return _read(self.err)


def environment(env: dict[str, str | None] | None = None) -> dict[str, str]:
    """This process's environment with PYTHONPATH at this checkout and `env` applied (a None value unsets)."""
    e = dict(os.environ, PYTHONPATH=ROOT)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return e


def start(argv: list[str], env: dict[str, str | None] | None = None, cwd: str | None = None,
          entry: Callable = python_main) -> Forked:
    """`python ARGV` (a script, or -m and a module) started as a fork, not waited for: subprocess.Popen's use."""
    return Forked(argv, environment(env), cwd, entry)


def launch(argv: list[str], world: int, env: dict[str, str | None] | None = None, timeout: float = 120.0,
           kill_stopped: bool = True, teardown_after: float | None = None, cwd: str | None = None,
           entry: Callable = train_main, term_grace: float = 5.0, launcher_env: bool = True) -> list[RankRun]:
    """Run `entry(argv)` (default: `python -m hybrid.train ARGV`) on `world` forked ranks with the env://
    variables torchrun sets (`launcher_env=False`: none, as a command run without torchrun), to completion or
    `timeout` (then SIGKILL); poll 10 times a second. `env` is applied to this process's environment (a None
    value unsets), then the launcher's variables.

    `teardown_after`: this many seconds after the first rank exits non-zero, stop the rest as torchrun does
    (SIGTERM, SIGKILL after `term_grace` s); None waits for every rank. `kill_stopped`: end the wait once every
    rank left is SIGSTOPped after an injected fault. `entry` must be importable by name (a module-level function).
    """
    (runs,) = launch_together([dict(argv=argv, world=world, env=env, timeout=timeout, kill_stopped=kill_stopped,
                                    teardown_after=teardown_after, cwd=cwd, entry=entry, term_grace=term_grace,
                                    launcher_env=launcher_env)])
    return runs


def launch_together(jobs: list[dict]) -> list[list[RankRun]]:
    """Several `launch`es at once (each dict: `launch`'s keyword arguments), watched by one poll loop: their
    start-up and their waits (a watchdog timeout, a collective timeout) overlap instead of adding up. Each job
    has its own port, deadline and exit times, as if launched alone."""
    running = [_Job(**job) for job in jobs]
    while not all(job.done for job in running):
        for job in running:
            job.poll()
        time.sleep(0.1)
    return [job.finish() for job in running]


class _Job:
    """One `launch`'s ranks and what its poll loop has seen: exit and first "inject:" times per rank."""

    def __init__(self, argv: list[str], world: int, env: dict[str, str | None] | None = None,
                 timeout: float = 120.0, kill_stopped: bool = True, teardown_after: float | None = None,
                 cwd: str | None = None, entry: Callable = train_main, term_grace: float = 5.0,
                 launcher_env: bool = True) -> None:
        port = free_port()
        self.world, self.kill_stopped, self.teardown_after, self.term_grace = world, kill_stopped, teardown_after, \
            term_grace
        self.procs = []
        for r in range(world):
            rank_env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world),
                            LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", OMP_NUM_THREADS="1")
            self.procs.append(Forked(argv, environment({**(env or {}), **(rank_env if launcher_env else {})}), cwd,
                                     entry, name=str(r)))
        self.exited: dict[int, float] = {}
        self.injected: dict[int, float] = {}
        self.deadline = time.monotonic() + timeout
        self.teardown: float | None = None
        self.done = False

    def poll(self) -> None:
        """One look at the ranks (the body of launch's loop); sets `done` when the wait is over."""
        if self.done:
            return
        if len(self.exited) == self.world or time.monotonic() >= self.deadline:
            self.done = True
            return
        for r, p in enumerate(self.procs):
            if r not in self.exited and p.poll() is not None:
                self.exited[r] = time.monotonic()
                if p.returncode != 0 and self.teardown_after is not None and self.teardown is None:
                    self.teardown = self.exited[r] + self.teardown_after
            if r not in self.injected and "inject:" in p.stdout():
                self.injected[r] = time.monotonic()
        if self.teardown is not None and time.monotonic() >= self.teardown:
            _stop(self.procs, self.term_grace)
            return
        if self.kill_stopped and self.injected and all(r in self.exited or _stopped(self.procs[r].pid)
                                                       for r in range(self.world)):
            self.done = True  # only SIGSTOPped ranks are left

    def finish(self) -> list[RankRun]:
        for p in self.procs:
            p.kill()
            p.wait()
        runs = [RankRun(r, p.returncode if r in self.exited else None, p.stdout(), p.stderr(), self.exited.get(r),
                        self.injected.get(r)) for r, p in enumerate(self.procs)]
        for p in self.procs:
            shutil.rmtree(p.folder, ignore_errors=True)
        return runs


def torchrun(argv: list[str], nproc: int, env: dict[str, str | None] | None = None, cwd: str | None = None,
             timeout: float = 600.0, entry: Callable = train_main) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node NPROC scripts/train.py ARGV` as forked ranks (`launch`): the ranks' stdout and
    stderr joined in rank order, status 0 when every rank exits 0, else 1 (torchrun's on a failed worker), the
    others stopped as torchrun stops them. A rank still running at `timeout` fails the call, as
    subprocess.run's timeout would (subprocess.TimeoutExpired)."""
    runs = launch(argv, nproc, env=env, timeout=timeout, kill_stopped=False, teardown_after=0.0, cwd=cwd,
                  entry=entry)
    stdout, stderr = "".join(r.stdout for r in runs), "".join(r.stderr for r in runs)
    if any(r.exited is None for r in runs):
        raise subprocess.TimeoutExpired(["torchrun", *argv], timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(["torchrun", "--nproc-per-node", str(nproc), *argv],
                                       0 if all(r.returncode == 0 for r in runs) else 1, stdout, stderr)


def torchrun_cli(args: list[str], env: dict[str, str | None] | None = None, cwd: str | None = None,
                 timeout: float = 600.0) -> subprocess.CompletedProcess:
    """`torchrun ARGS` as a user writes it, its arguments parsed by torch's own parser: a single-node job without
    restarts runs as forked ranks (`torchrun`, the script or module as __main__), anything else under the real
    torchrun (python -m torch.distributed.run)."""
    from torch.distributed.run import get_args_parser
    ta = get_args_parser().parse_args(args)
    if ta.nnodes in ("1", "1:1") and not ta.max_restarts and not ta.no_python and str(ta.nproc_per_node).isdigit():
        target = (["-m"] if ta.module else []) + [ta.training_script, *ta.training_script_args]
        return torchrun(target, int(ta.nproc_per_node), env=env, cwd=cwd, timeout=timeout, entry=python_main)
    return _run_child([sys.executable, "-m", "torch.distributed.run", *args], cwd or ROOT, environment(env), timeout)


def run(argv: list[str], env: dict[str, str | None] | None = None, cwd: str | None = None, timeout: float = 600.0,
        entry: Callable = python_main) -> subprocess.CompletedProcess:
    """`python ARGV` (a script, or -m and a module; no launcher) as one fork: subprocess.run's result (status,
    stdout, stderr) without a new interpreter's start-up."""
    (r,) = launch(argv, 1, env=env, timeout=timeout, kill_stopped=False, cwd=cwd, entry=entry, launcher_env=False)
    if r.exited is None:
        raise subprocess.TimeoutExpired(["python", *argv], timeout, output=r.stdout, stderr=r.stderr)
    return subprocess.CompletedProcess(["python", *argv], r.returncode, r.stdout, r.stderr)


# --- the real torchrun, its workers forked --------------------------------------------------------------------
WORKER = os.path.join(ROOT, "hybrid", "testing_worker.py")


def worker_command(argv: list[str]) -> list[str]:
    """What follows torchrun's own flags for a job whose workers are forks (`fork_service`): `--no-python`, then
    hybrid/testing_worker.py standing for `python -u ARGV`."""
    return ["--no-python", sys.executable, "-S", WORKER, *argv]


@contextlib.contextmanager
def fork_service():
    """While open, torchrun workers started as `worker_command(ARGV)` run ARGV as forks of this process's
    forkserver (hybrid/testing_worker.py says how each stands for its rank in torchrun's process tree). Yields the
    environment to give torchrun ({"HYBRID_FORK_SERVICE": its socket}). For a test whose subject is the real
    torchrun agent -- restarts, its failure summary and error files, elastic rendezvous -- but not the workers'
    interpreter start-up: each worker skips the ~3 s of CPU of importing torch and hybrid."""
    folder = tempfile.mkdtemp(prefix="hybrid-forks-")
    path = os.path.join(folder, "socket")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    threads: list[threading.Thread] = []
    ranks: list = []  # every rank forked, so that none outlives the service

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the service ends
                return
            t = threading.Thread(target=_serve_worker, args=(conn, ranks), daemon=True)
            t.start()
            threads.append(t)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield {"HYBRID_FORK_SERVICE": path}
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        acceptor.join(5)
        for proc in list(ranks):  # a rank still running (its test failed): SIGKILLed, its worker then ends too
            if proc.exitcode is None:
                proc.kill()
        for t in threads:
            t.join(10)
        shutil.rmtree(folder, ignore_errors=True)


def agent_run(torchrun_args: list[str], argv: list[str], env: dict[str, str | None] | None = None,
              cwd: str | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """`torchrun TORCHRUN_ARGS ARGV` (ARGV: a script or -m and a module, with its arguments) under the real
    torchrun agent -- its restarts, rendezvous, teardown, error files and failure summary -- each worker a fork of
    the forkserver (`fork_service`): subprocess.run's result. The agent is a fork too (`run`: torchrun's own code
    as __main__), without a new interpreter's ~2 s of CPU importing torch.distributed.run."""
    with fork_service() as service:
        return run(["-m", "torch.distributed.run", *torchrun_args, *worker_command(argv)],
                   env={**(env or {}), **service}, cwd=cwd or ROOT, timeout=timeout)


class _Fd:
    """A file descriptor handed to a forked process: the forkserver passes it (SCM_RIGHTS) with the fork request."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction
        return _inherited, (reduction.DupFd(self.fd),)  # DupFd at pickling time, inside the fork request


def _inherited(dup) -> int:
    return dup.detach()


def _worker_rank(argv: list[str], environ: dict[str, str], cwd: str, stdin: int, stdout: int, stderr: int) -> None:
    """A torchrun worker's rank (`fork_service`): `python -u ARGV` on the worker's streams and environment."""
    os.dup2(stdin, 0)
    if stdin != 0:
        os.close(stdin)
    _run_as_main(python_main, argv, environ, cwd, {1: stdout, 2: stderr}, unbuffered=True)


def _serve_worker(conn: socket.socket, ranks: list) -> None:
    """One hybrid/testing_worker.py: fork its rank, send the pid, then the rank's exit status -- or SIGKILL the
    rank when the worker's connection closes first (the worker was killed)."""
    from multiprocessing.connection import wait
    with conn:
        head, fds, _, _ = socket.recv_fds(conn, 8, 3)
        try:
            (size,), data = struct.unpack("!Q", head), b""
            while len(data) < size:
                chunk = conn.recv(size - len(data))
                if not chunk:
                    return
                data += chunk
            req = json.loads(data)
            proc = _forkserver().Process(target=_worker_rank, args=(req["argv"], req["env"], req["cwd"],
                                                                   *(_Fd(f) for f in fds)))
            proc.start()
            ranks.append(proc)
        finally:
            for f in fds:
                os.close(f)
        conn.sendall(f"{proc.pid}\n".encode())
        while proc.sentinel not in wait([proc.sentinel, conn]):
            if not conn.recv(64):  # EOF: the worker is gone; its rank goes with it, as under killpg
                proc.kill()
                proc.join()
                return
        proc.join()
        with contextlib.suppress(OSError):
            conn.sendall(f"{proc.exitcode}\n".encode())


def _stop(procs: list[Forked], grace: float) -> None:
    """torchrun's teardown of a failed job: SIGTERM to the workers still running, SIGKILL after `grace` s."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    end = time.monotonic() + grace
    for p in live:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False
