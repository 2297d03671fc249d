"""Building plugins/ through its one CMake project (plugins/CMakeLists.txt).

The sources are never looked up relative to this file: an installed package
has no checkout around it. They come from an explicit argument or the
MSAR_PLUGIN_SOURCES environment variable.

Build folders live in a cache outside the source tree (MSAR_BUILD_CACHE,
default ~/.cache/msar-export/cmake), one per hash of the source folder, its sources and the
configure options, so every caller - each test module, each test run - that
asks for the same build reuses it and an unchanged tree costs one ninja no-op.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

SOURCES_ENV = "MSAR_PLUGIN_SOURCES"
CACHE_ENV = "MSAR_BUILD_CACHE"
_SOURCE_SUFFIXES = {".h", ".cuh", ".cu", ".cpp", ".txt", ".map"}


class BuildError(RuntimeError):
    """configure or build failed; the message carries CMake's output."""


def plugin_sources(sources: str | os.PathLike | None = None) -> Path:
    """The plugins/ folder (holding CMakeLists.txt): `sources`, else $MSAR_PLUGIN_SOURCES."""
    where = sources if sources is not None else os.environ.get(SOURCES_ENV)
    if not where:
        raise FileNotFoundError(f"the msar plugin sources are not known: pass sources=PATH or set {SOURCES_ENV} "
                                "to the plugins/ folder of an msar-export checkout")
    path = Path(where).resolve()
    if not (path / "CMakeLists.txt").is_file():
        raise FileNotFoundError(f"{path} is not the msar plugins/ folder (no CMakeLists.txt); check {SOURCES_ENV}")
    return path


def tools_unavailable() -> str | None:
    """Why nothing can be built here (cmake, ninja and a C++ compiler are needed), or None."""
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        return "no C++ compiler (g++ or $CXX) found"
    return None


def _hash_sources(h, sources: Path) -> None:
    for path in sorted(p for p in sources.rglob("*") if p.suffix in _SOURCE_SUFFIXES and p.is_file()):
        h.update(str(path.relative_to(sources)).encode() + b"\0" + path.read_bytes() + b"\0")


def sources_digest(sources: Path) -> str:
    """sha256 of every source file under `sources` (names and bytes, not where the folder is): what
    a library was built from, so one built from other sources can be told apart."""
    h = hashlib.sha256()
    _hash_sources(h, Path(sources))
    return h.hexdigest()


def _tree_hash(sources: Path, options: dict[str, str]) -> str:
    # The folder too: a CMake build folder belongs to one source folder (CMakeCache.txt
    # records it), so two checkouts with equal sources must not share one.
    h = hashlib.sha256(str(sources.resolve()).encode() + b"\0")
    _hash_sources(h, sources)
    for key in sorted(options):
        h.update(f"{key}={options[key]}\0".encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "msar-export" / "cmake"
    return Path(base)


class CMakeBuild:
    """One configured build folder of plugins/ (configure runs once, on first use)."""

    def __init__(self, sources: str | os.PathLike | None = None, tensorrt_include: str | os.PathLike | None = None,
                 cuda_architectures: str | None = None, defines: dict[str, str] | None = None,
                 build_dir: str | os.PathLike | None = None):
        self.sources = plugin_sources(sources)
        self.options = {"CMAKE_BUILD_TYPE": "Release", "MSAR_WERROR": "ON",
                        # an empty value overrides a TENSORRT_INCLUDE_DIR in the environment
                        "TENSORRT_INCLUDE_DIR": str(tensorrt_include or "")}
        if cuda_architectures:
            self.options["CMAKE_CUDA_ARCHITECTURES"] = cuda_architectures
        self.options.update({k: str(v) for k, v in (defines or {}).items()})
        self.dir = Path(build_dir) if build_dir else cache_root() / _tree_hash(self.sources, self.options)

    def _run(self, cmd: list[str], what: str) -> subprocess.CompletedProcess:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"{what} failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}")
        return r

    def configure(self) -> str:
        """Configure if not done yet; returns the msar STATUS lines (what is built and what skipped)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / "msar-configure.log"
        with open(self.dir / ".lock", "w") as lock:  # two processes asking for one folder configure it once
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (self.dir / "build.ninja").is_file():
                defs = [f"-D{k}={v}" for k, v in self.options.items()]
                r = self._run(["cmake", "-S", str(self.sources), "-B", str(self.dir), "-G", "Ninja", *defs],
                              "cmake configure")
                log.write_text(r.stdout)
        return "\n".join(line[3:] for line in log.read_text().splitlines() if line.startswith("-- msar:"))

    def has_target(self, target: str) -> bool:
        self.configure()
        r = subprocess.run(["ninja", "-C", str(self.dir), "-t", "query", target], capture_output=True, text=True)
        return r.returncode == 0

    def build(self, *targets: str) -> Path:
        """Build `targets` (ninja no-op when up to date); returns the build folder."""
        self.configure()
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._run(["cmake", "--build", str(self.dir), "--target", *targets], f"building {', '.join(targets)}")
        return self.dir

    def artifact(self, target: str) -> Path:
        """Where `target`'s library or executable lands once built."""
        names = {"msar_emulation": "tests/libmsar_emulation.so", "msar_kernels": "libmsar_kernels.so",
                 "msar_plugins": "libmsar_plugins.so", "msar_plugins_dynamic": "libmsar_plugins_dynamic.so",
                 "msar_ort_ops": "libmsar_ort_ops.so"}
        return self.dir / names.get(target, f"tests/{target}")

    def built(self, target: str) -> Path:
        self.build(target)
        return self.artifact(target)
