"""train.py --compile (each Transformer block's forward under torch.compile) trains as the eager run does: tp 2
with sequence parallelism and dropout on both residual branches and the attention probabilities, so the TP
collectives, the sequence-parallel gathers and the tensor-parallel dropout streams all run inside compiled
forwards. Inductor fuses the elementwise kernels but keeps fp32 arithmetic: fp32 tolerance 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--model", "tiny-gpt2", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--hidden-dropout", "0.1",
         "--attention-dropout", "0.1", "--train-iters", "3", "--log-interval", "1", "--eval-iters", "0"]


def _losses(tmp_path, extra: list[str]) -> list[float]:
    out = tmp_path / f"m{len(extra)}.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "scripts", "train.py"), *FLAGS, "--metrics-file", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [r["lm_loss"] for r in map(json.loads, out.read_text().splitlines()) if "lm_loss" in r]


def test_compiled_blocks_train_as_the_eager_run(tmp_path):
    eager, compiled = _losses(tmp_path, []), _losses(tmp_path, ["--compile"])
    assert len(eager) == len(compiled) == 3
    for a, b in zip(compiled, eager):
        assert abs(a - b) <= 1e-5 * abs(b), (compiled, eager)
