"""Building the native msar kernels for ONNX Runtime (plugins/msarOrtOps, CMake target
msar_ort_ops) and installing the library where the runner looks for it: beside
runners/ort_runner.py (`ort_runner.NATIVE_LIBRARY`).

    python -m msar_export.kernels.ort_ops --sources plugins --headers DIR   # scripts/setup_env.sh

Prints one line: where the library went, or why it could not be built (exit 1); without
it ONNX Runtime runs the msar function bodies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from ..fileio import atomic_write_text
from . import cmake

TARGET = "msar_ort_ops"


def build_library(sources=None, headers=None, defines: dict | None = None) -> Path:
    """The built library (cached CMake build folder; a no-op when up to date).  `defines`: more
    CMake cache entries (a sanitizer's flags), which key a build folder of their own."""
    build = cmake.CMakeBuild(sources, defines={"ONNXRUNTIME_INCLUDE_DIR": str(headers or ""), "MSAR_CUDA": "OFF",
                                               **(defines or {})})
    if not build.has_target(TARGET):
        raise cmake.BuildError(f"CMake skipped {TARGET}: {build.configure()}")
    return build.built(TARGET)


def install_path() -> Path:
    from ..runners import ort_runner

    return Path(ort_runner.__file__).with_name(ort_runner.NATIVE_LIBRARY)


def stamp_path() -> Path:
    return install_path().with_name(install_path().name + ".sources")


def install(library: Path, sources: Path | None = None) -> Path:
    """Copy `library` beside the runner, atomically (a running process keeps its mapping), with the
    digest of the sources it was built from beside it."""
    dest = install_path()
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.copyfile(library, tmp)
    os.replace(tmp, dest)
    if sources is not None:
        atomic_write_text(stamp_path(), cmake.sources_digest(sources) + "\n")
    return dest


def uninstall() -> None:
    """A failed build leaves no library behind: an older one would run code the sources no longer hold."""
    for f in (install_path(), stamp_path()):
        f.unlink(missing_ok=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sources", default=None, help=f"the plugins/ folder (default: ${cmake.SOURCES_ENV})")
    p.add_argument("--headers", required=True, help="folder with onnxruntime_c_api.h")
    a = p.parse_args(argv)
    why = cmake.tools_unavailable()
    if why is None:
        try:
            sources = cmake.plugin_sources(a.sources)
            print(f"native msar kernels for ONNX Runtime: {install(build_library(sources, a.headers), sources)}")
            return 0
        except (cmake.BuildError, OSError) as e:
            why = str(e).strip().splitlines()[0]
    uninstall()
    print(f"native msar kernels not built ({why}); ONNX Runtime will run the msar function bodies", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
