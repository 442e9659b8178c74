"""One intra-op thread for the test process's own torch work (the references a test computes in-process:
transformers models, single-process training, checkpoints read back), as every rank already runs
(hybrid/testing.py).

The suite runs on two pytest-xdist workers with multi-rank tests beside them, so the machine's cores are always
oversubscribed. A test process at torch's default (one OpenMP thread per core) then spends its CPU spinning: its
OpenMP workers busy-wait between parallel regions while the other core's runnable processes preempt them. Measured
on test_moe_etp's transformers references (load ~25, 2 cores): 19.0 CPU s (194 s wall) at 2 threads, 0.5 CPU s
(14 s wall) at 1.

A result may move by fp32 rounding: a reduction split over threads sums in another order ("a matmul's reduction
order depends on the thread count", as test_diloco's _one_thread says, which already runs its references so).
In the modules that use it, every reference is compared with ranks that run at one thread, within a derived fp32
bound, or is copied bit for bit (no arithmetic); one thread makes the reference's kernels the ranks' own.
Measured on test_moe_etp's Mixtral reference, 1 thread against 2: gradients, weights after 2 AdamW steps and
logits differ by at most 3.3e-7 of each tensor's largest entry (the loss is identical), 30x inside its RTOL 1e-5.

    from suite_threads import one_thread_module  # noqa: F401  (an autouse, module-scoped fixture)
"""

from __future__ import annotations

import contextlib

import pytest
import torch


@contextlib.contextmanager
def one_thread():
    """torch.set_num_threads(1) for the block; the caller's count restored after (the next file on this worker
    starts as it would have)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def one_thread_module():
    """The whole module at one intra-op thread: autouse, so it is set up before the module's other fixtures."""
    with one_thread():
        yield
