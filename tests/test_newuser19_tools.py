"""Round 19: a new user's pass over the tools beside training -- hybrid convert, generate, checkpoint inspect and the
two data scripts -- with bad and edge inputs. Each finding is reproduced (what it did before is in the docstring) and
is now one line naming the flag or file and the fix, before any process group or work, with nothing written.

1. `hybrid convert ck/iter_0000003 out --iteration 0` exported iteration 3 and said nothing: --iteration was ignored
   for a SRC that is one iteration's folder.
2. A DeepSpeed checkpoint whose `*_model_states.pt` is empty, truncated or not a torch.save file: "DeepSpeed cannot
   read it as a ZeRO checkpoint (KeyError: 174812789)" (or "(EOFError: )"), the file unnamed, after DeepSpeed's own
   "Processing zero checkpoint ..." on stdout.
3. preprocess_data.py / train_tokenizer.py on a file that stops being UTF-8: "not UTF-8 text (byte 2609 of a read
   block)" after 10,000 documents -- no line to look at.
4. `hybrid checkpoint inspect conv/iter_0000000` on a conversion's iteration (which holds config.json) called it a
   transformers model folder and advised `--load conv/iter_0000000`, which train.py refuses; a missing path or
   iteration was "is not a directory", without the iterations the store holds.
5. `hybrid generate HF` with a config.json that does not match the weights: a config of fewer layers decoded with the
   first layers only, silently; more layers ended in a KeyError traceback on every rank; another width in a line
   naming `--load` (a flag generate does not take) -- all after the process group started.
6. The export of a converted checkpoint (no run) without tokenizer files: "the run recorded no tokenizer for its data
   (train with --tokenizer-type ...)".
7. `hybrid convert SRC hybrid/out`, `train_tokenizer.py --output hybrid/tok`, `preprocess_data.py --output-prefix
   hybrid/data/corpus`: written into the repository's Python package (train.py's --save is refused there).
8. The data tools given a JSON array (json.dump of a list) or text in a .md file: "line 1 is not JSON (Expecting
   value); give one JSON object per line" -- now what the file is and how to make it JSON lines or text.
9. `hybrid generate FILE` / an empty folder: "give a directory (... or a DeepSpeed checkpoint folder)", which generate
   refuses.
10. A transformers folder's model.safetensors.index.json truncated, or not an object: "not a readable safetensors
   checkpoint (TypeError: list indices must be integers or slices, not str)", the file unnamed.
11. preprocess_data.py --json-keys text text: two writers of the same files; train_tokenizer.py --input (no file, as
   `--input $FILES` with FILES empty): trained on pydoc's topics without a word.
12. convert / generate of an unfinished iteration folder (iter_N.tmp, or one without state.json): "not a transformers
   model folder ... or a DeepSpeed checkpoint" -- now the checkpoint directory to give instead.
13. train_tokenizer.py --output / preprocess_data.py --output-prefix inside a checkpoint directory (or one iteration
   of it): written there.
14. The data tools' --input a folder or a missing path: "is not a file" alike (train_tokenizer: without a fix).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hybrid.cli import main as hybrid_main

pytestmark = pytest.mark.usefixtures("one_process")


def _listing(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, ds, fs in os.walk(path) for n in ds + fs)


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory) -> str:
    """A tiny transformers Llama folder (2 layers, hidden 32, GQA)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    path = tmp_path_factory.mktemp("hf") / "llama"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=259, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 tie_word_embeddings=False)).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def converted(hf_llama, tmp_path_factory) -> str:
    """hf_llama converted to a hybrid checkpoint (iteration 0; it holds config.json in the iteration too)."""
    from hybrid.convert import hf_to_hybrid
    dst = str(tmp_path_factory.mktemp("conv") / "ck")
    hf_to_hybrid(hf_llama, dst, verify=False, log=lambda *a: None)
    return dst


# --- 1. --iteration with one iteration's folder -----------------------------------------------------------------------
def test_convert_iteration_naming_another_than_the_folder_is_refused(converted, tmp_path, one_line):
    src = os.path.join(converted, "iter_0000000")
    line = one_line(lambda: hybrid_main(["convert", src, str(tmp_path / "out"), "--iteration", "3", "--no-verify"]))
    assert line == (f"hybrid convert: error: --iteration 3: SRC {src!r} is iteration 0's folder; give the checkpoint "
                    f"directory ({converted} --iteration 3) or drop --iteration"), line
    assert not os.listdir(tmp_path)


