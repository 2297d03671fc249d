"""Read an .onnx file's structure without its weights, one protobuf field at a time.

Checking a 1.3 GB single-file model with `onnx.checker` / shape inference, or
parsing it before ONNX Runtime does, cost 2-4x its size (the file's bytes, the
parsed proto, the C++ copy).  None of them needs the weights: each initializer
whose raw data is large is kept with its name, type and shape and points, as
external data, at its own bytes inside the file itself - a valid reference that
readers follow only when asked to load external data.
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_GRAPH, GRAPH_INITIALIZER, TENSOR_RAW_DATA = 7, 5, 9
LEAVE_OUT_ABOVE = 1024  # bytes of raw data; smaller tensors (shapes, scalars) are read


def _varint(f) -> int:
    shift = result = 0
    while True:
        b = f.read(1)
        if not b:
            raise EOFError("truncated varint")
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise ValueError("malformed varint")


def _encode(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read(f, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError("truncated field")
    return data


def _fields(f, end: int):
    """(field number, wire type, payload bytes or None for a length-delimited field
    left unread at f.tell(), length) up to offset `end`."""
    while f.tell() < end:
        key = _varint(f)
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, wire, _encode(_varint(f)), 0
        elif wire == 1:
            yield number, wire, _read(f, 8), 0
        elif wire == 5:
            yield number, wire, _read(f, 4), 0
        elif wire == 2:
            n = _varint(f)
            if f.tell() + n > end:
                raise EOFError("a field runs past its message")
            yield number, wire, None, n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _key(number: int, wire: int) -> bytes:
    return _encode(number << 3 | wire)


def field_prefix(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited field."""
    return _key(number, 2) + _encode(length)


def _copy(f, number, wire, payload, n) -> bytes:
    if wire != 2:
        return _key(number, wire) + payload
    return field_prefix(number, n) + _read(f, n)


def _tensor(f, n: int, location: str):
    """An initializer's bytes, its large raw data replaced by a reference to where it lies."""
    import onnx

    out, raw = [], None
    end = f.tell() + n
    for number, wire, payload, length in _fields(f, end):
        if number == TENSOR_RAW_DATA and wire == 2 and length > LEAVE_OUT_ABOVE:
            raw = (f.tell(), length)
            f.seek(length, os.SEEK_CUR)
        else:
            out.append(_copy(f, number, wire, payload, length))
    if raw is None:
        return b"".join(out)
    t = onnx.TensorProto()
    t.ParseFromString(b"".join(out))
    t.data_location = onnx.TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1]))):
        t.external_data.add(key=key, value=value)
    return t.SerializeToString()


def _graph(f, n: int, location: str) -> bytes:
    out = []
    for number, wire, payload, length in _fields(f, f.tell() + n):
        if number == GRAPH_INITIALIZER and wire == 2:
            t = _tensor(f, length, location)
            out.append(field_prefix(number, len(t)) + t)
        else:
            out.append(_copy(f, number, wire, payload, length))
    return b"".join(out)


def load_without_weights(path: str | os.PathLike):
    """The ModelProto at `path`, large in-file weights left out (see the module doc)."""
    import onnx

    path = Path(path)
    parts = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for number, wire, payload, length in _fields(f, size):
            if number == MODEL_GRAPH and wire == 2:
                g = _graph(f, length, path.name)
                parts.append(field_prefix(number, len(g)) + g)
            else:
                parts.append(_copy(f, number, wire, payload, length))
        if f.tell() != size:
            raise EOFError("a field runs past the end of the file")
    model = onnx.ModelProto()
    model.ParseFromString(b"".join(parts))
    return model
