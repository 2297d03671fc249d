#!/usr/bin/env bash
# Print the folder holding ONNX Runtime's C/C++ API headers (onnxruntime_c_api.h), fetching them
# once into a cache outside the repository.  No PyPI wheel ships them and Debian 12 has no
# onnxruntime package; Debian 13 (trixie) has libonnxruntime-dev 1.21 (API 21), which is
# downloaded and unpacked with Debian's own tools (a private source list and state folder: the
# system's apt configuration is not touched).  A library built against API 21 loads in every
# newer ONNX Runtime.  Exit 1 with one line on stderr when that is impossible here.
#   ONNXRUNTIME_INCLUDE_DIR=DIR    use these headers instead (nothing is fetched)
set -euo pipefail
if [ -n "${ONNXRUNTIME_INCLUDE_DIR:-}" ]; then
    if [ -f "$ONNXRUNTIME_INCLUDE_DIR/onnxruntime_c_api.h" ]; then echo "$ONNXRUNTIME_INCLUDE_DIR"; exit 0; fi
    echo "fetch_ort_headers: ONNXRUNTIME_INCLUDE_DIR=$ONNXRUNTIME_INCLUDE_DIR has no onnxruntime_c_api.h" >&2
    exit 1
fi
version=1.21.0+dfsg-1
cache="${XDG_CACHE_HOME:-$HOME/.cache}/msar-export/onnxruntime-headers-${version}"
include="$cache/usr/include/onnxruntime"
if [ -f "$include/onnxruntime_c_api.h" ]; then echo "$include"; exit 0; fi
for tool in apt-get dpkg-deb; do
    if ! command -v "$tool" >/dev/null; then
        echo "fetch_ort_headers: $tool not found (a Debian-based system is needed to fetch the headers; or set ONNXRUNTIME_INCLUDE_DIR)" >&2
        exit 1
    fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
echo "deb [signed-by=$keyring] http://deb.debian.org/debian trixie main" >"$work/sources.list"
apt=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -o APT::Sandbox::User=root)
if ! apt-get -qq "${apt[@]}" update >"$work/log" 2>&1 \
    || ! (cd "$work" && apt-get -qq "${apt[@]}" download "libonnxruntime-dev=$version" >>"$work/log" 2>&1); then
    echo "fetch_ort_headers: could not download libonnxruntime-dev $version from Debian trixie ($(tail -n1 "$work/log"))" >&2
    exit 1
fi
mkdir -p "$cache.partial"
dpkg-deb -x "$work"/libonnxruntime-dev_*.deb "$cache.partial"
rm -rf "$cache" && mv "$cache.partial" "$cache"
echo "$include"
