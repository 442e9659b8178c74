"""Round 21's new-user pass over docs/context-parallel.md.

1. The page's first command (tp 2 + SP x cp 2, --cp-comm-type p2p, pp 1) printed "time split ...: pipeline waits
   13.8%" on a run without a pipeline: ring attention's key / value transfers are point-to-point ops, and the op
   trail counted every p2p wait as the pipeline's. Now a wait on the "cp" group counts as a collective's (TP's
   attention all-reduces are one too); only the "pp" group's messages are pipeline waits. Checked on the mesh's
   cp group: 2 gloo ranks, ring attention forward and backward at cp 2, then a message on a group named as
   Mesh.build names the pipeline's.
2. `hybrid plan --context-parallel-size 1,2 --gpu cpu` printed "mem GB 2.0" -- the GPU figure with the 2 GB
   CUDA reserve -- where the plain table on the same CPU prints "RSS MiB" as train.py measures it. The CP table is
   now in the plain table's unit on a host: its cp 1 rows equal the plain rows. In-process.
3. Resuming that run's checkpoint at cp 4: "checkpoint: resumed from cpck/iter_0000004 (saved at tp 2 x pp 1 x dp 1,
   ZeRO 0)" left its cp 2 out, beside the resume's "saved at tp 2 x cp 2 x pp 1 x dp 1" (in-process: the line).
"""

from __future__ import annotations

import pytest
import torch

from hybrid.cp.attention import CPContext
from hybrid.cp.comm_type import CommType
from hybrid.cp.masks import AttentionMask
from hybrid.mesh import Axis, Mesh, ParallelDims
from hybrid.planner import Cluster, Workload, hardware, search
from hybrid.planner import cli as plan_cli
from hybrid.planner import context
from hybrid.testing import run_distributed
from hybrid.trail import TRAIL
from models import load_config


def _waits(fn) -> dict[str, float]:
    """Seconds this rank spent in each phase while running fn (the trail starts in "forward")."""
    TRAIL.reset()
    TRAIL.enter("forward")
    fn()
    return TRAIL.take_phase_seconds()


def _worker(rank: int, world: int) -> tuple[dict, dict]:
    import torch.distributed as dist

    from hybrid.comm import Group
    torch.manual_seed(rank)
    mesh = Mesh.build(ParallelDims(cp=2))  # the mesh's own "cp" group, as train.py's ring attention gets it
    q, k, v = (torch.randn(1, 2, 32, 8, requires_grad=True) for _ in range(3))  # (B, heads, T / cp, d)

    def ring():
        CPContext(mesh.cp, CommType.P2P).attention(q, k, v, AttentionMask()).sum().backward()
    ring_waits = _waits(ring)
    pp = Group(Axis.PP.value, (0, 1), dist.group.WORLD, mesh.ledger)  # the name Mesh.build gives the pipeline's
    x = torch.zeros(4096)
    pipe_waits = _waits(lambda: pp.batch_p2p([(x, 1)], []) if rank == 0 else pp.batch_p2p([], [(x, 0)]))
    return ring_waits, pipe_waits


def test_ring_attention_transfers_are_collectives_not_pipeline_waits():
    for ring_waits, pipe_waits in run_distributed(_worker, 2):
        assert ring_waits["p2p"] == 0.0 and ring_waits["comm"] > 0.0, ring_waits
        assert pipe_waits["p2p"] > 0.0 and pipe_waits["comm"] == 0.0, pipe_waits


def test_cp_plan_on_a_cpu_is_in_the_plain_tables_rss_mib():
    work = Workload(load_config("tiny-llama"), global_batch=16, seq_length=256, fp32_grads=False)
    cluster = Cluster(gpus=4, hw=hardware("cpu"))
    baseline = 300 * 2**20
    plans = context.search_cp(work, cluster, cps=(1, 2), top=40)
    table = context.report(work, cluster, plans, host_baseline=baseline).splitlines()
    assert "RSS MiB" in table[1] and "mem GB" not in "\n".join(table)
    plain = {p.layout.short(): plan_cli._memory(p, baseline).strip() for p in search(work, cluster, top=200).plans}
    # '5  tp1 pp1 dp4 v1 b4 z3 none   320 0.004351 0 9.414e+05 46.9%': the layout, then five columns
    rows = [(" ".join(line.split()[1:-5]), line.split()[-5]) for line in table[2:-1]]
    cp1 = [(layout, mib) for layout, mib in rows if "cp2" not in layout and layout in plain]
    assert cp1 and all(plain[layout] == mib for layout, mib in cp1), (cp1, plain)
    assert all(int(mib.replace(",", "")) > 300 for layout, mib in rows if "cp2" in layout)  # tensors + the process


def test_cp_plan_on_a_gpu_keeps_gb():
    work = Workload(load_config("tiny-llama"), global_batch=16, seq_length=256, fp32_grads=False)
    plans = context.search_cp(work, Cluster(gpus=4, hw=hardware("h100-80g")), cps=(1, 2), top=3)
    table = context.report(work, Cluster(gpus=4, hw=hardware("h100-80g")), plans)
    assert "mem GB" in table and "RSS MiB" not in table
    assert f"{plans[0].memory_gb:>7.1f}" in table.splitlines()[2]


def test_the_resumed_line_names_the_saved_cp():
    from hybrid.checkpoint.run import resumed_line
    state = {"iteration": 4, "consumed_samples": 8}
    cp2 = {"tp": 2, "cp": 2, "pp": 1, "dp": 1, "zero": 0}
    assert resumed_line("cpck/iter_0000004", cp2, state, False, True, False, False) == (
        "checkpoint: resumed from cpck/iter_0000004 (saved at tp 2 x cp 2 x pp 1 x dp 1, ZeRO 0) | iteration 4 | "
        "consumed samples 8 | RNG not restored (another layout)")
    no_cp = {"tp": 2, "pp": 1, "dp": 2, "zero": 1}  # an older checkpoint, or cp 1: nothing added
    assert "(saved at tp 2 x pp 1 x dp 2, ZeRO 1) | iteration 4" in resumed_line("c", no_cp, state, False, True,
                                                                                  True, True)


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
