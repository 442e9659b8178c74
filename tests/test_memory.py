"""Measured memory, asserted exactly: activations saved for backward (SavedActivationLedger) and
model state (model_state_bytes).

Per-layer saved bytes at tp = 1, fp32, no dropout, CPU flash attention, per token (b s tokens), in
4-byte elements (hybrid/measured_memory.py lists each saved tensor):

    GPT-2:  4h + 4 + 2ad + 2gd + a + 2f
    Llama:  6h + 2 + 2ad + 2gd + a + 4f,   plus 2 s d (RoPE cos/sin, once per stage, not per layer)

Each is asserted at two (b, s), so it is a formula and not a constant.
"""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hybrid.comm import Group
from hybrid.measured_memory import ModelStateLedger, SavedActivationLedger, StateKind, model_state_bytes
from hybrid.tp import TPContext
from models import ModelConfig, StageLayout, build_model, load_config, shift_labels

FP32 = 4
SHAPES = [(2, 8), (3, 16)]  # (micro-batch b, sequence s)


@pytest.fixture(autouse=True, scope="module")
def no_gc():
    """Releases must come from reference counting alone (exact, at once), not from a collector pass."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _stage(name: str, layer_ids: tuple[int, ...], first: bool = False, last: bool = False):
    cfg = load_config(name)
    return cfg, build_model(cfg, TPContext(Group.solo("tp")), stage=StageLayout(layer_ids, first, last), seed=0)


def layer_saved_bytes(cfg: ModelConfig, b: int, s: int) -> int:
    """Derived bytes one of our layers saves for backward (module docstring), shared RoPE tables excluded."""
    h, a, f = cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size
    q, kv = a * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = 2 * q + 2 * kv + a  # q, k, v, output; logsumexp per head
    if cfg.arch == "gpt2":
        per_token = 4 * h + 4 + attention + 2 * f  # 2 LayerNorms (input, mean, rstd), 2 linear inputs, fused GELU input
    else:
        per_token = 6 * h + 2 + attention + 4 * f  # 2 RMSNorms (input, rsqrt, normed), 2 linear inputs, SwiGLU
    return FP32 * b * s * per_token


def rope_bytes(cfg: ModelConfig, s: int) -> int:
    return FP32 * 2 * s * cfg.head_dim if cfg.arch == "llama" else 0


def _forward_saved(model, cfg, b, s):
    ledger = SavedActivationLedger()
    x = torch.randn(b, s, cfg.hidden_size, requires_grad=True)
    with ledger, sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        y = model(x)
    return ledger, y


@pytest.mark.parametrize("b,s", SHAPES)
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_one_layer_saves_exactly_the_derived_bytes(name, b, s):
    cfg, model = _stage(name, (0,))
    ledger, y = _forward_saved(model, cfg, b, s)
    assert ledger.current_bytes == ledger.peak_bytes == layer_saved_bytes(cfg, b, s) + rope_bytes(cfg, s)
    y.sum().backward()
    assert ledger.current_bytes == 0


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_two_layers_save_twice_one_layer_and_share_rope_once(name):
    cfg, model = _stage(name, (0, 1))
    b, s = SHAPES[1]
    ledger, _ = _forward_saved(model, cfg, b, s)
    assert ledger.current_bytes == 2 * layer_saved_bytes(cfg, b, s) + rope_bytes(cfg, s)


@pytest.mark.parametrize("b,s", SHAPES)
def test_gpt2_layer_reconciles_with_korthikanti(b, s):
    """sbh(34 + 5as/h) fp16 bytes -> ours: drop the dropout masks (2sbh) and the s^2 softmax terms (5as^2 b),
    double the 2-byte activations for fp32, add flash attention's logsumexp (4asb) and the LayerNorm
    statistics (4 x 4sb). (GPT-2's GELU runs as torch's fused tanh kernel, which saves only its input, as
    Korthikanti et al. count it.)"""
    cfg = load_config("tiny-gpt2")
    h, a = cfg.hidden_size, cfg.num_heads
    korthikanti_fp16 = s * b * h * (34 + 5 * a * s / h)
    no_dropout_no_softmax = korthikanti_fp16 - 2 * s * b * h - 5 * a * s * s * b
    ours = 2 * no_dropout_no_softmax + 4 * a * s * b + 16 * s * b
    assert ours == layer_saved_bytes(cfg, b, s) == 64 * s * b * h + 16 * s * b + 4 * a * s * b


def _full_model_forward(model, ledger, tag, seed):
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(seed))
    with ledger, ledger.tagged(tag):
        return model(ids, shift_labels(ids))


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_two_forwards_peak_twice_one_and_backward_releases_each_tag(name):
    cfg, model = _stage(name, tuple(range(4)), first=True, last=True)
    one = SavedActivationLedger()
    _full_model_forward(model, one, "only", seed=0)  # the loss is dropped: its graph is freed at once
    assert one.peak_bytes > 0 and one.current_bytes == 0

    ledger = SavedActivationLedger()
    loss0 = _full_model_forward(model, ledger, 0, seed=1)
    loss1 = _full_model_forward(model, ledger, 1, seed=2)
    assert ledger.peak_bytes == ledger.current_bytes == 2 * one.peak_bytes
    assert ledger.tag_current(0) == ledger.tag_current(1) == one.peak_bytes
    loss0.backward()
    assert (ledger.tag_current(0), ledger.tag_current(1)) == (0, one.peak_bytes)
    assert ledger.current_bytes == one.peak_bytes and ledger.tag_peak(0) == one.peak_bytes
    loss1.backward()
    assert ledger.current_bytes == 0 and ledger.peak_bytes == 2 * one.peak_bytes


def test_parameters_and_their_views_are_not_activations():
    x = torch.randn(5, 3, requires_grad=True)
    linear = nn.Linear(3, 7)
    plain_weight = torch.randn(7, 3, requires_grad=True)  # model state that is not an nn.Parameter
    ledger = SavedActivationLedger(params=[plain_weight])
    with ledger:
        y = linear(x) + F.linear(x, plain_weight)  # each mm saves x and the weight's transpose (a view)
    assert ledger.current_bytes == x.numel() * FP32
    del y
    assert ledger.current_bytes == 0


def test_views_of_one_storage_count_once_and_release_with_the_last_saver():
    base = torch.randn(8, requires_grad=True)  # one storage of 8 floats (an input, not a parameter)
    ledger = SavedActivationLedger()
    with ledger:
        first = base[:4] * base[4:]  # saves two views of `base`
        second = base.exp()  # saves its own output (a new storage)
    assert ledger.current_bytes == 2 * 8 * FP32
    second.sum().backward()
    assert ledger.current_bytes == 8 * FP32  # `base` still held by `first`'s graph
    first.sum().backward()
    assert ledger.current_bytes == 0


def test_retained_graph_holds_its_bytes_until_freed():
    x = torch.randn(16, requires_grad=True)
    ledger = SavedActivationLedger()
    with ledger:
        y = x.tanh().sum()
    held = ledger.current_bytes
    assert held == 16 * FP32  # tanh saves its output
    y.backward(retain_graph=True)
    y.backward(retain_graph=True)  # two unpacks, still one storage held
    assert ledger.current_bytes == held
    del y
    assert ledger.current_bytes == 0


def test_reset_peak_starts_from_what_is_held():
    x = torch.randn(16, requires_grad=True)
    ledger = SavedActivationLedger()
    with ledger, ledger.tagged("a"):
        y, z = x.tanh().sum(), x.exp().sum()
    del z
    assert ledger.peak_bytes == 2 * 16 * FP32 and ledger.current_bytes == 16 * FP32
    ledger.reset_peak()
    assert ledger.peak_bytes == ledger.tag_peak("a") == 16 * FP32
    del y


def test_nothing_is_counted_outside_the_ledger():
    x = torch.randn(16, requires_grad=True)
    ledger = SavedActivationLedger()
    with ledger:
        pass
    y = x.tanh().sum()
    assert ledger.peak_bytes == 0
    y.backward()


# --- model state -----------------------------------------------------------------------------------

def test_adamw_after_one_step_holds_twice_the_parameter_bytes():
    cfg, model = _stage("tiny-gpt2", tuple(range(4)), first=True, last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0))
    model(ids, shift_labels(ids)).backward()
    opt.step()
    param_bytes = cfg.num_parameters * FP32  # the tied embedding is one parameter, counted once
    n_tensors = len(list(model.parameters()))
    assert model_state_bytes(model, opt) == {
        (StateKind.PARAMETERS, "cpu"): param_bytes,
        (StateKind.GRADIENTS, "cpu"): param_bytes,
        (StateKind.OPTIMIZER_STATES, "cpu"): 2 * param_bytes,  # exp_avg, exp_avg_sq
        (StateKind.OPTIMIZER_SCALARS, "cpu"): n_tensors * FP32,  # one fp32 `step` per parameter tensor
    }


def test_master_weights_are_optimizer_params_that_are_not_model_params():
    model = nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    master = nn.Parameter(model.weight.detach().float())  # fp32 copy the optimizer updates
    opt = torch.optim.SGD([master], lr=0.1)
    ledger = ModelStateLedger.measure(model, opt)
    assert ledger.entries == {(StateKind.PARAMETERS, "cpu"): 16 * 2, (StateKind.MASTER_WEIGHTS, "cpu"): 16 * 4}
    assert ledger.bytes(device="cpu") == 96 and ledger.bytes(StateKind.GRADIENTS) == 0


def test_gradients_viewing_one_flat_buffer_count_once():
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    numel = sum(p.numel() for p in model.parameters())
    flat = torch.zeros(numel + 10)  # a bucket with slack: the whole storage is held
    offset = 0
    for p in model.parameters():
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    assert model_state_bytes(model)[(StateKind.GRADIENTS, "cpu")] == (numel + 10) * FP32


def test_meta_model_is_measured_without_allocating():
    cfg = load_config("tiny-llama")
    with torch.device("meta"):
        model = build_model(cfg, TPContext(Group.solo("tp")), seed=None)
    state = model_state_bytes(model)
    assert state[(StateKind.PARAMETERS, "meta")] == cfg.num_parameters * FP32
    assert state[(StateKind.BUFFERS, "meta")] == cfg.head_dim // 2 * FP32  # RoPE inverse frequencies
