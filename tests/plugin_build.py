"""One CMake build of plugins/ per configuration for every test module and run:
msar_export.kernels.CMakeBuild keys its folder by a hash of the sources, so an
unchanged tree is configured and compiled once and later asks are ninja no-ops."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

from msar_export import kernels as K

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"


def trt_headers() -> str | None:
    inc = os.environ.get("TENSORRT_INCLUDE_DIR")
    return inc if inc and (Path(inc) / "NvInferRuntime.h").is_file() else None


@functools.lru_cache(maxsize=None)
def cmake_build(with_tensorrt: bool = False) -> K.CMakeBuild:
    reason = K.tools_unavailable()
    if reason:
        pytest.skip(f"cannot build plugins/ through CMake: {reason}")
    # MSAR_CUDA=OFF: these targets are host code, and skipping nvcc's detection saves seconds of every
    # cold configure (the kernels' CUDA compile is compile_check.sh's, in its own folder).
    return K.CMakeBuild(PLUGINS, tensorrt_include=trt_headers() if with_tensorrt else None,
                        defines={"MSAR_CUDA": "OFF"})


def built(target: str, with_tensorrt: bool = False) -> Path:
    """`target` built, or the test skipped with the configure step's reason when this machine cannot make it."""
    build = cmake_build(with_tensorrt)
    if not build.has_target(target):
        pytest.skip(f"{target} is not built here: {build.configure()}")
    return build.built(target)


@functools.lru_cache(maxsize=None)
def emulation() -> K.KernelLibrary:
    return K.KernelLibrary(built("msar_emulation"))


def run_cpp_test(target: str, with_tensorrt: bool = False, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(built(target, with_tensorrt))], capture_output=True, text=True, timeout=timeout)
