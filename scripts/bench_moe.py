"""Speed and memory of hybrid's MoE layer against megatron-core's, on the same shapes and weights, on CPU.

    python scripts/bench_moe.py --out docs/results/bench_moe.md    # the measurement (a quiet machine)
    python scripts/bench_moe.py --quick --out /tmp/moe.md           # smoke run (tiny sizes; measures nothing)
    [--runs 3] [--repeats 10] [--warmup 2] [--tokens 512] [--hidden 256] [--ffn 512] [--experts 8] [--topk 2]

Rows:

1. One MoE layer forward + backward at EP 2 (two gloo ranks, one thread each), each rank routing `--tokens`
   tokens of width h to k of E SwiGLU experts of width f, dropless, no auxiliary loss:
   ours (hybrid.moe.layer.MoELayer, alltoall dispatcher: counts, then tokens, all_to_all_v; the local experts as
   a loop) against megatron-core's MoELayer (TopKRouter, MoEAlltoAllTokenDispatcher, SequentialMLP: the
   dispatcher Megatron recommends for EP, experts as a loop too), built from the same weights: same router
   (softmax over the top-k logits = transformers' renormalised top-k), same experts; the outputs are compared
   first (max |ours - megatron| is printed and must be ~1e-6).
2. Our local experts at EP 1, one process: the loop of matmuls against torch's grouped GEMM
   (torch.nn.functional.grouped_mm over the stacked weights) -- what `--moe-experts-impl auto` chooses on CPU.

Memory: bytes the layer's forward saves for backward (torch.autograd.graph.saved_tensors_hooks; each saved
tensor counted once by its storage), per rank, and parameter bytes per rank. Deterministic: it needs no quiet
machine.

Timing as scripts/bench_tp.py: `--warmup` untimed steps, then `--runs` runs (fresh processes) of `--repeats`
rounds alternating ours and the peer (ABAB); per run the ratio median(ours) / median(peer); the table gives their
median and min-max and claims a lead only where the min-max excludes 1.0.

megatron-core on CPU. Its MoE layer is written for CUDA; four stand-ins let it run unchanged on the host, each
a no-op or the host path of what it does on a GPU: (a) torch.cuda.Stream / current_stream / stream (the
alltoall dispatcher copies split sizes to the host on a side stream: on CPU everything is synchronous), (b)
torch.cuda.current_device -> "cpu" (where the router puts its weight), (c) moe_utils.te_general_gemm = None
(megatron-core 0.16 names it without Transformer Engine installed: a NameError; None selects its torch.mm
path), (d) the split sizes as numpy arrays, as its own device-to-host copy gives them on a GPU. Plus
`use_cpu_initialization=True` and `gradient_accumulation_fusion=False`, as in bench_tp.py. If it still fails, its
row is skipped with the reason.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hybrid.cliutil import OneLineParser, cpu_name, nonnegative_int, package_version, write_text  # noqa: E402
from hybrid.cliutil import positive_int  # noqa: E402
from hybrid.testing import run_distributed  # noqa: E402

EP = 2
warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
warnings.filterwarnings("ignore", category=UserWarning, module="megatron")


@dataclass(frozen=True)
class Shape:
    """Attributes: tokens (per rank), hidden h, ffn f (one expert's width), experts E, topk k."""

    tokens: int
    hidden: int
    ffn: int
    experts: int
    topk: int


# --- megatron-core on the host -------------------------------------------------------------------------
class _Event:
    def synchronize(self) -> None:
        pass


class _Stream:
    def wait_stream(self, other) -> None:
        pass

    def record_event(self) -> _Event:
        return _Event()


_HOST_STREAM = _Stream()


def megatron_on_cpu() -> None:
    """The four stand-ins of the module docstring."""
    torch.cuda.Stream = lambda *a, **k: _Stream()
    torch.cuda.current_stream = lambda *a, **k: _HOST_STREAM
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_device = lambda: "cpu"
    import megatron.core.transformer.moe.moe_utils as mu
    import megatron.core.transformer.moe.token_dispatcher as td
    if not hasattr(mu, "te_general_gemm"):
        mu.te_general_gemm = None
    td.maybe_move_tensor_to_cpu = lambda t, as_numpy=False, record_stream=False: \
        t.numpy() if as_numpy and torch.is_tensor(t) else t


def megatron_layer(shape: Shape, world: int):
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module
    megatron_on_cpu()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=world)
    cfg = TransformerConfig(num_layers=1, hidden_size=shape.hidden, num_attention_heads=4,
                            num_moe_experts=shape.experts, moe_router_topk=shape.topk, moe_ffn_hidden_size=shape.ffn,
                            ffn_hidden_size=shape.ffn, moe_token_dispatcher_type="alltoall",
                            use_cpu_initialization=True, gated_linear_unit=True, activation_func=F.silu,
                            add_bias_linear=False, moe_grouped_gemm=False, moe_router_load_balancing_type="none",
                            moe_aux_loss_coeff=0.0, params_dtype=torch.float32, gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(num_experts=shape.experts, moe_grouped_gemm=False)
    return build_module(spec.submodules.mlp, config=cfg)


# --- ours ------------------------------------------------------------------------------------------------
def our_layer(shape: Shape, mesh, impl):
    from transformers.activations import ACT2FN

    from hybrid.moe.config import MoEConfig
    from hybrid.moe.layer import ExpertContext, MoELayer
    from hybrid.tp import TPContext
    from models.config import ModelConfig
    cfg = ModelConfig(arch="llama", vocab_size=16, hidden_size=shape.hidden, num_layers=1, num_heads=4,
                      num_kv_heads=4, head_dim=shape.hidden // 4, ffn_hidden_size=shape.ffn,
                      max_position_embeddings=16, norm_eps=1e-5, tie_embeddings=False, qkv_bias=False,
                      mlp_bias=False, out_bias=False, activation="silu", num_experts=shape.experts,
                      moe_top_k=shape.topk, moe_ffn_hidden_size=shape.ffn, moe_layers=(0,), model_type="mixtral")
    ep = mesh.ep.size if mesh.ep is not None else 1
    return MoELayer(cfg, TPContext(mesh.tp), ExpertContext(MoEConfig(expert_parallel=ep, experts_impl=impl), mesh.ep),
                    ACT2FN["silu"])


@torch.no_grad()
def copy_weights(ours, theirs) -> None:
    """Megatron's router (E, h) and each local expert's fc1 = [gate; up] (2f, h), fc2 (h, f) into ours."""
    ours.gate.weight.copy_(theirs.router.weight)
    f = ours.cfg.moe_ffn_hidden_size
    for mine, peer in zip(ours.experts.values(), theirs.experts.local_experts):
        mine.gate_proj.weight.copy_(peer.linear_fc1.weight[:f])
        mine.up_proj.weight.copy_(peer.linear_fc1.weight[f:])
        mine.down_proj.weight.copy_(peer.linear_fc2.weight)


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves while `fn()` runs forward (each storage once)."""
    seen: dict[int, int] = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def _step(forward, grad):
    def run():
        t0 = time.perf_counter()
        forward().backward(grad)
        return time.perf_counter() - t0
    return run


def _layer_rank(rank: int, world: int, shape: Shape, warmup: int, repeats: int) -> dict:
    import torch.distributed as dist

    from hybrid.mesh import ParallelDims
    from hybrid.moe.config import ExpertsImpl
    from hybrid.moe.parallel import build_mesh
    log = (lambda m: print(m, flush=True)) if rank == 0 else (lambda m: None)
    mesh = build_mesh(ParallelDims.from_world(world), world, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(shape.tokens, shape.hidden, generator=gen)
    grad = torch.randn(shape.tokens, shape.hidden, generator=gen)
    ours = our_layer(shape, mesh, ExpertsImpl.LOOP)
    steps = {"ours": _step(lambda: ours(x.view(1, -1, shape.hidden).requires_grad_()).view(-1, shape.hidden), grad)}
    out = {"skipped": "", "diff": float("nan")}
    try:
        theirs = megatron_layer(shape, world)
        copy_weights(ours, theirs)
        x_sbh = x.view(-1, 1, shape.hidden)
        with torch.no_grad():
            out["diff"] = (ours(x.view(1, -1, shape.hidden)).view(-1, shape.hidden)
                           - theirs(x_sbh)[0].view(-1, shape.hidden)).abs().max().item()
        steps["megatron"] = _step(lambda: theirs(x_sbh.clone().requires_grad_())[0].view(-1, shape.hidden), grad)
        out["saved_megatron"] = saved_bytes(lambda: theirs(x_sbh.clone().requires_grad_())[0])
        out["params_megatron"] = sum(p.numel() * p.element_size() for p in theirs.parameters())
    except Exception as e:  # missing package, no CPU path: report it, never invent numbers
        out["skipped"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        log(f"  megatron-core skipped: {out['skipped']}")
    out["saved_ours"] = saved_bytes(lambda: ours(x.view(1, -1, shape.hidden).requires_grad_()))
    out["params_ours"] = sum(p.numel() * p.element_size() for p in ours.parameters())
    for name, step in steps.items():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():  # ABAB: a burst of load slows both alike
            dist.barrier()
            times[name].append(step())
    out["times"] = times
    return out


def bench_layer(shape: Shape, warmup: int, repeats: int, runs: int) -> dict:
    ratios, per_side, extra = [], {"ours": [], "megatron": []}, None
    for run in range(runs):
        print(f"[1/2] MoE layer fwd+bwd, EP {EP}: ours vs megatron-core, run {run + 1}/{runs}", flush=True)
        res = run_distributed(_layer_rank, EP, args=(shape, warmup, repeats), timeout=900)
        extra = res
        if res[0]["skipped"]:
            break
        slow = {s: [max(ts) for ts in zip(*(r["times"][s] for r in res))] for s in ("ours", "megatron")}
        for s in slow:
            per_side[s] += slow[s]
        ratios.append(statistics.median(slow["ours"]) / statistics.median(slow["megatron"]))
    return {"ratios": ratios, "per_side": per_side, "ranks": extra}


def bench_experts(shape: Shape, warmup: int, repeats: int) -> dict:
    """Our local experts alone (EP 1): loop vs grouped GEMM on the same rows."""
    from hybrid.mesh import Mesh
    from hybrid.moe.config import ExpertsImpl
    from hybrid.moe import dispatch as dsp
    from hybrid.moe.router import route
    torch.set_num_threads(1)
    print("[2/2] local experts: loop vs torch grouped_mm", flush=True)
    layer = our_layer(shape, Mesh.single(), ExpertsImpl.LOOP)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape.tokens, shape.hidden, generator=gen)
    r = route(layer.gate(x), shape.topk)
    d = dsp.permutation(r.experts, shape.experts)
    rows, counts = x[d.rows // shape.topk].contiguous(), d.counts.tolist()
    grad = torch.randn_like(rows)
    times = {"loop": [], "grouped": []}
    for impl in (ExpertsImpl.LOOP, ExpertsImpl.GROUPED):
        layer.experts.impl = impl
        for _ in range(warmup):
            layer.experts(rows.requires_grad_(), counts).backward(grad)
    for _ in range(repeats):
        for impl in (ExpertsImpl.LOOP, ExpertsImpl.GROUPED):
            layer.experts.impl = impl
            t0 = time.perf_counter()
            layer.experts(rows.detach().requires_grad_(), counts).backward(grad)
            times[impl.value].append(time.perf_counter() - t0)
    return times


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})" if xs else "n/a"


def report(shape: Shape, layer: dict, experts: dict, args) -> str:
    r0 = layer["ranks"][0]
    lines = [f"# MoE layer: hybrid vs megatron-core (CPU, {'--quick: measures nothing' if args.quick else 'measured'})",
             "", f"- shape: {shape.tokens} tokens per rank, h {shape.hidden}, expert f {shape.ffn}, "
             f"E {shape.experts}, top-{shape.topk}, EP {EP} (gloo, one thread per rank), fp32, dropless",
             f"- machine: {cpu_name()}, {os.cpu_count()} cores, 1-min load average {os.getloadavg()[0]:.1f} at the end; "
             f"torch {torch.__version__}, "
             f"megatron-core {package_version('megatron-core')}",
             f"- warmup {args.warmup}, runs {args.runs} x repeats {args.repeats} (ABAB)", ""]
    if r0["skipped"]:
        lines.append(f"megatron-core skipped: {r0['skipped']}")
    else:
        ratios = layer["ratios"]
        lead = "" if not ratios or min(ratios) <= 1.0 <= max(ratios) else \
            (" (ours faster)" if max(ratios) < 1.0 else " (megatron faster)")
        lines += ["| row | ours s/step | megatron s/step | ratio ours/megatron, median of runs (min-max) |",
                  "|---|---|---|---|",
                  f"| MoE layer fwd+bwd, EP {EP}, alltoall | {_spread(layer['per_side']['ours'])} | "
                  f"{_spread(layer['per_side']['megatron'])} | {_spread(ratios)}{lead} |", "",
                  f"- same weights, same tokens: max |ours - megatron| = {r0['diff']:.2e}",
                  f"- saved for backward per rank: ours {r0['saved_ours'] / 2**20:.2f} MiB, megatron "
                  f"{r0['saved_megatron'] / 2**20:.2f} MiB; parameters per rank: ours {r0['params_ours'] / 2**20:.2f} "
                  f"MiB, megatron {r0['params_megatron'] / 2**20:.2f} MiB"]
    lines += ["", "| local experts (EP 1, one thread) | s/step fwd+bwd |", "|---|---|",
              f"| loop | {_spread(experts['loop'])} |", f"| torch grouped_mm | {_spread(experts['grouped'])} |"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    p = OneLineParser(prog="bench_moe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, one short run: a smoke test")
    p.add_argument("--out", default=None, metavar="PATH", help="write the markdown table here")
    p.add_argument("--runs", type=positive_int, default=3)
    p.add_argument("--repeats", type=positive_int, default=10)
    p.add_argument("--warmup", type=nonnegative_int, default=2)
    p.add_argument("--tokens", type=positive_int, default=512)
    p.add_argument("--hidden", type=positive_int, default=256)
    p.add_argument("--ffn", type=positive_int, default=512)
    p.add_argument("--experts", type=positive_int, default=8)
    p.add_argument("--topk", type=positive_int, default=2)
    args = p.parse_args(argv)
    p.check_out("--out", args.out)  # the parser's one line (check_output_file's ValueError was a traceback)
    if args.quick:
        args.runs, args.repeats, args.warmup = 1, 2, 1
        shape = Shape(tokens=32, hidden=32, ffn=64, experts=4, topk=2)
    else:
        shape = Shape(args.tokens, args.hidden, args.ffn, args.experts, args.topk)
    if shape.experts % EP or shape.topk > shape.experts:
        p.error(f"--experts {shape.experts} must be a multiple of EP {EP} and at least --topk {shape.topk}")
    layer = bench_layer(shape, args.warmup, args.repeats, args.runs)
    experts = bench_experts(shape, args.warmup, args.repeats)
    text = report(shape, layer, experts, args)
    print(text)
    if args.out:
        write_text(args.out, text)


if __name__ == "__main__":
    main()
