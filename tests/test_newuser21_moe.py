"""Round 21's new-user pass over docs/moe.md ("The planner"): `hybrid plan --model tiny-mixtral --gpu cpu
--explain` said the experts' all-to-all goes "over NVLink" on a CPU. The line names the node's links by the
hardware: NVLink on a GPU preset, the host's own links on CPU hardware. In-process: the planner's search.
"""

from __future__ import annotations

from hybrid.planner import Cluster, Workload, hardware, search
from models import load_config


def _experts_line(gpu: str) -> str:
    work = Workload(load_config("tiny-mixtral"), global_batch=16, seq_length=128, fp32_grads=False)
    return search(work, Cluster(gpus=4, hw=hardware(gpu)), top=1).plans[0].experts.explain()


def test_the_experts_line_names_the_nodes_links_by_the_hardware():
    cpu, gpu = _experts_line("cpu"), _experts_line("h100-80g")
    assert "over the host's links" in cpu and "NVLink" not in cpu, cpu
    assert "over NVLink" in gpu, gpu
