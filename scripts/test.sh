#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite on CPU with gloo. Extra args go to pytest.
# Two pytest-xdist workers, one file per worker at a time (module fixtures run once), longest files first (and a
# test marked @pytest.mark.serial alone; none is now): see tests/conftest.py. Many tests wait on process
# start-up, rendezvous and timeouts, so two workers overlap that waiting even on 2 cores.
#
#   bash scripts/test.sh           # everything (CI: .ci/run)
#   bash scripts/test.sh --fast    # the fast tier for the edit-test loop: no setup, the tests not marked slow
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec "${PYTHON:-python3}" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" "$@"
fi
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
