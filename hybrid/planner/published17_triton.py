"""Round 17 (issue 26): the H100 eager clock fitted on the FlashAttention-2 rows alone -- the what-if of round 17
that round 18 did not land (docs/planner/rounds.md "Round 17: one Triton rate on both cards", "Round 18").

    python -m hybrid.planner.published17_triton            # the pair with the clock on the 12 rows, by group
    python -m hybrid.planner.published17_triton --six-rows-clock  # the pair with the clock on its six rows alone

Round 18 landed AttentionKernel.TRITON at TRITON_FLASH2_SHARE x FlashAttention-2's published rate on every card,
with H100_EAGER_CLOCK fitted on 18 rows (the six single-node rows and the 12 FlashAttention-2 rows of the ">= 128
GPUs" table) and the share on 16 (fit.joint_fit: round 17's `--joint`). What stays a what-if here, each pair fitted
by fit.py's own functions on other fit sets and planned on fit.mosaicml_device:

* the clock on the 12 FlashAttention-2 rows alone (CLOCK_FIT: the same stack and sweep scripts as the Triton rows,
  a kernel whose H100 rate is published; 0.7139 with round 19's GEMM ceiling, 0.6886 before) and the share on its
  16 rows with that clock (0.5496; 0.5481): it moves
  the H100 Triton rows at s < 8192 to -6 % (the reason round 17 gave for not landing it);
* the clock on its six single-node rows alone, alternately with the share (`--six-rows-clock`: 0.798 / 0.524;
  0.765 / 0.524 before round 19's GEMM ceiling),
  which moves the FlashAttention-2 rows to +10.1 % (+9.5 % before).
"""

from __future__ import annotations

import sys

from hybrid.planner.families import all_published_runs, family_of
from hybrid.planner.fit import fit_triton_flash2_share, mosaicml_device, mosaicml_log_error, solve, \
    triton_share_fit_runs
from hybrid.planner.hardware import H100_EAGER_CLOCK, TRITON_FLASH2_SHARE, AttentionKernel
from hybrid.planner.published import PublishedRun, Role, _plan_on, summary

# what the what-ifs give (docs/planner/rounds.md "Round 17: one Triton rate on both cards";
# tests/test_planner17_triton.py)
CLOCK_FITTED, TRITON_SHARE_FITTED = 0.7139, 0.5496
CARD = "h100-80g"  # the preset H100_EAGER_CLOCK is fitted for; the 500 W part and the H200 are left as they are
LONG = 8192


def is_mpt(run: PublishedRun) -> bool:
    return run.name.startswith("MPT-")


def ran_triton(run: PublishedRun) -> bool:
    """Did this row run llm-foundry's `attn_impl: triton`? Its workload's kernel (published.mpt_attention_kernel)."""
    return run.workload.attention_kernel is AttentionKernel.TRITON


def clock_fit_rows(runs: list[PublishedRun]) -> list[PublishedRun]:
    """CLOCK_FIT: MosaicML's H100 rows that ran FlashAttention-2 (the ">= 128 GPUs" table's 1B, 3B, 7B, 70B)."""
    return [r for r in runs if is_mpt(r) and r.gpu == CARD and not ran_triton(r)]


def six_rows(runs: list[PublishedRun]) -> list[PublishedRun]:
    """H100_EAGER_CLOCK's six single-node rows (published.MPT_ROWS at MPT_FIT_GPUS): its fit rows that ran Triton."""
    return [r for r in runs if is_mpt(r) and r.gpu == CARD and r.fits.startswith("H100_EAGER_CLOCK") and ran_triton(r)]


def error_on(run: PublishedRun, clock: float, t: float) -> float:
    """The row's throughput error with the clock at `clock` and the Triton share at `t` (fit.mosaicml_device)."""
    return run.throughput_error(_plan_on(run, mosaicml_device(run, clock, t)))


