"""How low-rank are the gradients PowerSGD approximates? The share of each gradient matrix's squared Frobenius norm
held by its top r singular values (what a rank-r approximation can keep at best), on one DP rank's batch of the
reference corpus, at step 0 and after N synchronous AdamW steps (scripts/bench_comm_efficient.py's settings).

    python scripts/gradient_spectrum.py [--model tiny-llama] [--steps 60[,240]] [--ranks 4,16]
                                        [--global-batch 16] [--dp 2] [--look-batches 16,128]

One process, no parallelism: the matrices are the whole (unsharded) parameters' gradients, the batch DP rank 0's
G / dp sequences of 128 tokens of the bench's global batch G (default 16 at DP 2: 8 sequences), and the AdamW steps
between the looks train on that batch too. `--dp 1` looks at the whole global batch's gradient -- the DP mean,
which is what PowerSGD approximates (docs/comm-efficient.md) -- and trains on the whole batch (torch's AdamW with
the bench's betas and weight decay); with `--global-batch` it shows how the batch changes the gradient's rank
(gradient noise is high-rank, so the more samples a step averages, the larger the low-rank signal's share). `--look-batches G,G` looks, at the
same weights (the trajectory trained at --global-batch), at the gradient of each batch size G instead (the whole
G sequences: the DP mean at any DP size): the batch's effect alone. docs/comm-efficient.md ("Why they miss";
"PowerSGD r = 4: the batch") quotes its output.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402

from hybrid.cliutil import OneLineParser, positive_float, positive_int  # noqa: E402


def shares(model, batches, ranks: list[int]) -> dict[str, list[float]]:
    """Per 2-D parameter: sum of the top-r squared singular values / sum of all, for each r in `ranks`."""
    model.zero_grad()
    for x, y, *_ in batches:
        (model(x, y) / len(batches)).backward()
    out = {}
    for name, p in model.named_parameters():
        if p.dim() == 2:
            s2 = torch.linalg.svdvals(p.grad.reshape(p.shape[0], -1)) ** 2
            out[name] = [(s2[:r].sum() / s2.sum()).item() for r in ranks]
    return out


def by_group(got: dict[str, list[float]]) -> dict[str, float]:
    """The mean of each parameter group's (embed, attn, mlp, head: hybrid.compress.diagnose's) first-rank shares."""
    from hybrid.compress.diagnose import group_of
    groups: dict[str, list[float]] = {}
    for name, v in got.items():
        groups.setdefault(group_of(name), []).append(v[0])
    return {g: sum(v) / len(v) for g, v in groups.items()}


def _print(it: int, label: str, got: dict[str, list[float]], ranks: list[int]) -> None:
    means = [sum(v[i] for v in got.values()) / len(got) for i in range(len(ranks))]
    print(f"step {it}{label}: mean over {len(got)} matrices of the top-r share of |G|^2: "
          + ", ".join(f"r {r}: {m:.3f}" for r, m in zip(ranks, means))
          + f"; lowest at r {ranks[0]}: {min(v[0] for v in got.values()):.3f}; by group at r {ranks[0]}: "
          + ", ".join(f"{g} {m:.3f}" for g, m in by_group(got).items()), flush=True)


def main(argv=None) -> None:
    p = OneLineParser(prog="gradient_spectrum.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--steps", type=lambda v: [positive_int(x) for x in v.split(",")], default=[60], metavar="N[,N]",
                   help="look again after each of these many AdamW steps (the first look: step 0)")
    p.add_argument("--ranks", type=lambda v: [positive_int(x) for x in v.split(",")], default=[4, 16])
    p.add_argument("--lr", type=positive_float, default=3e-3)
    p.add_argument("--global-batch", type=positive_int, default=16, help="the bench's global batch (sequences)")
    p.add_argument("--dp", type=positive_int, default=2,
                   help="look at DP rank 0's G / dp sequences (1: the whole batch's gradient, the DP mean)")
    p.add_argument("--look-batches", type=lambda v: [positive_int(x) for x in v.split(",")], default=[],
                   metavar="G,G", help="at each look, the gradient of each of these batch sizes (whole, the DP mean)")
    args = p.parse_args(argv)
    if args.global_batch % args.dp:
        p.error(f"--global-batch {args.global_batch} must be a multiple of --dp {args.dp}")
    from hybrid.comm import Group
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.tp import TPContext
    from models import build_model, load_config
    try:  # an unknown preset or a bad config.json: the parser's one line, not load_config's traceback
        cfg = load_config(args.model)
    except ValueError as e:
        p.error(str(e))
    torch.set_num_threads(1)
    model = build_model(cfg, TPContext(Group.solo("tp")), seed=3).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    # the bench's global batch; DP rank 0's G / dp sequences as one micro-batch
    corpus, spec = load_corpus(), BatchSpec(args.global_batch, args.global_batch // args.dp, 128, args.dp)
    last = max(args.steps)
    for it in range(last + 1):
        if it == 0 or it in args.steps:
            # (label, batches): DP rank 0's share of the training batch, or each --look-batches size whole
            looks = [("", micro_batches(corpus, spec, 3, it, 0))] if not args.look_batches else [
                (f" batch {g}", micro_batches(corpus, BatchSpec(g, min(g, 16), 128, 1), 3, it, 0))
                for g in args.look_batches]
            for label, batches in looks:
                _print(it, label, shares(model, batches, args.ranks), args.ranks)
        if it < last:
            model.zero_grad()
            for x, y, *_ in micro_batches(corpus, spec, 3, it, 0):
                (model(x, y) / spec.num_micro_batches).backward()
            opt.step()


if __name__ == "__main__":
    main()
