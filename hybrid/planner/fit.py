"""The fitted constants of the planner's time model, each re-derived from the row(s) that fitted it.

    python -m hybrid.planner.fit        # prints each constant, its row, and the value hardware.py ships

Held-out discipline: a constant is fitted to the rows named here and nowhere else (one row each, but
H100_EAGER_CLOCK and TRITON_FLASH2_SHARE: the MosaicML rows published.mpt_fits names); every other published row
(hybrid/planner/published.py Role.CHECK, tests/data's Narayanan and ZeRO tables) only checks.
tests/test_planner_fit.py re-runs each fit and checks hardware.py holds its result. The two MosaicML constants are
fitted jointly: the clock's six single-node rows ran the Triton kernel and the share's rows run under the clock, so
each is fitted with the other at its shipped value, and the shipped pair is where both fits agree (joint_fit
alternates them from any start: docs/planner/rounds.md "Round 18").

| constant | fitted to | how |
|---|---|---|
| KERNEL_OVERHEAD_S | our H200 run 3 (docs/results/gpu_h200.md): a 1.2B Llama, s 4096, bf16, 8 micro-batches, forward + backward 0.7152 s | the one unknown left once the H200's GEMM curve (its own per-shape table), flash rate (FlashAttention-3's 35 %) and copy rate (measured) are fixed |
| A100_EFFICIENCY | Korthikanti et al. 2022 Table 5: the 22B model's whole step (t 8, one micro-batch of 4 x 2048, full recomputation, no SP) 1.42 s on A100 | the GEMM curve's asymptote e, everything else fixed (KERNEL_OVERHEAD_S from above); Table 4's single layer (7.7 + 11.9 ms) then checks: planned 20.6 ms |
| H100_500W_CLOCK | torchtitan's Table 1: Llama 3.1 8B, FSDP on 8 Grand Teton H100 (500 W, HBM2e), 5,762 tokens/s a GPU | the 500 W factor: the sustained clock of a power-capped H100 relative to a 700 W one on the same stack (GEMM asymptote and flash rate); a PyTorch-native run there also gets H100_EAGER_CLOCK |
| H100_EAGER_CLOCK | MosaicML's six single-node H100 rows (MPT 1B-30B, Composer + PyTorch FSDP on 8 H100 80GB; published.MPT_ROWS) and the 12 rows of its ">= 128 GPUs" table that ran FlashAttention-2 (MPT 1B / 3B / 7B / 70B on 128-512 H100; published_more.MPT_H100_MORE): 18 rows | the sustained tensor-core rate of PyTorch-native training on a 700 W H100 relative to the curve: their mean log throughput error 0, the Triton kernel at TRITON_FLASH2_SHARE |
| TRITON_FLASH2_SHARE | MosaicML's 16 bf16 H100 rows that ran llm-foundry's Triton attention at s >= 8192 (published.MPT_MORE_ROWS, published_more.MPT_H100_MORE; the six above excepted) | the Triton kernel's share of FlashAttention-2's published rate: their mean log throughput error 0, the clock at H100_EAGER_CLOCK |

Everything else in hardware.py is a data sheet, a published kernel benchmark or a measurement (its docstring).
"""

from __future__ import annotations

from typing import Callable

from hybrid.planner.hardware import Hardware, hardware

H200_RUN3_FORWARD_BACKWARD_S = 0.7151632995605468  # tests/data/gpu_h200/run3_8d2f7a7.json, breakdown, median
KORTHIKANTI_TABLE4_LAYER_S = 7.7e-3 + 11.9e-3  # a check of the fit below, no longer a fit row
KORTHIKANTI_TABLE5_22B_FULL_S = 1.42
TORCHTITAN_TABLE1_TOKENS_PER_GPU = 5762.0


