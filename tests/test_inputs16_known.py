"""Round 16: the five findings earlier new-user passes left, each now one line naming the flag, word or file and the
fix, before any process group or work.

1. scripts/plot_run.py --tensorboard-dir (train.py's flag, which users bring) said "see --help": a run's folder or
   file is a RUN, given without a flag -- said so, for --tensorboard-dir, TensorBoard's --logdir and --metrics-file.
2. `hybrid checkpoint reshard` / `convert` (other tools' sub-commands) said only "choose from 'inspect'": each says
   what does that here (a load reshards; `hybrid convert`); `hybrid train` / `hybrid reshard` likewise.
3. hybrid generate --pipeline-layers-per-stage at pp 1 said "gives 2 counts for 1 stages (pp x v)", naming a
   virtual size generate has no flag for: now train.py's words (one stage); and the partition's own messages name
   the flags that make the stages, the virtual one only where there are virtual stages.
4. train.py --save into a source tree (the repository's hybrid/ or tests/) wrote iter_*/ and `latest` among the
   sources: a Python package is refused; a folder of source files (*.py, a repository's .git) is refused without
   --overwrite-save (hybrid/checkpoint/args.py's consent flag, as for a folder holding another run's checkpoints).
5. Ctrl-C during `hybrid calibrate`'s first `import torch` printed Python's traceback: hybrid.cli imported torch
   (through hybrid.mesh) at module level, before main()'s handler -- now one line and status 130; scripts/train.py's
   imports likewise (hybrid.cliutil.interruptible_start).

In this process (conftest's `one_line`), but for one real Ctrl-C in a new interpreter (slow)."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from hybrid.cli import main as hybrid_main
from hybrid.metrics.plot import main as plot_main
from hybrid.partition import PartitionMethod, partition_layers
from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- 1. plot_run.py ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, flag, what", [
    (["--tensorboard-dir", "tb/"], "--tensorboard-dir", "TensorBoard folder"),
    (["--tensorboard-dir=tb/"], "--tensorboard-dir", "TensorBoard folder"),
    (["--logdir", "tb/"], "--logdir", "TensorBoard folder"),
    (["--metrics-file", "run.jsonl"], "--metrics-file", "metrics file"),
])
def test_plot_run_flags_of_the_run_say_give_it_as_a_run(argv, flag, what, tmp_path, one_line):
    line = one_line(lambda: plot_main(argv + ["--out", str(tmp_path / "a.png")]))
    assert line.startswith("plot_run.py: error: unrecognized arguments: ") and "see --help" not in line, line
    assert f"{flag}: give the {what} as a RUN, without the flag" in line
    assert os.listdir(tmp_path) == []


# --- 2. sub-commands other tools have ----------------------------------------------------------------------------
@pytest.mark.parametrize("word, hint", [
    ("reshard", "a checkpoint is resharded as it loads: resume with train.py --load DIR at the new layout"),
    ("convert", "conversion is its own command: `hybrid convert SRC DST`"),
    ("export", "conversion is its own command: `hybrid convert SRC DST`"),
    ("verify", "`hybrid checkpoint inspect DIR` checks every file's checksum"),
    ("prune", "train.py --save-keep N keeps the N newest complete ones"),
])
def test_checkpoint_subcommands_of_other_tools_say_what_does_that_here(word, hint, tmp_path, one_line):
    line = one_line(lambda: hybrid_main(["checkpoint", word, str(tmp_path)]))
    assert line.startswith(f"hybrid checkpoint: error: argument action: invalid choice: '{word}' (choose from "
                           f"'inspect'); ") and hint in line, line


@pytest.mark.parametrize("word, hint", [
    ("train", "torchrun --nproc-per-node N -m hybrid.train"),
    ("reshard", "a checkpoint is resharded as it loads"),
    ("inspect", "give `hybrid checkpoint inspect DIR`"),
])
def test_hybrid_commands_users_guess_say_where_they_live(word, hint, one_line):
    line = one_line(lambda: hybrid_main([word, "x"]))
    assert line.startswith(f"hybrid: error: argument command: invalid choice: '{word}'") and hint in line, line


def test_an_unknown_word_still_lists_the_choices_alone(one_line):
    assert one_line(lambda: hybrid_main(["checkpoint", "frobnicate", "x"])) == (
        "hybrid checkpoint: error: argument action: invalid choice: 'frobnicate' (choose from 'inspect')")


# --- 3. the stages' flags, said as given ----------------------------------------------------------------------------
def test_generate_layers_per_stage_at_one_stage_is_train_pys_line():
    from hybrid.generate.cli import _check_layout
    args = argparse.Namespace(pipeline_model_parallel_size=1, pipeline_layers_per_stage="1,2",
                              tensor_model_parallel_size=None)
    cfg = SimpleNamespace(num_layers=3, num_heads=4, num_kv_heads=4)
    with pytest.raises(ValueError) as e:
        _check_layout(args, 1, cfg)
    assert str(e.value) == ("--pipeline-layers-per-stage splits the layers over the pipeline's stages, and there is "
                            "one (--pipeline-model-parallel-size 1, holding all 3 layers): give "
                            "--pipeline-model-parallel-size N or drop --pipeline-layers-per-stage")


@pytest.mark.parametrize("pp, v, counts, method, said", [
    (2, 1, [1, 1, 2], None, "gives 3 counts for 2 stages (--pipeline-model-parallel-size 2); give one per stage"),
    (2, 2, [1, 1, 2], None, "gives 3 counts for 4 stages (--pipeline-model-parallel-size 2 x "
                            "--virtual-pipeline-model-parallel-size 2); give one per stage"),
    (4, 1, None, PartitionMethod.BALANCED, "the model's 1 layers cannot fill 4 stages (--pipeline-model-parallel-size 4)"
                                           ": every stage"),
    (2, 2, None, PartitionMethod.BALANCED, "cannot fill 4 stages (--pipeline-model-parallel-size 2 x "
                                           "--virtual-pipeline-model-parallel-size 2): every stage"),
])
def test_partition_messages_name_the_flags_that_make_the_stages(pp, v, counts, method, said):
    layers = 4 if counts else 1
    with pytest.raises(ValueError) as e:
        partition_layers(layers, pp, v, method=method, layers_per_stage=counts)
    assert said in str(e.value) and "pp x v" not in str(e.value), str(e.value)


# --- 4. --save into a source tree -----------------------------------------------------------------------------------
def _save(save: str, *extra: str):
    return lambda: validate(["--model", "tiny-gpt2", "--train-iters", "1", "--save", save, *extra])


@pytest.mark.parametrize("where", ["hybrid", "models", os.path.join("hybrid", "runs", "new")])
@pytest.mark.parametrize("consent", [(), ("--overwrite-save",)])
def test_save_inside_the_repositorys_packages_is_refused(where, consent, one_line):
    """The repository's own packages, as the user would type them: nothing created, --overwrite-save no way in."""
    before = sorted(os.listdir(os.path.join(ROOT, "hybrid")))
    line = one_line(_save(os.path.join(ROOT, where), *consent))
    package = os.path.join(ROOT, where.split(os.sep)[0])
    assert line.startswith(f"train.py: error: --save {os.path.join(ROOT, where)!r} is inside the Python package "
                           f"{package} (its folders hold __init__.py): checkpoints would be written among its source "
                           f"files; give a directory outside it, e.g. --save "), line
    assert line.endswith(os.path.relpath(os.path.join(ROOT, "checkpoints")))
    assert sorted(os.listdir(os.path.join(ROOT, "hybrid"))) == before


