"""Open an ONNX file with a specific error for each way it can be unusable, and
find its external-data files without ever leaving the model's folder."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import OnnxModelError
from .onnx_wire import load_without_weights
from .untrusted import contained


def _external_entries(model):
    """(tensor name, {key: value}) for every initializer stored outside the file."""
    import onnx

    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            yield init.name, {e.key: e.value for e in init.external_data}


def external_data_files(model, path: str | os.PathLike) -> dict[str, Path]:
    """{location as written in the model: real path} of each external-data file, checked:
    relative, inside the model's folder after symlinks, a regular file with one link,
    and long enough for every tensor stored in it."""
    path = Path(path)
    files: dict[str, Path] = {}
    need: dict[str, int] = {}
    for name, entry in _external_entries(model):
        loc = entry.get("location", "")
        if loc not in files:
            files[loc] = contained(path.parent, loc, f"{path}: external data file", OnnxModelError)
        try:
            offset, length = int(entry.get("offset", 0)), int(entry.get("length", 0))
        except ValueError:
            raise OnnxModelError(f"{path}: external data of '{name}' has a non-integer offset or length") from None
        if offset < 0 or length < 0:
            raise OnnxModelError(f"{path}: external data of '{name}' has a negative offset or length")
        need[loc] = max(need.get(loc, 0), offset + length)
    for loc, real in files.items():
        if real.stat().st_size < need[loc]:
            raise OnnxModelError(f"{path}: external data file {loc!r} is truncated")
    return files


def inspect_onnx(path: str | os.PathLike, weights: bool = True):
    """Return the ModelProto (without external data) or raise OnnxModelError.

    weights=False: large in-file weights are not read (see `load_without_weights`)."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(path)
    if not path.exists():
        raise OnnxModelError(f"{path}: no such file")
    if path.is_dir():
        raise OnnxModelError(f"{path}: is a directory, expected an .onnx file")
    if not path.is_file():
        raise OnnxModelError(f"{path}: not a regular file, expected an .onnx file")
    if path.stat().st_size == 0:
        raise OnnxModelError(f"{path}: file is empty")
    try:
        model = onnx.load(str(path), load_external_data=False) if weights else load_without_weights(path)
    except (DecodeError, ValueError, RuntimeError, EOFError) as e:
        raise OnnxModelError(f"{path}: not an ONNX model or truncated (protobuf parse failed: {str(e)[:120]})") from None
    if not model.graph.node or not model.graph.output:
        raise OnnxModelError(f"{path}: not an ONNX model or truncated (no graph nodes or outputs)")
    external_data_files(model, path)
    return model
