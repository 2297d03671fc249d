"""Open an ONNX file with a specific error for each way it can be unusable."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import OnnxModelError


def inspect_onnx(path: str | os.PathLike):
    """Return the ModelProto (without external data) or raise OnnxModelError."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.exists():
        raise OnnxModelError(f"{path}: no such file")
    if not path.is_file():
        raise OnnxModelError(f"{path}: is a directory, expected an .onnx file")
    if path.stat().st_size == 0:
        raise OnnxModelError(f"{path}: file is empty")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as e:
        raise OnnxModelError(f"{path}: not an ONNX model or truncated (protobuf parse failed: {str(e)[:120]})") from None
    if not model.graph.node or not model.graph.output:
        raise OnnxModelError(f"{path}: not an ONNX model or truncated (no graph nodes or outputs)")
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            loc = next((e.value for e in init.external_data if e.key == "location"), "")
            data = path.parent / loc
            if not data.is_file():
                raise OnnxModelError(f"{path}: external data file {loc!r} is missing; keep it next to the model")
            size = next((int(e.value) for e in init.external_data if e.key == "length"), 0)
            offset = next((int(e.value) for e in init.external_data if e.key == "offset"), 0)
            if data.stat().st_size < offset + size:
                raise OnnxModelError(f"{path}: external data file {loc!r} is truncated")
    return model
