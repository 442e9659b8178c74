"""scripts/bench_comm_efficient.py's row set and schedule, without running a row (the runs: the slow
tests/test_compress_bench.py): --powersgd-extra-ranks adds a PowerSGD row per rank after PowerSGD's, each with its
own rank and everything else the run's; every row steps at OptimizerConfig.lr_at of the run's schedule flags; bad
schedule values end in the parser's one line; --global-batch / --micro-batch reach every row's BatchSpec. And
scripts/gradient_spectrum.py's measure (the top-r share of |G|^2) against a gradient of known singular values."""

from __future__ import annotations

import argparse
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import bench_comm_efficient as bench  # noqa: E402


def _args(**over) -> argparse.Namespace:
    base = dict(lr=3e-3, min_lr=3e-4, adam_beta2=0.95, lr_warmup_iters=0, lr_decay_style="constant", steps=300,
                powersgd_rank=4, powersgd_extra_ranks=[], rows=[], model="tiny-llama", hidden_size=0,
                powersgd_start_iter=60, powersgd_min_compression_rate=2.0, powersgd_variant="torch",
                powersgd_no_error_feedback=False, optimizer="adam", sgd_momentum=0.9)
    return argparse.Namespace(**{**base, **over})


def test_extra_ranks_add_powersgd_rows_after_powersgd_with_only_the_rank_changed():
    args = _args(powersgd_extra_ranks=[8, 16])
    rows = bench._rows(args)
    assert list(rows) == ["AdamW (synchronous)", "PowerSGD", "PowerSGD r 8", "PowerSGD r 16", "1-bit Adam"]
    assert rows["PowerSGD"][1] is args and args.powersgd_rank == 4
    for r in (8, 16):
        fn, row_args = rows[f"PowerSGD r {r}"]
        assert fn is bench.row_powersgd
        assert vars(row_args) == {**vars(args), "powersgd_rank": r}
    # the default table: every row but the opt-in ones (round 15's momentum PowerSGD: only when --rows names it)
    assert list(bench._rows(_args())) == [n for n, row in bench.ROWS.items() if row not in bench.OPT_IN]
    assert bench.OPT_IN and all(row in bench.ROWS.values() for row in bench.OPT_IN)
    named = bench._rows(_args(rows=["AdamW", "Momentum PowerSGD"]))
    assert list(named) == ["AdamW (synchronous)", "Momentum PowerSGD (1-bit Adam's scheme)"]


def test_every_row_steps_at_the_schedule_of_the_flags():
    cfg = bench._opt_cfg(_args(lr_warmup_iters=30, lr_decay_style="cosine", adam_beta2=0.999))
    assert (cfg.beta2, cfg.weight_decay, cfg.train_iters) == (0.999, 0.01, 300)
    assert cfg.lr_at(0) == 0.0 and cfg.lr_at(15) == pytest.approx(1.5e-3) and cfg.lr_at(30) == pytest.approx(3e-3)
    # cosine from 3e-3 at step 30 to 3e-4 at step 300 (Megatron's formula, written out)
    ratio = (165 - 30) / (300 - 30)
    assert cfg.lr_at(165) == pytest.approx(3e-4 + 0.5 * (1 + math.cos(math.pi * ratio)) * (3e-3 - 3e-4))
    assert cfg.lr_at(300) == pytest.approx(3e-4)
    assert {bench._opt_cfg(_args()).lr_at(i) for i in (0, 150, 299)} == {3e-3}  # the default: constant


