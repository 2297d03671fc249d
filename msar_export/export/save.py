"""Write an exported model with at most one weight serialised at a time.

The file is the model without initializers, then one
`ModelProto{graph{initializer: [t]}}` fragment per weight: protobuf merges
repeated occurrences of a message field, so every reader parses it as one graph
whose initializers come in this order (the file stays deterministic).  Each
fragment's wire bytes are written by hand around the weight's own memory, so no
copy of the weight is made: building a TensorProto, wrapping
it in a ModelProto and serialising it made three more (profiled: +494 MB at the
largest weight of a 318 M-parameter model; a whole-model proto was ~3x the weights).
With external data the same fragments carry a location instead of the bytes,
which go to the data file, 4 KiB-aligned so runtimes can map them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir

from ..fileio import check_output_file, os_errors_as_output_errors, scratch_dir_beside
from ..onnx_wire import GRAPH_INITIALIZER, MODEL_GRAPH, TENSOR_RAW_DATA, field_prefix

TWO_GB = 2 * 1024**3
# Protobuf's 2 GB limit, less room for the graph itself.
EXTERNAL_DATA_ABOVE = TWO_GB - 64 * 1024**2
INLINE_BELOW = 1024  # with external data, smaller tensors stay in the .onnx file
ALIGN = 4096


def _tensor_head(name: str, tensor) -> "onnx.TensorProto":
    import onnx

    return onnx.TensorProto(name=name, dims=list(tensor.shape.numpy()), data_type=int(tensor.dtype))


def _stored_bytes(tensor):
    """The tensor's bytes as ONNX stores them: a view of its memory where the layout
    allows (no copy at all), else tobytes()."""
    if sys.byteorder == "little" and tensor.dtype.bitwidth >= 8:
        arr = tensor.numpy()
        if arr.flags.c_contiguous:
            return memoryview(arr.reshape(-1).view(np.uint8))
    return tensor.tobytes()


def _write_weight(f, name: str, tensor, data_file, data_name: str | None) -> None:
    """One initializer fragment; its bytes inline, or appended to `data_file`."""
    import onnx

    raw = _stored_bytes(tensor)
    head = _tensor_head(name, tensor)
    if data_file is not None and len(raw) >= INLINE_BELOW:
        offset = (data_file.tell() + ALIGN - 1) // ALIGN * ALIGN
        data_file.seek(offset)
        data_file.write(raw)
        head.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
            head.external_data.add(key=key, value=value)
        raw = b""
    head_bytes = head.SerializeToString(deterministic=True)
    data_prefix = field_prefix(TENSOR_RAW_DATA, len(raw)) if raw else b""
    tensor_len = len(head_bytes) + len(data_prefix) + len(raw)
    init_prefix = field_prefix(GRAPH_INITIALIZER, tensor_len)
    f.write(field_prefix(MODEL_GRAPH, len(init_prefix) + tensor_len) + init_prefix + head_bytes + data_prefix)
    f.write(raw)


def _write_streamed(model: ir.Model, path: Path, release: bool, data_name: str | None = None) -> None:
    """Write `model` to `path` (and its weights to `data_name` beside it, if given).
    release: drop each weight from `model` once written (the caller is done with it)."""
    inits = list(model.graph.initializers.values())
    model.graph.initializers.clear()
    try:
        head = ir.serde.serialize_model(model).SerializeToString(deterministic=True)
    finally:
        for v in inits:
            model.graph.initializers[v.name] = v
    data_file = open(path.parent / data_name, "wb") if data_name else None
    try:
        with open(path, "wb") as f:
            f.write(head)
            for v in inits:
                # the value's name: a lifted constant's tensor may still carry its old one
                _write_weight(f, v.name, v.const_value, data_file, data_name)
                if release:
                    v.const_value = None
    finally:
        if data_file is not None:
            data_file.close()


def weight_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def save_model(model: ir.Model, out: Path, release: bool = False, external_data: bool | None = None) -> int:
    """Write atomically; weights to `<out>.data` when external_data (None: when over protobuf's 2 GB).
    release: drop `model`'s weights once written.  Returns the bytes written."""
    external = weight_bytes(model) > EXTERNAL_DATA_ABOVE if external_data is None else external_data
    data_name = out.name + ".data"
    with scratch_dir_beside(out) as tmp, os_errors_as_output_errors(out):
        if external:
            _write_streamed(model, tmp / out.name, release, data_name)
        else:
            _write_streamed(model, tmp / out.name, release)
        check_output_file(out)
        if external:
            check_output_file(out.parent / data_name)
            # Data first: a model file never points at a missing or older data file.
            os.replace(tmp / data_name, out.parent / data_name)
        os.replace(tmp / out.name, out)
    return out.stat().st_size + ((out.parent / data_name).stat().st_size if external else 0)
