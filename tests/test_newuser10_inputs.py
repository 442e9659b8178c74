"""Tenth-round new-user findings: what a first-time user met following docs/moe.md, context-parallel.md,
pipeline.md, checkpoint.md, convert.md, data.md, operations.md and troubleshooting.md with bad or odd inputs (round
9's walk, tests/test_newuser9_inputs.py, is not redone here).

In this process, one rank, no process group (the shared harness: hybrid/testing_inputs.py, conftest's `one_line`)."""

from __future__ import annotations

import pytest

from hybrid.train.main import validate

pytestmark = pytest.mark.usefixtures("one_process")  # tests/conftest.py: python, not torchrun: world 1


def _world(monkeypatch, n: int) -> None:
    """torchrun's environment for rank 0 of `n` on one node: validate then checks the layout of an n-rank job."""
    for name, value in (("WORLD_SIZE", str(n)), ("RANK", "0"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", str(n)),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)


# --- 1. --sequence-parallel at --tensor-model-parallel-size 1: turned off with one warning, as Megatron-LM ----------
def test_sequence_parallel_at_tp1_is_turned_off_with_one_warning_on_rank0(capsys, monkeypatch):
    """It was accepted silently (RunConfig said sequence parallelism while no TP group existed to split over).
    Megatron-LM's validate_args: "Disabling sequence parallelism because tensor model parallelism is disabled"."""
    _world(monkeypatch, 2)
    run = validate(["--sequence-parallel", "--seq-length", "32"])[0]
    err = capsys.readouterr().err
    assert run.parallel.dims.tp == 1 and run.parallel.sequence_parallel is False
    assert run.flag_values["sequence_parallel"] is False  # a checkpoint records what ran
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == ["train.py: warning: --sequence-parallel is off: it splits norms and dropout over the "
                     "tensor-parallel group and --tensor-model-parallel-size is 1 (Megatron-LM turns it off the "
                     "same way); drop the flag, or raise --tensor-model-parallel-size"], lines


def test_sequence_parallel_warning_is_rank0s_alone_and_tp2_keeps_it(capsys, monkeypatch):
    _world(monkeypatch, 2)
    monkeypatch.setenv("RANK", "1")
    assert validate(["--sequence-parallel", "--seq-length", "32"])[0].parallel.sequence_parallel is False
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    run = validate(["--sequence-parallel", "--seq-length", "32", "--tensor-model-parallel-size", "2"])[0]
    assert run.parallel.sequence_parallel is True and run.warnings == () and capsys.readouterr().err == ""


# --- 2. --split with one or two numbers: megatron-core pads them with zeros -----------------------------------------
@pytest.mark.parametrize("text, want", [("98,2", (0.98, 0.02, 0.0)), ("98, 2", (0.98, 0.02, 0.0)),
                                        ("100", (1.0, 0.0, 0.0)), ("98/2", (0.98, 0.02, 0.0))])
def test_split_of_one_or_two_numbers_is_padded_with_zeros_as_megatron(text, want):
    """'--split 98,2' (a Megatron-LM command line: parse_and_normalize_split pads it to 98,2,0) was refused."""
    from hybrid.data.gpt import parse_split
    assert parse_split(text) == pytest.approx(want, abs=0, rel=1e-15)
    assert parse_split(text) == parse_split({"100": "100,0,0"}.get(text, "98,2,0"))


@pytest.mark.parametrize("text", ["1,2,3,4", "0", "0,0", ","])
def test_split_of_four_numbers_or_no_share_stays_one_line(text, one_line):
    line = one_line(lambda: validate(["--split", text]))
    assert line.startswith(f"train.py: error: --split {text!r}: give "), line
    assert "969,30,1" in line


def test_split_98_2_through_train_py_has_no_test_split(monkeypatch):
    run = validate(["--split", "98,2"])[0]
    assert run.data.split == pytest.approx((0.98, 0.02, 0.0))


# --- 3. --pipeline-layers-per-stage with --pipeline-partition balanced: the second was ignored ----------------------
def test_layers_per_stage_beside_balanced_partition_is_one_line(one_line, monkeypatch):
    """train.py took both and cut 1,3 by hand, silently dropping the balanced split (hybrid convert refused it)."""
    _world(monkeypatch, 2)
    line = one_line(lambda: validate(["--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "1,3",
                                      "--pipeline-partition", "balanced"]))
    assert line == ("train.py: error: --pipeline-layers-per-stage fixes the split, so --pipeline-partition balanced "
                    "cannot apply; drop one of the two")
    stages = validate(["--pipeline-model-parallel-size", "2", "--pipeline-layers-per-stage", "1,3"])[0]
    assert stages.parallel.pipeline.stages == [(0,), (1, 2, 3)]


# --- 4. --load of a checkpoint with a truncated or missing data file: named before any process group --------------
def _checkpoint(root, iteration: int, sizes: dict[str, int]) -> str:
    """A complete checkpoint's directory by its manifest: files of the given sizes (and the small ones), the
    manifest's bytes each."""
    import json
    import os

    from hybrid.checkpoint import store
    d = store.final_path(str(root), iteration)
    os.makedirs(d)
    files = {}
    for name, size in dict(sizes, **{".metadata": 10, "state.json": 2}).items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"\0" * size)
        files[name] = {"bytes": size, "sha256": "0" * 64}
    with open(os.path.join(d, store.MANIFEST), "w") as f:
        json.dump({"format": store.FORMAT, "files": files}, f)
    return d


@pytest.fixture
def small_files_pass(monkeypatch):
    """The small files' checks (manifest, state.json, DCP's .metadata: tests/test_trust.py) pass: these tests are of
    the data files' sizes, checked beside them."""
    from hybrid.checkpoint import safe_read, store
    monkeypatch.setattr(safe_read, "check_checkpoint", lambda d: "meta")
    monkeypatch.setattr(store, "read_state", lambda d: {"iteration": int(d.rsplit("_", 1)[-1])})


def test_a_truncated_data_file_of_the_only_checkpoint_is_named_before_start_up(tmp_path, small_files_pass):
    """It passed the checks (only the small files were read), the run started its process group, then the
    checksums failed: a warning and an error after start-up. A stat per file finds it first."""
    import os

    from hybrid.checkpoint.args import _resume_candidate
    d = _checkpoint(tmp_path, 2, {"__0_0.distcp": 100})
    with open(os.path.join(d, "__0_0.distcp"), "r+b") as f:
        f.truncate(40)
    with pytest.raises(ValueError) as e:
        _resume_candidate(str(tmp_path), None)
    assert str(e.value) == (f"--load {str(tmp_path)!r}: no intact checkpoint (the newest: {d}/__0_0.distcp: 40 bytes, "
                            f"the manifest says 100 (truncated?)); see `hybrid checkpoint inspect {tmp_path}`")
    os.remove(os.path.join(d, "__0_0.distcp"))
    with pytest.raises(ValueError, match=f"--ckpt-step 2: {d}/__0_0.distcp: missing$"):
        _resume_candidate(str(tmp_path), 2)


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_before_start_up(tmp_path, small_files_pass):
    import os

    from hybrid.checkpoint.args import _resume_candidate
    older = _checkpoint(tmp_path, 2, {"__0_0.distcp": 100})
    newest = _checkpoint(tmp_path, 4, {"__0_0.distcp": 100})
    assert _resume_candidate(str(tmp_path), None)[0] == newest
    with open(os.path.join(newest, "__0_0.distcp"), "r+b") as f:
        f.truncate(99)
    assert _resume_candidate(str(tmp_path), None) == (older, {"iteration": 2}, "meta")


# --- 5. hybrid convert with Megatron's converter flags, and a DST that is a file ------------------------------------
@pytest.mark.parametrize("flag, value, hint", [
    ("--model-type", "GPT", "--model-type: the model comes from SRC's config.json (or --model CONFIG); drop it"),
    ("--loader", "megatron", "--loader: SRC's format is detected from its files; drop it"),
    ("--saver", "hf", "--saver: the target format is --to hf or --to hybrid"),
    ("--load-dir", "ck", "--load-dir: give the source as SRC (hybrid convert LOAD_DIR SAVE_DIR)"),
])
def test_convert_given_megatron_converter_flags_says_where_each_lives(flag, value, hint, one_line, tmp_path):
    """Megatron-LM's tools/checkpoint/convert.py takes --model-type GPT --loader ... --saver ...; hybrid convert said
    "unrecognized arguments: --model-type; see --help"."""
    import hybrid.cli
    line = one_line(lambda: hybrid.cli.main(["convert", str(tmp_path / "a"), str(tmp_path / "b"), flag, value]))
    assert line.startswith(f"hybrid convert: error: unrecognized arguments: {flag}; {hint}"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_convert_dst_that_is_a_file_says_so(tmp_path):
    """It said "DST 'x' exists and is not empty" of a file."""
    from hybrid.convert.common import check_dst
    dst = tmp_path / "notes.txt"
    dst.write_text("mine")
    with pytest.raises(ValueError, match=r"^DST '.*notes.txt' is a file, not a directory; give a new directory "
                                         r"\(nothing is overwritten\)$"):
        check_dst(str(dst))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="exists and is not empty"):
        check_dst(str(tmp_path / "full"))
    assert dst.read_text() == "mine"


# --- 7. Megatron-LM's pretrain_gpt flags train.py does not take: a hint, not a misleading near spelling -------------
@pytest.mark.parametrize("argv, hint", [
    # --recompute-method / --recompute-num-layers: train.py's flags since round 22 (tests/test_newuser22_megatron.py)
    (["--lr-decay-samples", "100"], "--lr-decay-samples: give --lr-decay-iters (samples / --global-batch-size)"),
    # --data-cache-path: train.py's flag since round 25 (tests/test_data25_index_cache.py)
    (["--rampup-batch-size", "4", "4", "100"], "--rampup-batch-size: a batch-size ramp is not implemented"),
    (["--swiglu"], "--swiglu: the model's shape comes from --model (a preset, or a transformers config.json: write "
                   "model_type llama"),
    (["--position-embedding-type", "rope"], "--position-embedding-type: the model's shape comes from --model"),
    (["--use-flash-attn"], "--use-flash-attn: attention is torch's scaled_dot_product_attention"),
    (["--exit-duration-in-mins", "5"], "--exit-duration-in-mins: not implemented; --exit-interval N"),
])
def test_megatron_flags_get_where_their_setting_lives(argv, hint, one_line):
    """They said "see --help", or worse a near spelling that means something else: --data-cache-path "did you mean
    --data-path?", --lr-decay-samples "--lr-decay-style?", --recompute-num-layers "--recompute-granularity?",
    --rampup-batch-size "--micro-batch-size?"."""
    line = one_line(lambda: validate(argv))
    assert line.startswith(f"train.py: error: unrecognized arguments: "), line
    assert f"; {hint}" in line and "did you mean" not in line, line


# --- 8. --metrics-file naming a file a run did not write: it would be appended to -----------------------------------
@pytest.mark.parametrize("content", [b'{\n  "name": "cpu",\n  "peak_tflops": 1.0\n}\n', b"print('hi')\n",
                                     b'{"name": "cpu"}\n', b"\x89PNG\r\n\x1a\n"])
def test_metrics_file_that_is_not_a_metrics_file_is_refused_and_kept(content, tmp_path, one_line):
    """`--metrics-file cpu.json` (the `hybrid calibrate` profile meant for --hardware) was accepted and the run's JSON
    lines were appended to it."""
    path = tmp_path / "cpu.json"
    path.write_bytes(content)
    line = one_line(lambda: validate(["--metrics-file", str(path)]))
    assert line == (f"train.py: error: --metrics-file {str(path)!r} exists and is not a metrics file (its first line "
                    f"is not a JSON record with an \"iteration\"); the run appends to it: give a new file, or the "
                    f"--metrics-file of the run this one resumes")
    assert path.read_bytes() == content


def test_metrics_file_of_an_earlier_run_or_empty_is_taken(tmp_path):
    """An earlier run's file by the run that continues it (round 24: a fresh run is refused there,
    tests/test_newuser24_metrics.py): here `--save D --load D` before D's first checkpoint."""
    earlier = tmp_path / "run.jsonl"
    earlier.write_text('{"iteration": 1, "lm loss": 5.5}\n{"iteration": 2, "lm loss": 5.4}\n')
    (tmp_path / "empty.jsonl").write_text("")
    ck = str(tmp_path / "ck")
    for path, more in ((earlier, ["--save", ck, "--load", ck]), (tmp_path / "empty.jsonl", []),
                       (tmp_path / "new.jsonl", [])):
        assert validate(["--metrics-file", str(path)] + more)[0].metrics.metrics_file == str(path)


# --- 9. a --seq-length context parallelism cannot split: the line gives the lengths that work -----------------------
@pytest.mark.parametrize("cp, seq, near", [(2, 130, "128 or 132"), (4, 36, "32 or 40"), (4, 4, "8")])
def test_cp_sequence_length_that_does_not_split_names_the_nearest_that_do(cp, seq, near, one_line, monkeypatch):
    _world(monkeypatch, cp)
    line = one_line(lambda: validate(["--model", "tiny-llama", "--context-parallel-size", str(cp), "--seq-length",
                                      str(seq)]))
    assert line == (f"train.py: error: --seq-length {seq} is not divisible by 2 x --context-parallel-size {cp} = "
                    f"{2 * cp}; causal load balancing splits each sequence into {2 * cp} equal chunks: use a multiple "
                    f"of {2 * cp} "
                    f"({near})")
    for good in near.split(" or "):
        run = validate(["--model", "tiny-llama", "--context-parallel-size", str(cp), "--seq-length", good])[0]
        assert run.cp.size == cp and run.training.batch.seq_length == int(good)


# --- 10. Megatron's --tokenizer-type names: where the tokenizer goes here ---------------------------------------------
@pytest.mark.parametrize("name", ["GPT2BPETokenizer", "Llama2Tokenizer"])
def test_megatron_tokenizer_type_names_the_tokenizer_json_way(name, one_line, tmp_path):
    """'--tokenizer-type GPT2BPETokenizer' (Megatron's data docs' first example) was "invalid choice" alone, in
    train.py and in scripts/preprocess_data.py, whose --vocab-file / --merge-file said "see --help"."""
    from hybrid.data.preprocess import main as preprocess
    want = (f"invalid choice: '{name}' (choose from 'HuggingFaceTokenizer', 'ByteLevel'); Megatron's {name} is a "
            f"tokenizer.json here: --tokenizer-type HuggingFaceTokenizer --tokenizer-model tokenizer.json")
    assert want in one_line(lambda: validate(["--tokenizer-type", name]))
    args = ["--input", str(tmp_path / "c.jsonl"), "--output-prefix", str(tmp_path / "c")]
    line = one_line(lambda: preprocess(args + ["--tokenizer-type", name]))
    assert line.startswith("preprocess_data.py: error: argument --tokenizer-type: ") and want in line, line
    line = one_line(lambda: preprocess(args + ["--tokenizer-type", "ByteLevel", "--merge-file", "m.txt"]))
    assert "--merge-file: a GPT-2 BPE tokenizer is one tokenizer.json here" in line, line
    assert one_line(lambda: validate(["--tokenizer-type", "X"])).endswith("(choose from 'HuggingFaceTokenizer', "
                                                                          "'ByteLevel')")
    assert list(tmp_path.iterdir()) == []


# --- 11. a --watchdog-timeout the collectives' timeout always beats: the verdict could never print -------------------
@pytest.mark.parametrize("argv, seconds, minutes", [
    (["--watchdog-timeout", "900"], 900, 10),  # the default --distributed-timeout-minutes 10
    (["--watchdog-timeout", "60", "--distributed-timeout-minutes", "1"], 60, 1),
])
def test_watchdog_not_below_the_collective_timeout_is_one_line(argv, seconds, minutes, one_line):
    """docs/operations.md: "timeouts should nest"; a watchdog at or above the collectives' timeout was taken and
    could never fire (the collective times out first, with NCCL's message instead of the verdict)."""
    line = one_line(lambda: validate(argv))
    assert line == (f"train.py: error: --watchdog-timeout {seconds} s is not below --distributed-timeout-minutes "
                    f"{minutes} ({60 * minutes} s): a hung collective times out first and the hang verdict never "
                    f"prints; give a --watchdog-timeout below {60 * minutes} or a longer "
                    f"--distributed-timeout-minutes (--watchdog-timeout 0 turns the watchdog off)")


@pytest.mark.parametrize("argv", [["--watchdog-timeout", "59", "--distributed-timeout-minutes", "1"],
                                  ["--watchdog-timeout", "0", "--distributed-timeout-minutes", "0.5"],
                                  ["--distributed-timeout-minutes", "0.5"]])  # the default watchdog: left alone
def test_nested_timeouts_and_a_watchdog_turned_off_still_pass(argv):
    want = float(argv[1]) if argv[0] == "--watchdog-timeout" else 300.0
    assert validate(argv)[0].fault.watchdog_timeout == want


# --- 12. another tool's checkpoint folder as --load / --save / SRC: named, never read as ours or overwritten --------
def _megatron(root):
    """Megatron-LM's checkpoint folder: its tracker file and iter_0000002/mp_rank_00/ (the files by name)."""
    (root / "iter_0000002" / "mp_rank_00").mkdir(parents=True)
    (root / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"megatron")
    (root / "latest_checkpointed_iteration.txt").write_text("2")
    return root


def _deepspeed(root):
    """DeepSpeed's engine.save_checkpoint folder: `latest` naming global_step2/."""
    (root / "global_step2").mkdir(parents=True)
    (root / "global_step2" / "mp_rank_00_model_states.pt").write_bytes(b"deepspeed")
    (root / "latest").write_text("global_step2")
    return root


def _files(root) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("make, what, how", [
    (_megatron, "a Megatron-LM checkpoint (latest_checkpointed_iteration.txt)",
     "export it to a transformers folder with Megatron-LM's checkpoint converter, then give that folder to --load"),
    (_deepspeed, "a DeepSpeed checkpoint (latest + global_step*/)",
     "convert it first: hybrid convert {root} CKPT --model CONFIG, then --load CKPT (docs/convert.md)"),
])
def test_load_of_a_megatron_or_deepspeed_folder_names_it(make, what, how, tmp_path, one_line):
    """Both said "--load 'x' holds no complete checkpoint (only unfinished saves)": their iter_* / latest passed for
    hybrid's."""
    root = make(tmp_path / "ck")
    line = one_line(lambda: validate(["--load", str(root)]))
    assert line == (f"train.py: error: --load {str(root)!r} is {what}, which train.py does not read; "
                    + how.format(root=root))


@pytest.mark.parametrize("make, mine", [(_megatron, "its iter_* directory of each iteration saved"),
                                        (_deepspeed, "its `latest`")])
def test_save_into_a_megatron_or_deepspeed_folder_is_refused_and_changes_nothing(make, mine, tmp_path, one_line):
    """It was accepted: the run's save of iteration 2 would rmtree Megatron's iter_0000002/, and every save writes
    `latest` over DeepSpeed's."""
    root = make(tmp_path / "ck")
    before = _files(root)
    line = one_line(lambda: validate(["--save", str(root)]))
    assert line.startswith(f"train.py: error: --save {str(root)!r} holds a ") and f"would replace {mine}: " in line
    assert line.endswith("save to another directory, or pass --overwrite-save")
    assert _files(root) == before
    assert validate(["--save", str(root), "--overwrite-save"])[0].checkpoint.save == str(root)  # consent given


def test_convert_of_a_megatron_folder_names_it(tmp_path, one_line):
    import hybrid.cli
    root = _megatron(tmp_path / "ck")
    line = one_line(lambda: hybrid.cli.main(["convert", str(root), str(tmp_path / "out")]))
    assert line.startswith(f"hybrid convert: error: SRC {str(root)!r} is a Megatron-LM checkpoint "
                           f"(latest_checkpointed_iteration.txt), which hybrid convert does not read"), line
    assert not (tmp_path / "out").exists()


def test_megatron_hierarchical_cp_comm_type_says_it_is_not_implemented(one_line):
    """Megatron's --cp-comm-type a2a+p2p was "invalid choice" alone."""
    line = one_line(lambda: validate(["--cp-comm-type", "a2a+p2p"]))
    assert line == ("train.py: error: argument --cp-comm-type: invalid choice: 'a2a+p2p' (choose from 'p2p', 'a2a', "
                    "'allgather'); Megatron's hierarchical a2a+p2p is not implemented: use a2a (Ulysses, heads split "
                    "inside the CP group) or p2p (the ring) (docs/context-parallel.md)")
