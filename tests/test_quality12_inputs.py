"""Round 11's new-user leftovers (tests/test_newuser11_inputs.py named them, note11.md): a word left over after a
`hybrid` sub-command was refused under the top parser's name (`hybrid: error: unrecognized arguments: gpt2`),
`hybrid checkpoint inspect` said only "latest -> none" of a folder whose save did not finish, and `hybrid calibrate
--ranks 16` on 2 cores measured without a word about what its collectives' timings then mean.

In this process, one rank, no process group (conftest's `one_line`); nothing is measured or spawned."""

from __future__ import annotations

import os
import pickle

import pytest

from hybrid.checkpoint import store
from hybrid.cli import main

pytestmark = pytest.mark.usefixtures("one_process")


# --- 1. a word left over after a sub-command: its own one-line prefix ------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["models", "gpt3"], "hybrid models: error: no preset 'gpt3'; did you mean 'gpt2'? (`hybrid models` lists them all; "
                         "NAME may also be a folder holding a transformers config.json)"),
    (["layout", "--world", "2", "gpt2"], "hybrid layout: error: unrecognized arguments: gpt2; see --help"),
    (["checkpoint", "inspect", "a", "b"], "hybrid checkpoint inspect: error: unrecognized arguments: b; see --help"),
    (["convert", "a", "b", "c"], "hybrid convert: error: unrecognized arguments: c; see --help"),
])
def test_a_word_left_over_is_refused_by_the_sub_command_given(argv, line, one_line):
    """argparse's parse_args names the top parser for what a sub-command left over; every other error of a
    sub-command (and the train.py / plan ones) reads `<prog> <command>: error: ...` -- now these too
    (cliutil.OneLineParser.parse_args asks the innermost sub-command chosen)."""
    assert one_line(lambda: main(argv)) == line
    assert one_line.out == ""


def test_models_name_shows_that_preset_and_its_sizes(capsys):
    """`hybrid models gpt2` -- the first thing a user types after `hybrid models` -- shows gpt2 and the presets
    named gpt2-...; two words, both families, each preset once."""
    main(["models", "gpt2", "tiny-gpt2", "gpt2-xl"])
    rows = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]]
    assert rows == ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "tiny-gpt2"]


# --- 2. checkpoint inspect of a folder whose save did not finish ---------------------------------------------------
def _complete(root: str, iteration: int) -> None:
    """A complete checkpoint with no tensors, as store.finalize leaves it (then `latest` written)."""
    from torch.distributed.checkpoint.metadata import Metadata
    os.makedirs(store.tmp_path(root, iteration))
    with open(os.path.join(store.tmp_path(root, iteration), ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata={}, storage_data={}), f)
    store.finalize(root, iteration, {}, {"iteration": iteration, "consumed_samples": 8 * iteration,
                                         "model": "tiny-gpt2", "adam_step": iteration,
                                         "scaler": {"loss_scale": 1.0, "good_steps": 0, "skipped_steps": 0},
                                         "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0}})


def _listing(root) -> dict:
    return {os.path.join(d, n): os.stat(os.path.join(d, n)).st_mtime_ns
            for d, dirs, files in os.walk(root) for n in dirs + files}


def _inspect(root, capsys) -> tuple[int, list[str]]:
    before = _listing(root)
    with pytest.raises(SystemExit) as e:
        main(["checkpoint", "inspect", str(root)])
    assert _listing(root) == before  # nothing written, nothing removed
    return e.value.code, capsys.readouterr().out.splitlines()


def test_inspect_without_latest_names_the_iteration_load_resumes_from(tmp_path, capsys):
    """A save killed after its rename and before `latest` (store.py's order) leaves complete iterations and no
    `latest`: "latest -> none" read as "nothing to resume", yet --load takes the newest complete one."""
    _complete(str(tmp_path), 4)
    _complete(str(tmp_path), 8)
    os.remove(tmp_path / store.LATEST)
    (tmp_path / "iter_0000012.tmp").mkdir()
    main(["checkpoint", "inspect", str(tmp_path)])  # exit 0: sound checkpoints beside an unfinished save
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{tmp_path}: latest -> none (no `latest` file: the save that writes it did not finish); "
                        f"--load {tmp_path} resumes from iter_0000008, the newest complete checkpoint (--ckpt-step N "
                        f"for another)"), lines[0]
    assert len(lines) == 4 and lines[3].startswith("  iter_0000012.tmp: incomplete")


def test_inspect_of_only_interrupted_saves_says_load_is_refused_and_what_to_do(tmp_path, capsys):
    (tmp_path / "iter_0000010.tmp").mkdir()
    (tmp_path / "iter_0000010.tmp" / "__0_0.distcp").write_bytes(b"x")
    code, lines = _inspect(tmp_path, capsys)
    assert code == 1 and lines[0] == (
        f"{tmp_path}: latest -> none (no `latest` file: the save that writes it did not finish) and no complete "
        f"checkpoint: every save here was interrupted before its manifest.json; --load {tmp_path} is refused -- "
        f"start without --load (the next save removes them)"), lines
    (tmp_path / store.LATEST).write_text("iter_0000010\n")  # `latest` naming an iteration that never completed
    code, lines = _inspect(tmp_path, capsys)
    assert code == 1 and lines[0].startswith(f"{tmp_path}: latest -> none (`latest` names 'iter_0000010', not a "
                                             f"complete checkpoint here) and no complete checkpoint"), lines


# --- 3. calibrate with more gloo ranks than cores ------------------------------------------------------------------
class _Measured(Exception):
    """calibrate.calibrate was reached: the measuring began."""


@pytest.mark.parametrize("ranks, cores, warned", [(16, 2, True), (3, 2, True), (2, 2, False), (1, 2, False)])
def test_calibrate_more_ranks_than_cores_warns_before_measuring(ranks, cores, warned, tmp_path, capsys, monkeypatch):
    """Ranks beyond the cores make the timed collectives the OS scheduler's: a warning naming --ranks, the core
    count, what the numbers then mean and the fix -- not a refusal (calibrate.oversubscribed says why)."""
    from hybrid.planner import calibrate

    def measure(cfg):
        assert capsys.readouterr().err == (  # before the first rank is spawned
            f"hybrid calibrate: warning: --ranks {ranks} on {cores} CPU cores: ranks share cores, so the timed "
            f"collectives (intra_latency_s, intra_node_gbps) measure the OS scheduler, not gloo; measuring anyway, "
            f"as a training run of {ranks} ranks on these cores meets the same scheduler (the planner prices it) -- "
            f"plan only that run with this profile; for the links themselves give --ranks {cores} (no more ranks "
            f"than cores)\n" if warned else "")
        raise _Measured

    monkeypatch.setattr(calibrate, "calibrate", measure)
    monkeypatch.setattr(calibrate.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(calibrate.torch.cuda, "is_available", lambda: False)
    with pytest.raises(_Measured):
        main(["calibrate", "--ranks", str(ranks), "--out", str(tmp_path / "hw.json")])
    assert calibrate.oversubscribed(16, "nccl", 2) is None  # a GPU a rank: the cores are not what is shared