@pytest.mark.parametrize("extra,message", [
    (["--lr-warmup-iters", "300"], "--lr-warmup-iters must be >= 0 and below --steps (300)"),
    (["--adam-beta2", "1"], "--adam-beta2 must be in [0, 1)"),
    (["--min-lr", "1"], "--min-lr in [0, --lr]"),
    (["--powersgd-extra-ranks", "4,0"], "argument --powersgd-extra-ranks"),
    (["--hidden-size", "100"], "--hidden-size must be a multiple of the model's 4 heads x --tp 2"),
    (["--powersgd-min-compression-rate", "0.5"], "--powersgd-min-compression-rate must be >= 1"),
    (["--global-batch", "20", "--micro-batch", "4"],
     "--global-batch 20 must be a multiple of --micro-batch 4 x --dp 2 = 8"),
    (["--micro-batch", "0"], "argument --micro-batch"),
])
def test_bad_schedule_flags_are_one_line(capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        bench.main(extra)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_rows_selects_rows_and_always_keeps_the_adamw_baseline(capsys):
    assert list(bench._rows(_args(rows=["AdamW", "1-bit Adam"]))) == ["AdamW (synchronous)", "1-bit Adam"]
    with pytest.raises(SystemExit) as e:
        bench.main(["--rows", "LAMB"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--rows: unknown row 'LAMB'" in err and err.count("\n") == 1, err


def test_hidden_size_widens_the_preset_keeping_its_heads_layers_and_mlp_ratio():
    """--hidden-size 256 on tiny-llama (h 64, 4 heads of 16, 2 kv heads, MLP 176 = 2.75 h): h 256, heads of 64, MLP
    704, all else the preset's; the model builds with those shapes. Without the flag: the preset itself."""
    from models import build_pipeline_chunks, load_config
    from hybrid.mesh import Mesh
    from hybrid.tp import TPContext
    preset = load_config("tiny-llama")
    assert bench._arch(_args()) is preset
    wide = bench._arch(_args(hidden_size=256))
    assert (wide.hidden_size, wide.head_dim, wide.ffn_hidden_size) == (256, 64, 704)
    assert (wide.num_heads, wide.num_kv_heads, wide.num_layers, wide.vocab_size) == (4, 2, 4, 256)
    shapes = {n: tuple(p.shape) for n, p in build_pipeline_chunks(wide, TPContext(Mesh.single().tp), 0, 1,
                                                                   seed=0).named_parameters()}
    assert set(shapes.values()) == {(256,), (128, 256), (256, 256), (256, 704), (704, 256)}


def test_min_compression_rate_reaches_the_powersgd_rows_config():
    """--powersgd-min-compression-rate 10 (the PowerSGD authors' library's README setting): on tiny-llama at r 4
    the attention's 64 x 64 and 32 x 64 matrices are all-reduced whole (n m <= 10 r (n + m)), the MLP's 176 x 64
    and the 256 x 64 embedding and head still compressed; the default 2 (torch's) compresses all of them."""
    from hybrid.compress.powersgd import matrix_rank
    assert bench._powersgd_cfg(_args()).min_compression_rate == 2.0
    cfg = bench._powersgd_cfg(_args(powersgd_min_compression_rate=10.0))
    assert (cfg.rank, cfg.start_iter, cfg.min_compression_rate) == (4, 60, 10.0)
    assert [matrix_rank(s, cfg) for s in ((64, 64), (32, 64), (176, 64), (64, 176), (256, 64))] == [0, 0, 4, 4, 4]
    default = bench._powersgd_cfg(_args())
    assert [matrix_rank(s, default) for s in ((64, 64), (32, 64), (176, 64), (256, 64))] == [4, 4, 4, 4]


def test_global_and_micro_batch_reach_the_rows_batch_spec():
    """--global-batch 128 --micro-batch 8 (the batch study, docs/comm-efficient.md): at one rank (dp 1) the 128
    sequences in 16 micro-batches of 8, the pipeline's stage input (8, seq, h); the default: 16 in 8 of 2."""
    from hybrid.mesh import Mesh
    _, spec, runner = bench._setup(Mesh.single(), _args(global_batch=128, micro_batch=8, seq=32, seed=3))
    assert (spec.global_batch, spec.micro_batch, spec.seq_length, spec.num_micro_batches) == (128, 8, 32, 16)
    assert runner.io.shape[0] == 8
    _, spec, _ = bench._setup(Mesh.single(), _args(global_batch=16, micro_batch=bench.MICRO, seq=32, seed=3))
    assert (spec.micro_batch, spec.num_micro_batches) == (2, 8)


def test_gradient_spectrum_share_is_the_top_singular_values_share_of_the_squared_norm():
    """A 'model' whose loss is <W, C>: its gradient is C, singular values 3, 2, 1 by construction (C = U diag V^T
    with orthonormal U, V), so the top-1 share is 9 / 14 and the top-2 13 / 14; 1-D parameters are skipped."""
    import torch
    import gradient_spectrum as spectrum
    u, _ = torch.linalg.qr(torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))
    c = u @ torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64)) @ v.T

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(5, 4, dtype=torch.float64))
            self.norm = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))

        def forward(self, x, y):
            return (self.w * c).sum() + self.norm.sum() * 0

    got = spectrum.shares(Probe(), [(None, None)] * 2, [1, 2, 3])
    assert list(got) == ["w"] and got["w"] == pytest.approx([9 / 14, 13 / 14, 1.0], abs=1e-12)
    assert spectrum.by_group({"model.layers.0.mlp.up_proj.weight": [0.5], "model.layers.1.mlp.down_proj.weight": [0.7],
                              "lm_head.weight": [0.9]}) == pytest.approx({"mlp": 0.6, "head": 0.9})


def test_gradient_spectrum_bad_batch_is_one_line(capsys):
    import gradient_spectrum as spectrum
    with pytest.raises(SystemExit) as e:
        spectrum.main(["--global-batch", "15", "--dp", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--global-batch 15 must be a multiple of --dp 2" in err and err.count("\n") == 1, err