def test_convert_iteration_naming_the_folders_own_is_taken(converted, hf_llama, tmp_path, capsys):
    """And (6.) the export of a conversion without tokenizer files says so; it said "the run recorded no tokenizer for
    its data (train with --tokenizer-type, ...)" of a checkpoint no run wrote."""
    hybrid_main(["convert", os.path.join(converted, "iter_0000000"), str(tmp_path / "out"), "--iteration", "0",
                 "--no-verify"])
    assert os.path.isfile(tmp_path / "out" / "model.safetensors")
    assert (f"tokenizer: none written -- SRC is a conversion of {hf_llama}, which held no tokenizer files (copy them "
            f"into the export)\n") in capsys.readouterr().out


# --- 2. a DeepSpeed file that is not a torch.save file --------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"junk\n", b"PK\x03\x04" + b"0" * 64, b"xyz not a pickle"],
                         ids=["empty", "legacy-magic", "broken-zip", "no-opcode"])
def test_a_deepspeed_file_torch_cannot_read_is_named(content, hf_llama, tmp_path, one_line, monkeypatch):
    step = tmp_path / "ds" / "global_step1"
    step.mkdir(parents=True)
    (tmp_path / "ds" / "latest").write_text("global_step1")
    (step / "mp_rank_00_model_states.pt").write_bytes(content)
    monkeypatch.chdir(tmp_path)
    before = _listing(tmp_path)
    line = one_line(lambda: hybrid_main(["convert", "ds", "out", "--model", hf_llama]), ignore=("[WARNING]",))
    assert line == ("hybrid convert: error: SRC ds/global_step1/mp_rank_00_model_states.pt: not a file torch.save "
                    "wrote (empty, truncated or another format); copy the DeepSpeed ZeRO checkpoint again"), line
    assert one_line.out == ""  # DeepSpeed's "Processing zero checkpoint 'ds/global_step1'" no longer printed
    assert _listing(tmp_path) == before


# --- 3. the line that is not UTF-8 ------------------------------------------------------------------------------------
def _late_latin1(path) -> None:
    with open(path, "wb") as f:
        for i in range(30):
            f.write(json.dumps({"text": f"doc {i}"}).encode() + b"\n")
        f.write(b'{"text": "caf\xe9"}\n')


def test_preprocess_names_the_line_that_is_not_utf8(tmp_path, one_line):
    from hybrid.data import preprocess
    _late_latin1(tmp_path / "a.jsonl")
    line = one_line(lambda: preprocess.main(["--input", str(tmp_path / "a.jsonl"), "--output-prefix",
                                             str(tmp_path / "o"), "--tokenizer-type", "ByteLevel"]))
    assert line.endswith("a.jsonl: line 31 is not UTF-8 text (byte 14 of the line is 0xe9); convert the file to "
                         "UTF-8, e.g. iconv -f latin1 -t utf-8"), line
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


def test_train_tokenizer_names_the_line_that_is_not_utf8(tmp_path, one_line):
    from hybrid.data.train_tokenizer import main
    (tmp_path / "a.txt").write_bytes(b"plain\n\ncaf\xe9\n")
    line = one_line(lambda: main(["--input", str(tmp_path / "a.txt"), "--output", str(tmp_path / "t")]))
    assert line.endswith("a.txt: line 3 is not UTF-8 text (byte 4 of the line is 0xe9); convert the file to UTF-8, "
                         "e.g. iconv -f latin1 -t utf-8"), line
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


# --- 4. checkpoint inspect of a conversion's iteration, and of paths that are not there -------------------------------
def test_inspect_reads_a_conversions_iteration(converted, capsys):
    hybrid_main(["checkpoint", "inspect", os.path.join(converted, "iter_0000000")])  # exit status 0: no SystemExit
    out = capsys.readouterr().out
    assert out.startswith("iter_0000000: iteration 0 | ") and "ok: every checksum matches" in out, out


@pytest.mark.parametrize("where, said", [
    ("{ck}/iter_0000005", "'{ck}/iter_0000005' does not exist: {ck} has no iteration 5 (its complete ones: 0); give "
                          "{ck} (the one `latest` names) or one of its iter_* directories"),
    ("{ck}_gone", "'{ck}_gone' does not exist; give a --save directory or one of its iter_* directories"),
    ("{ck}/latest", "'{ck}/latest' is not a directory; give a --save directory or one of its iter_* directories"),
])
def test_inspect_says_what_is_missing(where, said, converted, one_line):
    line = one_line(lambda: hybrid_main(["checkpoint", "inspect", where.format(ck=converted)]))
    assert line == "hybrid checkpoint inspect: error: " + said.format(ck=converted), line


