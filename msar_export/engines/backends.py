"""The TensorRT builds an engine can come from: one `Backend` value each, made here
once and handed on (to the builder, the loader chain, the runner, the metadata).

- `tensorrt`: NVIDIA TensorRT (`import tensorrt`, wheels `tensorrt` / `tensorrt_libs`).
- `tensorrt-rtx`: TensorRT for RTX (`import tensorrt_rtx`, wheel `tensorrt-rtx`, the
  `.[rtx]` extra). Its builder runs without a GPU ("CPU-only AOT"): engines are
  built and inspected on any machine, and run only on an RTX-class GPU whose
  compute capability the engine was built for.

Both expose TensorRT's Python API, so msar_export.engines.loaders drives them with
the same code. Adding a backend is one more `Backend` in `BACKENDS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..errors import BackendUnavailable, InputError


@dataclass(frozen=True)
class Backend:
    name: str  # the --backend value, and what engine metadata records
    module: str  # the Python module it is imported as
    label: str  # how messages name it
    install: str  # what to do when it does not import
    # GPUs (trt.ComputeCapability names) its engines can target, chosen at build time
    # (--compute-capability); empty: the engine runs on the kind of GPU it was built on.
    targets: tuple[str, ...] = ()
    polygraphy_rtx: bool = False  # Polygraphy's POLYGRAPHY_USE_TENSORRT_RTX selects this module

    def load(self):
        """The backend's Python module, or BackendUnavailable saying how to install it.
        Not cached: importlib already is, and tests stand fakes in for the module."""
        try:
            return importlib.import_module(self.module)
        except Exception as e:  # ImportError, or OSError from a broken install's libraries
            raise BackendUnavailable(f"{self.label} is not installed (import {self.module} failed: {e}); "
                                     f"{self.install}") from None

    def unavailable(self) -> str | None:
        """None when the backend imports, else why not (one line)."""
        try:
            importlib.import_module(self.module)
        except Exception as e:
            return f"import {self.module} failed: {type(e).__name__}: {e}"
        return None


TENSORRT = Backend("tensorrt", "tensorrt", "TensorRT",
                   "build engines on a machine with TensorRT, or use --backend tensorrt-rtx "
                   "(pip install -e '.[rtx]': its builder needs no GPU)")
TENSORRT_RTX = Backend("tensorrt-rtx", "tensorrt_rtx", "TensorRT-RTX",
                       "pip install -e '.[rtx]' (tensorrt-rtx==1.7.1.116)",
                       targets=("SM75", "SM80", "SM86", "SM89", "SM120", "SM121"), polygraphy_rtx=True)
BACKENDS = {b.name: b for b in (TENSORRT, TENSORRT_RTX)}


def get_backend(name: str | Backend) -> Backend:
    """The Backend of a --backend value (a Backend is returned as it is)."""
    if isinstance(name, Backend):
        return name
    try:
        return BACKENDS[name]
    except (KeyError, TypeError):
        raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}") from None


def installed_backends() -> list[Backend]:
    return [b for b in BACKENDS.values() if b.unavailable() is None]
