"""Imported by the test session's forkserver only (tests/conftest.py appends it to hybrid.testing.PRELOAD): inductor's
per-process start-up done once, before the forks, instead of in every rank that runs `--compile`.

A process's first inductor compile imports inductor (torch._inductor.compile_fx and the ~300 modules below it),
probes the CPU's vector ISA (pick_vec_isa: builds and loads a probe per ISA, 6 Python interpreters and 3 g++ runs)
and hashes the preprocessed ATen header its kernels include (codecache._precompile_header: `g++ -E` over every
header, then `openssl sha512`); all three are kept per process (sys.modules, functools caches), ~2.5-3 s of CPU
(1.3 of it the children) measured in one process on this machine. Every compiling rank of the suite paid them:
test_compose20_compile's 2- and 4-rank launches (6 ranks; the file 137.5 -> 122.5 CPU s with this preload, both
runs at once, load 20-40), test_compile's, test_compile_recompute's, test_moe19_compile's and the compile
benchmarks' smoke tests' ranks.

Here a one-element function is compiled and differentiated once (forward and backward kernels, loaded as a cached
kernel is), so each fork inherits the imports and the caches; what a test compiles is unchanged -- its graphs are
traced and compiled in its ranks as before (dynamo is reset here and its counters cleared, so a rank starts with
none of this one's frames, graphs or breaks).

Not in hybrid/testing.py's PRELOAD: `hybrid calibrate` and the benchmark scripts fork from it too, and compile
nothing (calibrate) or time a first compile (scripts/bench_compile.py). One compile thread here (inductor's default
is one per core, and a pool would leave a process and threads in the forkserver, which forks); nothing of this
module may fail the forkserver: any error leaves the ranks to do it themselves, as without it. With an empty inductor
cache (a new machine) its two kernels are built once here (~10 s of g++ CPU, measured), as the first compiling rank
would build its own.
"""

from __future__ import annotations


def _warm_inductor() -> None:
    import torch
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    def f(x):
        return (x * 2).sin().sum()
    with inductor_config.patch(compile_threads=1):
        x = torch.ones(1, requires_grad=True)
        torch.compile(f, backend="inductor")(x).backward()
    torch._dynamo.reset()
    counters.clear()
    import tqdm  # a first compile (an empty inductor cache) shows a progress bar, whose monitor thread stays
    if tqdm.tqdm.monitor is not None:
        tqdm.tqdm.monitor.exit()  # a thread of its own, stopped and joined: the forkserver forks single-threaded
        tqdm.tqdm.monitor = None


try:
    _warm_inductor()
except Exception:  # noqa: BLE001 -- a warm-up: the ranks do the same work themselves if it fails
    pass
