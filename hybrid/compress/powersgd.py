"""PowerSGD (Vogels et al. 2019, arXiv 1905.13727): a rank-r all-reduce of each gradient matrix, with error feedback.

For one DP rank's gradient matrix M (n x m, the local TP shard viewed as (shape[0], -1)) plus its error e:

    M' = M + e                                  error feedback: what earlier steps did not transmit
    P  = M' Q                  (n x r)          Q (m x r) warm-started from the last step, orthonormalised
    P  = orth(sum_ranks P)                      all-reduce #1: r n numbers
    Q  = M'^T P                (m x r)
    Q  = (sum_ranks Q) / N                      all-reduce #2: r m numbers
    M~ = P Q^T                 ~ mean_ranks M'  what every rank applies
    e  = M' - M~                                this rank's residual, carried to the next step

Tensors for which r(n + m) x min_compression_rate >= n m (1-D ones: norms and biases; small matrices) are
all-reduced whole and averaged. So a step moves r(n + m) numbers per compressed matrix plus the uncompressed
elements: the ledger counts exactly that (tests/test_compress_powersgd.py).

The math follows torch's `powerSGD_hook` (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py)
operation for operation -- the same orthogonalisation (Gram-Schmidt for r <= 2, Householder QR above), the same
random initial Q (numpy RandomState(seed) draws a torch seed per bucket), the same error buffer over the whole
bucket -- so in plain DP it equals the hook bit for bit on the same gradients (the test drives the hook itself).

Kept as pure functions of tensors (`compress`, `project`, `decompress`, `orthogonalize`) beside the one function
that communicates (`reduce_bucket`), so the math and the bytes are checked apart.

Two diagnostics of scripts/bench_comm_efficient.py, not train.py flags (neither closed the r = 4 gap to AdamW,
docs/comm-efficient.md): `reduce_bucket_epfml`, the PowerSGD authors' library's two half power iterations a step
(the same bytes; tests/test_compress_powersgd_variants.py against their algorithm), and `error_feedback` False
(torch's `use_error_feedback=False`, bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from hybrid.cliutil import check_number
from hybrid.comm import Group
from hybrid.compress.volume import PowerSGDConfig, bucket_elements, matrix_rank  # noqa: F401  (re-exported)

SEED_HIGH = 1_000_000_000  # torch's hook: torch.manual_seed(rng.randint(1_000_000_000)) per new bucket


# --- the math: pure functions of tensors -------------------------------------------------------------------------
def orthogonalize(m: torch.Tensor) -> None:
    """Orthonormalise the columns of each (n, r) matrix of a (batch, n, r) tensor, in place: Gram-Schmidt for
    r <= 2 or half precision, Householder QR otherwise (torch's `_orthogonalize`, epsilon 0)."""
    rank = m.shape[2]
    if rank <= 2 or m.dtype in (torch.float16, torch.bfloat16):
        for i in range(rank):
            col = m[:, :, i:i + 1]
            col /= torch.norm(col, dim=1, keepdim=True)
            if i + 1 < rank:
                rest = m[:, :, i + 1:]
                rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    else:
        torch.linalg.qr(m, out=(m, torch.empty(m.shape[0], rank, rank, device=m.device, dtype=m.dtype)))


def compress(matrix: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """P = M Q: (1, n, m) x (1, m, r) -> (1, n, r), the left factor each rank sends."""
    return torch.bmm(matrix, q, out=out)


def project(matrix: torch.Tensor, p: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Q = M^T P: (1, m, n) x (1, n, r) -> (1, m, r), the right factor against the summed, orthonormal P."""
    return torch.bmm(matrix.transpose(1, 2), p, out=out)


def decompress(p: torch.Tensor, q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """M~ = P Q^T: (1, n, r) x (1, r, m) -> (1, n, m), written over the gradient."""
    return torch.bmm(p, q.transpose(1, 2), out=out)


# --- the state each rank carries ---------------------------------------------------------------------------------
@dataclass
class PowerSGDState:
    """Error feedback and warm-start factors, one entry per bucket index (as the hook's `PowerSGDState`).

    `error[b]` differs between DP ranks (each rank's untransmitted residual); `p[b]`, `q[b]` are equal on every
    DP rank (the outputs of all-reduces). `draws` counts seeds drawn from RandomState(seed): replaying them
    restores the generator (a checkpoint stores the count, not numpy's state)."""

    cfg: PowerSGDConfig
    iter: int = 0
    draws: int = 0
    error: dict[int, torch.Tensor] = field(default_factory=dict)
    p: dict[int, torch.Tensor] = field(default_factory=dict)
    q: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.RandomState(self.cfg.seed)
        for _ in range(self.draws):
            self.rng.randint(SEED_HIGH)

    @property
    def compressing(self) -> bool:
        return self.iter >= self.cfg.start_iter

    def next_seed(self) -> int:
        self.draws += 1
        return int(self.rng.randint(SEED_HIGH))

    def restore_draws(self, draws: int) -> None:
        """After a checkpoint load: the generator as after `draws` seeds."""
        self.rng = np.random.RandomState(self.cfg.seed)
        self.draws = 0
        for _ in range(draws):
            self.next_seed()


# --- one bucket's reduction (the only communication) -------------------------------------------------------------
def _factor_views(memory: torch.Tensor, dims: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Consecutive (1, d, r) views of one flat factor buffer."""
    out, at = [], 0
    for d, r in dims:
        out.append(memory[at:at + d * r].view(1, d, r))
        at += d * r
    return out


def _grouped_by_shape(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    """The matrices with equal shapes together, shapes in order of first appearance: the order the hook lays out
    P and Q (its `shape_to_tensors` dict) and draws the initial Q in."""
    groups: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for m in matrices:
        groups.setdefault(tuple(m.shape), []).append(m)
    return [m for ms in groups.values() for m in ms]


def _initial_q(state: PowerSGDState, qs: list[torch.Tensor], dtype: torch.dtype) -> None:
    """Random Q on the CPU from a seed drawn from the state's RandomState, as the hook does for a new bucket."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(state.next_seed())
        for q in qs:
            q.copy_(torch.randn(*q.shape, device="cpu", dtype=dtype))
            orthogonalize(q)


def _factors(state: PowerSGDState, index: int, matrices: list[torch.Tensor],
             buffer: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Bucket `index`'s P and Q views, allocated (and Q drawn, as the hook draws it) at its first compressed
    step, otherwise Q orthonormalised."""
    cfg = state.cfg
    ranks = [matrix_rank((t.shape[1], t.shape[2]), cfg) for t in matrices]
    fresh = index not in state.p
    if fresh:
        state.p[index] = buffer.new_empty(sum(t.shape[1] * r for t, r in zip(matrices, ranks)))
        state.q[index] = buffer.new_empty(sum(t.shape[2] * r for t, r in zip(matrices, ranks)))
    ps = _factor_views(state.p[index], [(t.shape[1], r) for t, r in zip(matrices, ranks)])
    qs = _factor_views(state.q[index], [(t.shape[2], r) for t, r in zip(matrices, ranks)])
    if fresh:
        _initial_q(state, qs, buffer.dtype)
    else:
        for q in qs:
            orthogonalize(q)
    return ps, qs


def reduce_bucket(state: PowerSGDState, index: int, buffer: torch.Tensor, tensors: list[torch.Tensor],
                  group: Group) -> None:
    """Replace `tensors` (views into `buffer`, this rank's gradients) by the DP mean of their PowerSGD
    approximation, in place; update the error feedback and the warm-start factors of bucket `index`.
    Three all-reduces on `group`: the uncompressed elements, then P, then Q."""
    cfg, world = state.cfg, group.size
    if cfg.error_feedback:
        if index in state.error:
            buffer.add_(state.error[index])
        else:
            state.error[index] = torch.zeros_like(buffer)
        sent = buffer.detach().clone()  # M' = M + e
    matrices, whole = [], []
    for t in tensors:
        (matrices if matrix_rank(tuple(t.shape), cfg) else whole).append(t)
    matrices = _grouped_by_shape([t.view(1, t.shape[0], -1) for t in matrices])
    ps, qs = _factors(state, index, matrices, buffer)
    for m, q, p in zip(matrices, qs, ps):
        compress(m, q, p)
    _all_reduce_whole(whole, buffer, group)
    group.all_reduce(state.p[index], tag="powersgd.p")
    for p in ps:
        orthogonalize(p)
    for m, p, q in zip(matrices, ps, qs):
        project(m, p, q)
    group.all_reduce(state.q[index], tag="powersgd.q")
    state.q[index].div_(world)
    for p, q, m in zip(ps, qs, matrices):
        decompress(p, q, m)
    if cfg.error_feedback:
        state.error[index] = sent - buffer


def _all_reduce_whole(whole: list[torch.Tensor], buffer: torch.Tensor, group: Group) -> None:
    """The tensors not worth compressing, concatenated, all-reduced and averaged."""
    flat = torch.cat([t.view(-1) for t in whole]) if whole else buffer.new_empty(0)
    if flat.numel():
        group.all_reduce(flat, tag="powersgd.uncompressed")
    flat.div_(group.size)
    at = 0
    for t in whole:
        t.copy_(flat[at:at + t.numel()].view_as(t))
        at += t.numel()


def reduce_bucket_epfml(state: PowerSGDState, index: int, buffer: torch.Tensor, tensors: list[torch.Tensor],
                        group: Group) -> None:
    """As `reduce_bucket`, with the PowerSGD authors' library's algorithm (github.com/epfml/powersgd,
    powersgd/powersgd.py `BasicPowerSGD.aggregate`, `num_iters_per_step=2`): two half power iterations a step,
    each subtracting what it sent from this rank's residual R (error feedback after each half), each sending one
    factor. Written for M^T of their code (their even half starts from P; ours from Q, so the factor carried
    between steps is Q, as torch's hook carries, and the checkpoint keeps it as the hook's):

        R = M' = M + e
        half 1:  Q <- orth(Q);   P = R Q;    R -= P Q^T;    P <- sum_ranks P    (all-reduce: r n numbers)
                 M~ = P Q^T / N
        half 2:  P <- orth(P);   Q = R^T P;  R -= P Q^T;    Q <- sum_ranks Q    (all-reduce: r m numbers)
                 M~ += P Q^T / N;   e = R;   Q carried to the next step (orthonormalised there)

    M~ = mean(M') Q Q^T + P P^T mean(M') (I - Q Q^T): rank up to 2 r, for the hook's r (n + m) numbers; the
    residual e_i = (I - P P^T) M'_i (I - Q Q^T) is this rank's own (the hook's is M'_i - M~). Both halves are
    linear in the M'_i before each all-reduce, so the factors depend on the errors only through their sum: the
    checkpoint's DP resharding by the mean holds as for the hook."""
    world = group.size
    if index in state.error:
        buffer.add_(state.error[index])
    residual = buffer.detach().clone()  # R = M'
    pairs = list(zip(tensors, _views_in(residual, buffer, tensors)))
    matrices = [(t, r) for t, r in pairs if matrix_rank(tuple(t.shape), state.cfg)]
    whole = [t for t, _ in pairs if not matrix_rank(tuple(t.shape), state.cfg)]
    out = _grouped_by_shape([t.view(1, t.shape[0], -1) for t, _ in matrices])
    res = _grouped_by_shape([r.view(1, r.shape[0], -1) for _, r in matrices])  # the same order: same shapes
    ps, qs = _factors(state, index, out, buffer)
    for r, p, q in zip(res, ps, qs):
        compress(r, q, p)
        r.baddbmm_(p, q.transpose(1, 2), alpha=-1)
    _all_reduce_whole(whole, buffer, group)
    group.all_reduce(state.p[index], tag="powersgd.p")
    for m, r, p, q in zip(out, res, ps, qs):
        decompress(p, q, m).div_(world)
        orthogonalize(p)
        project(r, p, q)
        r.baddbmm_(p, q.transpose(1, 2), alpha=-1)
    group.all_reduce(state.q[index], tag="powersgd.q")
    for m, p, q in zip(out, ps, qs):
        m.baddbmm_(p, q.transpose(1, 2), alpha=1 / world)
    for _, r in pairs:
        if not matrix_rank(tuple(r.shape), state.cfg):
            r.zero_()  # sent whole: nothing left over (the library's AllReduce zeroes it)
    state.error[index] = residual


def _views_in(other: torch.Tensor, buffer: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The views of `other` (a tensor shaped as `buffer`) at the places `tensors` view `buffer`."""
    base = buffer.data_ptr()
    size = buffer.element_size()
    return [other[(t.data_ptr() - base) // size:][:t.numel()].view_as(t) for t in tensors]


REDUCERS = {"torch": reduce_bucket, "epfml": reduce_bucket_epfml}  # PowerSGDConfig.variant -> its reduction


def reduce_step(state: PowerSGDState, index: int, buffer: torch.Tensor, tensors: list[torch.Tensor], group: Group,
                last: bool) -> None:
    """One bucket's DP mean as the hook gives it: before `start_iter` a plain all-reduce (divided first, as
    torch's default hook), after it `reduce_bucket`; the step count advances after the step's last bucket."""
    if state.compressing:
        REDUCERS[state.cfg.variant](state, index, buffer, tensors, group)
    else:
        group.all_reduce(buffer.div_(group.size), tag="powersgd.uncompressed")
    if last:
        state.iter += 1
