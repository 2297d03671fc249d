#!/usr/bin/env bash
# Create .venv-triton at the repo root (once): the Triton Inference Server that
# `msar-export serve` launches, and the client side of `msar-export loadtest`.
#
# Why a second venv: nvidia-pytriton (it ships the `tritonserver` binary, the
# Python backend and its stubs) pins numpy<2, and tritonclient[grpc] pins
# protobuf<7; the main .venv has numpy 2 and protobuf 7.
# torch is pinned to the local CPU wheel and installed first, so pip never
# resolves a multi-GB CUDA build. This package goes in editable, with its own
# dependencies resolved together with numpy<2 (so `import msar_export` works
# there whatever its __init__ grows to need).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CHECK="import pytriton, tritonclient.grpc, tritonclient.http, onnxruntime, onnx, torch, msar_export.serving.cli"
# One setup at a time (two test workers, or two shells, may ask at once): the second waits, then
# finds the venv ready.
mkdir -p .venv-triton
exec 9>.venv-triton/.setup.lock
flock 9
if [ ! -x .venv-triton/bin/python ]; then
    "$PY" -m venv .venv-triton
fi
# Keep the venv out of `git status` whatever .gitignore says.
echo '*' > .venv-triton/.gitignore
if ! .venv-triton/bin/python -c "$CHECK" >/dev/null 2>&1; then
    .venv-triton/bin/pip install -q torch==2.13.0
    .venv-triton/bin/pip install -q torch==2.13.0 "numpy<2" "nvidia-pytriton>=0.5" onnxruntime -e .
fi
.venv-triton/bin/python -c "$CHECK"

# Triton's perf_analyzer (`msar-export loadtest --perf-analyzer`), into .venv-triton/perf_analyzer
# {bin,lib}.  The perf-analyzer wheels (2.58-2.60) need glibc 2.38 and do not install on
# Debian 12; tritonclient 2.51.0 ships the binary in its data/bin, built for glibc <= 2.34.  It
# links libb64 (Debian's libb64-0d, downloaded and unpacked with a private apt state folder, as
# fetch_ort_headers.sh does: the system is not changed) and libcudart.so.12 (the
# nvidia-cuda-runtime-cu12 wheel; no GPU is needed).  Only the files are taken from the two
# wheels: tritonclient 2.51 itself would downgrade the client library.  Optional: when it cannot
# be had, the load test says so and the rest of the serving setup stands.
PA=.venv-triton/perf_analyzer
fetch_perf_analyzer() (  # a subshell: its trap and variables stay in it
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    .venv-triton/bin/pip download -q --no-deps --only-binary=:all: -d "$work" \
        tritonclient==2.51.0 nvidia-cuda-runtime-cu12==12.9.79 >"$work/log" 2>&1 || { tail -n1 "$work/log"; return 1; }
    if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
        echo "not a Debian system with apt-get and dpkg-deb (libb64 comes from Debian)"; return 1
    fi
    # The system's own sources, read into a private state folder (the system's lists stay as they are).
    mkdir -p "$work/lists/partial" "$work/archives/partial"
    apt=(-o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o APT::Sandbox::User=root)
    if ! apt-get -qq "${apt[@]}" update >>"$work/log" 2>&1 \
        || ! (cd "$work" && apt-get -qq "${apt[@]}" download libb64-0d >>"$work/log" 2>&1); then
        echo "could not download Debian's libb64-0d ($(tail -n1 "$work/log"))"; return 1
    fi
    dpkg-deb -x "$work"/libb64-0d_*.deb "$work/deb"
    rm -rf "$PA.partial" && mkdir -p "$PA.partial/bin" "$PA.partial/lib"
    cp -P "$work"/deb/usr/lib/*/libb64.so.0d* "$PA.partial/lib/"
    .venv-triton/bin/python - "$work" "$PA.partial" <<'PY'
import glob, os, sys, zipfile
work, dest = sys.argv[1:]
for pattern, member, target in (("tritonclient-2.51.0-*.whl", "tritonclient-2.51.0.data/data/bin/perf_analyzer", "bin/perf_analyzer"),
                                 ("nvidia_cuda_runtime_cu12-*.whl", "nvidia/cuda_runtime/lib/libcudart.so.12", "lib/libcudart.so.12")):
    with zipfile.ZipFile(glob.glob(os.path.join(work, pattern))[0]) as z, open(os.path.join(dest, target), "wb") as f:
        f.write(z.read(member))
os.chmod(os.path.join(dest, "bin/perf_analyzer"), 0o755)
PY
    rm -rf "$PA" && mv "$PA.partial" "$PA"
)
pa_runs() { LD_LIBRARY_PATH="$PWD/$PA/lib" "$PA/bin/perf_analyzer" --version >/dev/null 2>&1; }
if ! pa_runs; then
    if ! why=$(fetch_perf_analyzer) || ! pa_runs; then
        echo "setup_triton_env: perf_analyzer not installed (${why:-it does not run here}); \`loadtest --perf-analyzer\` will say so" >&2
    fi
fi
echo ".venv-triton ready: $(.venv-triton/bin/python -c 'import importlib.metadata as m; print(*(f"{p} {m.version(p)}" for p in ("nvidia-pytriton", "tritonclient", "onnxruntime", "numpy", "torch")), sep=", ")')$(pa_runs && echo ", perf_analyzer 2.51.0")"
