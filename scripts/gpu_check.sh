#!/usr/bin/env bash
# GPU check of the msar plugins and kernels, one call under 10 minutes, for a machine with an
# NVIDIA GPU, nvcc and PyTorch (TensorRT itself not needed; its headers, for the harness):
#   build     the kernels (msar_kernels) for the GPU that is here, and with TensorRT headers
#             (TENSORRT_INCLUDE_DIR, a folder outside the repo) the plugin harness (pluginHarness)
#   harness   the plugins driven as TensorRT drives them (plugins/tests/pluginHarness.cpp)
#   check     every launch path against float64 (verdict.py), then timing by CUDA-graph replay:
#             copy bandwidth, prefill paths, decode retrieval (scripts/gpu_check.py, gpu_timing.py)
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck on tiny cases of every path
#   ncu       one pass per kernel, --clock-control none (the clocks the timing rows ran at)
# Every stage is time-boxed and appends its line to summary.txt as it ends; a tool the device
# does not support is "skipped", not "FAILED". Results in MSAR_GPU_CHECK_DIR (default
# build/gpu_check). With $OUT set (the device tool's folder, which brings back at most 8 files),
# the run ends by leaving two files there: summary.txt and gpu_check.tgz (every log and result,
# not the build folder), also when a stage fails or the budget runs out.
#
#   scripts/gpu_check.sh [--quick]   # --quick: harness and correctness only
#   scripts/gpu_check.sh --build-only # no GPU needed: the device build alone (nvcc, sm MSAR_CUDA_ARCH, default 90),
#                                    # the harness included with TENSORRT_INCLUDE_DIR: checks a GPU run will compile
#   scripts/gpu_check.sh --dry-run   # no GPU: every host-side step on the CPU emulation (the build, the
#                                    # harness, the check, timing and report code at tiny shapes, the ncu
#                                    # report parser); tests/test_gpu_check.py runs it
# Environment: PYTHON (default .venv/bin/python or python3), NVCC (default nvcc), MSAR_GPU_CHECK_BUDGET_S
# (default 540), TENSORRT_INCLUDE_DIR (outside this checkout or in a folder git ignores, e.g. build/),
# MSAR_CUDA_ARCH (--build-only; a GPU run takes the device's), MSAR_GPU_CHECK_BUILD (a configured build folder to reuse).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
NVCC=${NVCC:-nvcc}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # msar_export from this checkout
DIR=${MSAR_GPU_CHECK_DIR:-build/gpu_check}
BUDGET=${MSAR_GPU_CHECK_BUDGET_S:-540}
# TensorRT's headers are never committed here: a folder inside the checkout that git would track is refused
# (an ignored one, e.g. under build/, may be how a device session carries them).
if [ -n "${TENSORRT_INCLUDE_DIR:-}" ] && [ -d "$TENSORRT_INCLUDE_DIR" ]; then
    inc=$(cd "$TENSORRT_INCLUDE_DIR" && pwd -P)
    case "$inc/" in
        "$(pwd -P)/"*) if git rev-parse --git-dir >/dev/null 2>&1 && ! git check-ignore -q "$inc"; then
            echo "TENSORRT_INCLUDE_DIR=$TENSORRT_INCLUDE_DIR is inside this checkout and not ignored by git: unpack" \
                 "TensorRT's headers outside it or under build/ (they must never be committed here)" >&2; exit 2
        fi ;;
    esac
fi
MODE=full
case "${1:-}" in
    --quick) MODE=quick ;;
    --dry-run) MODE=dry ;;
    --build-only) MODE=build ;;
    "") ;;
    *) echo "usage: scripts/gpu_check.sh [--quick|--dry-run|--build-only]" >&2; exit 2 ;;
esac

if [ "$MODE" != dry ] && [ "$MODE" != build ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
    echo "skipped: no CUDA device"
    exit 0
fi
mkdir -p "$DIR"
SUMMARY="$DIR/summary.txt"
: >"$SUMMARY"
# shellcheck disable=SC2317 # run by the trap
pack() {
    [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
    cp "$SUMMARY" "$OUT/summary.txt"
    tar czf "$OUT/gpu_check.tgz" -C "$DIR" --exclude=./cmake .
}
trap pack EXIT
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET - SECONDS)); }
status=0

# stage NAME SECONDS CMD...: run CMD time-boxed into NAME.log, one summary line. Exit 124: over its time box.
# A log saying the device or tool is unsupported makes the stage "skipped", not "FAILED".
stage() {
    local name=$1 box=$2
    shift 2
    if [ "$(left)" -lt 20 ]; then note "skipped: $name (budget: $(left) s left)"; return 0; fi
    [ "$box" -gt $(($(left) - 10)) ] && box=$(($(left) - 10))
    local t0=$SECONDS
    timeout "$box" "$@" >"$DIR/$name.log" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ] && grep -qiE "not supported|unsupported (device|gpu|architecture)|ERR_NVGPUCTRPERM" "$DIR/$name.log"; then
        note "skipped: $name (the device or tool does not support it: $(grep -iE -m1 'not supported|unsupported|ERR_NVGPU' "$DIR/$name.log"))"
    elif [ "$rc" -eq 124 ]; then
        note "FAILED: $name (over its ${box} s time box; see $name.log)"; status=1
    elif [ "$rc" -ne 0 ]; then
        note "FAILED: $name (exit $rc; see $name.log)"; status=1
    else
        note "ok: $name ($((SECONDS - t0)) s)"
    fi
    return $rc
}

