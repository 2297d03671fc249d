#!/usr/bin/env bash
# Set up .venv if needed and run the test suite.
#   ./scripts/test.sh          every stage, without the `slow` tier (what CI runs: .ci/run)
#   ./scripts/test.sh --all    everything, the slow tier too (before a release, or after touching
#                              the kernels, the exporter's passes or the tolerance model)
# Other arguments go to pytest, e.g. ./scripts/test.sh -m trt, ./scripts/test.sh -k interop.
# Markers (pyproject.toml): slow (more graph kinds, precisions and depths of paths the
# default tier already covers), trt (needs TensorRT or TensorRT-RTX), gpu (needs a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_env.sh
tier=(-m "not slow")
if [ "${1:-}" = "--all" ]; then
    tier=()
    shift
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "${tier[@]}" "$@" tests
