"""msar-export: reference model, ONNX export, TensorRT build and parity checks
for Multi-Stream Attention Residual language models."""

from __future__ import annotations

import importlib

__version__ = "0.1.0"
__all__ = ["MSARConfig", "MSARLM", "MsarError", "generate", "load_checkpoint", "save_checkpoint"]
# Imported on first use (PEP 562): `import msar_export` must not import torch, so
# the process that validates a large export with ONNX Runtime stays light
# (export/handoff.py; torch alone is ~180 MiB of RSS).
_HOME = {"MSARConfig": ".config", "MSARLM": ".model", "MsarError": ".errors", "generate": ".model",
         "load_checkpoint": ".checkpoint", "save_checkpoint": ".checkpoint"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
