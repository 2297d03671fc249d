"""The native msar kernel library for the tests: the installed one (scripts/setup_env.sh puts it
beside the runner), else built here from plugins/ with headers from scripts/fetch_ort_headers.sh.
The tests skip, with the reason, only where neither can be had."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def native_library() -> Path:
    from msar_export.kernels import cmake
    from msar_export.kernels.ort_ops import install_path, stamp_path
    from msar_export.runners.ort_runner import native_library as installed

    lib = installed()
    if lib is not None and lib != install_path():
        return lib  # MSAR_ORT_OPS names a build of its own (test_native_memory.py: a sanitized one)
    if lib is not None:
        # The tests judge the kernels in plugins/, not whatever was installed before they changed.
        stamp = stamp_path().read_text().strip() if stamp_path().is_file() else "none"
        if stamp != cmake.sources_digest(REPO / "plugins"):
            pytest.fail(f"{lib} was not built from plugins/ as it is now (re-run scripts/setup_env.sh)")
        return lib
    return built_library()


def built_library(defines: dict | None = None) -> Path:
    """The library built here from plugins/ (with `defines`, e.g. a sanitizer's flags, in a CMake
    folder of its own), headers from scripts/fetch_ort_headers.sh; skipped with the reason where
    it cannot be built."""
    from msar_export.kernels import cmake
    from msar_export.kernels.ort_ops import build_library

    why = cmake.tools_unavailable()
    if why is None:
        r = subprocess.run([str(REPO / "scripts" / "fetch_ort_headers.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            why = r.stderr.strip()
        else:
            return build_library(REPO / "plugins", r.stdout.strip(), defines=defines)
    pytest.skip(f"native msar kernels cannot be built here: {why}")


@pytest.fixture(scope="session")
def ort_ops_library() -> str:
    return str(native_library())
