"""The planner's slow-link rows for DiLoCo at ZeRO-3 (round 16; hybrid/planner/slowlink.py): now that the runtime
runs DiLoCo with ZeRO-3 inside a replica (tests/test_diloco16_compose.py), the table may place it there, and its DP
bytes must be the runtime's. dp 4 as the table runs DiLoCo (2 replicas, ZeRO-3 over each replica's 2 ranks): over
STEPS steps, every op's bytes on the replica's group ("dp": the per-block all-gathers and reduce-scatters) and on
the cross group ("diloco": the shard's outer all-reduce every H steps) equal `slowlink.run_bytes`, exactly -- as
tests/test_planner_slowlink.py checks the same at ZeRO 0-2."""

from __future__ import annotations

import pytest

from hybrid.comm import CommLedger
from hybrid.compress.args import CompressConfig
from hybrid.diloco import DiLoCoConfig
from hybrid.mesh import Mesh, ParallelDims
from hybrid.planner import Layout, slowlink
from hybrid.planner.layout import ZeroStage
from hybrid.planner.slowlink import Method, MethodConfig
from hybrid.testing import run_distributed
from suite_threads import one_thread_module  # noqa: F401  (autouse: the test process's own torch work at one thread)
from test_planner_slowlink import H, MICRO, STEPS, _run, _work

METHODS = [
    ("diloco-r2-z3", DiLoCoConfig(inner_steps=H, replicas=2), MethodConfig(Method.DILOCO, inner_steps=H, replicas=2)),
    ("streaming-r2-z3", DiLoCoConfig(inner_steps=H, replicas=2, fragments=2),
     MethodConfig(Method.STREAMING, inner_steps=H, replicas=2, fragments=2)),
]


def _measure(rank: int, world: int) -> dict:
    mesh = Mesh.build(ParallelDims.from_world(world), ledger=CommLedger())
    return {name: _run(mesh, 3, CompressConfig(), cfg) for name, cfg, _ in METHODS}


@pytest.fixture(scope="module")
def measured() -> list[dict]:
    return run_distributed(_measure, 4, timeout=600)


def test_diloco_zero3_dp_bytes_equal_the_ledger(measured):
    work = _work()
    layout = Layout(tp=1, pp=1, dp=4, micro_batch=MICRO, zero=ZeroStage.PARAMETERS)
    for rank, got in enumerate(measured):
        for name, _, method in METHODS:
            want = slowlink.run_bytes(work, layout, method, 0, STEPS)
            assert want == got[name], f"{name} rank {rank}"
            assert "all_reduce@diloco" in want and "all_gather@dp" in want, name


def test_the_table_places_diloco_at_every_zero_stage():
    for method in (Method.DILOCO, Method.STREAMING):
        assert MethodConfig(method, inner_steps=H).zero_stages() == tuple(ZeroStage)
