"""ZeRO data parallelism: stages 0-3, CPU offload, mixed precision (see docs/zero.md)."""

from hybrid.zero.config import CpuAdam, Precision, ZeroConfig
from hybrid.zero.engine import StepReport, ZeroOptimizer, block_modules

__all__ = ["CpuAdam", "Precision", "StepReport", "ZeroConfig", "ZeroOptimizer", "block_modules"]
