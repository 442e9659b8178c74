"""Pipeline parallelism: schedules as data (`schedules`) and their simulation (`simulate`)."""

from hybrid.pipeline.schedules import (
    Action,
    Op,
    Phase,
    Placement,
    ScheduleKind,
    build_schedule,
    compute_order,
    compute_phases,
    rank_chunk_of,
    stage_of,
    warmup_forwards,
)
from hybrid.pipeline.simulate import (
    BatchSpan,
    Costs,
    DeadlockError,
    SimResult,
    Span,
    Transfer,
    format_timeline,
    simulate,
)

__all__ = [
    "Action",
    "BatchSpan",
    "Costs",
    "DeadlockError",
    "Op",
    "Phase",
    "Placement",
    "ScheduleKind",
    "SimResult",
    "Span",
    "Transfer",
    "build_schedule",
    "compute_order",
    "compute_phases",
    "format_timeline",
    "rank_chunk_of",
    "simulate",
    "stage_of",
    "warmup_forwards",
]
