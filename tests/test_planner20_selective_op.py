"""The planner's op-level selective recomputation (--recompute-granularity selective-op) against torch as our
runtime runs it: which matmuls the backward runs again, and what the forward keeps.

Counted on torch, not read off the policy: a TorchDispatchMode records every aten mm / addmm the backward runs,
once with no recomputation and once under selective-op; the difference is the rerun. Three blocks of the runtime's
models (one layer, in-process): GPT-2 (GELU MLP with biases), Llama (SwiGLU) and a Nemotron-like one (GPT-2's
block with squared ReLU and no biases: a non-gated MLP of mm's). "TP shapes": the matmuls one rank runs at t 2 --
a / t query heads, g / t key/value heads, f / t MLP width, h whole -- built as a t 1 model of those widths (the
policy counts matmuls, which a TP rank runs at these shapes; the collectives do not enter the count).

The finding: torch's non-reentrant checkpoint stops its rerun once the last tensor the backward needs is saved
again, and autograd saves a linear's input before it runs the matmul. So a non-gated MLP's last matmul (GPT-2's
c_proj, Nemotron's down: an even count of matmuls, the last one not kept) is not run again -- unless a hidden
dropout follows it, whose mask is the last saved tensor. Before round 20 the planner reran it
(`linear_gemms_in_order[1::2]`); these tests fail on that."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from hybrid.comm import Group
from hybrid.measured_memory import SavedActivationLedger
from hybrid.planner.layout import Layout, Workload
from hybrid.planner.model import ActivationProfile, Shard
from hybrid.planner.ops import KernelProfile
from hybrid.planner.time import recompute_stops_early
from hybrid.tp import TPContext
from models import Recompute, build_model, load_config, shift_labels
from models import activations

B, S = 2, 8
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


class _SquaredReLU(nn.Module):
    """Nemotron's MLP activation, relu(x)^2 (transformers' ReLUSquaredActivation: relu, then square), here so
    that the test does not import transformers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.square(torch.relu(x))


@pytest.fixture(autouse=True)
def _relu2(monkeypatch):
    monkeypatch.setitem(activations.LOCAL, "relu2", _SquaredReLU)


def _configs() -> dict:
    """One-layer blocks; f 96 so that no MLP matmul has another's shape."""
    gpt2 = replace(load_config("tiny-gpt2"), num_layers=1, ffn_hidden_size=96)
    llama = replace(load_config("tiny-llama"), num_layers=1, ffn_hidden_size=96)
    nemotron = replace(gpt2, activation="relu2", qkv_bias=False, mlp_bias=False, out_bias=False)
    return {"gpt2": gpt2, "llama": llama, "nemotron-like": nemotron}


def _rank_shapes(cfg, t: int):
    """A t 1 model whose matmuls are one TP rank's at size t (see the module docstring)."""
    return replace(cfg, num_heads=cfg.num_heads // t, num_kv_heads=max(1, cfg.num_kv_heads // t),
                   ffn_hidden_size=cfg.ffn_hidden_size // t)


class _BackwardMatmuls(TorchDispatchMode):
    """(m, n, k) of every mm / addmm run while `on`: an (m x k)(k x n) product."""

    def __init__(self) -> None:
        super().__init__()
        self.on, self.shapes = False, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and func in MATMULS:
            a, b = args[-2:]
            self.shapes[(a.shape[0], b.shape[1], a.shape[1])] += 1
        return func(*args, **(kwargs or {}))


def _backward_matmuls(cfg, recompute: Recompute) -> Counter:
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=3, recompute=recompute).train()
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    with _BackwardMatmuls() as mode:
        loss = model(ids, shift_labels(ids))
        mode.on = True
        loss.backward()
    return mode.shapes


def _rerun_on_torch(cfg, recompute: Recompute = Recompute.SELECTIVE_OP) -> Counter:
    return _backward_matmuls(cfg, recompute) - _backward_matmuls(cfg, Recompute.NONE)


def _planned(cfg, t: int, stops_early: bool) -> Counter:
    shard = Shard(cfg, t, cfg.vocab_size, ActivationProfile.BF16_FLASH)
    return Counter((g.m, g.n, g.k) for g in shard.selective_op_rerun_gemms(B, S, stops_early))


