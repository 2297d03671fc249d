#!/usr/bin/env bash
# Serve the trained demo checkpoint (checkpoints/default/msar) on a real Triton
# server: models `logits` and `generate` on http://127.0.0.1:8000 and
# grpc://127.0.0.1:8001, dynamic batching on, until Ctrl-C.
#
# First run: creates .venv and .venv-triton if missing (about a minute each from
# PyPI) and exports both graphs into runs/serve/msar (about a minute on 2 cores);
# later runs reuse them. Extra arguments go to `msar-export serve`, e.g.
#   scripts/serve_demo.sh --port-http 9000 --port-grpc 9001 --no-batching
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup_env.sh
./scripts/setup_triton_env.sh >/dev/null
exec .venv/bin/msar-export serve checkpoints/default/msar "$@"
