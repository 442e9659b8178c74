"""The self-check of a conversion: our model on the hybrid side and transformers' on the other, logits on a
fixed batch compared. Single process, tp 1: both whole models are in memory here (the conversion itself
holds one tensor at a time; skip this with --no-verify when two copies do not fit).

    max-abs = max |z_ours - z_hf|                       over every (batch, position, token)
    KL      = mean over positions of sum_v p_hf(v) (log p_hf(v) - log p_ours(v)),  p = softmax(z)

Verdict: fp32 weights on both sides differ only by the order of floating-point operations, so the logits
agree to a few ulps of their magnitude: OK when max-abs <= 1e-4 x max(1, max |z_hf|). A bf16 / fp16 export
rounds every weight (relative 2^-8 / 2^-11), so there the check is the distributions: OK when the KL is
below KL_TOL (measured on the test models in docs/convert.md, with a margin).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch

from hybrid.checkpoint import safe_read
from hybrid.comm import Group
from hybrid.tp import TPContext
from models import build_model
from models.config import ModelConfig

BATCH, SEQ, SEED = 2, 32, 0
FP32_TOL = 1e-4
KL_TOL = {torch.bfloat16: 1e-3, torch.float16: 1e-4}


def fixed_batch(cfg: ModelConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED)
    return torch.randint(0, cfg.vocab_size, (BATCH, min(SEQ, cfg.max_position_embeddings)), generator=g)


def load_ours(cfg: ModelConfig, it_dir: str) -> torch.nn.Module:
    """Our whole model (tp 1) with every parameter read from the hybrid checkpoint `it_dir` by DCP."""
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=None).eval()
    sd = {f"model/{n}": p.data for n, p in model.named_parameters()}
    safe_read.load(sd, it_dir, no_dist=True)  # .metadata unpickled with only DCP's own classes
    return model


@torch.no_grad()
def compare(ours: torch.nn.Module, ref: torch.nn.Module, cfg: ModelConfig) -> tuple[float, float, float]:
    """(max-abs, KL, max |z_ref|) of the two models' logits on the fixed batch."""
    ids = fixed_batch(cfg)
    z_ours = ours(ids).float()
    z_ref = ref.eval()(input_ids=ids).logits.float()
    log_p, log_q = torch.log_softmax(z_ref, -1), torch.log_softmax(z_ours, -1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()
    return (z_ours - z_ref).abs().max().item(), kl, z_ref.abs().max().item()


def verdict(max_abs: float, kl: float, scale: float, dtype: torch.dtype) -> str:
    """One line; ValueError when the logits disagree."""
    ids = f"{BATCH} x {SEQ} tokens"
    if dtype == torch.float32:
        tol = FP32_TOL * max(1.0, scale)
        ok, rule = max_abs <= tol, f"max-abs <= {tol:.1e}"
    else:
        ok, rule = kl <= KL_TOL[dtype], f"KL <= {KL_TOL[dtype]:.0e} ({str(dtype).removeprefix('torch.')})"
    line = f"logits max-abs {max_abs:.2e}, KL {kl:.2e} on a fixed batch of {ids} (needs {rule})"
    if not ok:
        raise ValueError(f"verify: FAILED: {line}; nothing written (--no-verify keeps the output unchecked)")
    return f"verify: OK: {line}"


def announce(cfg: ModelConfig) -> None:
    """One line on stderr before the check starts: it builds two whole fp32 models (the conversion before it held
    one tensor at a time), minutes of silence for a 7B one otherwise. stderr, so stdout keeps the summary alone."""
    size = 2 * cfg.num_parameters * 4  # bytes: two fp32 copies of every parameter
    size_text = f"{size / 2**30:.3g} GiB" if size >= 2**30 else f"{size / 2**20:.3g} MiB"
    print(f"verify: loading the converted model and transformers' ({cfg.num_parameters / 1e6:.2f}M parameters each, "
          f"{size_text} in fp32 for both) to compare their logits on a fixed batch of {BATCH} x {SEQ} tokens "
          f"(--no-verify skips this) ...", file=sys.stderr, flush=True)


def verify_hybrid_against(cfg: ModelConfig, it_dir: str, make_ref: Callable[[], torch.nn.Module],
                          dtype: torch.dtype, quiet: bool = False) -> str:
    """Compare our model loaded from `it_dir` with the transformers model `make_ref()` builds. quiet (`hybrid
    convert --quiet`): no announcement and no transformers loading bar."""
    if not quiet:
        announce(cfg)
    ours = load_ours(cfg, it_dir)
    ref = _without_bars(make_ref) if quiet else make_ref()
    return verdict(*compare(ours, ref, cfg), dtype)


def _without_bars(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """make() with transformers' progress bars ("Loading weights") off, then back as they were."""
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return make()
    finally:
        if bars:
            hf_logging.enable_progress_bar()
