"""PowerSGD's warm-start Q of a key/value projection whose heads are replicated over TP (tp 4, 2 kv heads: TP
ranks 0, 1 hold head 0, ranks 2, 3 head 1) survives a checkpoint at the same layout: every TP rank reads back
the Q it saved. Only one rank of each replica pair writes its row (hybrid/stateful.is_owner), so the replica
must read the row of the first rank holding its shard (hybrid/compress/state._tp_row): with that index wrong
the replica reads a row nobody wrote, which DCP leaves as the buffer's zeros without a word (a zero Q makes the
next P = M Q zero). In-process: PowerSGDCheckpoint's own state_dict / _load_dict / load_state_dict on each of
the four TP ranks, the global tensor assembled from the written pieces as DCP would, no process group.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hybrid.compress.powersgd import PowerSGDConfig, PowerSGDState
from hybrid.compress.state import PowerSGDCheckpoint, q_offsets
from hybrid.tp.sharding import ShardSpec, set_spec

TP, HEADS, HEAD_DIM, HIDDEN, RANK = 4, 2, 8, 32, 2
NAME = "layers.0.attn.k_proj.weight"


def _reduction(tp_rank: int, q: torch.Tensor | None) -> SimpleNamespace:
    """A PowerSGDReduction as the checkpoint sees it: one bucket holding this rank's (8, 32) k_proj shard."""
    spec = ShardSpec(dim=0, full_size=HEADS * HEAD_DIM, starts=tuple(HEAD_DIM * (r * HEADS // TP) for r in range(TP)),
                     length=HEAD_DIM, partial_grad=True)  # (0, 0, 8, 8): heads replicated over rank pairs
    p = set_spec(torch.nn.Parameter(torch.zeros(HEAD_DIM, HIDDEN)), spec)
    state = PowerSGDState(PowerSGDConfig(rank=RANK, start_iter=1))
    unit = SimpleNamespace(params=[p], offsets=[0], numel=p.numel())
    (at, m, r), = q_offsets([p], state).values()
    if q is not None:
        state.iter = 5
        state.error[0], state.q[0] = torch.zeros(p.numel()), q.clone()
    return SimpleNamespace(units=[unit], names={id(p): NAME}, state=state, coords=(0, tp_rank), layout=(1, TP, 1),
                           dtype=torch.float32, duplicates=set(), sizes={0: (p.numel(), HEAD_DIM * r, m * r)})


def test_replicated_kv_heads_read_back_the_warm_start_q_they_saved():
    # ranks holding one head hold one Q (its gradient is summed over the pair: the same matrix, the same factors)
    qs = [torch.randn(HIDDEN * RANK, generator=torch.Generator().manual_seed(10 + r * HEADS // TP))
          for r in range(TP)]
    saved = [PowerSGDCheckpoint(_reduction(r, qs[r])).state_dict() for r in range(TP)]
    key = "powersgd.q/" + NAME
    full = torch.full(saved[0][key].global_shape, float("nan"))  # NaN: no rank wrote it
    for sd in saved:
        if sd[key].write:
            for t, (off, size) in zip(sd[key].tensors, sd[key].boxes):
                full[tuple(slice(o, o + s) for o, s in zip(off, size))] = t
    for r in range(TP):
        ck = PowerSGDCheckpoint(_reduction(r, None))
        ck.before_load({"powersgd": saved[r]["powersgd"]})
        sd = ck.state_dict()  # the load's buffers (_load_dict), filled in place as DCP does
        for t, (off, size) in zip(sd[key].tensors, sd[key].boxes):
            t.copy_(full[tuple(slice(o, o + s) for o, s in zip(off, size))])
        ck.load_state_dict(sd)
        assert torch.equal(ck.red.state.q[0], qs[r]), f"TP rank {r} read back another Q"