def fit_clock(rows: list[PublishedRun], t: float = TRITON_FLASH2_SHARE) -> float:
    """The eager clock at which `rows` have mean log error 0, the Triton share at `t`."""
    return solve(lambda c: mosaicml_log_error(rows, c, t), 0.0, 0.6, 0.8, iters=14)


def fits() -> tuple[float, float]:
    """The clock on CLOCK_FIT (FlashAttention-2 rows: the share plays no part), then the share on its rows."""
    clock = fit_clock(clock_fit_rows(all_published_runs()))
    return clock, fit_triton_flash2_share(clock)


def six_rows_fits(rounds: int = 3) -> tuple[float, float]:
    """The clock on its six single-node rows alone and the share on its 16 rows, alternately from the shipped pair."""
    rows = six_rows(all_published_runs())
    clock, t = H100_EAGER_CLOCK, TRITON_FLASH2_SHARE
    for _ in range(rounds):
        clock = fit_clock(rows, t)
        t = fit_triton_flash2_share(clock)
    return clock, t


def groups(runs: list[PublishedRun]) -> list[tuple[str, list[PublishedRun]]]:
    triton_fit = {r.name for r in triton_share_fit_runs()}
    h100 = [r for r in runs if ran_triton(r) and r.gpu == CARD and r.name not in triton_fit]
    a100 = [r for r in runs if ran_triton(r) and r.gpu != CARD]
    fa2_other = [r for r in runs if r.gpu == CARD and not is_mpt(r)
                 and family_of(r.source).split()[0] in ("OLMo-core", "IBM", "torchtitan")]
    return [("clock fit: MosaicML H100 FlashAttention-2 rows (>= 128 GPUs)", clock_fit_rows(runs)),
            ("Triton fit: MosaicML H100 bf16 Triton rows at s >= 8192", [r for r in runs if r.name in triton_fit]),
            ("the six single-node clock rows (8 H100)", six_rows(runs)),
            ("check: MosaicML H100 bf16 Triton rows at s < 8192",
             [r for r in h100 if not r.workload.fp8 and r.role is Role.CHECK]),
            ("check: MosaicML H100 FP8 rows (Triton attention, TE linears)", [r for r in h100 if r.workload.fp8]),
            ("check: MosaicML A100 80 GB, s >= 8192",
             [r for r in a100 if r.hardware().name == "a100-80g" and r.workload.seq_length >= LONG]),
            ("check: MosaicML A100 80 GB, s < 8192",
             [r for r in a100 if r.hardware().name == "a100-80g" and r.workload.seq_length < LONG]),
            ("check: MosaicML A100 40 GB, s >= 8192",
             [r for r in a100 if r.hardware().name != "a100-80g" and r.workload.seq_length >= LONG]),
            ("check: MosaicML A100 40 GB, s < 8192",
             [r for r in a100 if r.hardware().name != "a100-80g" and r.workload.seq_length < LONG]),
            ("check: OLMo-core, fms-fsdp, float8 blog on h100-80g (FlashAttention-2)", fa2_other)]


def report(clock: float, t: float, what: str) -> str:
    """Every group as shipped and under the pair (clock, t)."""
    runs = all_published_runs()
    out = [f"{what}: clock {clock:.4f}, share {t:.4f} (shipped: {H100_EAGER_CLOCK:.4f}, {TRITON_FLASH2_SHARE:.4f})"]
    for name, rows in groups(runs):
        out.append(summary([r.throughput_error(r.predict()) for r in rows]).line(f"{name}, as shipped"))
        out.append(summary([error_on(r, clock, t) for r in rows]).line(f"{name}, what-if"))
    return "\n".join(out)


def main() -> None:
    if sys.argv[1:] == ["--six-rows-clock"]:
        print(report(*six_rows_fits(), "the clock on its six rows, the share on its 16 rows"))
        return
    if sys.argv[1:]:
        raise SystemExit(f"unknown arguments {sys.argv[1:]}: pass nothing or --six-rows-clock")
    print(report(*fits(), "the clock on the 12 FlashAttention-2 rows, the share on its 16 rows"))


if __name__ == "__main__":
    main()
