"""`hybrid convert` says what it is doing while it works (round 19: nothing until done -- minutes on a 7B): on
stderr, "convert: ..." lines naming each source file read (file j of n), each target rank's chunks written (rank r
of R), and, exporting to transformers, the tensor (i of N) and safetensors file (j of n) at every tenth of the
tensors and at the end of each file; `--quiet` prints none of them (nor verify's announcement, nor transformers'
loading bar). The summary on stdout and the files written are the same either way.

In this process, on a tiny Llama saved by transformers in 4 safetensors shards (hybrid.cli.main, as the command)."""

from __future__ import annotations

import json
import os
import re
import struct

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hybrid.cli import main as hybrid_main
from hybrid.convert.common import PROGRESS_PARTS
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)

TENSORS = 21  # embed, 2 layers x 9 (4 attention, 3 MLP, 2 norms), final norm, untied LM head


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> str:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=48, vocab_size=259,
                                         max_position_embeddings=64, tie_word_embeddings=False))
    path = str(tmp_path_factory.mktemp("hf") / "model")
    model.save_pretrained(path, max_shard_size="40KB")
    return path


def _convert(argv: list[str], capsys) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of `hybrid convert ARGV`; transformers' loading bar (several lines by its
    carriage returns) counts as one line, "Loading weights"."""
    capsys.readouterr()
    hybrid_main(["convert", *argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    bar = [i for i, ln in enumerate(lines) if ln.startswith("Loading weights")]
    return out.splitlines(), [ln for i, ln in enumerate(lines) if i not in bar[1:]]


def _files(d: str) -> dict[str, bytes]:
    """Every file under `d` by relative path but state.json / manifest.json (DST's own path, the .metadata's
    checksum) and DCP's .metadata (a random save id); the tensors are in the .distcp / .safetensors files."""
    found = {}
    for root, _, names in os.walk(d):
        for n in names:
            path = os.path.join(root, n)
            if n not in ("state.json", "manifest.json", ".metadata"):
                found[os.path.relpath(path, d)] = open(path, "rb").read()
    return found


def _stored_order(path: str) -> list[str]:
    """A safetensors file's keys in the order of their bytes (its header: 8-byte length, then JSON)."""
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda k: header[k]["data_offsets"][0])


def test_to_hybrid_names_each_file_read_and_each_ranks_chunks_and_quiet_prints_none(hf, tmp_path, capsys):
    shards = sorted(n for n in os.listdir(hf) if n.endswith(".safetensors"))
    assert len(shards) >= 3
    target = ["--target-tensor-parallel-size", "2"]
    out, err = _convert([hf, str(tmp_path / "ck"), *target], capsys)
    reads = [ln for ln in err if ln.startswith("convert: reading ")]
    assert [re.match(r"convert: reading (\S+) \(file (\d+)/(\d+)\): \d+ tensors?, [\d.]+ kB as float32$", ln).groups()
            for ln in reads] == [(name, str(j), str(len(shards))) for j, name in enumerate(shards, 1)], err
    assert [ln.split(":")[1] for ln in err if "chunks" in ln] == [" writing rank 1/2's chunks", " writing rank 2/2's "
                                                                  "chunks"], err
    assert err[-2].startswith("verify: loading the converted model") and err[-1].startswith("Loading weights"), err
    assert len(err) == len(shards) + 2 + 2, err  # nothing else
    quiet_out, quiet_err = _convert([hf, str(tmp_path / "ck_q"), *target, "--quiet"], capsys)
    assert quiet_err == [] and quiet_out == [ln.replace("ck", "ck_q", 1) if "-> " in ln else ln for ln in out] \
        and out[-1].startswith("verify: OK"), (quiet_out, out)
    assert _files(str(tmp_path / "ck")) == _files(str(tmp_path / "ck_q"))


def test_to_hf_names_the_tensor_and_file_every_tenth_and_at_each_files_end(hf, tmp_path, capsys):
    _convert([hf, str(tmp_path / "ck"), "--quiet", "--no-verify"], capsys)
    out, err = _convert([str(tmp_path / "ck"), str(tmp_path / "out"), "--max-shard-size", "40kB"], capsys)
    written = sorted(n for n in os.listdir(tmp_path / "out") if n.endswith(".safetensors"))
    assert len(written) >= 3, written
    lines = [re.fullmatch(r"convert: tensor (\d+)/(\d+) \((\S+)\) -> (\S+) \(file (\d+)/(\d+)\), ([\d.]+) kB of "
                          r"([\d.]+) kB", ln) for ln in err[:-2]]
    assert all(lines), err
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())["weight_map"]
    order = [key for name in written for key in _stored_order(str(tmp_path / "out" / name))]
    ends = {i + 1 for i in range(TENSORS) if i + 1 == TENSORS or index[order[i]] != index[order[i + 1]]}
    step = -(-TENSORS // PROGRESS_PARTS)  # ceil: at most PROGRESS_PARTS lines besides the files' ends
    assert [int(m.group(1)) for m in lines] == sorted(set(range(step, TENSORS + 1, step)) | ends), err
    assert [(m.group(3), m.group(4)) for m in lines] == [(order[int(m.group(1)) - 1], index[order[int(m.group(1)) - 1]])
                                                         for m in lines], err
    assert {(m.group(2), m.group(6)) for m in lines} == {(str(TENSORS), str(len(written)))}, err
    assert [m.group(4) for m in lines if int(m.group(1)) in ends] == written, err
    assert lines[-1].group(7) == lines[-1].group(8), err  # all the bytes by the last
    assert err[-2].startswith("verify: loading the converted model") and err[-1].startswith("Loading weights"), err
    quiet_out, quiet_err = _convert([str(tmp_path / "ck"), str(tmp_path / "out_q"), "--max-shard-size", "40kB", "-q"],
                                    capsys)
    assert quiet_err == [] and quiet_out == [ln.replace("out", "out_q", 1) if "-> " in ln else ln for ln in out], \
        (quiet_out, out)
    assert _files(str(tmp_path / "out")) == _files(str(tmp_path / "out_q"))