# 1. Build through plugins/CMakeLists.txt.
BUILD=${MSAR_GPU_CHECK_BUILD:-$DIR/cmake}
if [ "$MODE" = dry ]; then
    cfg=(-DMSAR_CUDA=OFF)
    LIBTARGET=msar_emulation; LIB="$BUILD/tests/libmsar_emulation.so"; CHECK_LIB=(--emulation "$LIB" --dry-run)
else
    if [ "$MODE" = build ]; then
        ARCH=${MSAR_CUDA_ARCH:-90}
    else
        ARCH=$("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')")
    fi
    cfg=("-DCMAKE_CUDA_COMPILER=$(command -v "$NVCC")" "-DCMAKE_CUDA_ARCHITECTURES=$ARCH-real" -DMSAR_PTXAS_VERBOSE=ON)
    LIBTARGET=msar_kernels; LIB="$BUILD/libmsar_kernels.so"; CHECK_LIB=(--lib "$LIB")
fi
HARNESS="$BUILD/tests/pluginHarness"
targets=("$LIBTARGET")
if [ -n "${TENSORRT_INCLUDE_DIR:-}" ] && [ -f "$TENSORRT_INCLUDE_DIR/NvInferRuntime.h" ]; then
    targets+=(pluginHarness)
else
    HARNESS=""
fi
note "# $MODE check: building ${targets[*]} in $BUILD"
# shellcheck disable=SC2016 # expanded by the inner shell
stage build 360 bash -c 'b=$1 t=$2; shift 2
    [ -f "$b/build.ninja" ] || cmake -S plugins -B "$b" -G Ninja -DMSAR_WERROR=ON "-DTENSORRT_INCLUDE_DIR=${TENSORRT_INCLUDE_DIR:-}" "$@" || exit 1
    cmake --build "$b" --target $t' _ "$BUILD" "${targets[*]}" "${cfg[@]}" || { note "# gpu_check: exit 1 after ${SECONDS} s (build failed)"; exit 1; }
grep -E "ptxas|registers|spill|bytes stack" "$DIR/build.log" >"$DIR/ptxas.txt"
if [ "$MODE" = build ]; then
    [ -n "$HARNESS" ] && [ -x "$HARNESS" ] && note "ok: device harness built ($HARNESS, sm $ARCH; not run: --build-only)"
    note "# gpu_check: exit $status after ${SECONDS} s (build only)"
    exit $status
fi

# 2. The plugin harness (the device build, or the emulation's in a dry run).
if [ -n "$HARNESS" ]; then
    stage harness 120 "$HARNESS"
else
    note "skipped: harness (no TensorRT headers: set TENSORRT_INCLUDE_DIR to a TensorRT include/ folder)"
fi

# 3. Correctness against float64, then timing (the script stops starting timed cases at its own budget).
extra=()
[ "$MODE" = quick ] && extra=(--quick)
stage check 300 "$PY" scripts/gpu_check.py "${CHECK_LIB[@]}" --out "$DIR/results.json" ${extra[@]+"${extra[@]}"}
grep -E "^(FAIL|time|#)" "$DIR/check.log" >>"$SUMMARY"
if [ "$MODE" = quick ]; then note "# gpu_check: exit $status after ${SECONDS} s"; exit $status; fi

# 4. compute-sanitizer on the tiny cases of every path.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
for tool in memcheck racecheck synccheck; do
    if [ "$MODE" = dry ]; then note "skipped: sanitize-$tool (dry run: no device)"; continue; fi
    if [ -z "$SAN" ]; then note "skipped: sanitize-$tool (compute-sanitizer not found)"; continue; fi
    stage "sanitize-$tool" 120 "$SAN" --tool "$tool" --error-exitcode 9 \
        "$PY" scripts/gpu_check.py --lib "$LIB" --sanitize --out "$DIR/sanitize-$tool.json"
done

# 5. One ncu pass per kernel launch of the profile run, at the clocks the timing ran at.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
if [ "$MODE" = dry ]; then
    note "skipped: ncu (dry run: no device)"
    : >"$DIR/ncu.csv"
elif [ -z "$NCU" ]; then
    note "skipped: ncu (not found)"
else
    stage ncu 150 "$NCU" --clock-control none --target-processes all --csv --page details \
        -k 'regex:tileMixerKernel|mergeKernel|warpMixerKernel|depthRetrievalKernel' \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
        --log-file "$DIR/ncu.csv" "$PY" scripts/gpu_check.py --lib "$LIB" --profile
fi
[ -f "$DIR/ncu.csv" ] && { "$PY" scripts/ncu_summary.py "$DIR/ncu.csv" >>"$SUMMARY" || { note "FAILED: ncu report"; status=1; }; }
note "# gpu_check: exit $status after ${SECONDS} s; results in $DIR"
exit $status
