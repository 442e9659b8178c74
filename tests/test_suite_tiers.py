"""The fast tier (`bash scripts/test.sh --fast`, `-m "not slow"`) stays fast: a test that starts a new interpreter
(subprocess: torchrun, `python -c`, a shell) is marked `slow`, or runs its processes as forks of hybrid.testing's
forkserver (`testing.run` / `torchrun` / `launch` / `start`, no interpreter start-up), or is named below with the
reason a fresh interpreter is its subject. Read statically: each test function, the module's helpers and fixtures
it calls or takes, transitively."""

from __future__ import annotations

import ast
import glob
import os

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
SPAWN = ("subprocess.run(", "subprocess.Popen(", "subprocess.check_output(", "subprocess.check_call(",
         "subprocess.call(", "os.system(", "os.exec", "multiprocessing.")
# (file, test): why a new interpreter is the point, and why it is cheap enough for the fast tier
FRESH = {
    ("test_presets.py", "test_importing_the_training_entry_point_and_a_one_process_run_import_neither"):
        "what a new interpreter imports is the subject (a fork inherits the forkserver's modules); one step",
    ("test_data_metrics.py", "test_peak_rss_counts_an_allocation_the_process_touches_and_not_its_parents"):
        "a child's peak RSS is the subject (a fork shares its parent's pages); a `python -c` of a few lines",
    ("test_trust.py", "test_a_first_cpu_adam_build_prints_progress_and_a_killed_builds_lock_is_named"):
        "a build killed mid-way leaves its lock: the killed process is the subject; a `python -c`, no torch run",
    ("test_trust.py", "test_a_build_in_progress_is_waited_for_not_called_stale"):
        "a live process holding the lock is the subject; a `python -c`, no torch run",
    ("test_startup18_torch_free.py", "test_hybrid_plan_runs_a_search_without_importing_torch"):
        "what a new interpreter imports is the subject (a fork inherits torch); a plan search, ~2 s, no torch",
    ("test_startup18_torch_free.py", "test_the_planner_and_its_profile_loader_import_no_torch"):
        "what a new interpreter imports is the subject (a fork inherits torch); imports only, no torch",
    ("test_mutation19_catches.py", "test_the_packages_torch_free_names_load_no_torch"):
        "what a new interpreter imports is the subject (a fork inherits torch); two imports, ~0.1 s, no torch",
}


def _marked_slow(decorators: list[ast.expr]) -> bool:
    return any("slow" in ast.unparse(d) for d in decorators)


def unmarked_spawners(source: str) -> list[str]:
    """Names of the test functions in `source` that start a new interpreter and are not marked slow."""
    tree = ast.parse(source)
    if any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
           and "slow" in ast.unparse(n.value) for n in tree.body):
        return []
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    body = {name: ast.get_source_segment(source, n) or "" for name, n in funcs.items()}
    spawns = {name for name in funcs if any(p in body[name] for p in SPAWN)}
    grew = True
    while grew:  # a helper's or fixture's caller, or a test taking the fixture, spawns too
        grew = False
        for name, n in funcs.items():
            if name not in spawns and (any(f"{h}(" in body[name] for h in spawns)
                                       or any(a.arg in spawns for a in n.args.args)):
                spawns.add(name)
                grew = True
    return sorted(name for name in spawns if name.startswith("test_") and not _marked_slow(funcs[name].decorator_list))


def test_every_test_that_starts_an_interpreter_is_slow_forked_or_named():
    found = []
    for path in sorted(glob.glob(os.path.join(TESTS, "test_*.py"))):
        f = os.path.basename(path)
        found += [(f, name) for name in unmarked_spawners(open(path).read()) if (f, name) not in FRESH]
    assert not found, f"mark these @pytest.mark.slow, or run them through hybrid.testing: {found}"


def test_every_named_exception_still_exists():
    for f, name in FRESH:
        assert f"def {name}(" in open(os.path.join(TESTS, f)).read(), (f, name)


@pytest.mark.parametrize("source, found", [
    ("import subprocess\ndef test_a():\n    subprocess.run(['x'])", ["test_a"]),
    ("import subprocess\ndef _go():\n    return subprocess.run(['x'])\ndef test_a():\n    _go()", ["test_a"]),
    ("import pytest, subprocess\n@pytest.fixture\ndef runs():\n    subprocess.run(['x'])\ndef test_a(runs):\n    pass",
     ["test_a"]),
    ("import pytest, subprocess\n@pytest.mark.slow\ndef test_a():\n    subprocess.run(['x'])", []),
    ("import pytest, subprocess\npytestmark = pytest.mark.slow\ndef test_a():\n    subprocess.run(['x'])", []),
    ("from hybrid import testing\ndef test_a():\n    testing.torchrun(['--x'], 2)", []),
])
def test_the_check_sees_a_spawn_through_helpers_and_fixtures(source, found):
    assert unmarked_spawners(source) == found
