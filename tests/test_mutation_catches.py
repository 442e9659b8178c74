"""Tests added by a mutation pass (issue 25's reviewer's pass): each feature was broken on purpose by one line in a
scratch copy and its tests run; these catch the breaks that survived them. In process, no launch, < 1 CPU s each.

* --recompute-granularity selective-op, "save instead of recompute" (SelectiveOpPolicy returning MUST_SAVE for every
  op): tests/test_recompute.py's memory check counts what the policy *tracks*, which still follows its rule, so it
  passed; only torch's own "cached tensor mutated" error at tp 2 (test_recompute_parallel) stopped it.
* --offload-optimizer, "skip the offload copy" (ZeroOptimizer._place returning the tensor where it is): on a CPU-only
  machine the compute device is the offload device, so every training test passes; on a GPU the master weights and
  Adam moments would stay in GPU memory and nothing asserted where they live.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.utils.checkpoint import CheckpointPolicy

from models.common import _ATTENTION, _MATMULS, SelectiveOpPolicy


def test_selective_op_policy_recomputes_all_but_the_attention_kernel_and_every_second_matmul():
    """torchtitan's op-level rule, as models/common.py states it: store the attention kernel's outputs and the 1st,
    3rd, ... matmul of the block, recompute everything else -- in forward and, counted apart, in the
    recomputation, which must choose the same ops."""
    mm, addmm = _MATMULS
    other = (torch.ops.aten.add.Tensor, torch.ops.aten.gelu.default, torch.ops.aten.native_layer_norm.default)
    ops = [other[2], mm, mm, mm, _ATTENTION[0], addmm, other[1], addmm, other[0]]
    want = [False, True, False, True, True, False, False, True, False]  # matmuls 1 3 (mm), 5 (the 2nd addmm)
    policy = SelectiveOpPolicy()
    for recompute in (False, True):
        ctx = SimpleNamespace(is_recompute=recompute, op_output=None)
        got = [policy(ctx, op) for op in ops]
        assert got == [CheckpointPolicy.MUST_SAVE if s else CheckpointPolicy.PREFER_RECOMPUTE for s in want], recompute


def test_offload_places_a_tensor_on_the_offload_device_and_leaves_it_otherwise():
    """ZeroOptimizer._place, where --offload-optimizer's master weights and moments (and --offload-params' shards)
    go: onto `offload_device`. A device other than this CPU stands in for the host (meta: no memory), so the
    copy is visible on a CPU-only machine too."""
    from hybrid.zero.engine import ZeroOptimizer
    engine = SimpleNamespace(offload_device=torch.device("meta"), pin=False)
    t = torch.ones(4)
    assert ZeroOptimizer._place(engine, t, offload=False) is t
    moved = ZeroOptimizer._place(engine, t, offload=True)
    assert moved.device.type == "meta" and moved.shape == t.shape
