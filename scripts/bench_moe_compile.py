"""Eager vs `--compile` on an MoE model after warm-up, in one launch: docs/moe.md's "With --compile" step-time row.

    python scripts/bench_moe_compile.py                 # 2 gloo ranks, tiny-mixtral at ep 2, 6 blocks of 10 steps
    python scripts/bench_moe_compile.py --blocks 10 --per 20

Each rank builds tiny-mixtral twice from the same seed, one as train.py runs it and one with its blocks compiled as
`--compile` compiles them (hybrid/train/loop.py compile_blocks, inductor), warms both up (3 steps; the compiled one's
first step is the compilation, reported apart), then runs forward + backward in alternating blocks of `--per` steps
(E C E C ...), new tokens every step, so a change in the machine's load falls on both. Per rank: the median CPU time
(this process's) and wall time per step of each, eager / compiled per block pair (> 1: compiled faster), and dynamo's
frame count before and after the timed blocks (equal: no recompilation while the routing changed every step).
No optimizer, no ZeRO: the two models differ only in the compiled blocks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout


def _model(ep):
    from hybrid.comm import Group
    from hybrid.moe.config import MoEConfig
    from hybrid.moe.layer import ExpertContext
    from hybrid.tp import TPContext
    from models import build_model, load_config
    return build_model(load_config("tiny-mixtral"), TPContext(Group.solo("tp")), seed=0,
                       moe=ExpertContext(MoEConfig(expert_parallel=ep.size), ep))


def _rank(rank: int, world: int, blocks: int, per: int, seq: int) -> dict:
    import torch
    from torch._dynamo.utils import counters

    from hybrid.mesh import ParallelDims
    from hybrid.moe.parallel import build_mesh
    from hybrid.train.loop import compile_blocks
    from models import shift_labels
    mesh = build_mesh(ParallelDims.from_world(world), world)  # dp folded into ep
    eager, compiled = _model(mesh.ep), _model(mesh.ep)
    compile_blocks([compiled])

    def step(model, s: int) -> None:
        ids = torch.randint(0, 256, (2, seq), generator=torch.Generator().manual_seed(1000 * rank + s))
        model(ids, shift_labels(ids)).backward()
    t = time.process_time()
    step(compiled, 0)
    first = time.process_time() - t
    for s in range(1, 4):
        step(compiled, s)
        step(eager, s)
    frames = counters["frames"]["total"]
    times: dict[str, list[tuple[float, float]]] = {"eager": [], "compiled": []}
    s = 10
    for _ in range(blocks):
        for name, model in (("eager", eager), ("compiled", compiled)):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(per):
                s += 1
                step(model, s)
            times[name].append(((time.process_time() - cpu) / per, (time.perf_counter() - wall) / per))
    ratios = [e[0] / c[0] for e, c in zip(times["eager"], times["compiled"])]
    return {"first_s": first, "frames": (frames, counters["frames"]["total"]),
            "breaks": sum(counters["graph_break"].values()),
            **{f"{k}_cpu_ms": 1e3 * statistics.median(x[0] for x in v) for k, v in times.items()},
            **{f"{k}_wall_ms": 1e3 * statistics.median(x[1] for x in v) for k, v in times.items()},
            "ratio_median": statistics.median(ratios), "ratio_range": (min(ratios), max(ratios))}


def main() -> None:
    from hybrid.cliutil import OneLineParser  # one line for a mistyped flag (tests/test_newuser11_inputs.py)
    p = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=6, help="alternating eager / compiled blocks of each")
    p.add_argument("--per", type=int, default=10, help="steps per block")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence (micro-batch 2)")
    a = p.parse_args()
    from hybrid import testing
    for rank, r in enumerate(testing.run_distributed(_rank, 2, (a.blocks, a.per, a.seq), timeout=1800)):
        lo, hi = r["ratio_range"]
        print(f"rank {rank}: CPU ms/step eager {r['eager_cpu_ms']:.1f}, compiled {r['compiled_cpu_ms']:.1f}; "
              f"wall ms/step eager {r['eager_wall_ms']:.1f}, compiled {r['compiled_wall_ms']:.1f}; eager / compiled "
              f"per block pair median {r['ratio_median']:.3f} ({lo:.3f}-{hi:.3f}); first compiled step "
              f"{r['first_s']:.1f} s CPU; frames {r['frames'][0]} -> {r['frames'][1]}, graph breaks {r['breaks']}; "
              f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
