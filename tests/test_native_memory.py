"""The native ONNX Runtime kernels (plugins/msarOrtOps) under AddressSanitizer: their own tests,
every shape in turn in one process, with a build of the library that checks each write.

A write past a buffer corrupts the heap without failing the test that made it; the process then
crashes later, in whatever frees or collects next.  Stop 39's CI run died that way: a segfault
in the garbage collector during an export in test_rtx, after the width sweep's tiny run had
written past StreamGate's per-thread row buffer in the same worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ort_ops_fixtures import built_library

REPO = Path(__file__).resolve().parent.parent
SANITIZED = {"CMAKE_CXX_FLAGS": "-fsanitize=address -fno-omit-frame-pointer",
             "CMAKE_SHARED_LINKER_FLAGS": "-fsanitize=address"}
# What the kernel tests run: every op's float64 comparisons, odd shapes and bad input.
MODULES = ["tests/test_ort_kernels.py", "tests/test_ort_scored_kernels.py"]
PLANTED = """#include <vector>
extern "C" float past_the_end(int n) { std::vector<float> v(n); v.data()[n] = 1.F; return v[0]; }
"""


def runtime_libraries() -> list[str]:
    """The sanitizer's runtime and libstdc++, preloaded into Python (whose binary links neither):
    ASan must come first, and must see libstdc++ to intercept C++ exceptions."""
    libs = []
    for name in ("libasan.so", "libstdc++.so"):
        r = subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True)
        path = r.stdout.strip()
        if r.returncode != 0 or not Path(path).is_file():
            pytest.skip(f"g++ has no {name} here: AddressSanitizer cannot be preloaded")
        libs.append(path)
    return libs


@pytest.fixture(scope="module")
def asan_library() -> Path:
    return built_library(SANITIZED)


def sanitized_run(cmd: list[str], logs: Path, env: dict | None = None) -> tuple[int, str]:
    """(exit code, the sanitizer's reports) of `cmd` run with ASan preloaded."""
    logs.mkdir(parents=True, exist_ok=True)
    full = {**os.environ, **(env or {}), "LD_PRELOAD": " ".join(runtime_libraries()),
            "ASAN_OPTIONS": f"detect_leaks=0:log_path={logs / 'asan'}"}
    r = subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=900)
    reports = "".join(f.read_text(errors="replace") for f in sorted(logs.glob("asan*")))
    return r.returncode, reports + (r.stdout[-3000:] if r.returncode else "")


def test_the_kernels_tests_write_nothing_out_of_bounds(asan_library, tmp_path):
    env = {"MSAR_ORT_OPS": str(asan_library), "PYTHONPATH": str(REPO / "tests")}
    rc, reports = sanitized_run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "asan_no_arena",
                                 *MODULES], tmp_path / "logs", env)
    assert rc == 0 and "AddressSanitizer" not in reports, reports[:6000]


def test_control_a_planted_write_past_a_vector_is_reported(tmp_path):
    """Negative control: the same preload and report files catch a library that writes one float
    past a std::vector, loaded into Python as the kernels are."""
    src = tmp_path / "planted.cpp"
    src.write_text(PLANTED)
    lib = tmp_path / "libplanted.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", *SANITIZED["CMAKE_CXX_FLAGS"].split(), str(src), "-o", str(lib)],
                   check=True, capture_output=True)
    rc, reports = sanitized_run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r}).past_the_end(5)"],
                                tmp_path / "logs")
    assert rc != 0 and "heap-buffer-overflow" in reports, reports[:3000]
