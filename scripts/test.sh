#!/usr/bin/env bash
# Set up .venv if needed and run the test suite.
#   ./scripts/test.sh          every stage, without the `slow` tier (what CI runs: .ci/run)
#   ./scripts/test.sh --all    everything, the slow tier too (before a release, or after touching
#                              the kernels, the exporter's passes or the tolerance model)
# Other arguments go to pytest, e.g. ./scripts/test.sh -m trt, ./scripts/test.sh -k interop.
# Markers (pyproject.toml): slow (more graph kinds, precisions and depths of paths the
# default tier already covers), trt (needs TensorRT or TensorRT-RTX), gpu (needs a GPU),
# serial (speed ratios: run alone after the parallel stage).  MSAR_TEST_WORKERS=1 for one worker.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_env.sh
tier="not slow and "
if [ "${1:-}" = "--all" ]; then
    tier=""
    shift
fi
pytest=(.venv/bin/python -m pytest -q -rs -p no:cacheprovider --durations=25)  # -rs: each skip with its reason
# loadfile: a test module runs on one worker, so its module fixtures (a build folder, the nvcc
# compile check) are made once.  (loadgroup's xdist_group marks do nothing with pytest 9.2 and
# pytest-xdist 3.8.0: xdist renames nodes through an attribute pytest 9 no longer reads.)
# --max-worker-restart 0: a worker that crashes (a segfault in native code) fails the run at once.
# Replacing it hangs pytest-xdist 3.8.0's loadfile scheduler at the end of the run (it re-queues the
# crashed worker's finished files as empty work: pytest-dev/pytest-xdist#784, #1378), which CI only
# ends at its own time limit, with no summary.
workers=(-n "${MSAR_TEST_WORKERS:-2}" --dist loadfile --max-worker-restart 0)
if [ "$#" -gt 0 ]; then
    # The caller's selection (a later -m replaces the tier), in the workers.
    exec "${pytest[@]}" "${workers[@]}" -m "${tier% and }" "$@" tests
fi
# Two pytest-xdist workers on this project's 2-core machines (most tests keep one core busy),
# then the `serial` tests (speed ratios) alone.
rc=0
"${pytest[@]}" "${workers[@]}" -m "${tier}not serial" tests || rc=$?
"${pytest[@]}" -m "${tier}serial" tests || rc=$((rc ? rc : $?))
exit "$rc"
