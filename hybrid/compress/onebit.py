"""1-bit Adam (Tang et al. 2021, arXiv 2102.02888): Adam for a warm-up, then the variance frozen and the momentum
all-reduced as signs with error feedback on both sides.

What we followed: the paper's Algorithm 1 and DeepSpeed's implementation of it -- runtime/fp16/onebit/adam.py
(OnebitAdam.step: no bias correction, the weight decay added to the update, `freeze_step`) and
runtime/comm/nccl.py's `compressed_allreduce` (worker and server error feedback, signs packed 8 to a byte, one
scale per worker and per server chunk), whose pure-torch simulation in DeepSpeed's tests (`torch_sim`) is the
reference of tests/test_compress_onebit.py. The installed DeepSpeed no longer ships 1-bit Adam.

compressed all-reduce of a flat x over n ranks (x padded to a multiple of 8 n; chunk k belongs to rank k):

    x' = x + e_w                                     worker error feedback
    s_w = ||x'|| / sqrt(len x'),  C(x') = s_w sign(x')    (sign(0) = +1), e_w = x' - C(x')
    all-to-all: rank k gets every rank's packed signs of chunk k; all-gather: every s_w
    y_k = (1/n) sum_i s_w,i sign_i(chunk k) + e_s      server error feedback (rank k's chunk only)
    s_s = ||y_k|| / sqrt(len y_k),  e_s = y_k - s_s sign(y_k)
    all-gather: every chunk's packed signs and its s_s  ->  x~ = [s_s,k sign(y_k)]_k   on every rank

Bytes on the ledger (nccl-tests' size S): all-to-all len/8 + all-gather 4n + all-gather len/8 + all-gather 4n
= len/4 + 8n per call: 1 bit per element twice (worker and server phases) and one fp32 scale per chunk.
"""

from __future__ import annotations

import math

import torch

from hybrid.comm import Group
from hybrid.compress.volume import padded_length  # noqa: F401  (re-exported)

BITS = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8)  # numpy.packbits' big-endian bit order


# --- the pure functions --------------------------------------------------------------------------------------------
def signs(x: torch.Tensor) -> torch.Tensor:
    """+1 where x >= 0, -1 elsewhere (DeepSpeed's x.sign().add_(1).bool(): zero counts as positive)."""
    return x.sign().add_(1).bool().to(x.dtype).add_(-0.5).mul_(2.0)


def compress(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed signs: len/8 uint8, scale ||x|| / sqrt(len)): C(x) = scale * sign(x). len a multiple of 8."""
    scale = torch.linalg.norm(x) / math.sqrt(x.numel())
    bits = (x >= 0).to(torch.uint8).view(-1, 8)
    return (bits * BITS.to(x.device)).sum(1, dtype=torch.uint8), scale.reshape(1)


def decompress(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """scale * (+-1 per bit) from `compress`'s output."""
    bits = (packed.unsqueeze(-1) & BITS.to(packed.device)).ne(0).reshape(*packed.shape[:-1], -1)
    return bits.to(dtype).add_(-0.5).mul_(2.0).mul_(scale.reshape(*scale.shape, *([1] * (bits.dim() - 1)))
                                                    if scale.dim() else scale)


def compressed_all_reduce(x: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor,
                          group: Group) -> torch.Tensor:
    """The mean over `group` of x, sign-compressed twice with error feedback (module docstring); x (padded to
    `padded_length`) is overwritten with it. worker_error: len(x); server_error: len(x) / n (this rank's chunk)."""
    n = group.size
    x.add_(worker_error)
    packed, scale = compress(x)
    worker_error.copy_(x - decompress(packed, scale, x.dtype))
    chunks = group.all_to_all(packed.view(n, -1), scatter_dim=0, gather_dim=0)  # (n, len/8n): chunk k from all
    scales = group.all_gather(scale)  # (n,)
    y = (decompress(chunks, scales, x.dtype) / n).sum(0) + server_error
    s_packed, s_scale = compress(y)
    server_error.copy_(y - decompress(s_packed, s_scale, x.dtype))
    all_signs = group.all_gather(s_packed.view(1, -1))  # (n, len/8n)
    all_scales = group.all_gather(s_scale)
    x.copy_(decompress(all_signs, all_scales, x.dtype).reshape(-1))
    return x