# --- 5. generate: a transformers folder whose config.json is not its weights' -----------------------------------------
@pytest.mark.parametrize("field, value, said", [
    ("num_hidden_layers", 1, "tensor model.layers.1.input_layernorm.weight belongs to layer 1, but the model config "
                             "has 1 layer; use the config.json saved with this checkpoint"),
    ("num_hidden_layers", 3, "checkpoint has no tensor 'model.layers.2.input_layernorm.weight'; the checkpoint does "
                             "not match its config.json"),
    ("hidden_size", 64, "tensor model.embed_tokens.weight has shape [259, 32], but the model config implies "
                        "[259, 64]; use the config.json saved with this checkpoint"),
])
def test_generate_checks_the_weights_against_config_json_first(field, value, said, hf_llama, tmp_path, one_line):
    src = tmp_path / "m"
    src.mkdir()
    cfg = json.loads(open(os.path.join(hf_llama, "config.json")).read())
    (src / "config.json").write_text(json.dumps({**cfg, field: value}))
    shutil.copyfile(os.path.join(hf_llama, "model.safetensors"), src / "model.safetensors")
    line = one_line(lambda: hybrid_main(["generate", str(src), "--prompt-ids", "1,2", "--max-new-tokens", "1"]))
    assert line == f"hybrid generate: error: SRC {src}: {said}", line


# --- 7. outputs inside a Python package -------------------------------------------------------------------------------
def _package(tmp_path) -> str:
    """A repository's package (a folder holding __init__.py, one below it too), as hybrid/ and models/ are."""
    (tmp_path / "repo" / "pkg" / "sub").mkdir(parents=True)
    for d in ("pkg", "pkg/sub"):
        (tmp_path / "repo" / d / "__init__.py").write_text("")
    return str(tmp_path / "repo" / "pkg")


@pytest.mark.parametrize("tool", ["convert", "train_tokenizer", "preprocess"])
def test_an_output_inside_a_python_package_is_refused(tool, hf_llama, tmp_path, one_line, monkeypatch):
    """Before: `hybrid convert SRC hybrid/out`, `train_tokenizer.py --output hybrid/tok` and `preprocess_data.py
    --output-prefix hybrid/data/corpus` wrote there (train.py's --save was refused there since round 16)."""
    from hybrid.data import preprocess, train_tokenizer
    package = _package(tmp_path)
    (tmp_path / "a.jsonl").write_text('{"text": "abc"}\n')
    monkeypatch.chdir(tmp_path / "repo")
    flag, what, call = {
        "convert": ("DST", "the converted checkpoint",
                    lambda: hybrid_main(["convert", hf_llama, "pkg/sub/out", "--no-verify"])),
        "train_tokenizer": ("--output", "the tokenizer", lambda: train_tokenizer.main(
            ["--input", str(tmp_path / "a.jsonl"), "--output", "pkg/sub/out", "--vocab-size", "300"])),
        "preprocess": ("--output-prefix", "the dataset", lambda: preprocess.main(
            ["--input", str(tmp_path / "a.jsonl"), "--output-prefix", "pkg/sub/out", "--tokenizer-type", "ByteLevel"])),
    }[tool]
    before = _listing(tmp_path)
    line = one_line(call)
    assert line.endswith(f"{flag} 'pkg/sub/out' is inside the Python package {package} (its folders hold "
                         f"__init__.py): {what} would be written among its source files; give a path outside it, "
                         f"e.g. {flag} out"), line
    assert _listing(tmp_path) == before


# --- 8. a JSON array, and text in a file that is not .txt ------------------------------------------------------------
@pytest.mark.parametrize("name, text, said", [
    ("a.json", '[\n  {"text": "a"}\n]\n', "line 1 is not JSON (...); the file is one JSON array, not JSON lines: write "
                                         "an object per line, e.g. jq -c '.[]' {d}/a.json > {d}/a.jsonl"),
    ("a.json", '[{"text": "a"}]\n', "line 1 is not a JSON object; the file is one JSON array, not JSON lines: write "
                                    "an object per line, e.g. jq -c '.[]' {d}/a.json > {d}/a.jsonl"),
    ("notes.md", "Some text.\n", "line 1 is not JSON (...); JSON lines are read from .jsonl / .json files, plain text "
                                 "(paragraphs as documents) from .txt: name the file notes.txt if it is text"),
])
@pytest.mark.parametrize("tool", ["preprocess", "train_tokenizer"])
def test_an_input_that_is_not_json_lines_says_what_it_is(tool, name, text, said, tmp_path, one_line):
    """Before: "line 1 is not JSON (Expecting value); give one JSON object per line" for all three (train_tokenizer:
    "line 1 has no string 'text'" for the one-line array)."""
    from hybrid.data import preprocess, train_tokenizer
    (tmp_path / name).write_text(text)
    src = str(tmp_path / name)
    call = {"preprocess": lambda: preprocess.main(["--input", src, "--output-prefix", str(tmp_path / "o"),
                                                   "--tokenizer-type", "ByteLevel"]),
            "train_tokenizer": lambda: train_tokenizer.main(["--input", src, "--output", str(tmp_path / "t")])}[tool]
    line = one_line(call)
    head, tail = said.format(d=tmp_path).split("(...)") if "(...)" in said else (said.format(d=tmp_path), "")
    assert f"--input {src}: {head}" in line and line.endswith(tail or head), line
    assert sorted(os.listdir(tmp_path)) == [name]


