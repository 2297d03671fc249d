"""The two TensorRT builds an engine can come from, and what each needs here.

- `tensorrt`: NVIDIA TensorRT (`import tensorrt`, wheels `tensorrt` / `tensorrt_libs`).
- `tensorrt-rtx`: TensorRT for RTX (`import tensorrt_rtx`, wheel `tensorrt-rtx`, the
  `.[rtx]` extra). Its builder runs without a GPU ("CPU-only AOT"): engines are
  built and inspected on any machine, and run only on an RTX-class GPU whose
  compute capability the engine was built for.

Both expose TensorRT's Python API, so msar_export.engines.loaders drives them with
the same code; this module imports them, names what cannot run here, and works
around the one packaging gap found so far (`prepare_rtx_parser`).
"""

from __future__ import annotations

import ctypes
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import BackendUnavailable, EngineError, InputError


@dataclass(frozen=True)
class Backend:
    name: str  # the --backend value
    module: str  # what to import
    install: str  # how to get it

    @property
    def label(self) -> str:
        return "TensorRT-RTX" if self.name == "tensorrt-rtx" else "TensorRT"


BACKENDS = {
    "tensorrt": Backend("tensorrt", "tensorrt", "pip install tensorrt (and a GPU machine to run the engines)"),
    "tensorrt-rtx": Backend("tensorrt-rtx", "tensorrt_rtx", "pip install -e '.[rtx]' (tensorrt-rtx==1.7.1.116)"),
}

#: Compute capabilities TensorRT-RTX 1.7 can target (trt.ComputeCapability.SM*).
RTX_RUNTIME_NOTE = "TensorRT-RTX engines run on RTX-class GPUs (compute capability 7.5/8.0/8.6/8.9/12.x)"


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}") from None


def import_backend(name: str):
    """The backend's Python module, or BackendUnavailable saying how to install it."""
    b = get_backend(name)
    try:
        return importlib.import_module(b.module)
    except Exception as e:  # ImportError, or OSError from a broken install's libraries
        raise BackendUnavailable(f"{b.label} is not installed (import {b.module} failed: {e}); "
                                 f"{b.install}") from None


def backend_unavailable(name: str) -> str | None:
    """None when the backend imports, else why not (one line)."""
    b = get_backend(name)
    try:
        importlib.import_module(b.module)
    except Exception as e:
        return f"import {b.module} failed: {type(e).__name__}: {e}"
    return None


def installed_backends() -> list[str]:
    return [n for n in BACKENDS if backend_unavailable(n) is None]


def module_backend(trt) -> str:
    """'tensorrt-rtx' for the tensorrt_rtx module, else 'tensorrt'."""
    return "tensorrt-rtx" if getattr(trt, "__name__", "").startswith("tensorrt_rtx") else "tensorrt"


# -- compute capabilities (TensorRT-RTX) -------------------------------------------

def parse_compute_capabilities(specs) -> list[str]:
    """["8.6", "12.0"] or "8.6,12.0" or "86" -> ["SM86", "SM120"] (names of trt.ComputeCapability)."""
    if not specs:
        return []
    if isinstance(specs, str):
        specs = [specs]
    out = []
    for spec in specs:
        for item in filter(None, (s.strip() for s in str(spec).split(","))):
            major, dot, minor = item.partition(".")
            if not dot and item.isdigit() and len(item) >= 2:
                major, minor = item[:-1], item[-1]
            if not (major.isdigit() and minor.isdigit()):
                raise InputError(f"--compute-capability: bad value {item!r}; use MAJOR.MINOR, e.g. 8.6 or 12.0")
            name = f"SM{int(major)}{int(minor)}"
            if name not in out:
                out.append(name)
    return out


