"""Suite-wide pytest hooks: running the suite on two pytest-xdist workers (scripts/test.sh passes `-n 2 --dist
loadfile`) without changing what any test sees, the fast tier's marker, and per-file durations recorded each run.

* `--dist loadfile` keeps each file on one worker, so a module-scoped fixture (one spawn shared by a file's
  tests) still runs once, and files that share a working directory in document order (test_docs_commands) keep
  their order.
* Under xdist the files go out longest first (HEAVY, measured wall times on 2 cores): the longest file starts at
  once instead of last, and the short files fill in at the end (longest-processing-time-first scheduling).
  Without xdist the order is pytest's own.
* A test marked `serial` runs alone under xdist: it takes a lock the other worker's tests share, so the other
  worker waits between two tests until it is done (and a serial test waiting for the lock keeps new tests from
  starting, so it is not starved); without xdist every test already runs alone. It costs the other core for the
  test's whole length, so no test takes it now: the timing tests (a verdict within the watchdog timeout, a
  straggler named against its peers, a collective timeout) each derive a bound that holds with another test
  running beside them -- wall-clock waits that load does not lengthen, ranks compared within one run (see
  test_fault_hang's and test_fault_nodes' comments). It stays for a bound that cannot be derived so.
* `slow` marks what the fast tier (`python -m pytest -m "not slow"`, the edit-test loop) leaves out: end-to-end
  launches, the larger multi-rank matrices (a file's fast cases in a launch of their own, the rest in another,
  as test_cp_training, test_zero and test_cp_models do), documented commands, benchmarks, the planner's
  whole-space searches of published models. Each such mark names the faster test that
  keeps its subject in the fast tier. The full suite runs everything.
* Each run records how long each file took (setup + call + teardown of its tests, wall seconds, and the CPU
  seconds of the worker's process tree meanwhile: `_tree_cpu`) in pytest's cache
  (.pytest_cache/v/hybrid/durations: a file's entry is replaced only when all its tests ran, so a -k or -m run
  does not shorten it) and prints the table at the end. The longest-first order uses those records, falling back
  to HEAVY (a clean clone's measurements, tests/durations.json) for files this checkout never ran whole, and to
  the median known file's for a file in neither (a new file: placed mid-way, never left to start last).
* Under xdist the table ends with each worker's share: its files, the seconds of its tests and when its last test
  ended (seconds after the controller's start), and the gap between the two workers' ends -- the time one core
  sat idle at the run's end (loadfile keeps a file on one worker, so a long file late in the order shows here).
  The cache keeps it (`workers`) beside the per-file records.
* After collection, hybrid.testing's forkserver is given one more module to preload,
  hybrid/testing_preload_inductor.py: inductor's per-process start-up (imports, CPU ISA probes, header hash) done
  once there instead of in every rank that compiles (round 24: ~2-2.5 s of CPU a compiling rank).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections import defaultdict

import pytest

# file -> seconds (setup + call + teardown summed per file), from tests/durations.json: a full run's record (see
# the module docstring; written by `python -m pytest --write-durations`). Only the order matters; files missing
# from it (new files) keep pytest's order, after these.
DURATIONS_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
HEAVY: dict[str, float] = json.load(open(DURATIONS_JSON)) if os.path.exists(DURATIONS_JSON) else {}
CACHE_KEY = "hybrid/durations"
_RECORDER: list = []  # this run's _Durations where reports arrive (pytest_runtest_logreport gets no config)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--write-durations", action="store_true",
                     help="after the run, write each file that ran whole into tests/durations.json (HEAVY)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: measures time; under pytest-xdist it runs with no other test "
                                       "alongside (tests/conftest.py)")
    config.addinivalue_line("markers", "slow: left out of the fast tier (`-m \"not slow\"`); the full suite runs it")
    config._hybrid_durations = None
    if _xdist_worker(config):
        config.workeroutput["partial_files"] = []
    else:
        config._hybrid_durations = _Durations(config)
        _RECORDER[:] = [config._hybrid_durations]


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _file(nodeid: str) -> str:
    return os.path.basename(nodeid.split("::")[0])


def _heavy(config: pytest.Config) -> dict[str, float]:
    """file -> seconds for the order: this checkout's records (pytest's cache), else HEAVY."""
    recorded = config.cache.get(CACHE_KEY, {}).get("files", {}) if getattr(config, "cache", None) is not None else {}
    return {**HEAVY, **{f: v["seconds"] for f, v in recorded.items()}}


def _unknown_weight(heavy: dict[str, float]) -> float:
    """The place of a file with no record (new since durations.json was written): the median known file's. At
    weight 0 it went out last, and a new file of minutes (test_compress_reshard: 274 s, loaded) set the run's tail
    alone; at the median it starts while the other worker still has half the files to run."""
    known = sorted(heavy.values())
    return known[len(known) // 2] if known else 0.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _xdist_worker(config):  # stable: a file's tests keep their order
        heavy = _heavy(config)
        unknown = _unknown_weight(heavy)
        items.sort(key=lambda item: -heavy.get(os.path.basename(item.path), unknown))


def pytest_deselected(items: list[pytest.Item]) -> None:
    """A file with a test left out (-k, -m) did not run whole: its duration is not recorded."""
    if not items:
        return
    config = items[0].config
    files = {os.path.basename(item.path) for item in items}
    if _xdist_worker(config):
        config.workeroutput["partial_files"].extend(sorted(files))
    elif config._hybrid_durations is not None:
        config._hybrid_durations.partial |= files


class _Durations:
    """Per-file wall seconds of this run (in the process that sees every report: the only one, or xdist's
    controller), recorded for the files whose every collected test ran."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.done: dict[str, int] = defaultdict(int)
        self.collected: dict[str, int] = defaultdict(int)
        self.partial: set[str] = set()
        self.start = time.monotonic()
        self.workers: dict[str, dict] = defaultdict(lambda: {"files": set(), "seconds": 0.0, "end": 0.0})

    def collection(self, nodeids: list[str]) -> None:
        counts: dict[str, int] = defaultdict(int)
        for nodeid in nodeids:
            counts[_file(nodeid)] += 1
        for f, n in counts.items():  # every xdist worker collects the same tests
            self.collected[f] = max(self.collected[f], n)

    def report(self, report: pytest.TestReport) -> None:
        f = _file(report.nodeid)
        self.seconds[f] += report.duration
        self.cpu[f] += dict(report.user_properties).get("cpu_seconds", 0.0)
        if report.when == "teardown":
            self.done[f] += 1
        gateway = getattr(getattr(report, "node", None), "gateway", None)  # xdist's controller sets report.node
        if gateway is not None:
            w = self.workers[gateway.id]
            w["files"].add(f)
            w["seconds"] += report.duration
            w["end"] = time.monotonic() - self.start

    def complete(self) -> dict[str, float]:
        return {f: round(s, 1) for f, s in self.seconds.items()
                if f not in self.partial and self.collected.get(f) and self.done[f] == self.collected[f]}

    def finish(self, terminal) -> None:
        whole = self.complete()
        if getattr(self.config, "cache", None) is not None and whole:
            record = self.config.cache.get(CACHE_KEY, {"files": {}})
            stamp = time.strftime("%Y-%m-%d %H:%M")
            record["files"].update({f: {"seconds": s, "cpu_seconds": round(self.cpu[f], 1), "tests": self.done[f],
                                        "at": stamp} for f, s in whole.items()})
            if self.workers:
                record["workers"] = {**self.balance(), "at": stamp}
            self.config.cache.set(CACHE_KEY, record)
        if self.config.getoption("write_durations") and whole:
            table = {**HEAVY, **whole}
            with open(DURATIONS_JSON, "w") as out:
                json.dump(dict(sorted(table.items(), key=lambda kv: -kv[1])), out, indent=0)
                out.write("\n")
        if terminal is not None and self.seconds:
            terminal.write_sep("-", "seconds per test file: wall, CPU of the worker's process tree (setup + call + "
                                    "teardown; * = not every test ran)")
            for f, s in sorted(self.seconds.items(), key=lambda kv: -kv[1]):
                terminal.write_line(f"{s:8.1f} {self.cpu[f]:8.1f}  {f}{'' if f in whole else ' *'}")
            terminal.write_line(f"{sum(self.seconds.values()):8.1f} {sum(self.cpu.values()):8.1f}  (all files)")
            for line in balance_lines(self.balance()):
                terminal.write_line(line)

    def balance(self) -> dict[str, dict]:
        """worker -> its files, the seconds of its tests and when its last test ended (after this run's start)."""
        return {w: {"files": len(v["files"]), "seconds": round(v["seconds"], 1), "end": round(v["end"], 1)}
                for w, v in sorted(self.workers.items())}