@pytest.mark.parametrize("where, found", [("tests", "command_flags.py, conftest.py"), ("scripts", None)])
def test_save_into_a_folder_of_sources_needs_consent(where, found, one_line):
    line = one_line(_save(os.path.join(ROOT, where)))
    assert f"holds source files ({found or ''}" in line and "would be written among them; give a directory of its " \
        "own, e.g. --save " in line and line.endswith("or pass --overwrite-save to write there anyway"), line


def test_save_at_a_repositorys_root_suggests_a_folder_in_it(tmp_path, one_line, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    line = one_line(_save("."))
    assert line == ("train.py: error: --save '.' holds source files (.git): checkpoints (iter_*/, latest) would be "
                    "written among them; give a directory of its own, e.g. --save ./checkpoints, or pass "
                    "--overwrite-save to write there anyway")
    assert os.listdir(tmp_path) == [".git"]


def test_save_beside_sources_with_consent_or_in_a_folder_of_its_own_is_taken(tmp_path):
    (tmp_path / "run.py").write_text("print('launch')\n")
    assert validate(["--model", "tiny-gpt2", "--train-iters", "1", "--save", str(tmp_path), "--overwrite-save"])
    assert validate(["--model", "tiny-gpt2", "--train-iters", "1", "--save", str(tmp_path / "ckpt")])  # README's
    assert sorted(os.listdir(tmp_path)) == ["run.py"]  # checked, nothing written


def test_a_package_found_above_a_missing_save_folder(tmp_path, one_line):
    pkg = tmp_path / "proj" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (tmp_path / "proj" / "__init__.py").write_text("")
    line = one_line(_save(str(pkg / "a" / "b")))
    assert f"is inside the Python package {tmp_path / 'proj'} " in line, line  # the outermost package
    assert not (pkg / "a").exists()


# --- 5. Ctrl-C while hybrid imports torch ---------------------------------------------------------------------------
def test_hybrid_cli_imports_no_heavy_module_at_its_top():
    """The console script runs `from hybrid.cli import main` before main()'s KeyboardInterrupt handler: the module
    and hybrid.cliutil and hybrid.fault_hook (all they import of hybrid: the one test-only fault hook's crash points
    in cliutil's writers, round 17) import the standard library only."""
    for name in ("cli.py", "cliutil.py", "fault_hook.py"):
        tree = ast.parse(open(os.path.join(ROOT, "hybrid", name)).read())
        top = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names] + \
              [n.module for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert all(m.split(".")[0] in sys.stdlib_module_names or m in ("__future__", "hybrid.cliutil",
                                                                       "hybrid.fault_hook")
                   for m in top), (name, top)


# a SIGINT sent from inside the import of torch (a finder that sees the name first), as a Ctrl-C lands there
_CTRL_C_IN_IMPORT = """
import os, signal, sys
# a terminal's Ctrl-C: SIGINT raises KeyboardInterrupt (an xdist worker, this test's parent, ignores SIGINT, and an
# ignored disposition is inherited across exec: Python would then install no handler and the signal would do nothing)
signal.signal(signal.SIGINT, signal.default_int_handler)
class CtrlC:
    def find_spec(self, name, path, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)
sys.meta_path.insert(0, CtrlC())
from hybrid.cli import main
main(["calibrate", "--ranks", "1", "--out", sys.argv[1]])
"""


_CTRL_C_IN_TRAIN_PY = _CTRL_C_IN_IMPORT.split("from hybrid.cli")[0] + """
sys.argv = ["train.py", "--model", "tiny-gpt2", "--save", sys.argv[1]]
import runpy
runpy.run_path(os.path.join(os.environ["PYTHONPATH"], "scripts", "train.py"), run_name="__main__")
"""


@pytest.mark.slow
def test_ctrl_c_during_train_pys_first_import_of_torch_is_one_line_and_130(tmp_path):
    """The main job's entry point too (scripts/train.py; under torchrun rank 0 alone prints the line)."""
    p = subprocess.run([sys.executable, "-c", _CTRL_C_IN_TRAIN_PY, str(tmp_path / "ckpt")], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path)
    assert p.returncode == 130, p.stderr
    assert p.stderr == "train.py: interrupted while starting, before any work: nothing was run or written\n"
    assert p.stdout == "" and os.listdir(tmp_path) == []


@pytest.mark.slow
def test_ctrl_c_during_calibrates_first_import_of_torch_is_one_line_and_130(tmp_path):
    out = tmp_path / "hw.json"
    p = subprocess.run([sys.executable, "-c", _CTRL_C_IN_IMPORT, str(out)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path)
    assert p.returncode == 130, p.stderr
    assert p.stderr == "hybrid: interrupted while starting, before any work: nothing was run or written\n"
    assert p.stdout == "" and os.listdir(tmp_path) == []