def ledger_bytes(numel: int, world: int) -> int:
    """Bytes one compressed all-reduce of `numel` elements records: signs twice at 1 bit, 2 n fp32 scales."""
    length = padded_length(numel, world)
    return length // 8 + 4 * world + length // 8 + 4 * world


# --- the optimizer ---------------------------------------------------------------------------------------------------
class OneBitAdam(torch.optim.Optimizer):
    """DeepSpeed's OnebitAdam update over the engine's units, at ZeRO 0 (the fp32 master is the whole unit) and
    ZeRO 1-2 (the master is this rank's shard; docs/comm-efficient.md).

    Steps 0 .. freeze-1 (warm-up: plain (ZeRO) AdamW's reduction, the gradient g the DP mean of the shard):
        m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2                          (on the shard)
    from step `freeze` on (no gradient traffic; g_local is this rank's own gradient):
        m = b1 m + (1 - b1) g_local;   m = compressed_all_reduce(m)   (v frozen)
    and every step, without bias correction (as DeepSpeed), on the shard:  p -= lr (m / (sqrt(v) + eps) + wd p).
    At ZeRO 0 g_local is the master gradient (clipped by --clip-grad with this rank's own norm); at ZeRO 1-2 the
    master gradient is a shard, so the reduction folds the whole local gradient into the whole momentum as the
    unit's backward completes (OneBitAdamReduction.reduce; --clip-grad refused there).

    Per unit: the momentum `m` is the whole padded unit on every rank (each worker compresses its whole momentum;
    after each compressed all-reduce all ranks hold the same m); v, the decay mask and the master are the shard
    [a, b) = u.shard_range (ZeRO 0: the whole unit). The optimizer state of each master segment (what the
    checkpoint reads, hybrid/zero/state.py) is a view of m's shard and of v, so they save and load as AdamW's do."""

    def __init__(self, engine, groups: list[dict], freeze: int, lr: float, betas: tuple[float, float], eps: float,
                 owner) -> None:
        super().__init__(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))
        self.engine, self.freeze, self.owner = engine, freeze, owner
        self.grad_scale: torch.Tensor | None = None  # set by the engine (_make_master_grads)
        decay_of = {id(v): g["weight_decay"] for g in groups for v in g["params"]}
        self.flat: list[dict[str, torch.Tensor]] = []
        for u, length in zip(engine.units, owner.lengths):
            a = u.shard_range[0]
            m = torch.zeros(length, dtype=torch.float32, device=u.master.device)  # the whole padded unit
            v, wd = (torch.zeros_like(u.master) for _ in range(2))
            for view, s in zip(u.views, u.segments):
                wd[s.lo:s.hi] = decay_of[id(view)]
                self.state[view] = {"step": torch.zeros((), dtype=torch.float32), "exp_avg": m[a + s.lo:a + s.hi],
                                    "exp_avg_sq": v[s.lo:s.hi]}
            self.flat.append({"exp_avg": m, "exp_avg_sq": v, "wd": wd, "shard": m[a:a + u.master.numel()]})

    @property
    def step_count(self) -> int:
        return int(next(iter(self.state.values()))["step"])

    @torch.no_grad()
    def step(self, closure=None):
        group = self.param_groups[0]
        lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
        frozen = self.step_count >= self.freeze
        for i, (u, st) in enumerate(zip(self.engine.units, self.flat)):
            m, v = st["shard"], st["exp_avg_sq"]
            if not (frozen and self.owner.sharded):  # ZeRO 1-2 after the freeze: folded in by the reduction
                g = u.master_grad / self.grad_scale if self.grad_scale is not None else u.master_grad
                m.mul_(b1).add_(g, alpha=1 - b1)
            if frozen:
                self.owner.all_reduce_momentum(i, st["exp_avg"], u.numel)
            else:
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
            update = m / (v.sqrt() + eps)  # DeepSpeed's operations, in its order
            update += st["wd"] * u.master
            u.master.add_(-lr * update)
        for st in self.state.values():
            st["step"] += 1