# --- 9. generate's errors offer only what it reads ------------------------------------------------------------------
@pytest.mark.parametrize("make, said", [
    (lambda p: p.write_text("{}"), "is a file; give a directory (a transformers model folder, a hybrid checkpoint "
                                   "directory or one iter_*/ of it)"),
    (lambda p: p.mkdir(), "is not a transformers model folder (config.json + model.safetensors) nor a hybrid "
                          "checkpoint (latest + iter_*/)"),
])
def test_generate_does_not_offer_a_deepspeed_folder(make, said, tmp_path, one_line):
    """Before: "give a directory (..., a hybrid checkpoint directory or a DeepSpeed checkpoint folder)" -- and a
    DeepSpeed folder is then refused: "generate reads a hybrid checkpoint or a transformers folder; convert it
    first"."""
    make(tmp_path / "src")
    line = one_line(lambda: hybrid_main(["generate", str(tmp_path / "src"), "--prompt-ids", "1"]))
    assert line == f"hybrid generate: error: SRC {str(tmp_path / 'src')!r} {said}", line


# --- 10. a transformers index that is not one ---------------------------------------------------------------------
@pytest.mark.parametrize("index, why", [('{"weight_map": ', "JSONDecodeError: truncated?"), ("[]", "no weight_map"),
                                        ('{"weight_map": [1]}', "its weight_map is not an object")])
@pytest.mark.parametrize("command", ["convert", "generate"])
def test_an_index_that_is_not_one_is_named(command, index, why, hf_llama, tmp_path, one_line):
    """Before: "not a readable safetensors checkpoint (TypeError: list indices must be integers or slices, not str)"
    for a list, "(JSONDecodeError: Expecting property name ...)" for a truncated index -- the file unnamed."""
    src = tmp_path / "m"
    src.mkdir()
    shutil.copyfile(os.path.join(hf_llama, "config.json"), src / "config.json")
    (src / "model.safetensors.index.json").write_text(index)
    argv = [str(tmp_path / "out")] if command == "convert" else ["--prompt-ids", "1"]
    line = one_line(lambda: hybrid_main([command, str(src), *argv]))
    assert line == (f"hybrid {command}: error: SRC {src}: model.safetensors.index.json is not the index "
                    f"save_pretrained writes ({why}); copy the model folder again"), line
    assert sorted(os.listdir(tmp_path)) == ["m"]


# --- 11. the data tools' flags that named nothing twice or nothing at all ---------------------------------------------
def test_preprocess_refuses_a_json_key_given_twice(tmp_path, one_line):
    """Before: `--json-keys text text` ran two writers of the same o_text_document.bin/.idx ("-> o_text_document,
    o_text_document.bin/.idx")."""
    from hybrid.data import preprocess
    (tmp_path / "a.jsonl").write_text('{"text": "abc"}\n')
    line = one_line(lambda: preprocess.main(["--input", str(tmp_path / "a.jsonl"), "--json-keys", "text", "text",
                                             "--output-prefix", str(tmp_path / "o"), "--tokenizer-type", "ByteLevel"]))
    assert line.endswith(f"--json-keys text text: 'text' is given twice; each key writes its own "
                         f"{tmp_path}/o_text_document.bin/.idx once: give it once"), line
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl"]


def test_train_tokenizer_refuses_input_given_no_file(tmp_path, one_line):
    """Before: `--input $FILES` with FILES empty trained on Python's pydoc topics without a word."""
    from hybrid.data.train_tokenizer import main
    line = one_line(lambda: main(["--input", "--output", str(tmp_path / "t"), "--vocab-size", "300"]))
    assert line == ("train_tokenizer.py: error: --input was given no file; give the text or JSON-lines files, or drop "
                    "--input to train on Python's pydoc topics"), line
    assert not os.listdir(tmp_path)