def balance_lines(workers: dict[str, dict]) -> list[str]:
    """Each worker's share of the run, and how long before the last one the first one finished (its core idle
    meanwhile, as far as this run's tests go)."""
    lines = [f"worker {w}: {v['files']} file{'s' * (v['files'] != 1)}, {v['seconds']:.1f} s of tests, its last ended "
             f"at {v['end']:.1f} s"
             for w, v in workers.items()]
    if len(workers) > 1:
        ends = [v["end"] for v in workers.values()]
        lines.append(f"workers' ends differ by {max(ends) - min(ends):.1f} s (one worker idle that long at the end)")
    return lines


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config._hybrid_durations is not None:
        session.config._hybrid_durations.collection([item.nodeid for item in session.items])
    testing = sys.modules.get("hybrid.testing")  # imported by the collected tests that fork ranks (not the controller)
    if testing is not None and "hybrid.testing_preload_inductor" not in testing.PRELOAD:
        # inductor: once in the forkserver, before hybrid.testing_preload, whose gc.freeze must be the last step
        # (appended after it, inductor's objects stayed in the young generations and every fork's collections
        # walked them: round 24's CI, +5-14 CPU s in files that compile nothing)
        at = testing.PRELOAD.index("hybrid.testing_preload") if "hybrid.testing_preload" in testing.PRELOAD else None
        testing.PRELOAD.insert(len(testing.PRELOAD) if at is None else at, "hybrid.testing_preload_inductor")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    durations = node.config._hybrid_durations
    if durations is not None:
        durations.collection(ids)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    durations = node.config._hybrid_durations
    if durations is not None:
        durations.partial |= set(getattr(node, "workeroutput", {}).get("partial_files", []))


