"""Can an engine run here? The CUDA devices (through the driver API, no toolkit needed)
against what a backend's engines run on."""

from __future__ import annotations

import ctypes

from .backends import Backend
from .targets import cc_text


def cuda_devices() -> tuple[list[tuple[int, int]], str]:
    """Compute capabilities of the CUDA devices here (through the driver API), and
    why there are none (empty when there are)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return [], "no NVIDIA driver (libcuda.so.1 not found)"
    if cuda.cuInit(0) != 0:
        return [], "the NVIDIA driver found no usable GPU (cuInit failed)"
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return [], "no CUDA device"
    caps = []
    for i in range(count.value):
        dev, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        cuda.cuDeviceGet(ctypes.byref(dev), i)
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
        caps.append((major.value, minor.value))
    return caps, ""


def cannot_run_reason(backend: Backend, compute_capabilities: list[str] | None = None) -> str | None:
    """None when an engine of this backend (built for these targets) can run on GPU 0 here, else why not."""
    caps, why = cuda_devices()
    if not caps:
        return why
    major, minor = caps[0]
    if backend.targets:
        name = f"SM{major}{minor}"
        if name not in backend.targets:
            return (f"GPU 0 has compute capability {major}.{minor}; {backend.label} engines run on compute capability "
                    f"{'/'.join(cc_text(n) for n in backend.targets)}")
        if compute_capabilities and name not in compute_capabilities:
            return (f"the engine was built for {', '.join(cc_text(n) for n in compute_capabilities)}, GPU 0 is "
                    f"{major}.{minor}")
    return None
