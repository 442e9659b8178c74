"""scripts/bench_cp.py --quick runs end to end and writes its table (speed is never asserted here): the unsharded
row and each of hybrid's three comm types with a number; torch's context_parallel row either with a number or
with the reason it does not run on gloo / CPU."""

import os
import re

import pytest

from hybrid import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # a benchmark / train.py end to end: the full suite runs it
def test_bench_cp_quick_writes_the_table(tmp_path):
    out = tmp_path / "cp.md"
    p = testing.run([os.path.join(ROOT, "scripts", "bench_cp.py"), "--quick", "--out", str(out)],  # a fork
                    env={"OMP_NUM_THREADS": "1"}, cwd=str(tmp_path), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    assert "load average" in text
    for row in ("unsharded", "hybrid p2p", "hybrid a2a", "hybrid allgather"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {row}"))
        assert re.match(r"\| [^|]+ \| \d+\.\d \| \d+\.\d \|", line), line  # wall ms, CPU ms
    torch_row = next(ln for ln in text.splitlines() if ln.startswith("| torch context_parallel"))
    assert re.match(r"\| [^|]+ \| (\d+\.\d|not run on gloo/CPU: .+) \|", torch_row), torch_row



def _bench_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_cp", os.path.join(ROOT, "scripts", "bench_cp.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv,message", [
    (["--seq", "100", "--cp", "4"], "--seq 100 is not divisible by 2 x --cp (8)"),
    (["--cp", "9"], "--cp 9: use 2 to 8"),
    (["--cp", "4"], "--cp 4 is more ranks than this machine's 2 cores"),
    (["--heads", "8", "--kv-heads", "3"], "--heads 8 is not divisible by --kv-heads 3"),
    (["--repeats", "0"], "--repeats 0 must be a positive integer")])
def test_bench_cp_rejects_bad_sizes_in_one_line_before_any_process(argv, message, capsys, monkeypatch):
    bench = _bench_module()
    monkeypatch.setattr(bench, "cores", lambda: 2)
    monkeypatch.setattr(bench, "table", lambda args: pytest.fail("started work on bad input"))
    with pytest.raises(SystemExit) as exit_:
        bench.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(f"bench_cp.py: error: {message}") and err.count("\n") == 1, err


def test_bench_cp_defaults_time_a_median_of_ten_within_the_cores_and_oversubscribe_is_explicit(monkeypatch):
    """The defaults a plain run gets: a median of >= 10 timed runs, CP 2; --cp beyond the cores only with
    --oversubscribe (and --quick, which times nothing, runs anywhere)."""
    bench = _bench_module()
    seen = []
    monkeypatch.setattr(bench, "cores", lambda: 2)
    monkeypatch.setattr(bench, "table", lambda args: seen.append(args) or "")
    bench.main([])
    bench.main(["--cp", "4", "--oversubscribe"])
    monkeypatch.setattr(bench, "cores", lambda: 1)
    bench.main(["--quick"])
    assert seen[0].repeats >= 10 and seen[0].cp == 2
    assert seen[1].cp == 4 and seen[2].cp == 2
