"""Time the sample index of a GPT split (document + shuffle index) and of a two-dataset blend at a few sizes: built
in memory, built through the cache (build + write), and loaded from it (verify + map). CPU seconds
(time.process_time) of this process; docs/data.md quotes the table.

    python scripts/bench_data_index.py 1000000 10000000
    PYTHONPATH=OLD_TREE python scripts/bench_data_index.py ...   # an older tree: its in-memory build only
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
import time

import numpy as np

from hybrid.cliutil import OneLineParser, int_in
from hybrid.data.gpt import Blend, GPTSamples
from hybrid.data.indexed import InMemoryDocuments


def cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("samples", type=int_in(1), nargs="+", help="sample counts to time")
    p.add_argument("--documents", type=int_in(1), default=200_000, help="synthetic documents of 100-4,000 tokens")
    p.add_argument("--seq-length", type=int_in(1), default=2048, help="tokens per sample")
    p.add_argument("--blend-max", type=int_in(1), default=4_000_000, help="blend sizes above this are skipped")
    a = p.parse_args()
    lengths = np.random.default_rng(0).integers(100, 4000, a.documents).astype(np.int32)
    docs = InMemoryDocuments(np.zeros(1, np.uint16), lengths, "synthetic")
    ids = np.arange(a.documents)
    has_cache = "cache" in inspect.signature(GPTSamples).parameters
    for n in a.samples:
        row = {"memory": cpu(lambda: GPTSamples(docs, ids, a.seq_length, n, 1234))}
        if has_cache:
            folder = tempfile.mkdtemp()
            row["cache build"] = cpu(lambda: GPTSamples(docs, ids, a.seq_length, n, 1234, folder))
            row["cache load"] = cpu(lambda: GPTSamples(docs, ids, a.seq_length, n, 1234, folder))
            shutil.rmtree(folder)
        print(f"split, {n:,} samples: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)
        if n > a.blend_max:
            continue
        part = GPTSamples(docs, ids[:1000], 16, 10, 1)
        row = {"memory": cpu(lambda: Blend([part, part], [0.3, 0.7], n))}
        if has_cache:
            folder = tempfile.mkdtemp()
            row["cache build"] = cpu(lambda: Blend([part, part], [0.3, 0.7], n, folder))
            row["cache load"] = cpu(lambda: Blend([part, part], [0.3, 0.7], n, folder))
            shutil.rmtree(folder)
        print(f"blend of 2, {n:,} samples: " + ", ".join(f"{k} {v:.2f} s" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
