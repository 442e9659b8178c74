"""The activation-recomputation modes: an enum with no torch import, so the planner (which prices each mode) and
`hybrid plan` import it without the runtime (models/common.py re-exports it for the model code)."""

from __future__ import annotations

import enum


class Recompute(enum.Enum):
    """Activation recomputation (`--recompute-granularity`; Korthikanti et al. 2022).

    SELECTIVE recomputes the attention core in backward (its saved q, k, v are kept, its output and
    softmax statistics are not); FULL keeps only each block's input and reruns the whole block in
    backward (its TP collectives included, as in Megatron). SELECTIVE_OP checkpoints the block like FULL but with
    an op-level policy (`SelectiveOpPolicy`, torch's create_selective_checkpoint_contexts): the outputs of the
    block's 1st, 3rd, 5th ... matmul and of the attention kernel are stored in forward, everything else (norms,
    RoPE, activations, residual adds, the other matmuls and the collectives they feed) is rerun in backward.
    All use torch's non-reentrant checkpoint.
    The one enum of the runtime and the planner (hybrid/planner/layout.py prices each mode)."""

    NONE = "none"  # keep every activation
    SELECTIVE = "selective"  # recompute the attention core (QK^T, softmax, dropout, .V) in backward
    SELECTIVE_OP = "selective-op"  # op-level (torchtitan's SAC): keep every other matmul's output and the
    #                                attention's, rerun the cheap ops and the other matmuls in backward
    FULL = "full"  # keep only each layer's input, rerun the layer's forward in backward
