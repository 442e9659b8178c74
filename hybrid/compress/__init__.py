"""Gradient compression over the data-parallel group: PowerSGD (powersgd.py) and 1-bit Adam (onebit.py).

Each compressor is a pair of pure functions (compress, decompress) plus the error-feedback state it carries; the
ZeRO engine reaches them through one seam, a `DPReduction` strategy (reduction.py). docs/comm-efficient.md."""
