"""One forward + backward of an L-layer model at tp = t moves exactly the Megatron volume.

Per layer: 2 all-reduces forward (attention output, MLP output) and 2 backward (attention input,
MLP input) of b*s*h elements; with sequence parallelism each becomes an all-gather + reduce-scatter
pair of the same wire bytes. Beyond the layers (docs/tensor-parallel.md):
  * embedding: forward all-reduce (SP: reduce-scatter; backward all-gather) of b*s*h;
  * LM head input: backward all-reduce (SP: forward all-gather, backward reduce-scatter) of b*s*h;
  * vocab-parallel cross-entropy: 3 all-reduces of b*s (max, sum of exponentials, target logit);
  * SP only: one all-reduce of the partial gradients of every parameter applied on sequence
    shards (norms, row-parallel biases, position embeddings).

The ranks do not import transformers (~1.2 s of CPU a rank): the config is made here, in the test process, and
passed to them without the transformers config object it was read from (GPT-2 has no RoPE to compute from it).
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from hybrid.mesh import Mesh, ParallelDims
from hybrid.testing import run_distributed
from hybrid.tp import TPContext, spec_of, sync_partial_grads
from models import build_model, from_hf, shift_labels

B, T, L, H, V, POS = 2, 16, 3, 32, 251, 64
BYTES = 4  # fp32


def _cfg():
    from transformers import GPT2Config  # in the test process only (the module doc)
    hf = GPT2Config(n_layer=L, n_embd=H, n_head=4, vocab_size=V, n_positions=POS, resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return dataclasses.replace(from_hf(hf), hf_config=None)


def _measure(rank, world, cfg, tp_size, sp):
    mesh = Mesh.build(ParallelDims.from_world(world, tp=tp_size))
    model = build_model(cfg, TPContext(mesh.tp, sequence_parallel=sp), seed=0)
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(0))
    phases = {}
    mesh.ledger.reset()
    loss = model(ids, shift_labels(ids))
    phases["forward"] = mesh.ledger.summary()
    mesh.ledger.reset()
    loss.backward()
    phases["backward"] = mesh.ledger.summary()
    mesh.ledger.reset()
    sync_partial_grads(model.parameters(), mesh.tp)
    phases["grad_sync"] = mesh.ledger.summary()
    phases["partial_numel"] = sum(p.numel() for p in model.parameters() if spec_of(p).partial_grad)
    return phases


def _entry(calls, elements):
    return {"calls": calls, "bytes": calls * elements * BYTES}


def expected(sp: bool) -> dict:
    bsh, bs = B * T * H, B * T
    n = 2 * L + 1  # two per layer, plus the embedding (forward) or the LM-head input (backward)
    loss = _entry(3, bs)
    if not sp:
        return {"forward": {"all_reduce@tp": {"calls": n + 3, "bytes": n * bsh * BYTES + loss["bytes"]}},
                "backward": {"all_reduce@tp": _entry(n, bsh)},
                "grad_sync": {}}
    partial = L * (2 * H + 2 * H + H + H) + 2 * H + POS * H  # ln_1, ln_2, 2 row biases per layer; ln_f; wpe
    return {"forward": {"all_gather@tp": _entry(n, bsh), "reduce_scatter@tp": _entry(n, bsh), "all_reduce@tp": loss},
            "backward": {"all_gather@tp": _entry(n, bsh), "reduce_scatter@tp": _entry(n, bsh)},
            "grad_sync": {"all_reduce@tp": _entry(1, partial)}}


CASES = [(2, False), (2, True), (4, True)]


def _measure_all(rank, world, cfg):
    out = {case: _measure(rank, world, cfg, *case) for case in CASES}
    assert "transformers" not in sys.modules, "a rank imported transformers (the module doc)"
    return out


@pytest.fixture(scope="module")
def measured():
    return run_distributed(_measure_all, 4, args=(_cfg(),))[0]


@pytest.mark.parametrize("tp,sp", CASES)
def test_forward_backward_moves_exactly_the_megatron_volume(measured, tp, sp):
    got = measured[(tp, sp)]
    for phase, want in expected(sp).items():
        assert got[phase] == want, f"{phase}: {got[phase]} != {want}"


def test_sequence_parallel_moves_the_same_wire_bytes_as_all_reduce(measured):
    """Ring all-reduce sends 2(n-1)/n S per rank; all-gather and reduce-scatter (n-1)/n S each."""
    def layer_wire(phases, sp):
        if sp:
            return sum(phases[p][f"{op}@tp"]["bytes"] for p in ("forward", "backward")
                       for op in ("all_gather", "reduce_scatter")) / 2
        return sum(phases[p]["all_reduce@tp"]["bytes"] for p in ("forward", "backward")) - 3 * B * T * BYTES
    assert layer_wire(measured[(2, True)], True) == layer_wire(measured[(2, False)], False)