def solve(f: Callable[[float], float], target: float, lo: float, hi: float, iters: int = 40) -> float:
    """x in [lo, hi] with f(x) = target, f monotone (bisection)."""
    increasing = f(hi) > f(lo)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def h200_llama_workload():
    """The H200 speed section's model: Llama 3.2 1B's shape (16 layers, h 2048, 32 heads, 8 kv-heads, FFN 8192,
    vocabulary 128256, tied), s 4096, 8 micro-batches of 1, our eager runtime with SDPA flash attention."""
    from hybrid.planner.layout import Workload
    from hybrid.planner.model import ActivationProfile, Precision
    from hybrid.planner.ops import KernelProfile
    from models.config import ARCH_LLAMA, ModelConfig
    cfg = ModelConfig(arch=ARCH_LLAMA, vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32,
                      num_kv_heads=8, head_dim=64, ffn_hidden_size=8192, max_position_embeddings=4096, norm_eps=1e-5,
                      tie_embeddings=True, qkv_bias=False, mlp_bias=False, out_bias=False, activation="silu",
                      dropout=0.0)
    return Workload(cfg, global_batch=8, seq_length=4096, precision=Precision.MIXED,
                    activations=ActivationProfile.BF16_FLASH, kernels=KernelProfile.EAGER, fp32_grads=False)


def h200_forward_backward(hw: Hardware) -> float:
    """Planned seconds of run 3's forward + backward of 8 micro-batches (no optimizer, no DP): the pipeline."""
    from hybrid.planner.layout import Cluster, Layout
    from hybrid.planner.time import step_time
    return step_time(h200_llama_workload(), Cluster(gpus=1, hw=hw), Layout(micro_batch=1)).pipeline


def fit_kernel_overhead() -> float:
    """KERNEL_OVERHEAD_S: the per-kernel seconds that make run 3's forward + backward take what it measured."""
    base = hardware("h200")
    return solve(lambda k: h200_forward_backward(base.with_overrides(kernel_overhead_s=k)),
                 H200_RUN3_FORWARD_BACKWARD_S, 0.0, 100e-6)


def korthikanti_layer(hw: Hardware) -> float:
    """Planned seconds of Table 4's 22B layer, forward + backward, TP collectives included."""
    from hybrid.planner.layout import Cluster, Layout, Recompute, Workload
    from hybrid.planner.reference import gpt_model
    from hybrid.planner.time import _context, _layer_cost
    work = Workload(gpt_model(48, 6144, 64, 51200, 2048), global_batch=4, seq_length=2048, fp32_grads=False)
    cost = _layer_cost(_context(work, Cluster(gpus=8, hw=hw), Layout(tp=8, micro_batch=4,
                                                                      recompute=Recompute.NONE)))
    return cost.forward_compute + cost.backward_compute + cost.forward_comm + cost.backward_comm


def korthikanti_22b_step(hw: Hardware) -> float:
    """Planned seconds of Table 5's 22B step with full recomputation (published.korthikanti_runs()[0])."""
    from hybrid.planner.layout import Cluster
    from hybrid.planner.published import korthikanti_runs
    from hybrid.planner.search import search
    from hybrid.planner.time import FlopsFormula
    run = korthikanti_runs()[0]
    plan = search(run.workload, Cluster(gpus=run.gpus, hw=hw), run.space, top=1, formula=FlopsFormula.EXACT).plans[0]
    return run.value(plan)


def fit_a100_efficiency(kernel_overhead_s: float | None = None) -> float:
    """A100_EFFICIENCY: the GEMM asymptote e that makes Table 5's 22B step (full recomputation) take 1.42 s."""
    base = hardware("a100-80g")
    if kernel_overhead_s is not None:
        base = base.with_overrides(kernel_overhead_s=kernel_overhead_s)
    return solve(lambda e: korthikanti_22b_step(base.with_overrides(compute_efficiency=e)),
                 KORTHIKANTI_TABLE5_22B_FULL_S, 0.3, 1.0)


def torchtitan_table1(hw: Hardware) -> float:
    """Planned tokens/s a GPU of torchtitan's Table 1 row on `hw`."""
    from hybrid.planner.layout import Cluster
    from hybrid.planner.published import Role, torchtitan_runs
    from hybrid.planner.search import search
    from hybrid.planner.time import FlopsFormula
    run = next(r for r in torchtitan_runs() if r.role is Role.FIT)
    plan = search(run.workload, Cluster(gpus=run.gpus, hw=hw), run.space, top=1, formula=FlopsFormula.EXACT).plans[0]
    return plan.tokens_per_s / run.gpus


