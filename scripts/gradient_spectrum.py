"""How low-rank are the gradients PowerSGD approximates? The share of each gradient matrix's squared Frobenius norm
held by its top r singular values (what a rank-r approximation can keep at best), on one DP rank's batch of the
reference corpus, at step 0 and after N synchronous AdamW steps (scripts/bench_comm_efficient.py's settings).

    python scripts/gradient_spectrum.py [--model tiny-llama] [--steps 60] [--ranks 4,16]

One process, no parallelism: the matrices are the whole (unsharded) parameters' gradients, the batch one DP rank's
of the bench's DP 2 (8 sequences of 128 tokens). docs/comm-efficient.md ("Why they miss") quotes its output.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

import torch  # noqa: E402

from hybrid.cliutil import OneLineParser, positive_int  # noqa: E402


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


def main(argv=None) -> None:
    p = OneLineParser(prog="gradient_spectrum.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--steps", type=int, default=60, help="AdamW steps before the second look")
    p.add_argument("--ranks", type=lambda v: [positive_int(x) for x in v.split(",")], default=[4, 16])
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args(argv)
    from hybrid.comm import Group
    from hybrid.data import BatchSpec, load_corpus, micro_batches
    from hybrid.tp import TPContext
    from models import build_model, load_config
    torch.set_num_threads(1)
    model = build_model(load_config(args.model), TPContext(Group.solo("tp")), seed=3).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    corpus, spec = load_corpus(), BatchSpec(16, 8, 128, 2)  # the bench's global batch; DP rank 0's half
    for it in range(args.steps + 1):
        if it in (0, args.steps):
            got = shares(model, micro_batches(corpus, spec, 3, it, 0), args.ranks)
            means = [sum(v[i] for v in got.values()) / len(got) for i in range(len(args.ranks))]
            print(f"step {it}: mean over {len(got)} matrices of the top-r share of |G|^2: "
                  + ", ".join(f"r {r}: {m:.3f}" for r, m in zip(args.ranks, means))
                  + f"; lowest at r {args.ranks[0]}: {min(v[0] for v in got.values()):.3f}")
        if it < args.steps:
            model.zero_grad()
            for x, y, *_ in micro_batches(corpus, spec, 3, it, 0):
                (model(x, y) / spec.num_micro_batches).backward()
            opt.step()


if __name__ == "__main__":
    main()
