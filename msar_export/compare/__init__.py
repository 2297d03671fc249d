"""Numerical parity checks: eager PyTorch vs ONNX Runtime vs TensorRT, layer by layer.

`check_parity(checkpoint, onnx, ...)` returns a `ParityResult`; `msar-export check`
is the command line over it.  Heavy modules (torch, polygraphy) load on first use.
"""

from __future__ import annotations

from .tolerances import Tolerance

__all__ = ["Tolerance", "check_parity", "CheckOptions", "ParityResult", "BackendResult", "LayerResult", "write_report",
           "print_report", "console_for"]


def __getattr__(name):
    if name in ("check_parity", "CheckOptions"):
        from . import parity

        return getattr(parity, name)
    if name in ("ParityResult", "BackendResult", "LayerResult"):
        from . import result

        return getattr(result, name)
    if name in ("write_report", "print_report", "console_for"):
        from . import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
