"""`--cp-comm-type`: an enum with no torch import, so the planner and `hybrid plan` read it without the runtime
(hybrid/cp/attention.py re-exports it)."""

from __future__ import annotations

import enum


class CommType(enum.Enum):
    """`--cp-comm-type` (Megatron's name and values)."""

    P2P = "p2p"
    A2A = "a2a"
    ALLGATHER = "allgather"
