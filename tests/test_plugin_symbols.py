"""Issue 23 defect 5: the plugin libraries export the TensorRT entry points and nothing else
(plugins/msarPlugins.map), so another build of the kernels loaded with RTLD_GLOBAL cannot take
over msar::fusedMixerForward<T> or the C ABI. Checked with `nm -D` on a real link (nvcc and the
TensorRT headers needed; skipped with the reason without them)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from plugin_build import PLUGINS, emulation, trt_headers

from msar_export import kernels as K

ENTRY_POINTS = {"getCreators", "setLoggerFinder"}


def exported(lib) -> set[str]:
    """Names of the symbols `lib` defines in its dynamic table (`nm -D --defined-only`)."""
    r = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[-1].split("@")[0] for line in r.stdout.splitlines() if line.strip()}


def test_symbol_check_sees_kernel_symbols():
    """Negative control: a library built without the version script (the emulation, default visibility)
    exports the kernels' C ABI and the msar templates, and the check sees them."""
    names = exported(emulation().path)
    assert "msarFusedMixerForward" in names
    assert any(n.startswith("_ZN4msar") for n in names)
    assert names - ENTRY_POINTS


def test_plugin_library_exports_only_the_tensorrt_entry_points():
    if shutil.which("nvcc") is None or shutil.which("nm") is None:
        pytest.skip("nvcc and nm are needed to link and inspect the plugin library")
    if trt_headers() is None:
        pytest.skip("set TENSORRT_INCLUDE_DIR to the TensorRT include/ folder to link the plugin library")
    build = K.CMakeBuild(PLUGINS, tensorrt_include=trt_headers(), cuda_architectures="90-real")
    lib = build.built("msar_plugins_dynamic")
    assert exported(lib) == ENTRY_POINTS
