#!/usr/bin/env bash
# GPU check of the msar plugin kernels, one call under 10 minutes, for a machine
# with an NVIDIA GPU, nvcc and PyTorch (TensorRT not needed):
#   1. builds the msar_kernels target of plugins/CMakeLists.txt for the GPU that is here
#      (cmake + ninja + nvcc, ptxas -v kept),
#   2. checks every launch path against float64 with msar_export/verdict.py
#      (tile, split sources, warp kernel, scalar loads, 97-256 sources, d 8192,
#      decode retrieval), then times FusedMixer against cached-view
#      DepthRetrieval for prefill and the decode retrieval (scripts/gpu_check.py),
#   3. compute-sanitizer memcheck, racecheck and synccheck on tiny cases of every path,
#   4. one ncu pass per kernel (tile, split + merge, warp, retrieval) at real shapes,
# and writes everything to MSAR_GPU_CHECK_DIR (default $OUT/gpu_check when $OUT is
# set, else build/gpu_check): build.log, ptxas.txt, results.json, check.log,
# sanitize-*.log, ncu.csv, summary.txt. Steps that would pass the budget are
# skipped and say so. Without a GPU it prints "skipped: no CUDA device" and exits 0.
#
#   scripts/gpu_check.sh [--quick]          # --quick: correctness only (no timing, sanitizers, ncu)
# Environment: PYTHON (default .venv/bin/python or python3), NVCC (default nvcc),
#              MSAR_GPU_CHECK_BUDGET_S (default 540).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
NVCC=${NVCC:-nvcc}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # msar_export from this checkout
if [ -n "${OUT:-}" ]; then DEFAULT_DIR="$OUT/gpu_check"; else DEFAULT_DIR=build/gpu_check; fi
DIR=${MSAR_GPU_CHECK_DIR:-$DEFAULT_DIR}
BUDGET=${MSAR_GPU_CHECK_BUDGET_S:-540}
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "skipped: no CUDA device"
    exit 0
fi
if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "gpu_check: nvcc not found (set NVCC or put the CUDA toolkit on PATH)" >&2
    exit 1
fi
mkdir -p "$DIR"
SUMMARY="$DIR/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - SECONDS)); }
status=0

# 1. Build the msar_kernels target of plugins/CMakeLists.txt for the compute capability torch reports.
ARCH=$("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')")
BUILD="$DIR/cmake"
LIB="$BUILD/libmsar_kernels.so"
note "# building $LIB for sm_$ARCH"
if ! { cmake -S plugins -B "$BUILD" -G Ninja "-DCMAKE_CUDA_COMPILER=$(command -v "$NVCC")" \
         "-DCMAKE_CUDA_ARCHITECTURES=$ARCH-real" -DMSAR_PTXAS_VERBOSE=ON -DTENSORRT_INCLUDE_DIR= \
       && cmake --build "$BUILD" --target msar_kernels; } >"$DIR/build.log" 2>&1; then
    note "FAILED: build (see $DIR/build.log)"
    exit 1
fi
grep -E "ptxas|registers|spill|bytes stack" "$DIR/build.log" >"$DIR/ptxas.txt"
note "# built in ${SECONDS} s; registers and spills per kernel: $DIR/ptxas.txt"

# 2. Correctness against float64, then timing (the script stops starting timed cases at its own budget).
extra=()
[ "$QUICK" = 1 ] && extra=(--quick)
"$PY" scripts/gpu_check.py --lib "$LIB" --out "$DIR/results.json" ${extra[@]+"${extra[@]}"} 2>&1 | tee "$DIR/check.log"
rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] && status=1
grep -E "^(FAIL|time|#)" "$DIR/check.log" >>"$SUMMARY"
[ "$QUICK" = 1 ] && exit $status

# 3. compute-sanitizer on the tiny cases of every path.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
for tool in memcheck racecheck synccheck; do
    if [ -z "$SAN" ]; then note "skipped: compute-sanitizer $tool (not found)"; continue; fi
    if [ "$(left)" -lt 90 ]; then note "skipped: compute-sanitizer $tool (budget: $(left) s left)"; continue; fi
    timeout $(( $(left) - 60 < 120 ? $(left) - 60 : 120 )) "$SAN" --tool "$tool" --error-exitcode 9 \
        "$PY" scripts/gpu_check.py --lib "$LIB" --sanitize --out "$DIR/sanitize-$tool.json" >"$DIR/sanitize-$tool.log" 2>&1
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    note "compute-sanitizer $tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$DIR/sanitize-$tool.log" | tail -n 1)"
done

# 4. One ncu pass per kernel launch of the profile run (transposeTaps excluded).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ -z "$NCU" ]; then
    note "skipped: ncu (not found)"
elif [ "$(left)" -lt 45 ]; then
    note "skipped: ncu (budget: $(left) s left)"
else
    timeout $(( $(left) - 10 )) "$NCU" --target-processes all -k 'regex:tileMixerKernel|mergeKernel|warpMixerKernel|depthRetrievalKernel' \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
        --csv --page details "$PY" scripts/gpu_check.py --lib "$LIB" --profile >"$DIR/ncu.csv" 2>"$DIR/ncu.log"
    rc=$?
    [ "$rc" -ne 0 ] && status=1
    note "ncu: exit $rc, $(grep -c 'Duration' "$DIR/ncu.csv") kernel durations in $DIR/ncu.csv"
    "$PY" - "$DIR/ncu.csv" >>"$SUMMARY" <<'PYEOF'
import csv, sys
keep = {"Duration", "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput", "Registers Per Thread",
        "Achieved Occupancy", "Grid Size", "Block Size"}
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
if rows and "Kernel Name" in rows[0]:
    h = rows[0]
    k, name, unit, value = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Unit"), h.index("Metric Value")
    for r in rows[1:]:
        if r[name] in keep:
            print(f"ncu {r[k][:60]:<60} {r[name]:<26} {r[value]} {r[unit]}")
PYEOF
fi
note "# gpu_check: exit $status after ${SECONDS} s; results in $DIR"
exit $status
