"""Round 23's new-user pass over docs/moe.md ("Seeing it": the log line names "the most loaded expert and the rank
holding it"). docs/moe.md's first command, shrunk to 4 ranks (tp 2 + SP x pp 2 x ep 2, 8 experts), logged
"hot: layer 3 expert 3 on rank 0": layer 3 is on pipeline stage 1, whose ranks are 2 and 3, and expert 3 of it is
on rank 2. step_statistics looked the expert up over every rank's experts and took the first holder -- always a
stage-0 rank, since every stage holds experts 0..E-1 of its own layers. The table now carries each layer's stage.
In-process: a stage-1 rank's statistics with stand-in groups for its DP partner and the other stage.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

from hybrid.mesh import ParallelDims
from hybrid.moe.config import MoEConfig
from hybrid.moe.parallel import ExpertLayout
from hybrid.moe.runtime import step_statistics

E = 4  # experts; world 4 = dp 2 x pp 2, ep 2: stage 0 is ranks 0-1, stage 1 ranks 2-3; ep rank 1 holds experts 2-3


class _Group:
    """A stand-in group: its other ranks add `other` to a SUM all-reduce; `rank` is this rank's index in it."""

    def __init__(self, other: torch.Tensor | None = None, rank: int = 0, size: int = 2):
        self.other, self.rank, self.size = other, rank, size

    def all_reduce(self, t: torch.Tensor, tag: str = "") -> torch.Tensor:
        return t if self.other is None else t.add_(self.other)


def _stage_one() -> nn.Module:
    """Stage 1 of a 4-layer model: MoE blocks named by their global ids 2 and 3, as models/llama.py names them."""
    from hybrid.moe.layer import ExpertContext, MoELayer
    from hybrid.tp.sharding import REPLICATED
    cfg = SimpleNamespace(num_experts=E, hidden_size=8, moe_ffn_hidden_size=16, moe_top_k=2,
                          moe_router_pre_softmax=True, moe_norm_topk_prob=True, moe_shared_expert_gate=False)
    tp = SimpleNamespace(size=1, sequence_parallel=False, replicated_spec=lambda: REPLICATED, group=None)
    stage = nn.Module()
    stage.cfg = SimpleNamespace(num_experts=E, num_layers=4)
    stage.layers = nn.ModuleDict({str(i): nn.Module() for i in (2, 3)})
    for block in stage.layers.values():
        block.mlp = MoELayer(cfg, tp, ExpertContext(MoEConfig()), F.silu).train()
        block.mlp(torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(0)))
    return stage


def _hot(layer: int, expert: int) -> tuple[int, int, int]:
    """The hot expert step_statistics names on rank 2 (stage 1, dp 0) when `layer`'s `expert` got 100 slots."""
    stage = _stage_one()
    for lid, block in stage.layers.items():
        block.mlp.stat_counts = torch.zeros(E)
        if int(lid) == layer:
            block.mlp.stat_counts[expert] = 100.0
    partner = torch.zeros(4, E + 3, dtype=torch.float64)  # the DP partner (rank 3): the same layers, stage 1
    partner[2:, E + 2] = 2.0
    other_stage = torch.zeros(4, E + 3, dtype=torch.float64)  # stage 0's rows, summed over its 2 ranks
    other_stage[:2, :E] = 10.0
    other_stage[:2, E + 2] = 2 * 1.0
    if layer < 2:
        other_stage[layer, expert] = 100.0
    mesh = SimpleNamespace(tp=_Group(size=1), cp=_Group(size=1), dp=_Group(partner), pp=_Group(other_stage, rank=1),
                           device=torch.device("cpu"))
    layout = ExpertLayout(ParallelDims(pp=2, dp=2), ep=2)
    return step_statistics(stage, mesh, micro_batches=1, layout=layout).hot_expert


def test_the_hot_expert_is_named_on_the_ranks_of_its_layers_stage():
    assert _hot(3, 3) == (3, 3, 3)  # stage 1, ep rank 1: rank 3 (it was rank 1, on stage 0)
    assert _hot(2, 0) == (2, 0, 2)  # stage 1, ep rank 0: rank 2 (it was rank 0)


def test_a_hot_expert_of_the_other_stage_is_named_on_that_stages_ranks():
    assert _hot(1, 2) == (1, 2, 1)  # stage 0's layer 1, expert 2 on ep rank 1: rank 1
    assert _hot(0, 0) == (0, 0, 0)


def test_hybrid_layout_names_one_expert_a_rank_as_one(capsys):
    """`hybrid layout --world 8 --expert-model-parallel-size 2` (docs/moe.md's layout command without --num-experts:
    one expert a rank) printed "rank 6: experts 0-0"."""
    from hybrid.cli import main as hybrid_main
    hybrid_main(["layout", "--world", "8", "--expert-model-parallel-size", "2"])
    out = capsys.readouterr().out
    assert "  rank 6: expert 0\n" in out and "  rank 7: expert 1\n" in out and "-0\n" not in out, out
    hybrid_main(["layout", "--world", "8", "--expert-model-parallel-size", "2", "--num-experts", "8"])
    assert "  rank 7: experts 4-7\n" in capsys.readouterr().out


def test_resuming_a_checkpoint_without_expert_bias_with_the_bias_on_is_named_before_start_up(
        tmp_path, monkeypatch, one_line, capsys):
    """docs/moe.md's expert bias (--moe-router-enable-expert-bias) given to a run resuming a checkpoint saved without
    it (or a `hybrid convert` of a transformers Mixtral) passed the checks and failed after start-up: "--load
    ck/iter_0000002: RuntimeError: Missing key in checkpoint state_dict: moe/layers.0.mlp.gate.expert_bias." Now
    one line before any process group; the same checkpoint resumes without the flag, and the fix it names (the
    weights as a transformers folder, --load'ed with the bias on) passes the checks too."""
    import transformers

    from hybrid.cli import main as hybrid_main
    from hybrid.train.main import validate
    hf = transformers.MixtralConfig(vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                    num_experts_per_tok=2, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(hf).save_pretrained(tmp_path / "hf")
    assert hybrid_main(["convert", str(tmp_path / "hf"), str(tmp_path / "ck"), "--no-verify", "-q"]) in (0, None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    for name in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    flags = ["--model", str(tmp_path / "hf"), "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "2"]
    line = one_line(lambda: validate(flags + ["--load", str(tmp_path / "ck"), "--moe-router-enable-expert-bias"]))
    assert line.startswith(f"train.py: error: --moe-router-enable-expert-bias: the checkpoint --load resumes "
                           f"({tmp_path / 'ck' / 'iter_0000000'}) holds no expert bias"), line
    assert validate(flags + ["--load", str(tmp_path / "ck")])[0].checkpoint.load == str(tmp_path / "ck")
    assert validate(flags + ["--load", str(tmp_path / "hf"), "--moe-router-enable-expert-bias"])[0].moe.expert_bias
