"""1-bit Adam's compressed all-reduce (hybrid/compress/onebit.py) against DeepSpeed's own reference, and its bytes.

The reference is `torch_sim` from DeepSpeed's tests of NcclBackend.compressed_allreduce (tests/onebit/ and
tests/unit/runtime/half_precision/onebit/, "A simulated compression function using torch.distributed"), written
out below with plain torch.distributed: worker sign compression with scale ||a|| / sqrt(len), an uncompressed
all-reduce of the compressed values, then per-chunk server compression. Ours moves packed signs (all-to-all +
all-gather) instead; on the same inputs (zero errors, as DeepSpeed's test) the result and both error buffers must
match, and the ledger must hold 1 bit per element per phase plus one fp32 scale per worker and per chunk.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybrid.compress.onebit import compress, decompress, ledger_bytes, padded_length
from hybrid.testing import run_distributed

N = 8 * 2 * 37  # a multiple of 8 x world


def torch_sim(a: torch.Tensor):
    """DeepSpeed's test reference, transcribed (see the module docstring)."""
    import torch.distributed as dist
    a_sign = a.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
    scale = a.norm() / np.sqrt(a.numel())
    a_compressed = scale * a_sign
    worker_error = a - a_compressed
    dist.all_reduce(a_compressed)
    a_compressed.mul_(1 / dist.get_world_size())
    a_server_sign = a_compressed.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
    a_list = torch.chunk(a_compressed, chunks=dist.get_world_size())
    server_scale = [chunk_a.norm() / np.sqrt(chunk_a.numel()) for chunk_a in a_list]
    a_sign_list = torch.chunk(a_server_sign, dist.get_world_size())
    a_server_compressed = torch.cat([server_scale[i] * a_sign_list[i] for i in range(dist.get_world_size())])
    rank = dist.get_rank()
    server_error = a_list[rank] - server_scale[rank] * a_sign_list[rank]
    return a_server_compressed, worker_error, server_error


def _compare(rank, world):
    from hybrid.compress.onebit import compressed_all_reduce
    from hybrid.mesh import Mesh, ParallelDims
    mesh = Mesh.build(ParallelDims.from_world(world))
    a = torch.randn(N, generator=torch.Generator().manual_seed(rank))
    ref = torch_sim(a.clone())
    x, we, se = a.clone(), torch.zeros(N), torch.zeros(N // world)
    mesh.ledger.reset()
    compressed_all_reduce(x, we, se, mesh.dp)
    return ref, (x, we, se), mesh.ledger.summary()


@pytest.fixture(scope="module")
def runs():
    return run_distributed(_compare, 2)


def test_compressed_all_reduce_equals_deepspeeds_torch_sim(runs):
    for ref, ours, _ in runs:
        for r, o in zip(ref, ours):
            assert torch.equal(r, o)
    assert torch.equal(runs[0][1][0], runs[1][1][0])  # every rank ends with the same momentum


def test_compressed_all_reduce_ledger_is_one_bit_per_element_per_phase_plus_scales(runs):
    world = 2
    for _, _, ledger in runs:
        total = sum(v["bytes"] for k, v in ledger.items() if k.endswith("@dp"))
        # signs: N/8 bytes to the all-to-all and N/8 gathered back; scales: one fp32 per rank, twice
        assert total == N // 8 + N // 8 + 2 * 4 * world == ledger_bytes(N, world)
        assert ledger["all_to_all@dp"]["bytes"] == N // 8
    assert ledger_bytes(N, world) * 16 < 4 * N * 2  # vs an fp32 all-reduce's S = 4N: ~16x fewer bytes


def test_sign_packing_round_trips_with_zero_as_positive():
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, 3.0, -1e-9, 2.0, -4.0] * 2)
    packed, scale = compress(x)
    assert packed.dtype == torch.uint8 and packed.numel() == 2
    assert packed[0].item() == 0b10111010  # numpy.packbits order; +-0 count as positive (DeepSpeed's sign + 1)
    assert torch.equal(decompress(packed, scale), scale * torch.tensor([1., -1, 1, 1, 1, -1, 1, -1] * 2))
    assert scale.item() == pytest.approx(x.norm().item() / math.sqrt(16))
    assert padded_length(17, 2) == 32
