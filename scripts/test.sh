#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite on CPU with gloo. Extra args go to pytest.
# Two pytest-xdist workers, one file per worker at a time (module fixtures run once), longest files first, and
# the timing-sensitive tests (@pytest.mark.serial) alone: see tests/conftest.py. Many tests wait on process
# start-up, rendezvous and timeouts, so two workers overlap that waiting even on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
