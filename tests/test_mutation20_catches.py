"""Round 20's outside mutation review of round 19's new code: one-line bugs planted on purpose in the planner's H100
GEMM ceiling and refit, the torchtitan H200 rows' compiled loss, selective-op's FLOP count, 1-bit Adam at dp 1 and
DeepSpeed's OneBitAdam keys, MoE + ZeRO 3 + selective-op and the MoE layer under --compile, newuser19's tool fixes
and the families tables the planner guide quotes; the area's fast tier run on each. Each test here kills a mutant
that tier let live, shown failing on the mutant and passing on HEAD. In-process, no process group.

The mutant ids (F2-iteration-0-ignored, ...) are those of branch mutation20's report and of docs/architecture.md's
tally."""

from __future__ import annotations

import os

import pytest


# --- D: 1-bit Adam at dp 1 (hybrid/compress/args.py) -------------------------------------------------------------
def test_onebit_adam_resuming_at_dp_1_carries_its_state():
    """1-bit Adam at dp 1 is refused (nothing to compress: Adam with a frozen variance), except with --load, which
    carries a checkpoint's 1-bit state through a dp 1 stretch to the next save, as PowerSGD's (the refusal's own
    `not resuming`). D2-resuming-dropped (the refusal at dp 1 whether resuming or not) lived through
    test_inputs19_train_axes, test_dsjson_inputs, test_compress_reshard, test_newuser_inputs and the compress
    files' fast tier: none checks 1-bit Adam at dp 1 with --load. No checkpoint needed: the check is told."""
    from hybrid.compress import args as compress_args
    from hybrid.train.args import parse_args
    argv = ["--model", "tiny-llama", "--optimizer", "onebit-adam", "--onebit-freeze-iters", "2"]
    with pytest.raises(ValueError, match="^--optimizer onebit-adam compresses the DP momentum all-reduce"):
        compress_args.check(parse_args(argv), 1, resuming=False)
    assert compress_args.check(parse_args(argv), 1, resuming=True).onebit_freeze_iters == 2


# --- F: newuser19's tool fixes (hybrid/convert/to_hf.py, hybrid/cliutil.py, hybrid/checkpoint_paths.py) ----------
def test_convert_iteration_0_of_another_iterations_folder_is_refused(tmp_path):
    """Round 19's finding itself: `hybrid convert ck/iter_0000003 out --iteration 0` exported iteration 3. The check
    must test `iteration is None`, not its truth: F2-iteration-0-ignored (`if not iteration or ...`) lived through
    test_newuser19_tools (its case is iter_0000000 with --iteration 3, the other way round), test_convert and the
    newuser files' fast tier. The folder need only look like one iteration (.metadata, state.json): the check runs
    before anything is read."""
    from hybrid.convert.to_hf import iteration_dir
    src = tmp_path / "ck" / "iter_0000003"
    src.mkdir(parents=True)
    (src / ".metadata").write_bytes(b"")
    (src / "state.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^--iteration 0: SRC .* is iteration 3's folder; give the checkpoint "
                                         r"directory \(.*ck --iteration 0\)"):
        iteration_dir(str(src), 0)


def test_an_output_through_a_link_into_a_package_names_the_outermost_package(tmp_path):
    """cliutil.package_root walks the REAL path up to the outermost package: a link to a subpackage (pkg/sub) is
    inside pkg, whose name and a path beside it the refusal gives. F3-package-abspath (os.path.abspath) lived
    through test_newuser19_tools and the newuser / convert / data files' fast tier: it still refuses, but names the
    link as the package and walks no further up."""
    from hybrid.cliutil import check_outside_packages, package_root
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for d in (pkg, pkg / "sub"):
        (d / "__init__.py").write_text("")
    link = tmp_path / "link"
    link.symlink_to(pkg / "sub", target_is_directory=True)
    out = str(link / "out")
    assert package_root(out) == os.path.realpath(pkg)
    with pytest.raises(ValueError, match=f"is inside the Python package {os.path.realpath(pkg)} "):
        check_outside_packages("DST", out, "the converted checkpoint")


def test_an_output_through_a_link_into_a_checkpoint_is_refused(tmp_path):
    """checkpoint_paths.enclosing_checkpoint walks the real path: a link to one iteration of a checkpoint directory
    (ck/iter_0000001) puts link/tok among its checkpoints, where a save's replace or --save-keep deletes it.
    F4-enclosing-abspath (os.path.abspath) lived through test_newuser19_tools and the newuser / convert / data
    files' fast tier: the link's lexical parents hold no iter_* or `latest`, so the output was accepted."""
    from hybrid.checkpoint_paths import check_outside_checkpoints
    ck = tmp_path / "ck"
    (ck / "iter_0000001").mkdir(parents=True)
    (ck / "latest").write_text("1")
    link = tmp_path / "link"
    link.symlink_to(ck / "iter_0000001", target_is_directory=True)
    out = str(link / "tok")
    with pytest.raises(ValueError, match=f"is inside the checkpoint directory {os.path.realpath(ck)} "):
        check_outside_checkpoints("--output", out, out, "the tokenizer")


def test_the_checkpoint_directory_itself_is_left_to_train_tokenizers_own_check(tmp_path):
    """check_outside_checkpoints refuses paths INSIDE a checkpoint directory; the directory itself is
    train_tokenizer.check_fresh_output's to name ("is a checkpoint or model folder ... give the tokenizer a
    directory of its own"). F5-ckpt-itself-refused (dropping `or realpath(path) == root`) lived through
    test_newuser19_tools and the newuser / data files' fast tier: it refused with "give a path beside it, e.g.
    --output ck" -- the very path refused."""
    from hybrid.checkpoint_paths import check_outside_checkpoints
    from hybrid.data.train_tokenizer import check_fresh_output
    ck = tmp_path / "ck"
    (ck / "iter_0000001").mkdir(parents=True)
    (ck / "latest").write_text("1")
    assert check_outside_checkpoints("--output", str(ck), str(ck), "the tokenizer") is None
    with pytest.raises(ValueError, match="is a checkpoint or model folder"):
        check_fresh_output(str(ck))
