"""Train a byte-level BPE tokenizer offline; see hybrid/data/train_tokenizer.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.data.train_tokenizer import main  # noqa: E402

if __name__ == "__main__":
    main()
