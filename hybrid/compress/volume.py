"""What the compressors send and how they are configured, with no torch import: the planner (hybrid/planner/slowlink.py)
prices the same bytes the runtime sends from these functions, and `hybrid plan` reads them without the runtime
(powersgd.py and onebit.py re-export them)."""

from __future__ import annotations

from dataclasses import dataclass

from hybrid.cliutil import check_number


def padded_length(numel: int, world: int) -> int:
    """The buffer length the compressed all-reduce needs: a multiple of 8 n (whole bytes per chunk)."""
    return -(-numel // (8 * world)) * 8 * world


@dataclass(frozen=True)
class PowerSGDConfig:
    """Attributes:
        rank: r, the rank of each matrix's approximation (`--powersgd-rank`); 0: PowerSGD off.
        start_iter: optimizer steps of plain all-reduce before compressing (`--powersgd-start-iter`; torch's
            `start_powerSGD_iter`); >= 2, as torch requires with error feedback and warm start.
        min_compression_rate: compress a matrix only when n m > rate x r (n + m) (torch's default 2).
        seed: seed of the initial random Q (torch's `random_seed`).
        variant: "torch" (default): torch's powerSGD_hook, bit for bit (`reduce_bucket`); "epfml": the PowerSGD
            authors' library with `num_iters_per_step=2` (`reduce_bucket_epfml`). A diagnostic of
            scripts/bench_comm_efficient.py (`--powersgd-variant`), not a train.py flag: at r = 4 it did not close
            the gap to AdamW (docs/comm-efficient.md).
        error_feedback: carry each rank's residual to the next step (torch's `use_error_feedback`, default on);
            off only in the bench's `--powersgd-no-error-feedback` diagnostic.
    """

    rank: int = 0
    start_iter: int = 2
    min_compression_rate: float = 2.0
    seed: int = 0
    variant: str = "torch"
    error_feedback: bool = True

    def __post_init__(self) -> None:
        for flag, value in (("--powersgd-rank", self.rank), ("--powersgd-start-iter", self.start_iter),
                            ("PowerSGDConfig.seed", self.seed)):
            check_number(flag, value, 0, integer=True)
        check_number("PowerSGDConfig.min_compression_rate", self.min_compression_rate, 0)
        if self.variant not in ("torch", "epfml"):
            raise ValueError(f"PowerSGD variant must be 'torch' or 'epfml', got {self.variant!r}")
        if self.variant == "epfml" and not self.error_feedback:
            raise ValueError("the epfml PowerSGD variant always carries its error feedback (as the authors' library)")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def matrix_rank(shape: tuple[int, ...], cfg: PowerSGDConfig) -> int:
    """The rank a tensor of `shape` is compressed at, 0 when it is all-reduced whole: viewed as
    (shape[0], prod(rest)), compressed when n m > min_compression_rate x r (n + m) (torch's `_should_compress`)."""
    n = shape[0] if shape else 1
    m = 1
    for s in shape[1:]:
        m *= s
    r = min(n, m, cfg.rank)
    return r if (n + m) * r * cfg.min_compression_rate < n * m else 0


def bucket_elements(shapes: list[tuple[int, ...]], cfg: PowerSGDConfig) -> tuple[int, int]:
    """(numbers all-reduced per step after the start, numbers before): sum r(n + m) over compressed tensors plus
    the uncompressed elements; the bucket's elements."""
    after = before = 0
    for shape in shapes:
        numel = 1
        for s in shape:
            numel *= s
        r = matrix_rank(shape, cfg)
        after += r * (shape[0] + numel // shape[0]) if r else numel
        before += numel
    return after, before
