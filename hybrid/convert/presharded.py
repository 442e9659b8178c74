"""A converted checkpoint pre-sharded for a TP x PP layout (Megatron's converter: `--target-tensor-parallel-size`,
`--target-pipeline-parallel-size`).

A training run at tp t x pp p (dp 1, or any dp at ZeRO 0) saves every parameter as a ShardedTensor whose chunk
is the rank's whole TP shard (hybrid/checkpoint/shards.py: ZeRO's flat range is then the whole parameter, one
rectangle), written by the owning rank into its own file `__{rank}_0.distcp`. This module writes exactly that
from one process, with no process group:

* the shards come from the model itself: build_pipeline_chunks at each target (tp rank, pp rank) on the meta
  device gives every parameter's ShardSpec, and shards.shard_box / shards.is_owner turn it into the global box
  and the writer -- the same functions the save of a run calls;
* the files come from DCP's own planner and FileSystemWriter, driven through the steps dcp.save runs over a
  process group (each rank's local plan, the coordinator's global plan and metadata, each rank's writes, the
  metadata file), with rank r's state dict in place of rank r's process.

Loading reads whatever chunks overlap the loader's own (DCP), so another layout still reshards; at the target
layout each rank reads one chunk per parameter from one file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from hybrid.checkpoint.shards import is_owner, shard_box, sharded_tensor
from hybrid.comm import CommLedger, Group
from hybrid.convert.common import Progress, size_text
from hybrid.mesh import ParallelDims, validate_model_dims
from hybrid.partition import PartitionMethod, parse_layers_per_stage, partition_layers, stage_costs_from_config
from hybrid.tp import TPContext
from hybrid.zero.engine import tied_weight
from models import build_pipeline_chunks
from models.config import ModelConfig

TP_FLAG, PP_FLAG = "--target-tensor-parallel-size", "--target-pipeline-parallel-size"
# train.py's defaults, which its balanced split's FLOP costs read (tests/test_convert.py holds them equal)
SEQ_LENGTH, MICRO_BATCH = 128, 4


@dataclass(frozen=True)
class TargetLayout:
    """The layout a converted checkpoint is pre-sharded for, with train.py's partition flags: the stages are
    the ones train.py builds from the same flags (hybrid/train/args.py's check_pipeline, v = 1).

    Attributes:
        tp: tensor-parallel size (`--target-tensor-parallel-size`).
        pp: pipeline-parallel size (`--target-pipeline-parallel-size`).
        partition: "uniform" or "balanced" (`--pipeline-partition`): the same layers on every stage, or the
            split that minimises the largest stage's FLOPs, embedding and LM head counted.
        layers_per_stage: the layers of each stage by hand (`--pipeline-layers-per-stage`, e.g. "1,2"); None:
            `partition` decides.
        seq_length, micro_batch: the run's `--seq-length` and `--micro-batch-size`, which the balanced split's
            FLOP costs depend on (train.py's defaults unless given).
    """

    tp: int = 1
    pp: int = 1
    partition: str = "uniform"
    layers_per_stage: str | None = None
    seq_length: int = SEQ_LENGTH
    micro_batch: int = MICRO_BATCH

    @property
    def world(self) -> int:
        return self.tp * self.pp

    def stages(self, cfg: ModelConfig) -> list[tuple[int, ...]]:
        """Each stage's layer ids; ValueError naming the partition flag when they cannot be split so."""
        if self.layers_per_stage:  # with --pipeline-partition balanced: partition_layers names the conflict
            method = PartitionMethod.BALANCED if self.partition == "balanced" else None
            return partition_layers(cfg.num_layers, self.pp, 1, method=method,
                                    layers_per_stage=parse_layers_per_stage(self.layers_per_stage))
        if self.partition == "balanced":
            costs = stage_costs_from_config(cfg, self.seq_length, self.micro_batch)
            return partition_layers(cfg.num_layers, self.pp, 1, method=PartitionMethod.BALANCED, **costs.as_kwargs())
        return partition_layers(cfg.num_layers, self.pp, 1)

    def describe(self, cfg: ModelConfig) -> str:
        """', layers [1, 2]' with more than one stage."""
        return f", layers {[len(s) for s in self.stages(cfg)]}" if self.pp > 1 else ""

    def layout(self, cfg: ModelConfig) -> dict:
        """state.json's "layout" of a run at this layout (hybrid/train/loop.run_info)."""
        return {"tp": self.tp, "pp": self.pp, "dp": 1, "zero": 0, "v": 1,
                "stages": [list(s) for s in self.stages(cfg)]}


@dataclass
class RankView(Group):
    """A TP group seen from one of its ranks, without processes: building layers reads only size and rank (for
    the ShardSpecs); no collective may run on it."""

    seen_from: int = 0

    @property
    def rank(self) -> int:
        return self.seen_from


def _with_target_flags(e: ValueError) -> ValueError:
    msg = str(e).replace("--tensor-model-parallel-size", TP_FLAG).replace("--pipeline-model-parallel-size", PP_FLAG)
    return ValueError(msg)


def rank_chunks(cfg: ModelConfig, target: TargetLayout, tp_rank: int, pp_rank: int) -> torch.nn.ModuleList:
    """The model chunk of target rank (tp_rank, pp_rank), on the meta device (shapes and specs, no memory)."""
    group = RankView(name="tp", ranks=tuple(range(target.tp)), pg=None, ledger=CommLedger(), seen_from=tp_rank)
    with torch.device("meta"):
        return build_pipeline_chunks(cfg, TPContext(group), pp_rank, target.pp, 1, stages=target.stages(cfg),
                                     seed=None)


def check_target(cfg: ModelConfig, target: TargetLayout) -> None:
    """Every rule a run at this layout checks (mesh.validate_model_dims, the layers' even splits), with the
    target flags' names; ValueError before anything is written."""
    try:
        validate_model_dims(ParallelDims(tp=target.tp, pp=target.pp), cfg.num_heads, cfg.num_kv_heads,
                            cfg.num_layers)
        target.stages(cfg)  # the partition flags' errors, before any chunk is built
        for pp_rank in range(target.pp):
            rank_chunks(cfg, target, target.tp - 1, pp_rank)
    except ValueError as e:
        raise _with_target_flags(e) from None


def rank_state_dicts(cfg: ModelConfig, target: TargetLayout,
                     full: Callable[[str], torch.Tensor]) -> list[dict[str, object]]:
    """For each target rank (global rank order tp + tp_size * pp: dp 1), the `model/NAME` ShardedTensors it
    would save: its TP shard of every parameter it owns, sliced from `full(NAME)` (the global tensor)."""
    out = []
    for pp_rank in range(target.pp):
        for tp_rank in range(target.tp):
            sd: dict[str, object] = {}
            for chunk in rank_chunks(cfg, target, tp_rank, pp_rank):
                tied = tied_weight(chunk)
                duplicate = tied is not None and not chunk.stage.first  # the LM-head copy: stage 0 writes it
                for name, p in chunk.named_parameters():
                    box = shard_box(p, tp_rank)
                    if box is None or not is_owner(p, tp_rank, 0, False, duplicate and p is tied):
                        continue
                    t = full(name)
                    for d, (o, s) in enumerate(zip(*box)):
                        t = t.narrow(d, o, s)
                    sd[f"model/{name}"] = sharded_tensor([t], [box], tuple(full(name).shape))
            out.append(sd)
    return out


def save_as_ranks(state_dicts: list[dict[str, object]], path: str, progress: Progress = Progress()
                  ) -> None:
    """What dcp.save does on len(state_dicts) ranks, from one process: rank r plans and writes state_dicts[r]
    into __{r}_*.distcp, rank 0 merges the plans into the metadata and writes .metadata. `progress`: a line before
    each rank's write (the rank of how many, its tensors and bytes)."""
    planners, writers, plans = [], [], []
    for rank, sd in enumerate(state_dicts):
        planner, writer = DefaultSavePlanner(), FileSystemWriter(path, sync_files=True)
        planner.set_up_planner(state_dict=sd, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
        plans.append(writer.prepare_local_plan(planner.create_local_plan()))
        planners.append(planner)
        writers.append(writer)
    global_plans, metadata = planners[0].create_global_plan(plans)
    global_plans = writers[0].prepare_global_plan(global_plans)
    results = []
    for rank, (planner, writer, plan) in enumerate(zip(planners, writers, global_plans)):
        local = [t.local_shards()[0].tensor for t in state_dicts[rank].values()]
        progress(f"writing rank {rank + 1}/{len(state_dicts)}'s chunks: {len(local)} tensors, "
                 f"{size_text(sum(t.numel() * t.element_size() for t in local))}")
        future = writer.write_data(planner.finish_plan(plan), planner)
        future.wait()
        results.append(future.value())
    writers[0].finish(metadata=metadata, results=results)


__all__ = ["TargetLayout", "check_target", "rank_state_dicts", "save_as_ranks"]
