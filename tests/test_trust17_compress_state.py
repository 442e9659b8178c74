"""Compression state read back from a checkpoint is checked before use, one line naming the file and the key:

* the plain counters in state.json (`compress/powersgd`, `compress/momentum_powersgd`, `compress/onebit`: the step
  count and the layout the tensors were saved at, which before_load maps them by) are typed and ranged by
  store.read_state, before any process group -- a forged `"iter": "many"` was a TypeError deep in the load, a
  `"tp": 1.5` a wrong global shape;
* the tensors (error feedback, warm-start Q; DiLoCo's outer state through the same check) must be finite: a NaN
  error feedback is added into every later compressed gradient. Shown live: saved and loaded through
  checkpoint.core on one gloo rank, the NaN error feedback was taken as it was.
"""

from __future__ import annotations

import json

import pytest
import torch

from hybrid import testing
from hybrid.checkpoint import store

STATE = {"iteration": 5, "consumed_samples": 40, "model": "tiny-gpt2", "contents": "model",
         "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0}, "format": store.FORMAT}
GOOD = {"compress/powersgd": {"iter": 5, "dp": 2, "tp": 1, "pp": 1, "rank": 2},
        "compress/onebit": {"iter": 0, "dp": 2, "tp": 1, "pp": 1}}
FORGED = [("compress/powersgd", {"iter": "many", "dp": 2, "tp": 1, "pp": 1, "rank": 2}, "compress/powersgd.iter"),
          ("compress/powersgd", {"iter": 5, "dp": 2, "tp": 1.5, "pp": 1, "rank": 2}, "compress/powersgd.tp"),
          ("compress/powersgd", {"iter": 5, "dp": 2, "tp": 1, "pp": 1}, "compress/powersgd"),  # no rank
          ("compress/momentum_powersgd", [5, 2, 1, 1, 2], "compress/momentum_powersgd"),
          ("compress/onebit", {"iter": 3, "dp": 0, "tp": 1, "pp": 1}, "compress/onebit.dp"),
          ("compress/onebit", {"iter": -1, "dp": 2, "tp": 1, "pp": 1}, "compress/onebit.iter")]


def _state_dir(tmp_path, **fields) -> str:
    d = tmp_path / "iter_0000005"
    d.mkdir()
    (d / "state.json").write_text(json.dumps({**STATE, **fields}))
    return str(d)


def test_written_compression_counters_pass(tmp_path):
    assert store.read_state(_state_dir(tmp_path, **GOOD))["compress/powersgd"]["rank"] == 2


@pytest.mark.parametrize("key,value,named", FORGED, ids=[f[2] + "=" + json.dumps(f[1])[:20] for f in FORGED])
def test_forged_compression_counters_are_one_line_naming_the_key(key, value, named, tmp_path):
    d = _state_dir(tmp_path, **{key: value})
    with pytest.raises(store.CorruptCheckpoint) as e:
        store.read_state(d)
    assert str(e.value).startswith(f"{d}/state.json: {named} is "), e.value


# --- the tensors: finite, or refused ------------------------------------------------------------------------------
def _save_and_load(rank: int, world: int, root: str, poison: bool) -> str:
    """PowerSGD's state on one rank (the kv-projection bucket of test_trust17_kv_q), saved with its error feedback
    NaN or not, loaded into a fresh owner; the error, or the Q read back."""
    from hybrid.checkpoint import core
    from hybrid.compress.state import PowerSGDCheckpoint
    from tests.test_trust17_kv_q import _reduction
    q = torch.randn(64, generator=torch.Generator().manual_seed(3))
    red = _reduction(0, q)
    if poison:
        red.state.error[0][7] = float("nan")
    core.save_state({"compress/": PowerSGDCheckpoint(red)}, root, 5, dict(STATE)).finish()
    fresh = PowerSGDCheckpoint(_reduction(0, None))
    try:
        core.load_state({"compress/": fresh}, store.final_path(root, 5))
    except store.CorruptCheckpoint as e:
        return str(e)
    return "loaded, Q equal" if torch.equal(fresh.red.state.q[0], q) else "loaded, Q differs"


def test_a_nan_error_feedback_is_refused_naming_the_file_and_key_and_a_clean_one_loads(tmp_path):
    clean, = testing.run_distributed(_save_and_load, 1, (str(tmp_path / "clean"), False))
    assert clean == "loaded, Q equal"
    line, = testing.run_distributed(_save_and_load, 1, (str(tmp_path / "nan"), True))
    want = f"{store.final_path(str(tmp_path / 'nan'), 5)}/__0_0.distcp: compress/powersgd.error/layers.0.attn.k_proj" \
           f".weight holds NaN or inf"
    assert line.startswith(want) and "\n" not in line, line
