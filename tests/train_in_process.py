"""train.py's runs of several argvs one after another in one rank of hybrid.testing.run_distributed (its process
group and imports serve all of them), each one's stdout captured -- for tests that read train.py's lines. Here, not in
hybrid.testing: hybrid.testing importing hybrid.train.loop would close a package import cycle
(tests/test_import_graph.py)."""

from __future__ import annotations

import contextlib
import importlib
import io


def train_runs(argvs: list[list[str]]) -> list[str]:
    """Each run's stdout. What a caller patched in hybrid.train.loop first (a clock, train_step) is what runs."""
    import torch

    from hybrid.train import loop
    train_main = importlib.import_module("hybrid.train.main")  # the module: hybrid.train.main is also a function
    outs = []
    for argv in argvs:
        run, _, corpus = train_main.validate(argv)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            loop.run(run, corpus, torch.device("cpu"))
        outs.append(out.getvalue())
    return outs