def h100_500w(clock: float) -> Hardware:
    """The 500 W HBM2e H100 at `clock` x a 700 W H100's sustained tensor-core rate (GEMMs, flash, FP8 alike), on
    top of the PyTorch stack's clock (H100_EAGER_CLOCK, kept: it is the six MPT rows', not this row's)."""
    from hybrid.planner.hardware import H100_EAGER_CLOCK, H100_EFFICIENCY, HOPPER_FLASH
    return hardware("h100-96g-500w").with_overrides(compute_efficiency=H100_EFFICIENCY * clock,
                                                    flash_efficiency=HOPPER_FLASH * clock,
                                                    eager_clock=H100_EAGER_CLOCK)


def fit_h100_500w_clock() -> float:
    """H100_500W_CLOCK: the 500 W factor (times the PyTorch stack's H100_EAGER_CLOCK) that makes torchtitan's
    Table 1 (eager, PyTorch-native) run at 5,762 tokens/s a GPU."""
    return solve(lambda c: torchtitan_table1(h100_500w(c)), TORCHTITAN_TABLE1_TOKENS_PER_GPU, 0.3, 1.0)


def fit_runs(constant: str) -> list:
    """The published rows that name `constant` as the one they fit (every module's: families.all_published_runs)."""
    from hybrid.planner.families import all_published_runs
    from hybrid.planner.published import Role
    return [r for r in all_published_runs() if r.role is Role.FIT and r.fits.split()[0] == constant]


def mpt_h100_fit_runs() -> list:
    """The rows H100_EAGER_CLOCK is fitted to: MosaicML's six single-node H100 rows (published.MPT_FIT_GPUS) and the
    12 FlashAttention-2 rows of its ">= 128 GPUs" table (published.mpt_fits)."""
    return fit_runs("H100_EAGER_CLOCK")


def triton_share_fit_runs() -> list:
    """The rows TRITON_FLASH2_SHARE is fitted to: MosaicML's bf16 H100 Triton rows at s >= 8192 (published.mpt_fits)."""
    return fit_runs("TRITON_FLASH2_SHARE")


def mosaicml_device(run, clock: float, share: float) -> Hardware:
    """`run`'s device with the PyTorch stack's H100 clock at `clock` (h100-80g; other cards keep theirs) and its
    Triton attention at `share` of FlashAttention-2's rate: the flash rate scaled by share / TRITON_FLASH2_SHARE,
    which only a TRITON row reads that way (AttentionKernel.efficiency)."""
    from hybrid.planner.hardware import TRITON_FLASH2_SHARE, AttentionKernel
    hw = run.hardware()
    triton = run.workload.attention_kernel is AttentionKernel.TRITON
    return hw.with_overrides(flash_efficiency=hw.flash_efficiency * share / TRITON_FLASH2_SHARE if triton else None,
                             eager_clock=clock if hw.name == "h100-80g" else hw.eager_clock)


def mosaicml_log_error(runs: list, clock: float, share: float) -> float:
    """Mean log(predicted / published throughput) of `runs` planned on mosaicml_device(run, clock, share)."""
    import math
    from hybrid.planner.published import _plan_on
    return sum(math.log1p(r.throughput_error(_plan_on(r, mosaicml_device(r, clock, share)))) for r in runs) / len(runs)


def eager_clock_log_error(clock: float, runs: list | None = None, share: float | None = None) -> float:
    """Mean log(predicted / published throughput) of `runs` (default: the fit rows) planned on an H100 whose
    eager (PyTorch-native) tensor-core rate is `clock` x the curve's, the Triton kernel at `share` (default: the
    shipped TRITON_FLASH2_SHARE)."""
    from hybrid.planner.hardware import TRITON_FLASH2_SHARE
    return mosaicml_log_error(mpt_h100_fit_runs() if runs is None else runs, clock,
                              TRITON_FLASH2_SHARE if share is None else share)


