"""Tokenize JSON lines or text into Megatron's indexed format (.bin/.idx); see hybrid/data/preprocess.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.data.preprocess import main  # noqa: E402

if __name__ == "__main__":
    main()
