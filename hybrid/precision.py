"""The number format of a run: one enum for the runtime (`--bf16`, `--fp16`, hybrid/zero) and the planner
(`hybrid plan --precision`, hybrid/planner).

Bytes a parameter holds (Rajbhandari et al. 2020, Sec. 3.1: 2 + 2 + K):

    FP32        fp32 parameters and gradients, two fp32 Adam moments, no master copy    4 + 4 + 8
    BF16, FP16  16-bit parameters and gradients, fp32 master weights and Adam moments    2 + 2 + 12
    MIXED       the planner's name for BF16 or FP16: the same bytes, so one plan serves both

The runtime runs FP32, BF16 or FP16 (`dtype`); the planner plans FP32 or MIXED (`planned`).
"""

from __future__ import annotations

import enum


class Precision(str, enum.Enum):
    """Dtype of the parameters the forward/backward uses (and of gradients and their collectives), and the
    bytes of each model state that follow from it (module docstring)."""

    FP32 = "fp32"
    BF16 = "bf16"  # `--bf16`: fp32 master weights, no loss scaling (bf16 has fp32's exponent range)
    FP16 = "fp16"  # `--fp16`: fp32 master weights and dynamic loss scaling
    MIXED = "mixed"  # `hybrid plan --precision mixed`: bf16 or fp16, planned alike

    @property
    def dtype(self):
        """The torch dtype of the compute parameters (BF16, FP16 or FP32; MIXED names no single one)."""
        import torch

        if self is Precision.MIXED:
            raise ValueError("precision 'mixed' is the planner's bf16-or-fp16; give --bf16 or --fp16 to run")
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.value]

    @property
    def mixed(self) -> bool:
        """16-bit parameters and gradients with fp32 master weights (BF16, FP16, MIXED)."""
        return self is not Precision.FP32

    @property
    def planned(self) -> "Precision":
        """What the planner plans this run as: MIXED for BF16 / FP16 (the same bytes), FP32 as itself."""
        return Precision.MIXED if self.mixed else Precision.FP32

    @property
    def param_bytes(self) -> int:
        return 2 if self.mixed else 4

    @property
    def grad_bytes(self) -> int:
        return 2 if self.mixed else 4

    @property
    def optimizer_bytes(self) -> int:
        """K: optimizer-state bytes per parameter (fp32 master + momentum + variance, or the two moments)."""
        return 12 if self.mixed else 8

    @property
    def activation_bytes(self) -> int:
        """Bytes of one activation element between stages and in TP collectives."""
        return 2 if self.mixed else 4

    @property
    def adam_bytes(self) -> int:
        """HBM bytes Adam moves per parameter. Mixed: read + write fp32 master, momentum, variance (24),
        read the gradient and write the 2-byte parameter (4) = 28. FP32: read + write the parameter and both
        moments (24), read the gradient (4) = 28."""
        return 28
