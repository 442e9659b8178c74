"""scripts/preprocess_data.py `--workers` beyond the CPUs this process may run on (round 19: `--workers 10000`
forked 10000 tokenizing processes) is capped at them with one warning line naming the flag and the count used; up
to them it runs as asked, with no line. The pool's size is read from the Pool call itself (the pool runs in this
process); the dataset is the same bytes either way. ByteLevel tokenizer, no tokenizer file."""

from __future__ import annotations

import pytest

from hybrid.data import preprocess


class _InProcessPool:
    """What preprocess uses of a Pool (imap in order, terminate), run in this process: the suite's fast tier starts
    no process (tests/test_suite_tiers.py); tests/test_data_preprocess.py runs a real pool of 2."""

    def __init__(self, n, initializer, initargs) -> None:
        initializer(*initargs)

    def imap(self, func, items, chunksize=1):
        return map(func, items)

    def terminate(self) -> None:
        pass


@pytest.fixture
def pools(monkeypatch) -> list[int]:
    """The process counts of every Pool preprocess asks its fork context for (none is forked: _InProcessPool)."""
    sizes: list[int] = []

    class Context:
        def __init__(self, method):
            assert method == "fork"

        def Pool(self, n, *args):  # noqa: N802 (multiprocessing's name)
            sizes.append(n)
            return _InProcessPool(n, *args)
    monkeypatch.setattr(preprocess.multiprocessing, "get_context", Context)
    return sizes


def _run(tmp_path, name: str, workers: int, capsys) -> tuple[list[str], list[str]]:
    (tmp_path / "in.txt").write_text("one\n\ntwo\n\nthree\n\nfour\n")
    capsys.readouterr()
    preprocess.main(["--input", str(tmp_path / "in.txt"), "--output-prefix", str(tmp_path / name),
                     "--tokenizer-type", "ByteLevel", "--append-eod", "--workers", str(workers)])
    out, err = capsys.readouterr()
    return out.splitlines(), [ln for ln in err.splitlines() if ln.strip()]


@pytest.mark.parametrize("workers", [3, 10000])
def test_workers_beyond_the_usable_cpus_are_capped_with_one_line(workers, tmp_path, capsys, monkeypatch, pools):
    monkeypatch.setattr(preprocess.os, "sched_getaffinity", lambda pid: {0, 1})  # a 2-CPU mask
    out, err = _run(tmp_path, "capped", workers, capsys)
    assert err == [f"preprocess_data.py: warning: --workers {workers} is more than the 2 CPUs this process may run "
                   f"on; using 2 (tokenizing processes beyond the cores only share them): give --workers 2 or fewer"]
    assert pools == [2] and "2 workers)" in out[-1], (pools, out)
    _run(tmp_path, "two", 2, capsys)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"capped_text_document{ext}").read_bytes() == \
            (tmp_path / f"two_text_document{ext}").read_bytes()


@pytest.mark.parametrize("cpus, workers, forked", [(2, 2, [2]), (4, 2, [2]), (1, 1, [])])
def test_workers_within_the_usable_cpus_run_as_asked_with_no_line(cpus, workers, forked, tmp_path, capsys,
                                                                   monkeypatch, pools):
    monkeypatch.setattr(preprocess.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    out, err = _run(tmp_path, "o", workers, capsys)
    assert err == [] and pools == forked and f"{workers} worker" in out[-1], (err, pools, out)


def test_the_cap_is_the_affinity_mask_not_the_machines_cpu_count(monkeypatch):
    """taskset / a cgroup cpuset / a Slurm allocation narrow the mask below os.cpu_count()."""
    monkeypatch.setattr(preprocess.os, "sched_getaffinity", lambda pid: {5})
    monkeypatch.setattr(preprocess.os, "cpu_count", lambda: 64)
    assert preprocess.usable_cpus() == 1
    monkeypatch.delattr(preprocess.os, "sched_getaffinity")  # macOS: no mask
    assert preprocess.usable_cpus() == 64


def test_a_bad_input_with_too_many_workers_is_still_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(preprocess.os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(SystemExit) as e:
        preprocess.main(["--input", str(tmp_path / "missing.jsonl"), "--output-prefix", str(tmp_path / "o"),
                         "--tokenizer-type", "ByteLevel", "--workers", "64"])
    err = capsys.readouterr().err + (e.value.code if isinstance(e.value.code, str) else "")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("preprocess_data.py: error: --input"), lines
