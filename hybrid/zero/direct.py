"""ZeRO 1-2's gradient reduce-scatter straight from autograd's gradient tensors (2-rank gloo groups on the host).

The flat path copies each parameter's gradient into its unit's flat buffer (the hook: read 4, write 4 bytes a
parameter) and then reduce-scatters the buffer: send the peer's half, receive the peer's contribution to this
rank's half, add. Nothing in that needs the gradients to be contiguous: the unit's layout is known on both ranks,

    flat = [p_0 | p_1 | ... | p_k | pad],   rank r owns flat[r S : (r+1) S]

so each rank can send the pieces of its parameters' gradients that fall in the peer's half where autograd left
them, and land its own half as out = x_me + x_other piece by piece. The bytes on the wire are the same (the padding
is not sent: it is zero on both ranks), the sum is the same one addition, x_me + x_other, bit for bit (IEEE addition
commutes; a slot with no gradient is 0 + x_other, as the flat path's zeroed slot gives), and the copy is gone:
8 bytes a parameter of memory traffic a step (808 MB a rank for the bench's 101M-parameter model), against the
optimizer step's 28 on half the parameters. docs/zero.md, round 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from hybrid.comm import Group, Work
from hybrid.zero.units import FlatUnit


@dataclass(frozen=True)
class Piece:
    """Flat range [lo, hi) of a unit restricted to one parameter: param.flatten()[lo - off : hi - off]."""

    param: nn.Parameter
    off: int  # the parameter's offset in the flat unit
    lo: int
    hi: int

    def of(self, grad: torch.Tensor) -> torch.Tensor:
        return grad.view(-1)[self.lo - self.off:self.hi - self.off]


def pieces(u: FlatUnit, lo: int, hi: int) -> list[Piece]:
    """The parameters' parts inside flat[lo:hi), in flat order (the padding, which belongs to none, left out): the
    same list on every rank, so the sender's pieces of a half and the receiver's pair up one to one."""
    out = []
    for p, off in zip(u.params, u.offsets):
        a, b = max(lo, off), min(hi, off + p.numel())
        if a < b:
            out.append(Piece(p, off, a, b))
    return out


def can_reduce_directly(group: Group, device: torch.device) -> bool:
    """Where the piecewise exchange runs: 2-rank gloo groups on host tensors (where the flat path uses the
    exchange reduce-scatter too, hybrid/comm.py `_reduces_by_exchange`). Elsewhere the flat path runs."""
    return group.size == 2 and device.type == "cpu" and group.host_staged


def reduce_scatter_grads(group: Group, u: FlatUnit, grads: dict[int, torch.Tensor], out: torch.Tensor,
                         recv: torch.Tensor) -> Work:
    """Post u's reduce-scatter over a 2-rank gloo `group` from `grads` (id(param) -> its gradient, a parameter
    missing: no gradient, zeros): the peer's half sent piece by piece, the peer's pieces of this rank's half received
    into `recv` (shard size); the returned Work lands out = grads' own half + recv (the padding zeroed) once
    waited. Recorded on the ledger as the flat reduce-scatter it replaces (the full unit's bytes)."""
    me, s = group.rank, u.shard_numel
    mine, theirs = pieces(u, me * s, (me + 1) * s), pieces(u, (1 - me) * s, (2 - me) * s)
    sends = [x.of(grads[id(x.param)]) if id(x.param) in grads else torch.zeros(x.hi - x.lo, dtype=recv.dtype)
             for x in theirs]
    got = [recv[x.lo - me * s:x.hi - me * s] for x in mine]
    own = [(x, grads.get(id(x.param))) for x in mine]

    def land() -> None:
        for (x, g), r in zip(own, got):
            o = out[x.lo - me * s:x.hi - me * s]
            if g is None:  # no gradient here: 0 + x_other, as the flat path's zeroed slot
                o.zero_().add_(r)
            else:
                torch.add(x.of(g), r, out=o)
        end = mine[-1].hi - me * s if mine else 0  # the parameters fill the half from its start; then padding
        out[end:].zero_()

    return group.reduce_scatter_pieces(u.padded * recv.element_size(), sends, got, land)
