"""`--fused-cross-entropy` (Workload.fused_cross_entropy): a loss that is one fused kernel over the bf16 logits
(flash-attn's CrossEntropyLoss, llm-foundry's MPT default) keeps 2 bytes a logit and a fp32 logsumexp a token,
and its backward writes one bf16 gradient -- where torch's cross-entropy over fp32-upcast logits keeps 6 and needs
8 more. With it the five MosaicML H100 layouts that ran are planned to fit; without it they are rejected
(docs/planner/validation.md "Published runs")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hybrid.planner import Cluster, Workload
from hybrid.planner.cli import main
from hybrid.planner.model import ActivationProfile
from hybrid.planner.published import MPT_MORE_ROWS, mpt_runs
from hybrid.planner.search import search
from models.config import load_config


def test_fused_loss_keeps_two_bytes_a_logit_and_writes_two_in_its_backward():
    """One micro-batch of 2 x 1024 tokens, V 50257 padded to 50257 at t 1: kept logits 2 V + 4 bytes a token
    against 6 V; the backward's transient 2 V against 8 V. The rest of the head (norm and head inputs) is the same."""
    work = Workload(load_config("gpt2"), global_batch=2, seq_length=1024, activations=ActivationProfile.BF16_FLASH,
                    fp32_grads=False)
    plain, fused = work.shard(1), replace(work, fused_cross_entropy=True).shard(1)
    tokens, vocab = 2 * 1024, plain.vocab
    assert plain.head_activation_bytes(2, 1024, False) - fused.head_activation_bytes(2, 1024, False) == \
        tokens * (6 * vocab - 2 * vocab - 4)
    assert (plain.head_backward_transient_bytes(2, 1024), fused.head_backward_transient_bytes(2, 1024)) == \
        (8 * tokens * vocab, 2 * tokens * vocab)


def test_the_five_mpt_layouts_that_ran_fit_only_with_the_fused_loss():
    """The last five rows of MPT_MORE_ROWS ran on 80 GB H100s; planned with torch's loss they need 87-102 GB."""
    runs = {r.name: r for r in mpt_runs()}
    late = [r for r in runs.values() if (r.workload.model.num_layers, r.workload.seq_length, r.gpus,
                                         r.space.micro_batch[0]) in
            {(48, 8192, 8, 1), (40, 16384, 8, 3), (32, 8192, 8, 3), (24, 2048, 64, 20), (24, 2048, 16, 20)}
            and not r.workload.fp8 and r.gpu == "h100-80g"]
    assert len(late) == 5 == len(MPT_MORE_ROWS[-5:])
    for run in late:
        cluster = Cluster(gpus=run.gpus, hw=run.hardware())
        fits = search(run.workload, cluster, run.space, top=1)
        assert fits.plans and fits.plans[0].memory.peak.total <= run.hardware().capacity_bytes
        torch_loss = search(replace(run.workload, fused_cross_entropy=False), cluster, run.space, top=1)
        assert not torch_loss.plans and "OOM" in torch_loss.rejected[0].reason


def test_the_flag_reaches_the_plan_and_is_refused_where_it_means_nothing(capsys):
    """The CLI flag plans the fused loss (less memory on the same layout); with the korthikanti profile, or with
    --emit-args (train.py's loss upcasts), it is one line naming it."""
    flags = ["--model", "gpt2", "--gpus", "1", "--gpu", "h100-80g", "--global-batch-size", "8", "--seq-length",
             "1024", "--activation-profile", "bf16-flash", "--micro-batch-size", "8", "--json"]
    import json
    assert main(flags) == 0
    plain = json.loads(capsys.readouterr().out)["plans"][0]["memory_gb"]
    assert main(flags + ["--fused-cross-entropy"]) == 0
    fused = json.loads(capsys.readouterr().out)["plans"][0]["memory_gb"]
    assert fused < plain - 1.0  # 8 x 1024 tokens x 50257 logits x 10 bytes = 4.1 GB less at the peak
    for extra in (["--activation-profile", "korthikanti"], ["--emit-args"]):
        assert main(flags[:-1] + extra + ["--fused-cross-entropy"]) == 2
        err = capsys.readouterr().err
        assert "--fused-cross-entropy" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="--fused-cross-entropy"):
        Workload(load_config("gpt2"), global_batch=8, seq_length=1024, fused_cross_entropy=True, fp32_grads=False)
