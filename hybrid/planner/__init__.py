"""The layout planner: which TP x PP x DP (+ ZeRO, offload, recomputation, SP) layout to train a model with.

    from hybrid.planner import Cluster, Workload, hardware, search, evaluate
    from models.config import load_config

    work = Workload(load_config("llama-3-70b"), global_batch=1024, seq_length=4096)  # mixed precision with fp32
    # gradients by default: as `hybrid plan` at its defaults and train.py's --bf16
    result = search(work, Cluster(gpus=256, hw=hardware("h100-80g")), top=5)
    best = result.plans[0]          # Plan: layout, memory per pipeline rank, step time, tokens/s, MFU

For this repository's own runtime on CPU (fp32, flash attention), `Workload(..., precision=Precision.FP32,
activations=ActivationProfile.FP32_FLASH)`; `step_ledger` predicts its communication ledger, and
tests/test_planner_runtime.py checks all three against a run. `hybrid calibrate` (calibrate.py) measures a
machine for `hybrid plan --hardware FILE`.

Memory (predicted_memory.py), time (time.py) and the pipeline numbers (schedule.py, from hybrid.pipeline's simulation)
are documented with their formulas and sources in docs/planner.md. The `hybrid plan` command is cli.py.
"""

from hybrid.planner.hardware import COMPUTE_EFFICIENCY, PRESETS, GpuKind, Hardware, hardware
from hybrid.planner.layout import Cluster, Layout, Offload, Recompute, Workload, ZeroStage, check_layout
from hybrid.planner.predicted_comm import step_ledger
from hybrid.planner.predicted_memory import MemoryPlan, RankMemory, model_state_bytes, model_states, plan_memory
from hybrid.planner.model import ActivationProfile, Precision
from hybrid.planner.schedule import InFlight, PipelineRun, SimulationTooLarge, in_flight, run_pipeline
from hybrid.planner.search import Plan, Rejection, SearchResult, SearchSpace, evaluate, search
from hybrid.planner.time import FlopsFormula, StepTime, exact_step_flops, megatron_step_flops, step_time

__all__ = [
    "COMPUTE_EFFICIENCY",
    "ActivationProfile",
    "Cluster",
    "FlopsFormula",
    "GpuKind",
    "Hardware",
    "InFlight",
    "Layout",
    "MemoryPlan",
    "Offload",
    "PRESETS",
    "PipelineRun",
    "Precision",
    "Plan",
    "RankMemory",
    "Recompute",
    "Rejection",
    "SearchResult",
    "SearchSpace",
    "SimulationTooLarge",
    "StepTime",
    "Workload",
    "ZeroStage",
    "check_layout",
    "evaluate",
    "exact_step_flops",
    "hardware",
    "in_flight",
    "megatron_step_flops",
    "model_state_bytes",
    "model_states",
    "plan_memory",
    "run_pipeline",
    "search",
    "step_ledger",
    "step_time",
]
