"""The bench's PowerSGD diagnostics (hybrid/compress/powersgd.py; not train.py flags) against independent references.

`--powersgd-variant epfml` (`reduce_bucket_epfml`) against the PowerSGD authors'
library's algorithm, re-implemented here from its source (github.com/epfml/powersgd, powersgd/powersgd.py
`BasicPowerSGD.aggregate` with `num_iters_per_step=2`, powersgd/orthogonalization.py), independently of ours: every
rank's gradients in one process, the all-reduces written as sums over the ranks, the library's own QR
orthogonalisation (ours: Gram-Schmidt for r <= 2), its error kept in the gradient (its `optimizer_step` never zeroes
it). The library runs on each matrix as given; we run it on M^T (so that the factor carried between steps is Q, as
in torch's hook): the reference is the library applied to the transposed gradients, its first factor our Q.

At world 2, ranks 1, 2 and 4, two buckets with repeated shapes, a 4-D tensor, 1-D tensors and a small matrix sent
whole, two plain steps then four compressed ones: each rank's output (the DP mean's approximation) and error feedback
equal the reference's within float64 rounding; the ledger's bytes are torch's hook's r (n + m) per compressed
matrix plus the uncompressed elements; and the variant is other math than the hook (its output differs).

`--powersgd-no-error-feedback` against torch's own `powerSGD_hook(use_error_feedback=False)`, bit for bit.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybrid.testing import run_distributed

BUCKETS = [[(24, 16), (16,), (3, 4), (40, 20), (8, 2, 3, 5), (24, 16)], [(32, 12), (12,), (40, 20), (32, 12)]]
STEPS, START, WORLD = 6, 2, 2
# float64: each output element is a few dot products of <= 40 terms and two QR factorisations of <= 40 x 4 matrices;
# their roundings (~1e-16 each, amplified by the conditioning of the QR inputs) stay far below this
TOL = 1e-10


def _grads(rank: int, step: int, b: int) -> torch.Tensor:
    n = sum(math.prod(s) for s in BUCKETS[b])
    return torch.randn(n, generator=torch.Generator().manual_seed(1000 * rank + 10 * step + b), dtype=torch.float64)


def _split(flat: torch.Tensor, shapes) -> list[torch.Tensor]:
    out, at = [], 0
    for s in shapes:
        out.append(flat[at:at + math.prod(s)].view(s))
        at += math.prod(s)
    return out


def _compressed(shape, r: int) -> bool:
    """torch's / the library's rule at min_compression_rate 2, written out: n m > 2 r' (n + m), r' = min(n, m, r)."""
    n, m = shape[0], math.prod(shape[1:])
    rr = min(n, m, r)
    return n * m > 2 * rr * (n + m)


# --- the library's algorithm, from its source ----------------------------------------------------------------------
def _lib_orthogonalize(x: torch.Tensor) -> torch.Tensor:
    """powersgd/orthogonalization.py: divide by the norm at rank 1, else the Q of torch.linalg.qr."""
    return x / x.norm() if x.shape[-1] == 1 else torch.linalg.qr(x).Q


def _lib_aggregate(grads: list[torch.Tensor], p: torch.Tensor, q: torch.Tensor, step: int):
    """One `BasicPowerSGD.aggregate` (num_iters_per_step 2) of one matrix over the ranks: `grads` (each rank's
    matrix, the library's input: gradient + error, changed into the error), `p`, `q` the library's factors (p: rows
    x r, q: cols x r). Returns (the approximation of the mean, the new p and q)."""
    n = len(grads)
    approx = torch.zeros_like(grads[0])
    for it in range(2):
        if (step * 2 + it) % 2 == 0:  # even: out = Q = G^T P, all-reduced
            p = _lib_orthogonalize(p)
            outs = [g.T @ p for g in grads]
            for g, o in zip(grads, outs):
                g -= p @ o.T
            q = sum(outs)
            approx += p @ q.T / n
        else:  # odd: out = P = G Q, all-reduced
            q = _lib_orthogonalize(q)
            outs = [g @ q for g in grads]
            for g, o in zip(grads, outs):
                g -= o @ q.T
            p = sum(outs)
            approx += p @ q.T / n
    return approx, p, q


def _reference(r: int, q0: dict[tuple[int, int], torch.Tensor]):
    """Every rank's (output, error) per step and bucket, the library's algorithm on each transposed matrix (its
    p = our Q, from `q0`), plain averaging before START and for the tensors sent whole."""
    err = {(k, b, j): torch.zeros(s, dtype=torch.float64) for k in range(WORLD) for b, shapes in enumerate(BUCKETS)
           for j, s in enumerate(shapes)}
    fac = {key: (q.clone(), None) for key, q in q0.items()}
    out = {}
    for step in range(STEPS):
        for b, shapes in enumerate(BUCKETS):
            grads = [_split(_grads(k, step, b), shapes) for k in range(WORLD)]
            for j, s in enumerate(shapes):
                if step < START or not _compressed(s, r):
                    mean = sum(g[j] for g in grads) / WORLD
                    for k in range(WORLD):
                        out[(k, step, b, j)] = (mean, torch.zeros(s, dtype=torch.float64))
                    continue
                mats = [(grads[k][j] + err[(k, b, j)]).reshape(s[0], -1).T.clone() for k in range(WORLD)]
                p, q = fac[(b, j)]
                approx, p, q = _lib_aggregate(mats, p, q if q is not None else torch.zeros(1), step - START)
                fac[(b, j)] = (p, q)
                for k in range(WORLD):
                    err[(k, b, j)] = mats[k].T.reshape(s).clone()
                    out[(k, step, b, j)] = (approx.T.reshape(s), err[(k, b, j)])
    return out


# --- ours, at world 2 ------------------------------------------------------------------------------------------------
def _initial_q(r: int) -> dict[tuple[int, int], torch.Tensor]:
    """A random Q per compressed matrix (the test's, installed into our state before the first compressed step)."""
    g = torch.Generator().manual_seed(7)
    return {(b, j): torch.randn(math.prod(s[1:]), min(s[0], math.prod(s[1:]), r), generator=g, dtype=torch.float64)
            for b, shapes in enumerate(BUCKETS) for j, s in enumerate(shapes) if _compressed(s, r)}


def _install_q(state, r: int, q0) -> None:
    """Our flat P and Q buffers per bucket, Q filled from q0 in the hook's layout (matrices grouped by shape in
    order of first appearance), so that the first compressed step uses q0 instead of a drawn Q."""
    for b, shapes in enumerate(BUCKETS):
        groups: dict[tuple[int, int], list[int]] = {}
        for j, s in enumerate(shapes):
            if _compressed(s, r):
                groups.setdefault((s[0], math.prod(s[1:])), []).append(j)
        order = [j for js in groups.values() for j in js]
        state.q[b] = torch.cat([q0[(b, j)].reshape(-1) for j in order])
        state.p[b] = torch.cat([torch.zeros(shapes[j][0] * q0[(b, j)].shape[1], dtype=torch.float64)
                                for j in order])


def _ours(rank: int, world: int, r: int, variant: str):
    from hybrid.compress.powersgd import PowerSGDConfig, PowerSGDState, reduce_step
    from hybrid.mesh import Mesh, ParallelDims
    mesh = Mesh.build(ParallelDims.from_world(world))
    state = PowerSGDState(PowerSGDConfig(rank=r, start_iter=START, variant=variant))
    q0 = _initial_q(r)
    out, ledgers = {}, []
    for step in range(STEPS):
        if step == START:
            _install_q(state, r, q0)
        mesh.ledger.reset()
        for b, shapes in enumerate(BUCKETS):
            buf = _grads(rank, step, b)
            tensors = _split(buf, shapes)
            reduce_step(state, b, buf, tensors, mesh.dp, b == len(BUCKETS) - 1)
            err = state.error.get(b)
            errs = _split(err, shapes) if err is not None else [torch.zeros(s, dtype=torch.float64) for s in shapes]
            for j in range(len(shapes)):
                out[(rank, step, b, j)] = (tensors[j].clone(), errs[j].clone())
        ledgers.append(sum(e.bytes for (op, g), e in mesh.ledger.entries.items()
                           if op == "all_reduce" and g.startswith("dp")))
    return out, ledgers


def _no_error_feedback(rank: int, world: int, r: int):
    """torch's hook with use_error_feedback=False and ours with error_feedback False, on the same gradients
    (float32, as test_compress_powersgd.py): (hook's outputs, ours) per step and bucket."""
    from test_compress_powersgd import BUCKETS as HOOK_BUCKETS
    from test_compress_powersgd import FakeBucket
    from test_compress_powersgd import _grads as hook_grads
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState as TorchState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook

    from hybrid.compress.powersgd import PowerSGDConfig, PowerSGDState, reduce_step
    from hybrid.mesh import Mesh, ParallelDims
    mesh = Mesh.build(ParallelDims.from_world(world))
    ref_state = TorchState(process_group=mesh.dp.pg, matrix_approximation_rank=r, start_powerSGD_iter=START,
                           use_error_feedback=False)
    ours = PowerSGDState(PowerSGDConfig(rank=r, start_iter=START, error_feedback=False))
    out = []
    for step in range(STEPS):
        for b, shapes in enumerate(HOOK_BUCKETS):
            last = b == len(HOOK_BUCKETS) - 1
            ref = powerSGD_hook(ref_state, FakeBucket(b, hook_grads(rank, step, b), shapes, last)).wait()
            buf = hook_grads(rank, step, b)
            reduce_step(ours, b, buf, FakeBucket(b, buf, shapes, last).gradients(), mesh.dp, last)
            out.append((ref.clone(), buf.clone(), bool(ours.error)))
    return out


def _all(rank: int, world: int):
    out = {(r, v): _ours(rank, world, r, v) for r in (1, 2, 4) for v in ("epfml", "torch")}
    out.update({(r, "no-ef"): _no_error_feedback(rank, world, r) for r in (1, 4)})
    return out


@pytest.fixture(scope="module")
def runs():
    """One launch of 2 ranks: {(r, variant): [rank 0's (out, ledgers), rank 1's]}."""
    per_rank = run_distributed(_all, WORLD)
    return {key: [res[key] for res in per_rank] for key in per_rank[0]}


@pytest.mark.parametrize("r", [1, 2, 4])
def test_powersgd_epfml_variant_equals_the_authors_library_algorithm(runs, r):
    ref = _reference(r, _initial_q(r))
    compressed = 0
    for k, (out, _) in enumerate(runs[(r, "epfml")]):
        for key, (got, err) in out.items():
            want, want_err = ref[key]
            scale = want.abs().max().item() + 1
            assert (got - want).abs().max().item() <= TOL * scale, key
            assert (err - want_err).abs().max().item() <= TOL * scale, key
            compressed += bool(want_err.abs().max() > 0)
    assert compressed > 0  # the error feedback carried something: the compressed path ran


@pytest.mark.parametrize("r", [1, 2, 4])
def test_powersgd_epfml_variant_sends_the_hooks_bytes_and_is_other_math(runs, r):
    after = sum(min(s[0], math.prod(s[1:]), r) * (s[0] + math.prod(s[1:])) if _compressed(s, r) else math.prod(s)
                for shapes in BUCKETS for s in shapes)
    full = sum(math.prod(s) for shapes in BUCKETS for s in shapes)
    for (_, ledger), (_, hook_ledger) in zip(runs[(r, "epfml")], runs[(r, "torch")]):
        assert ledger == [8 * full] * START + [8 * after] * (STEPS - START)  # float64: 8 bytes a number
        assert ledger == hook_ledger
    ours, hook = runs[(r, "epfml")][0][0], runs[(r, "torch")][0][0]  # a variant: the hook's output differs
    last = [key for key in ours if key[1] == STEPS - 1 and _compressed(BUCKETS[key[2]][key[3]], r)]
    assert max((ours[key][0] - hook[key][0]).abs().max().item() for key in last) > 1e-3


@pytest.mark.parametrize("r", [1, 4])
def test_powersgd_without_error_feedback_equals_torch_hook_bit_for_bit(runs, r):
    """The bench's `--powersgd-no-error-feedback` diagnostic is torch's `use_error_feedback=False`: the hook's
    outputs bit for bit, and no error state kept."""
    for per_rank in runs[(r, "no-ef")]:
        for ref, ours, kept_error in per_rank:
            assert torch.equal(ref, ours)
            assert not kept_error


def test_bench_diagnostic_flags_reach_the_powersgd_rows_config_and_every_rows_optimizer():
    """scripts/bench_comm_efficient.py: --powersgd-variant, --powersgd-no-error-feedback and --optimizer sgd reach
    the configs its rows build (the defaults: torch's hook with error feedback, AdamW)."""
    import argparse
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    import bench_comm_efficient as bench
    base = dict(lr=0.3, min_lr=0.0, adam_beta2=0.95, lr_warmup_iters=0, lr_decay_style="constant", steps=300,
                powersgd_rank=4, powersgd_start_iter=60, powersgd_min_compression_rate=2.0, powersgd_variant="torch",
                powersgd_no_error_feedback=False, optimizer="adam", sgd_momentum=0.9)
    cfg = bench._powersgd_cfg(argparse.Namespace(**base))
    assert (cfg.variant, cfg.error_feedback) == ("torch", True)
    cfg = bench._powersgd_cfg(argparse.Namespace(**{**base, "powersgd_variant": "epfml"}))
    assert (cfg.rank, cfg.start_iter, cfg.variant, cfg.error_feedback) == (4, 60, "epfml", True)
    assert not bench._powersgd_cfg(argparse.Namespace(**{**base, "powersgd_no_error_feedback": True})).error_feedback
    assert bench._opt_cfg(argparse.Namespace(**base)).optimizer == "adam"
    sgd = bench._opt_cfg(argparse.Namespace(**{**base, "optimizer": "sgd"}))
    assert (sgd.optimizer, sgd.sgd_momentum, sgd.lr) == ("sgd", 0.9, 0.3)
    from hybrid.compress.powersgd import PowerSGDConfig
    with pytest.raises(ValueError, match="variant must be 'torch' or 'epfml'"):
        PowerSGDConfig(rank=4, variant="dalle")