# --- 12. SRC one unfinished (or damaged) iteration folder ------------------------------------------------------------
@pytest.mark.parametrize("command", ["convert", "generate"])
def test_an_unfinished_iteration_folder_names_its_checkpoint_directory(command, converted, tmp_path, one_line):
    """Before: "SRC 'ck/iter_0000004.tmp' is not a transformers model folder (config.json + model.safetensors), a
    hybrid checkpoint (...) or a DeepSpeed checkpoint (...)"; a conversion's iteration without state.json "has a
    config.json but no model.safetensors"."""
    ck = tmp_path / "ck"
    shutil.copytree(converted, ck)
    unfinished = ck / "iter_0000004.tmp"
    shutil.copytree(ck / "iter_0000000", unfinished)
    for name in (".metadata", "manifest.json", "state.json"):
        os.remove(unfinished / name)
    before = _listing(tmp_path)
    argv = [str(tmp_path / "out")] if command == "convert" else ["--prompt-ids", "1"]
    line = one_line(lambda: hybrid_main([command, str(unfinished), *argv]))
    assert line == (f"hybrid {command}: error: SRC {str(unfinished)!r} is not a complete checkpoint of {ck} (no "
                    f".metadata or state.json: a save that did not finish, or a damaged copy); give {ck} (its newest "
                    f"complete one) -- `hybrid checkpoint inspect {ck}` lists them"), line
    assert _listing(tmp_path) == before


def test_generate_counts_one_new_token_in_the_singular(hf_llama, capsys):
    """Before: "generate: 1 new tokens (greedy): ..."."""
    hybrid_main(["generate", hf_llama, "--prompt-ids", "1,2", "--max-new-tokens", "1"])
    assert capsys.readouterr().out.startswith("generate: 1 new token (greedy): "), "singular"


# --- 13. the data tools' outputs inside a checkpoint directory ------------------------------------------------------
@pytest.mark.parametrize("inside", ["ck/out", "ck/iter_0000000/out"])
@pytest.mark.parametrize("tool", ["train_tokenizer", "preprocess"])
def test_a_data_output_inside_a_checkpoint_is_refused(tool, inside, converted, tmp_path, one_line, monkeypatch):
    """Before: both wrote there -- into an iteration a save replaces and --save-keep deletes (train.py's outputs and
    convert's DST are refused there since round 17)."""
    from hybrid.data import preprocess, train_tokenizer
    shutil.copytree(converted, tmp_path / "ck")
    (tmp_path / "a.jsonl").write_text('{"text": "abc"}\n')
    monkeypatch.chdir(tmp_path)
    flag, what, call = {
        "train_tokenizer": ("--output", "the tokenizer", lambda: train_tokenizer.main(
            ["--input", "a.jsonl", "--output", inside, "--vocab-size", "300"])),
        "preprocess": ("--output-prefix", "the dataset", lambda: preprocess.main(
            ["--input", "a.jsonl", "--output-prefix", inside, "--tokenizer-type", "ByteLevel"])),
    }[tool]
    before = _listing(tmp_path)
    line = one_line(call)
    assert line.endswith(f"{flag} {inside!r} is inside the checkpoint directory {tmp_path / 'ck'} (iter_*/, latest): "
                         f"{what} would be written among its checkpoints; give a path beside it, e.g. {flag} out"), line
    assert _listing(tmp_path) == before


# --- 14. --input a folder, or a path that is not there --------------------------------------------------------------
@pytest.mark.parametrize("tool, give", [
    ("preprocess", "a JSON-lines or .txt file (one --input: join several with cat)"),
    ("train_tokenizer", "text (.txt) or JSON-lines files"),
])
@pytest.mark.parametrize("kind", ["folder", "missing"])
def test_an_input_that_is_a_folder_or_missing_says_which(tool, give, kind, tmp_path, one_line):
    """Before: "--input 'data' is not a file; give ..." for both (train_tokenizer: "is not a regular file" / "is not a
    file", no fix)."""
    from hybrid.data import preprocess, train_tokenizer
    src = tmp_path / "data"
    if kind == "folder":
        src.mkdir()
    call = {"preprocess": lambda: preprocess.main(["--input", str(src), "--output-prefix", str(tmp_path / "o"),
                                                   "--tokenizer-type", "ByteLevel"]),
            "train_tokenizer": lambda: train_tokenizer.main(["--input", str(src), "--output",
                                                             str(tmp_path / "t")])}[tool]
    line = one_line(call)
    what = "is a directory" if kind == "folder" else "does not exist"
    folder = f", e.g. --input {src}/*.txt" if kind == "folder" and tool == "train_tokenizer" else ""
    assert line.endswith(f"--input {str(src)!r} {what}; give {give}{folder}"), line
