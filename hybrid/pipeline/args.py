"""The zero-bubble schedules' rules on the training flags (hybrid/train/args.py's check_pipeline calls
`check_zero_bubble` once the schedule is known). Each failure is one ValueError naming the flag and the fix,
raised before any process group."""

from __future__ import annotations

import argparse

from hybrid.cliutil import one_of
from hybrid.pipeline.schedules import ScheduleKind

V_FLAGS = "--virtual-pipeline-model-parallel-size / --num-layers-per-virtual-pipeline-stage"


def check_zero_bubble(args: argparse.Namespace, kind: ScheduleKind, v: int, pp: int, num_layers: int,
                      ranks: int | None = None) -> int:
    """Chunks per rank for `kind` (2 for zbv, which fixes them; v otherwise), or ValueError:

    * zbv holds exactly two chunks a rank (stages r and 2 pp - 1 - r), so 2 pp stages of at least one layer;
    * zbh1 runs one chunk a rank and needs pp >= 2 (one stage has no bubble to fill: pp = 1 would run the plain
      local step, not the schedule asked for);
    * neither runs with --compile: a compiled block's backward is one autograd node, so B could not leave the
      weight gradients to W (torch.distributed.pipelining refuses the same).

    `ranks`: world / (tp x cp), the ranks pp must divide, for the sizes a message offers (None: any size)."""
    if not kind.splits_backward:
        return v
    v_given = args.virtual_pipeline_model_parallel_size is not None or \
        args.num_layers_per_virtual_pipeline_stage is not None
    if kind is ScheduleKind.ZBV:
        if v_given and v != 2:
            raise ValueError(f"--pipeline-schedule zbv holds exactly 2 chunks a rank (stages r and 2 pp - 1 - r), "
                             f"but {V_FLAGS} give {v}; drop them or make it 2")
        if num_layers < 2 * pp:
            sizes = [p for p in range(2, num_layers // 2 + 1) if ranks is None or ranks % p == 0]
            fix = (f"use --pipeline-model-parallel-size {one_of(sizes)}" if ranks is not None and sizes else
                   f"use --pipeline-model-parallel-size {num_layers // 2} or less" if sizes else
                   "use --pipeline-schedule 1f1b")
            raise ValueError(f"--pipeline-schedule zbv cuts the model into 2 x --pipeline-model-parallel-size = "
                             f"{2 * pp} stages, more than its {num_layers} layers; {fix}")
        v = 2
    else:
        if v > 1:
            raise ValueError(f"--pipeline-schedule zbh1 runs one chunk a rank; drop {V_FLAGS} (or use "
                             f"--pipeline-schedule zbv for two)")
        if pp == 1:
            raise ValueError("--pipeline-schedule zbh1 needs --pipeline-model-parallel-size >= 2 (a single stage "
                             "has no pipeline bubble to fill)")
    if getattr(args, "compile", False):
        raise ValueError(f"--pipeline-schedule {kind.value} does not run with --compile (a compiled block's "
                         f"backward is one autograd node, so B cannot leave the weight gradients to W); drop "
                         f"--compile or use --pipeline-schedule 1f1b")
    return v
