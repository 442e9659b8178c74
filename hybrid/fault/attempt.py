"""One id per launch attempt, agreed by every rank through torchrun's agent store.

torchrun's c10d rendezvous (torch >= 2.4) hands every attempt of a job the same agent TCPStore, and env://
adds no per-attempt prefix. Keys from the attempt before survive: a restarted rank can read a dead rank's gloo
address and fail in connectFullMesh ("Connection refused"), or a dead NCCL unique id (pytorch/pytorch#135712).
TORCHELASTIC_RESTART_COUNT is no cure: each agent counts its own restarts, and an agent that restarts its workers
for a membership change does not count one, so two nodes can disagree on it.

So the ranks agree on a fresh id before the process group exists. Every key the exchange waits on is made
fresh by a random nonce, so nothing written by an earlier attempt can be mistaken for this one's:

    rank r > 0:  set hello/r = n_r (fresh nonce)      wait ack/n_r -> id     set confirm/id/r
    rank 0:      id = fresh nonce; until every confirm/id/r exists: for each r, read hello/r and, when it
                 holds a nonce not yet acked, set ack/<that nonce> = id

hello/r may still hold a dead rank's nonce when rank 0 first reads it; that ack goes unread, and the live
rank's own hello overwrites it and is acked on a later pass. Cost: rank 0 makes O(world) store round trips a
pass (about 0.1 ms each on a LAN: under a second a pass at 4k ranks) until every rank has confirmed; the others
make three. The process group, the heartbeat and the hang watchdog then keep their keys under the id
(`attempt_id()`).
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import torch.distributed as dist

ENV = "HYBRID_ATTEMPT_ID"  # set in this process once the ranks agree; read by the heartbeat and the watchdog
_POLL_S = 0.02


def attempt_id() -> str:
    """This attempt's agreed id; before (or without) the agreement, torchrun's restart count."""
    return os.environ.get(ENV) or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def agree(store: dist.Store, rank: int, world: int, timeout: timedelta) -> str:
    """The exchange above; every rank returns rank 0's fresh id. TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout.total_seconds()
    if rank != 0:
        nonce = uuid.uuid4().hex
        store.set(f"hybrid/attempt/hello/{rank}", nonce)
        store.wait([f"hybrid/attempt/ack/{nonce}"], timeout)
        ident = store.get(f"hybrid/attempt/ack/{nonce}").decode()
        store.set(f"hybrid/attempt/confirm/{ident}/{rank}", "1")
        return ident
    ident = uuid.uuid4().hex
    acked: dict[int, str] = {}
    pending = set(range(1, world))
    while pending:
        for r in sorted(pending):
            if store.check([f"hybrid/attempt/confirm/{ident}/{r}"]):
                pending.discard(r)
            elif store.check([f"hybrid/attempt/hello/{r}"]):
                nonce = store.get(f"hybrid/attempt/hello/{r}").decode()
                if acked.get(r) != nonce:
                    store.set(f"hybrid/attempt/ack/{nonce}", ident)
                    acked[r] = nonce
        if pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks {sorted(pending)} did not join this attempt within {timeout}")
            time.sleep(_POLL_S)
    return ident


def attempt_store(timeout: timedelta) -> dist.Store | None:
    """torchrun's shared agent store under this attempt's agreed id (`/worker/attempt_<id>`), for
    init_process_group; None when the launcher gives each attempt a fresh store (env:// then works as is)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    tcp = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=timeout)
    ident = agree(tcp, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), timeout)
    os.environ[ENV] = ident
    return dist.PrefixStore(f"/worker/attempt_{ident}", tcp)
