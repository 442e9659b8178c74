"""PowerSGD (hybrid/compress/powersgd.py) against torch's own `powerSGD_hook`, bit for bit, and its bytes.

The reference is torch's hook itself (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py), called on
the same per-rank gradients through a stand-in for DDP's `GradBucket` (torch does not expose its constructor to
Python): an object with the four methods the hook reads -- buffer(), index(), gradients(), is_last() -- where
gradients() are views into buffer(), as DDP's are. Two buckets, a mix of shapes (matrices compressed, a 4-D
tensor viewed as (shape[0], -1), a matrix too small to be worth it, 1-D norms/biases sent whole, repeated shapes --
which the hook lays out grouped by shape), ranks 1, 2
(Gram-Schmidt) and 4 (Householder QR), steps before and after the start iteration, error feedback and warm start.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.compress.powersgd import PowerSGDConfig, bucket_elements, matrix_rank
from hybrid.testing import run_distributed

BUCKETS = [[(24, 16), (16,), (3, 4), (40, 20), (8, 2, 3, 5), (24, 16)], [(32, 12), (12,), (40, 20), (32, 12)]]
STEPS, START = 5, 2


class FakeBucket:
    """DDP's GradBucket interface as the hook reads it."""

    def __init__(self, index: int, buffer: torch.Tensor, shapes, last: bool) -> None:
        self._index, self._buffer, self._last = index, buffer, last
        self._grads, at = [], 0
        for s in shapes:
            n = math.prod(s)
            self._grads.append(buffer[at:at + n].view(s))
            at += n

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def gradients(self):
        return self._grads

    def is_last(self):
        return self._last


def _grads(rank: int, step: int, b: int) -> torch.Tensor:
    n = sum(math.prod(s) for s in BUCKETS[b])
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + 10 * step + b))


def _compare(rank: int, world: int, r: int):
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState as TorchState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    from hybrid.compress.powersgd import PowerSGDState, reduce_step
    from hybrid.mesh import Mesh, ParallelDims
    mesh = Mesh.build(ParallelDims.from_world(world))
    ref_state = TorchState(process_group=mesh.dp.pg, matrix_approximation_rank=r, start_powerSGD_iter=START)
    ours = PowerSGDState(PowerSGDConfig(rank=r, start_iter=START))
    out, ledgers = [], []
    for step in range(STEPS):
        mesh.ledger.reset()
        for b, shapes in enumerate(BUCKETS):
            last = b == len(BUCKETS) - 1
            ref_buf = _grads(rank, step, b)
            ref = powerSGD_hook(ref_state, FakeBucket(b, ref_buf, shapes, last)).wait()
            buf = _grads(rank, step, b)
            reduce_step(ours, b, buf, FakeBucket(b, buf, shapes, last).gradients(), mesh.dp, last)
            out.append((ref.clone(), buf.clone(), ref_state.error_dict.get(b), ours.error.get(b)))
        ledgers.append(sum(e.bytes for (op, g), e in mesh.ledger.entries.items()
                           if op == "all_reduce" and g.startswith("dp")))
    return out, ledgers


@pytest.fixture(scope="module")
def runs():
    return {r: run_distributed(_compare, 2, args=(r,)) for r in (1, 2, 4)}


@pytest.mark.parametrize("r", [1, 2, 4])
def test_powersgd_equals_torch_hook_bit_for_bit(runs, r):
    for rank_out in runs[r]:
        out, _ = rank_out
        for ref, ours, ref_err, our_err in out:
            assert torch.equal(ref, ours)
            if ref_err is None:
                assert our_err is None
            else:
                assert torch.equal(ref_err, our_err)
    # the two ranks end with the same reduced gradients (it is an all-reduce), and compression did something
    a, b = runs[r][0][0], runs[r][1][0]
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b))
    assert any(x[3] is not None and x[3].abs().max() > 0 for x in a)


@pytest.mark.parametrize("r", [1, 2, 4])
def test_powersgd_ledger_bytes_are_r_n_plus_m_per_matrix_plus_uncompressed(runs, r):
    cfg = PowerSGDConfig(rank=r, start_iter=START)
    # the formula written out, not taken from the code: r(n + m) per compressed matrix, the rest whole
    expect_after = 0
    for shapes in BUCKETS:
        for s in shapes:
            n, m = s[0], math.prod(s[1:])
            rr = min(n, m, r)
            expect_after += rr * (n + m) if 2 * rr * (n + m) < n * m else n * m
    assert expect_after == sum(bucket_elements(s, cfg)[0] for s in BUCKETS)
    full = sum(math.prod(s) for shapes in BUCKETS for s in shapes)
    for _, ledger in runs[r]:
        assert ledger == [4 * full] * START + [4 * expect_after] * (STEPS - START)
    assert expect_after < full


def test_powersgd_sends_1d_and_small_matrices_whole():
    cfg = PowerSGDConfig(rank=4)
    assert matrix_rank((16,), cfg) == 0
    assert matrix_rank((3, 4), cfg) == 0
    assert matrix_rank((24, 16), cfg) == 4
    assert matrix_rank((8, 2, 3, 5), cfg) == 0  # 8 x 30 at rank 4: 4 * 38 * 2 >= 240
    assert matrix_rank((8, 2, 3, 5), PowerSGDConfig(rank=1)) == 1
