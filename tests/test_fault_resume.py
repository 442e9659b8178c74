"""Restarts that continue a run exactly, and restarts on another number of ranks.

* Auto-resume: a worker SIGKILLed under `torchrun --max-restarts 2` -- mid-step, inside gradient accumulation
  (a seeded random iteration, micro-batch and rank) -- and the restarted job resumes by itself from the latest
  complete checkpoint in --save: every loss it logs (as exact float reprs from --metrics-file, the re-run
  iterations included) and every tensor of its final checkpoint (parameters, Adam moments, master weights) equal
  the uninterrupted run's, at tp2 x dp2 (4 ranks) and tp2 x pp2 x dp2 (8 ranks). At tp2 x dp2 the restarted
  attempt is SIGKILLed again inside its first save (between a rank's files and the metadata); the third attempt
  resumes from the checkpoint before it.
* Elastic: a run saved on 8 ranks (tp2 x pp2 x dp2) and restarted on 4 with --auto-parallel re-plans the layout,
  reshards the checkpoint and continues with the same global batch and data order: its losses stay within fp32
  reduction noise of the uninterrupted 8-rank run (another summation order; the bound is derived below).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hybrid import testing
from hybrid.fault.attempt import agree
from hybrid.testing import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMON = ["--global-batch-size", "8", "--seq-length", "32", "--log-interval", "1", "--lr", "3e-3",
          "--eval-iters", "1"]  # the end's validation and test passes on one batch each (no check reads them)
MICRO = ["--micro-batch-size", "2"]  # --auto-parallel picks its own
TP2PP2 = MICRO + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
TP2 = MICRO + ["--tensor-model-parallel-size", "2"]
ITERS = ["--train-iters", "8"]
SEED = 20261203  # draws where each kill lands


def _torchrun(nproc: int, flags: list[str], env: dict | None = None, restarts: int = 0) -> subprocess.CompletedProcess:
    """The real torchrun agent where it is the subject (restarts > 0): `python -m torch.distributed.run` run as a
    fork of hybrid.testing's forkserver (testing.run: torchrun's own code as __main__, without a new interpreter's
    ~2 s of CPU importing torch), each attempt's workers forked too (hybrid.testing.agent_run's fork_service: the
    agent's restarts, rendezvous and teardown as they are, without each worker's interpreter start-up); else the
    same job as forked ranks (torchrun's environment, no agent)."""
    env = {"HYBRID_FAULT": None, "OMP_NUM_THREADS": "1", **(env or {})}  # no fault unless the test injects one
    if not restarts:
        return testing.torchrun(COMMON + flags, nproc, env=env, cwd=ROOT, timeout=600)
    agent = ["--nproc-per-node", str(nproc), "--max-restarts", str(restarts), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"localhost:{free_port()}"]
    with testing.fork_service() as service:
        return testing.run(["-m", "torch.distributed.run", *agent,
                            *testing.worker_command(["-m", "hybrid.train", *COMMON, *flags])],
                           env={**env, **service}, cwd=ROOT, timeout=600)


def _losses(out: str) -> dict[int, list[str]]:
    """iteration -> every loss printed for it (a resumed job prints the re-run iterations again)."""
    found: dict[int, list[str]] = {}
    for it, loss in re.findall(r"iteration +(\d+)/\d+ \| lm loss (\S+)", out):
        found.setdefault(int(it), []).append(loss)
    return found


def _agree_all(master: "dist.TCPStore", world: int, delays: list[float]) -> list[str]:
    """Every rank's result of `agree`, each rank a thread on its own store client, starting after its delay."""
    out: list[str | None] = [None] * world

    def rank(r: int) -> None:
        time.sleep(delays[r])
        client = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=20))
        out[r] = agree(client, r, world, timedelta(seconds=20))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_ranks_agree_on_a_fresh_attempt_id_over_an_earlier_attempts_keys():
    """A second attempt on the same store, its rank 0 first (so it reads every hello/r the first attempt left),
    then its ranks in reverse: all get one id, not the first attempt's."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    first = _agree_all(master, 4, [0.0, 0.0, 0.0, 0.0])
    assert len(set(first)) == 1
    second = _agree_all(master, 4, [0.0, 0.6, 0.4, 0.2])
    assert len(set(second)) == 1 and second[0] != first[0], (first, second)
    fewer = _agree_all(master, 2, [0.3, 0.0])  # a membership change: another world, the same store
    assert len(set(fewer)) == 1 and fewer[0] not in (first[0], second[0])


def _json_losses(path: str) -> dict[int, list[str]]:
    """iteration -> repr of every lm loss the metrics file holds for it (appended across restarts)."""
    found: dict[int, list[str]] = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "lm_loss" in rec:
                found.setdefault(rec["iteration"], []).append(repr(rec["lm_loss"]))
    return found


def _tensors(root: str) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint `latest` names -- model, fp32 master weights, Adam moments -- each read
    whole by DCP in this one process (DCP reassembles the ranks' chunks)."""
    it_dir = os.path.join(root, open(os.path.join(root, "latest")).read().strip())
    meta = dcp.FileSystemReader(it_dir).read_metadata().state_dict_metadata
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items()
          if isinstance(m, TensorStorageMetadata)}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(it_dir), no_dist=True)
    return sd


