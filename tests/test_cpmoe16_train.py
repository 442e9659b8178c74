"""CP x EP through train.py, as users launch it (forked ranks, gloo): tiny-mixtral at --context-parallel-size 2 x
--expert-model-parallel-size 2 on 4 ranks (dp 2; each EP group a CP pair), ZeRO 1, the balancing loss, the z-loss
and DeepSeek-V3's expert bias on.

* Saved after step 4 and resumed for steps 5-6, the run equals the uninterrupted one bit for bit: every logged
  loss and every saved tensor (master weights, Adam moments, the routers' expert biases) -- the shared
  tests/test_compress_train.assert_resume_bit_for_bit.
* `hybrid checkpoint inspect` calls that checkpoint loadable at cp 2 x ep 2 and at cp 1 x ep 4 (a checkpoint
  stores every expert whole and CP changes no parameter).
* Step 1's LM loss and the log's balancing and z-losses equal the same run's at cp 1 (dp 4, the micro-batches the
  same 2 sequences) within 1e-5 relative: the CP ranks' counts are summed over CP by the run train.py builds
  (hybrid/train/loop.expert_context hands the layers the CP and tp_cp groups). Broken on purpose (the CP sum
  left out of hybrid/moe/layer._group_counts) the cp 2 run logs an aux loss of 0.0220 against cp 1's 0.0439 and
  this test fails.

Slow: four train.py runs of 4 ranks end to end. The fast tier keeps CP x EP's numerics in
tests/test_cpmoe16_parallel.py and tests/test_cpmoe16_units.py."""

from __future__ import annotations

import json
import os

import pytest

from hybrid import testing
from test_compress_train import ROOT, assert_resume_bit_for_bit

FLAGS = ["--model", "tiny-mixtral", "--expert-model-parallel-size", "2", "--global-batch-size", "8",
         "--micro-batch-size", "2", "--seq-length", "32", "--log-interval", "1", "--lr", "3e-3", "--train-iters", "6",
         "--zero-stage", "1", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001",
         "--moe-router-enable-expert-bias", "--eval-iters", "1"]
CP2 = ["--context-parallel-size", "2"]


def _run(flags: list[str]):
    out = testing.torchrun(FLAGS + flags, 4, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _records(path) -> dict[int, dict]:
    with open(path) as f:
        return {r["iteration"]: r for r in map(json.loads, f) if "lm_loss" in r}


@pytest.mark.slow
def test_cp2_ep2_run_resumes_bit_for_bit_and_its_routing_equals_cp1(tmp_path, capsys):
    tensors = assert_resume_bit_for_bit(lambda flags: _run(CP2 + flags), tmp_path)
    assert any(k.startswith("moe/") and k.endswith("expert_bias") for k in tensors), sorted(tensors)[:8]
    assert any(".experts." in k for k in tensors)
    # inspect: loadable at the layout it was saved at, and at another EP without CP
    from hybrid.cli import main
    ckpt = str(tmp_path / "straight" / "ckpt")
    for cp, ep in ((2, 2), (1, 4)):
        capsys.readouterr()
        main(["checkpoint", "inspect", ckpt, "--world-size", "4", "--context-parallel-size", str(cp),
              "--expert-model-parallel-size", str(ep)])
        out = capsys.readouterr().out
        where = f"at tp 1{' x cp 2' if cp > 1 else ''} x pp 1 (ep {ep}) on 4 ranks: loadable (dp {4 // cp};"
        assert where in out and "NOT loadable" not in out, out
    # step 1 at cp 1 (dp 4): the same micro-batches, so the same LM, balancing and z-losses
    _run(["--train-iters", "1", "--metrics-file", str(tmp_path / "cp1.jsonl")])
    cp1, cp2 = _records(tmp_path / "cp1.jsonl")[1], _records(tmp_path / "straight" / "m.jsonl")[1]
    for key in ("lm_loss", "moe_aux_loss", "moe_z_loss"):
        assert cp1[key] > 0 and abs(cp2[key] - cp1[key]) <= 1e-5 * cp1[key], (key, cp2[key], cp1[key])
    assert cp2["moe_tokens_per_expert_max"] == cp1["moe_tokens_per_expert_max"]  # 8 x 32 x 2 slots either way
    assert os.path.isdir(tmp_path / "straight" / "ckpt")