def check_compute_capabilities(trt, names: list[str]) -> None:
    """InputError unless every name is a target of this TensorRT-RTX (before any slow step)."""
    if not names:
        return
    cc = getattr(trt, "ComputeCapability", None)
    if cc is None:
        raise InputError("--compute-capability is a TensorRT-RTX option; use --backend tensorrt-rtx")
    known = [n for n in cc.__members__ if n.startswith("SM")]
    bad = [n for n in names if n not in known]
    if bad:
        raise InputError(f"--compute-capability: {', '.join(_cc(n) for n in bad)} is not a target of this "
                         f"TensorRT-RTX; it supports {', '.join(_cc(n) for n in known)}")


def apply_compute_capabilities(trt, config, names: list[str]) -> None:
    if not names:
        return
    check_compute_capabilities(trt, names)
    cc = trt.ComputeCapability
    config.num_compute_capabilities = len(names)
    for i, n in enumerate(names):
        config.set_compute_capability(getattr(cc, n), i)


def _cc(name: str) -> str:
    digits = name[2:]
    return f"{digits[:-1]}.{digits[-1]}"


# -- the TensorRT-RTX ONNX parser and its runtime library ----------------------------

RTX_RUNTIME = "libtensorrt_rtx.so"


def prepare_rtx_parser(trt, say=None) -> Path | None:
    """Make `libtensorrt_rtx.so` loadable by the TensorRT-RTX ONNX parser.

    The parser (libtensorrt_onnxparser_rtx.so.1) dlopens the runtime by its
    unversioned name `libtensorrt_rtx.so` to look up `getPrivateApi_INTERNAL`
    the first time it creates a plugin layer; the wheel ships only
    `libtensorrt_rtx.so.1`, the dlopen fails, the parser throws from a path that
    cannot throw, and the process dies with "terminate called without an active
    exception" (docs/tensorrt.md section 6). The parser searches its own folder
    first (RPATH $ORIGIN), so a symlink there named `libtensorrt_rtx.so` is
    enough. It is made atomically; returns its path (None: nothing to do).
    """
    if module_backend(trt) != "tensorrt-rtx":
        return None
    try:
        libs = importlib.import_module("tensorrt_rtx_libs")
        folder = Path(libs.__file__).resolve().parent
    except Exception:
        return None  # not the pip layout (a tarball install has the unversioned name)
    if not (folder / "libtensorrt_onnxparser_rtx.so.1").is_file():
        return None
    link = folder / RTX_RUNTIME
    if link.exists():
        return link
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory and (Path(directory) / RTX_RUNTIME).exists():
            return Path(directory) / RTX_RUNTIME
    target = folder / f"{RTX_RUNTIME}.1"
    tmp = folder / f".{RTX_RUNTIME}.{os.getpid()}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target.name)
        os.replace(tmp, link)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"the TensorRT-RTX ONNX parser needs {link} (it dlopens that name for plugin layers and "
                          f"aborts the process without it) and it cannot be created ({e}); run "
                          f"`ln -s {target.name} {link}`") from None
    if say is not None:
        say(f"created {link} -> {target.name} (the TensorRT-RTX parser loads that name for plugin layers)")
    return link


# -- can an engine run here? -----------------------------------------------------------

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


def cannot_run_reason(backend: str, compute_capabilities: list[str] | None = None) -> str | None:
    """None when an engine of this backend (built for these targets) can run on GPU 0 here, else why not."""
    caps, why = cuda_devices()
    if not caps:
        return why
    major, minor = caps[0]
    if backend == "tensorrt-rtx":
        name = f"SM{major}{minor}"
        rtx_targets = ("SM75", "SM80", "SM86", "SM89", "SM120", "SM121")
        if name not in rtx_targets:
            return f"GPU 0 has compute capability {major}.{minor}; {RTX_RUNTIME_NOTE}"
        if compute_capabilities and name not in compute_capabilities:
            return (f"the engine was built for {', '.join(_cc(n) for n in compute_capabilities)}, GPU 0 is "
                    f"{major}.{minor}")
    return None
