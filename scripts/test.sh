#!/usr/bin/env bash
# Set up .venv if needed and run the test suite (the command CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_env.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@" tests
