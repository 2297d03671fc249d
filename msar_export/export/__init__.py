from __future__ import annotations

import importlib

__all__ = ["ExportOptions", "ExportReport", "export_checkpoint", "export_model"]
# Imported on first use: export/handoff.py runs ONNX Runtime validation in a process without torch.
_HOME = {"ExportOptions": ".report", "ExportReport": ".report", "export_checkpoint": ".exporter",
         "export_model": ".exporter"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
