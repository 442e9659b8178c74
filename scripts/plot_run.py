"""Loss, throughput and peak-memory curves of train.py runs to a PNG; see hybrid/metrics/plot.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from hybrid.metrics.plot import main  # noqa: E402

if __name__ == "__main__":
    main()