def _stops_early(cfg) -> bool:
    """time.recompute_stops_early for `cfg` trained as our runtime trains it: PyTorch-native (eager kernels), bf16
    linears of torch (no FP8)."""
    work = Workload(cfg, global_batch=B, seq_length=S, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.EAGER, fp32_grads=False)
    return recompute_stops_early(work, Layout(micro_batch=B, recompute=Recompute.SELECTIVE_OP))


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "nemotron-like"])
def test_planner_reruns_the_matmuls_torch_reruns(arch, t):
    """The planner's rerun matmuls are, shape for shape, the ones torch runs again in the backward. GPT-2 and the
    Nemotron-like block rerun k and o (not c_proj / down), Llama k, o and up."""
    cfg = _configs()[arch]
    measured = _rerun_on_torch(_rank_shapes(cfg, t))
    assert _stops_early(cfg)
    assert _planned(cfg, t, _stops_early(cfg)) == measured
    assert sum(measured.values()) == (3 if arch == "llama" else 2)


@pytest.mark.parametrize("arch", ["gpt2", "nemotron-like"])
def test_hidden_dropout_makes_the_last_matmul_rerun(arch):
    """With hidden dropout the mask after the MLP's last matmul is the rerun's last saved tensor: torch runs that
    matmul again, under selective-op and under full recomputation alike; the planner then does not stop early."""
    cfg = replace(_configs()[arch], dropout=0.1, attention_dropout=0.0, embedding_dropout=0.0)
    last = (B * S, cfg.hidden_size, cfg.ffn_hidden_size)
    assert not _stops_early(cfg)
    measured = _rerun_on_torch(cfg)
    assert measured[last] == 1 and _planned(cfg, 1, _stops_early(cfg)) == measured
    assert _rerun_on_torch(cfg, Recompute.FULL)[last] == 1
    assert _rerun_on_torch(replace(cfg, dropout=0.0), Recompute.FULL)[last] == 0


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "nemotron-like"])
def test_planner_keeps_what_the_runtime_ledger_holds(arch, t):
    """Kept bytes: the saved-activation ledger over one layer's forward under selective-op holds the outputs the
    policy stores beside what full recomputation keeps (the block input, and the embedding / head's tensors
    alike in both), so the two peaks differ by Shard.selective_op_kept_bytes less the block input (fp32)."""
    cfg = _configs()[arch]
    peaks = {mode: _forward_peak(_rank_shapes(cfg, t), mode) for mode in (Recompute.FULL, Recompute.SELECTIVE_OP)}
    shard = Shard(cfg, t, cfg.vocab_size, ActivationProfile.FP32_FLASH)
    block_input = B * S * cfg.hidden_size * 4
    assert peaks[Recompute.SELECTIVE_OP] - peaks[Recompute.FULL] == shard.selective_op_kept_bytes(B, S, False) - \
        block_input


def _forward_peak(cfg, recompute: Recompute) -> int:
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=3, recompute=recompute).train()
    ids = torch.randint(0, cfg.vocab_size, (B, S), generator=torch.Generator().manual_seed(0))
    ledger = SavedActivationLedger(params=model.parameters())
    with ledger:
        model(ids, shift_labels(ids))
    return ledger.peak_bytes


def test_the_step_prices_that_rerun():
    """time.step_flops (the plan's hardware FLOPs) and the rerun pass take the same list: a GPT-2 step under
    selective-op on the PyTorch stack does k and o once more a layer, not c_proj."""
    from hybrid.planner.time import FlopsFormula, exact_step_flops, step_flops
    cfg = replace(load_config("tiny-gpt2"), ffn_hidden_size=96)
    work = Workload(cfg, global_batch=B, seq_length=S, activations=ActivationProfile.BF16_FLASH,
                    kernels=KernelProfile.EAGER, fp32_grads=False)
    extra = step_flops(work, Layout(micro_batch=B, recompute=Recompute.SELECTIVE_OP), FlopsFormula.EXACT) - \
        exact_step_flops(work)
    h = cfg.hidden_size
    assert extra == B * S * cfg.num_layers * 2 * (h * h + h * h)  # k (h -> h) and o (h -> h), 2 FLOPs a weight