def _straight(tmp_path_factory, nproc: int, layout: list[str]) -> tuple[dict[int, list[str]], str, str]:
    """The uninterrupted run: (losses from its metrics file, its stdout, its checkpoints: `latest` the final one).
    A save changes no number (the killed runs' equality to this one proves it again)."""
    d = tmp_path_factory.mktemp(f"straight{nproc}")
    metrics, save = str(d / "metrics.jsonl"), str(d / "ckpt")
    out = _torchrun(nproc, layout + ITERS + ["--save", save, "--metrics-file", metrics])
    assert out.returncode == 0, out.stderr[-3000:]
    return _json_losses(metrics), out.stdout, save


@pytest.fixture(scope="module")
def straight4(tmp_path_factory):
    return _straight(tmp_path_factory, 4, TP2)


@pytest.fixture(scope="module")
def straight8(tmp_path_factory):
    """Saved at iteration 4 too: where the run restarted on fewer ranks takes over."""
    return _straight(tmp_path_factory, 8, TP2PP2 + ["--save-interval", "4"])


def _kill(nproc: int, micro_batches: int) -> str:
    """HYBRID_FAULT for one SIGKILL in torchrun's first attempt, before a TP all-reduce of a seeded random
    rank, iteration (after the first save at 3, so a checkpoint exists; 8 is the last) and micro-batch."""
    rng = random.Random(SEED + nproc)
    rank, iteration, mb = rng.randrange(nproc), rng.randint(4, 8), rng.randrange(micro_batches)
    return f"signal:rank={rank},iteration={iteration},microbatch={mb},op=tp.all_reduce,signal=SIGKILL,restart=0"


def _killed_and_restarted(tmp_path, nproc: int, layout: list[str], straight, in_save: bool = False) -> None:
    """in_save: the restarted attempt is killed too, inside its first save (a seeded rank, after writing its own
    file, before DCP's .metadata), and the third attempt resumes from the checkpoint before that save."""
    want, _, want_ckpt = straight
    metrics, save = str(tmp_path / "metrics.jsonl"), str(tmp_path / "ckpt")
    fault = _kill(nproc, micro_batches=2)  # global 8 = micro 2 x dp 2 x 2 micro-batches
    if in_save:
        rank = random.Random(SEED - nproc).randrange(nproc)
        fault += f";crash:point=after_rank_files,rank={rank},signal=SIGKILL,restart=1"
    out = _torchrun(nproc, layout + ITERS + ["--save", save, "--save-interval", "3", "--metrics-file", metrics],
                    env={"HYBRID_FAULT": fault}, restarts=2)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "inject: SIGKILL" in out.stdout or "inject: rank" in out.stdout, (fault, out.stdout[-2000:])
    assert out.stdout.count("checkpoint: resumed from") == 1 + in_save, out.stdout[-3000:]
    if in_save:
        assert "at crash point after_rank_files" in out.stdout, out.stdout[-3000:]
    got = _json_losses(metrics)
    assert sorted(got) == sorted(want) == list(range(1, 9)), (fault, got)
    for it, losses in got.items():
        assert set(losses) == set(want[it]), (fault, it, losses, want[it])  # exact reprs, re-runs included
    ref, resumed = _tensors(want_ckpt), _tensors(save)
    assert sorted(resumed) == sorted(ref)
    for k in ref:
        assert torch.equal(resumed[k], ref[k]), (fault, k)


@pytest.mark.slow
def test_killed_mid_accumulation_then_mid_save_under_torchrun_restarts_and_matches_bit_for_bit_tp2_dp2(
        tmp_path, straight4):
    _killed_and_restarted(tmp_path, 4, TP2, straight4, in_save=True)


@pytest.mark.slow
def test_a_worker_killed_mid_accumulation_under_torchrun_restarts_and_matches_bit_for_bit_tp2_pp2_dp2(
        tmp_path, straight8):
    _killed_and_restarted(tmp_path, 8, TP2PP2, straight8)


@pytest.mark.slow
def test_a_run_restarted_on_fewer_ranks_re_plans_reshards_and_continues(tmp_path, straight8):
    """8 ranks for 4 iterations, saved (the uninterrupted 8-rank run's checkpoint at iteration 4, in its own
    folder); then 4 ranks with --auto-parallel load it (--ckpt-step 4) and run iterations 5-8.
    Bound: the loss is a mean over the global batch; another layout sums the same terms in another order
    (dp 2 -> another dp, other TP partial sums), each float32 sum off by <= n * 2^-24 relative with n the
    number of addends folded together (here <= 64 per reduction), through 4 steps of AdamW whose early steps
    are sign-like -- measured 1e-5 here as in tests/test_parallel_adamw.py; we allow 1e-4 relative on the loss."""
    save = str(tmp_path / "ckpt")
    second = _torchrun(4, ["--auto-parallel", *ITERS, "--load", straight8[2], "--ckpt-step", "4", "--save", save])
    assert second.returncode == 0, second.stderr[-3000:]
    want, got = _losses(straight8[1]), _losses(second.stdout)
    assert sorted(got) == [5, 6, 7, 8], got
    for it in got:
        assert float(got[it][0]) == pytest.approx(float(want[it][0]), rel=1e-4), (it, got[it], want[it])
