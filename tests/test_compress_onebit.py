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


# --- 1-bit Adam through the engine against DeepSpeed's OnebitAdam.step, written out -----------------------------
STEPS, FREEZE = 6, 3


def ds_compressed_allreduce(buffer_m, worker_error, server_error, group):
    """DeepSpeed's NcclBackend.compressed_allreduce with its error feedback, as torch_sim computes it (an
    uncompressed all-reduce of the compressed values in place of the packed all-to-all)."""
    import torch.distributed as dist
    n, rank, pg = group.size, group.rank, group.pg
    buffer_m = torch.cat([buffer_m, torch.zeros(worker_error.numel() - buffer_m.numel())])
    buffer_m.add_(worker_error)
    worker_scale = torch.linalg.norm(buffer_m) / np.sqrt(buffer_m.numel())
    compressed = worker_scale * buffer_m.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
    worker_error.set_(buffer_m - compressed)
    dist.all_reduce(compressed, group=pg)
    compressed.mul_(1 / n)
    mine = torch.chunk(compressed, n)[rank] + server_error
    server_scale = torch.linalg.norm(mine) / np.sqrt(mine.numel())
    server_error.set_(mine - server_scale * mine.sign().add_(1).bool().float().add_(-0.5).mul_(2.0))
    out = [torch.zeros(1) for _ in range(n)]
    dist.all_gather(out, server_scale.reshape(1), group=pg)
    # every chunk's server signs: its owner's compensated chunk (gathered uncompressed here, then signed)
    gathered = [torch.zeros_like(mine) for _ in range(n)]
    dist.all_gather(gathered, mine, group=pg)
    return torch.cat([out[k] * g.sign().add_(1).bool().float().add_(-0.5).mul_(2.0) for k, g in enumerate(gathered)])


class RefOneBitAdam(torch.optim.Optimizer):
    """DeepSpeed's OnebitAdam.step (runtime/fp16/onebit/adam.py) over flat buckets of the model's parameters (the
    buckets DeepSpeed's fp32 flat groups are here: the engine's unit layout, hybrid.dp.make_buckets)."""

    def __init__(self, model, cfg, world, group):
        from hybrid.compress.onebit import padded_length
        from hybrid.dp import DEFAULT_BUCKET_BYTES, make_buckets
        decay = [p for p in model.parameters() if p.dim() >= 2]
        super().__init__([{"params": decay, "weight_decay": cfg.weight_decay},
                          {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                         dict(lr=cfg.lr))
        self.cfg, self.steps, self.group = cfg, 0, group
        self.buckets = make_buckets(list(model.parameters()), DEFAULT_BUCKET_BYTES)
        ids = {id(p) for p in decay}
        self.flat = []
        for b in self.buckets:
            n = sum(p.numel() for p in b)
            wd = torch.cat([torch.full((p.numel(),), cfg.weight_decay if id(p) in ids else 0.0) for p in b])
            self.flat.append(dict(m=torch.zeros(n), v=torch.zeros(n), wd=wd, we=torch.zeros(padded_length(n, world)),
                                  se=torch.zeros(padded_length(n, world) // world)))

    @torch.no_grad()
    def step(self, closure=None):
        b1, b2, eps, lr = self.cfg.beta1, self.cfg.beta2, self.cfg.eps, self.param_groups[0]["lr"]
        for b, st in zip(self.buckets, self.flat):
            g = torch.cat([p.grad.flatten() for p in b])
            p_flat = torch.cat([p.detach().flatten() for p in b])
            st["m"].mul_(b1).add_(g, alpha=1 - b1)
            if self.steps < FREEZE:
                st["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
            else:
                st["m"].copy_(ds_compressed_allreduce(st["m"], st["we"], st["se"], self.group)[:st["m"].numel()])
            update = st["m"] / (st["v"].sqrt() + eps)
            update += st["wd"] * p_flat
            p_flat.add_(-lr * update)
            at = 0
            for p in b:
                p.copy_(p_flat[at:at + p.numel()].view_as(p))
                at += p.numel()
        self.steps += 1


def _onebit(rank, world, tp, pp):
    from hybrid.compress.reduction import OneBitAdamReduction
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.dp import GradAverager
    from hybrid.mesh import Mesh, ParallelDims
    from hybrid.tp import TPContext
    from hybrid.train_step import OptimizerConfig, train_step
    from hybrid.zero import ZeroConfig, ZeroOptimizer
    from models import build_pipeline_chunks, load_config
    from tests.test_compress_engine import _runner
    torch.set_num_threads(1)
    mesh = Mesh.build(ParallelDims.from_world(world, tp=tp, pp=pp))
    dp = mesh.dims.dp
    cfg = OptimizerConfig(lr=3e-3, eps=1e-8, weight_decay=0.01, decay_style="constant")
    spec, corpus, out = BatchSpec(8, 2, 32, dp), load_corpus(), {}
    for kind in ("ref", "engine"):
        chunks = build_pipeline_chunks(load_config("tiny-llama"), TPContext(mesh.tp), mesh.coords.pp, pp, 1, seed=7)
        if kind == "ref":
            opt = RefOneBitAdam(chunks, cfg, dp, mesh.dp)

            class Sync(GradAverager):
                def __call__(self):
                    if opt.steps < FREEZE:  # warm-up: the mean; after: each rank's own gradient
                        super().__call__()
            sync = Sync(chunks.parameters(), mesh.dp)
        else:
            opt, sync = ZeroOptimizer(chunks, mesh, ZeroConfig(stage=0), cfg,
                                      OneBitAdamReduction(FREEZE, (dp, tp, pp))), None
        losses, sent = [], []
        for it in range(STEPS):
            mesh.ledger.reset()
            losses.append(train_step(chunks, micro_batches(corpus, spec, 3, it, mesh.coords.dp), opt, mesh, sync,
                                     runner=_runner(mesh, chunks, load_config("tiny-llama"))))
            sent.append({k: v["bytes"] for k, v in mesh.ledger.summary().items() if k.endswith("@dp")})
        out[kind] = {"losses": losses, "weights": {n: p.detach().clone() for n, p in chunks.named_parameters()},
                     "sent": sent, "numel": sum(p.numel() for p in chunks.parameters())}
    return out


@pytest.fixture(scope="module", params=["dp2", "tp2pp2dp2"])
def onebit_runs(request):
    world, tp, pp = {"dp2": (2, 1, 1), "tp2pp2dp2": (8, 2, 2)}[request.param]
    return run_distributed(_onebit, world, args=(tp, pp), timeout=900)


def test_engine_onebit_adam_equals_deepspeeds_update_bit_for_bit(onebit_runs):
    for r in onebit_runs:
        assert r["engine"]["losses"] == r["ref"]["losses"]
        for n, w in r["ref"]["weights"].items():
            assert torch.equal(r["engine"]["weights"][n], w), n
    assert onebit_runs[0]["ref"]["losses"][-1] < onebit_runs[0]["ref"]["losses"][0]


def test_engine_onebit_adam_dp_bytes_are_signs_and_scales_after_the_freeze(onebit_runs):
    for r in onebit_runs:
        numel, sent = r["engine"]["numel"], r["engine"]["sent"]
        for step in sent[:FREEZE]:  # warm-up: the fp32 gradient all-reduce
            assert step["all_reduce@dp"] == 4 * numel
        for step in sent[FREEZE:]:  # after: no gradient all-reduce; signs + one scale per worker and chunk
            assert "all_reduce@dp" not in step
            assert step["all_to_all@dp"] + step["all_gather@dp"] == ledger_bytes(numel, 2)  # one unit (tiny-llama)