def fit_h100_eager_clock(share: float | None = None, iters: int = 14) -> float:
    """H100_EAGER_CLOCK: the clock that centres the fit rows' errors (least squares in log throughput: their
    mean log error is 0), the Triton kernel at `share` (default: the shipped share). Bisection in [0.6, 0.8]:
    14 halvings resolve 1.2e-5."""
    return solve(lambda c: eager_clock_log_error(c, share=share), 0.0, 0.6, 0.8, iters=iters)


def fit_triton_flash2_share(clock: float | None = None, iters: int = 14) -> float:
    """TRITON_FLASH2_SHARE: the Triton kernel's share of FlashAttention-2's published rate that centres its 16 fit
    rows (mean log error 0), the H100 clock at `clock` (default: the shipped H100_EAGER_CLOCK). In [0.4, 0.7]."""
    from hybrid.planner.hardware import H100_EAGER_CLOCK
    rows = triton_share_fit_runs()
    clock = H100_EAGER_CLOCK if clock is None else clock
    return solve(lambda t: mosaicml_log_error(rows, clock, t), 0.0, 0.4, 0.7, iters=iters)


def joint_fit(rounds: int = 3) -> tuple[float, float]:
    """(H100_EAGER_CLOCK, TRITON_FLASH2_SHARE) fitted alternately, each on its rows with the other at its last
    value, from the shipped pair: the point where both fits agree (the shipped one, within the tests' 0.002)."""
    from hybrid.planner.hardware import H100_EAGER_CLOCK, TRITON_FLASH2_SHARE
    clock, share = H100_EAGER_CLOCK, TRITON_FLASH2_SHARE
    for _ in range(rounds):
        clock = fit_h100_eager_clock(share)
        share = fit_triton_flash2_share(clock)
    return clock, share


# every fitted constant of hardware.py -> the function that re-derives it from its one row (hybrid/planner/heldout.py
# lists that row as the only FIT row naming the constant; tests/test_planner_heldout.py checks the two agree)
FITS: dict[str, Callable[[], float]] = {"KERNEL_OVERHEAD_S": fit_kernel_overhead,
                                        "A100_EFFICIENCY": fit_a100_efficiency,
                                        "H100_500W_CLOCK": fit_h100_500w_clock,
                                        "H100_EAGER_CLOCK": fit_h100_eager_clock,
                                        "TRITON_FLASH2_SHARE": fit_triton_flash2_share}


def main() -> None:
    import sys
    hw_module = sys.modules["hybrid.planner.hardware"]
    k = fit_kernel_overhead()
    print(f"KERNEL_OVERHEAD_S   fitted {k * 1e6:.2f} us   ships {hw_module.KERNEL_OVERHEAD_S * 1e6:.2f} us   "
          f"(our H200 run 3, forward + backward {H200_RUN3_FORWARD_BACKWARD_S:.4f} s)")
    e = fit_a100_efficiency()
    print(f"A100_EFFICIENCY     fitted {e:.4f}   ships {hw_module.A100_EFFICIENCY:.4f}   "
          f"(Korthikanti Table 5, the 22B step with full recomputation, {KORTHIKANTI_TABLE5_22B_FULL_S} s)")
    c = fit_h100_500w_clock()
    print(f"H100_500W_CLOCK     fitted {c:.4f}   ships {hw_module.H100_500W_CLOCK:.4f}   "
          f"(torchtitan Table 1, {TORCHTITAN_TABLE1_TOKENS_PER_GPU:g} tokens/s a GPU)")
    g = fit_h100_eager_clock()
    print(f"H100_EAGER_CLOCK    fitted {g:.4f}   ships {hw_module.H100_EAGER_CLOCK:.4f}   "
          f"(MosaicML's {len(mpt_h100_fit_runs())} MPT rows on H100: six single-node, 12 FlashAttention-2; mean log "
          f"error 0, the Triton share as shipped)")
    t = fit_triton_flash2_share()
    print(f"TRITON_FLASH2_SHARE fitted {t:.4f}   ships {hw_module.TRITON_FLASH2_SHARE:.4f}   "
          f"(MosaicML's {len(triton_share_fit_runs())} bf16 Triton rows on H100 at s >= 8192, mean log error 0, the "
          f"clock as shipped)")


if __name__ == "__main__":
    main()