def _tree_cpu() -> float:
    """CPU seconds (user + sys) so far of this process, the children it has reaped (torchrun agents, commands run
    as subprocesses, with what they reaped), and hybrid.testing's forkserver with the ranks it has reaped -- read
    from /proc, as the forkserver is reaped only at the session's end (hybrid.testing.stop_forkserver). A rank
    counts once reaped: at most a test late."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    forkserver = sys.modules.get("multiprocessing.forkserver")
    pid = forkserver._forkserver._forkserver_pid if forkserver is not None else None
    if pid:
        try:
            with open(f"/proc/{pid}/stat") as f:
                utime_stime_cutime_cstime = f.read().rsplit(")", 1)[1].split()[11:15]  # fields 14-17 of proc(5)
            total += sum(int(x) for x in utime_stime_cutime_cstime) / os.sysconf("SC_CLK_TCK")
        except OSError:  # it has exited
            pass
    return total


_CPU_MARK: list[float] = []  # _tree_cpu() at the end of the last phase (setup, call, teardown) of this process


def pytest_runtest_logstart(nodeid: str, location) -> None:
    _CPU_MARK[:] = [_tree_cpu()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Each phase's report carries the CPU seconds of the process tree since the last (user_properties travel
    from an xdist worker to the controller with the report)."""
    outcome = yield
    now = _tree_cpu()
    outcome.get_result().user_properties.append(("cpu_seconds", now - (_CPU_MARK[0] if _CPU_MARK else now)))
    _CPU_MARK[:] = [now]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _RECORDER:
        _RECORDER[0].report(report)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The forkserver stopped and waited for, so `time` counts the forked ranks' CPU (hybrid.testing.stop_forkserver);
    in each xdist worker too (the controller waits for its workers)."""
    testing = sys.modules.get("hybrid.testing")  # not imported: no forkserver of its own (nor torch to import)
    if testing is not None:
        testing.stop_forkserver()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if config._hybrid_durations is not None:
        config._hybrid_durations.finish(terminalreporter)


# --- the bad-input harness (hybrid/testing_inputs.py) ---------------------------------------------------------
@pytest.fixture
def one_line(capsys):
    """`one_line(call)`: `call()` must exit non-zero with one line and no process group; returns the line
    (`one_line.out`: what it printed to stdout). hybrid.testing_inputs.OneLine says what is checked."""
    from hybrid.testing_inputs import OneLine
    return OneLine(capsys)


@pytest.fixture
def one_process(monkeypatch) -> None:
    """A command run as `python`, not under torchrun: no launcher variable (WORLD_SIZE, RANK, ...), world 1."""
    from hybrid.testing_inputs import python_environment
    python_environment(monkeypatch)


class _RunAloneLock:
    """A readers-writer lock over two files shared by the workers (flock): every test holds `room` shared, a
    serial test holds it exclusive. `turn` is the turnstile: a waiting serial test holds it, so no test starts
    until the serial one has run."""

    def __init__(self, directory: str) -> None:
        self.turn = open(os.path.join(directory, "hybrid-run-alone.turn"), "a")
        self.room = open(os.path.join(directory, "hybrid-run-alone.room"), "a")

    def acquire(self, alone: bool) -> None:
        fcntl.flock(self.turn, fcntl.LOCK_EX)
        fcntl.flock(self.room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(self.turn, fcntl.LOCK_UN)

    def release(self, alone: bool) -> None:
        fcntl.flock(self.room, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(self.turn, fcntl.LOCK_UN)


_LOCK: list[_RunAloneLock] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """Setup (module fixtures included), call and teardown of one test, under the lock when under xdist."""
    if not _xdist_worker(item.config):
        yield
        return
    if not _LOCK:  # the workers' basetemps are <run's basetemp>/gw0, gw1: their parent is this run's, shared
        _LOCK.append(_RunAloneLock(os.path.dirname(str(item.config.option.basetemp))))
    alone = item.get_closest_marker("serial") is not None
    _LOCK[0].acquire(alone)
    try:
        yield
    finally:
        _LOCK[0].release(alone)
