"""`hybrid convert --target-pipeline-parallel-size` with train.py's partition flags: a model whose layers do not
divide the stages (3 layers on 2) pre-shards with --pipeline-layers-per-stage or --pipeline-partition balanced,
into the stages train.py builds from the same flags and the chunks a run at that layout saves, and the run loads it
with transformers' loss; every error of `hybrid convert` suggests only flags it accepts."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest
import torch

from command_flags import foreign
from hybrid.checkpoint import store
from hybrid.cli import main as hybrid_main
from hybrid.convert.presharded import MICRO_BATCH, SEQ_LENGTH, TargetLayout
from hybrid.train.args import build_parser, check_args, parse_args
from models import load_config, shift_labels

UNEVEN = {"manual": ["--pipeline-layers-per-stage", "1,2"], "balanced": ["--pipeline-partition", "balanced"]}


def gpt2_3_layers(path: str) -> str:
    from transformers import GPT2Config, GPT2LMHeadModel  # in the test process only: _load_uneven's ranks do not
    torch.manual_seed(3)
    model = GPT2LMHeadModel(GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=0,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.save_pretrained(path)
    return path


def test_convert_splits_as_train_py_does_with_the_same_flags(tmp_path):
    """For each partition flag set, the converter's stages are train.py's check_pipeline's (pp 2), and its
    balanced split's defaults are train.py's --seq-length / --micro-batch-size."""
    src = gpt2_3_layers(str(tmp_path / "hf"))
    defaults = build_parser().parse_args([])
    assert (SEQ_LENGTH, MICRO_BATCH) == (defaults.seq_length, defaults.micro_batch_size)
    cfg = load_config(src)
    for flags, target in ((UNEVEN["manual"], TargetLayout(pp=2, layers_per_stage="1,2")),
                          (UNEVEN["balanced"], TargetLayout(pp=2, partition="balanced")),
                          (UNEVEN["balanced"] + ["--seq-length", "64"],
                           TargetLayout(pp=2, partition="balanced", seq_length=64))):
        args = parse_args(["--model", src, "--pipeline-model-parallel-size", "2", *flags])
        _, _, _, plan = check_args(args, 2)
        assert target.stages(cfg) == plan.stages, flags
    assert TargetLayout(pp=2, layers_per_stage="1,2").stages(cfg) == [(0,), (1, 2)]


def _load_uneven(rank: int, world: int, root: str, cfg, ids: torch.Tensor) -> dict:
    """A pp 2 run's model at each converted checkpoint's stages: the resume path (core.load, model only), the
    loss of a fixed batch through both stages, and a save of its own to compare chunk by chunk. `cfg`: the
    folder's config, read in the test process and passed without its transformers config object (reading or
    unpickling one imports transformers in the rank, ~1.2 s of CPU each; GPT-2 has no RoPE to compute from it)."""
    import torch.distributed as dist

    from hybrid.checkpoint import core
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks
    mesh = Mesh.build(ParallelDims.from_world(world, pp=2))
    out = {}
    for kind in UNEVEN:
        it_dir = store.final_path(os.path.join(root, kind), 0)
        layout = store.read_state(it_dir)["layout"]
        stages = [tuple(s) for s in layout["stages"]]
        model = build_pipeline_chunks(cfg, TPContext(mesh.tp), mesh.coords.pp, 2, 1, stages=stages, seed=7)
        opt = ZeroOptimizer(model, mesh, ZeroConfig(stage=0), OptimizerConfig())
        names = core.param_names(model)
        core.load(opt, names, None, it_dir, optim=False, rng_too=False)
        with torch.no_grad():
            if mesh.is_first_stage:
                dist.send(model[0](ids).contiguous(), 1)
            else:
                h = torch.empty(ids.shape + (cfg.hidden_size,))
                dist.recv(h, 0)
                out[kind] = model[0](h, shift_labels(ids)).item()
        core.start_save(opt, names, None, os.path.join(root, kind + ".run"), 1,
                        {"model": os.path.join(root, "hf"), "layout": layout, "iteration": 1,
                         "consumed_samples": 0}).finish()
    assert "transformers" not in sys.modules, "a rank imported transformers"
    return out


def test_three_layers_pre_shard_on_two_stages_as_a_run_saves_them_and_load_with_transformers_loss(tmp_path):
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    from hybrid.testing import run_distributed
    root = str(tmp_path)
    src = gpt2_3_layers(os.path.join(root, "hf"))
    with pytest.raises(SystemExit, match="--pipeline-partition balanced, or --pipeline-layers-per-stage 1,2"):
        hybrid_main(["convert", src, os.path.join(root, "even"), "--target-pipeline-parallel-size", "2"])
    for kind, flags in UNEVEN.items():
        hybrid_main(["convert", src, os.path.join(root, kind), "--target-pipeline-parallel-size", "2", *flags])
    layouts = {k: store.read_state(store.final_path(os.path.join(root, k), 0))["layout"]["stages"] for k in UNEVEN}
    assert layouts == {"manual": [[0], [1, 2]], "balanced": [[0, 1], [2]]}  # the LM head (V = 256) weighs on stage 1
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(4))
    cfg = dataclasses.replace(load_config(src), hf_config=None)
    losses = run_distributed(_load_uneven, 2, (root, cfg, ids), timeout=240)[1]
    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(src)(input_ids=ids, labels=ids).loss.item()

    def chunks(it_dir: str) -> dict:
        md = dcp.FileSystemReader(it_dir).read_metadata()
        files = {(i.fqn, i.offset): md.storage_data[i].relative_path for i in md.storage_data}
        return {k: sorted((tuple(c.offsets), files[(k, c.offsets)]) for c in m.chunks)
                for k, m in md.state_dict_metadata.items() if k.startswith("model/")}
    for kind in UNEVEN:
        assert abs(losses[kind] - want) <= 1e-5, kind
        assert chunks(store.final_path(os.path.join(root, kind), 0)) == \
            chunks(store.final_path(os.path.join(root, kind + ".run"), 1)), kind


# --- every error suggests only flags `hybrid convert` accepts ------------------------------------------------------

CONVERT_ERRORS = [
    (["--target-pipeline-parallel-size", "2"], "the model's 3 layers do not divide into the 2 stages "
                                               "(--target-pipeline-parallel-size 2)"),
    (["--target-pipeline-parallel-size", "2", "--pipeline-layers-per-stage", "2,2"], "sums to 4, not the model's 3"),
    (["--target-pipeline-parallel-size", "2", "--pipeline-layers-per-stage", "3"], "gives 1 counts for 2 stages"),
    (["--target-pipeline-parallel-size", "2", "--pipeline-layers-per-stage", "1,x"], "give comma-separated"),
    (["--target-pipeline-parallel-size", "4"], "--target-pipeline-parallel-size 4 exceeds the 3 layers"),
    (["--target-pipeline-parallel-size", "3", "--pipeline-layers-per-stage", "1,0,2"], "stages [1] hold no layers"),
    (["--target-tensor-parallel-size", "3"], "--target-tensor-parallel-size 3 does not divide the 4"),
    (["--target-pipeline-parallel-size", "2", "--pipeline-partition", "balanced", "--pipeline-layers-per-stage",
      "1,2"], "--pipeline-partition balanced cannot apply"),
]


@pytest.mark.parametrize("argv,words", CONVERT_ERRORS, ids=[" ".join(a) for a, _ in CONVERT_ERRORS])
def test_convert_errors_suggest_only_flags_convert_accepts(tmp_path, argv, words):
    src = gpt2_3_layers(str(tmp_path / "hf"))
    with pytest.raises(SystemExit) as e:
        hybrid_main(["convert", src, str(tmp_path / "out"), *argv])
    msg = str(e.value.code)
    assert msg.startswith("hybrid convert: error: ") and words in msg, msg
    assert foreign(msg, "hybrid convert", argv) == [], msg
    assert not os.path.exists(tmp_path / "out")


def test_the_walker_finds_a_flag_the_command_does_not_take():
    """The check itself: train.py's --pipeline-model-parallel-size in a convert message, and a quoted command
    line's flag checked against that command."""
    assert foreign("use --pipeline-model-parallel-size 2", "hybrid convert") == ["--pipeline-model-parallel-size"]
    assert foreign("run `train.py --pipeline-model-parallel-size 2`", "hybrid convert") == []
    assert foreign("run `hybrid calibrate --nope`", "hybrid convert") == ["--nope"]
    assert foreign("launch with torchrun --nproc-per-node 2", "hybrid convert") == []
    assert foreign("--bogus 3 is wrong", "hybrid convert", ("--bogus", "3")) == []  # the user's own flag
