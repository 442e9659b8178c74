#!/usr/bin/env bash
# Sets up (scripts/setup.sh) and runs the whole test suite on CPU with gloo. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q "$@"
