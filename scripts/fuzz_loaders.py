#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris) of the untrusted-input loaders (and, issue 22, of every
numeric CLI option's converter, `--profile`, and the serving front's infer-body check with
duplicate keys): config.json
text, model.safetensors bytes, the `msar.config` metadata of an ONNX file, and an
ONNX file's external-data table (location, offset, length).  The only acceptable
outcomes are a loaded model or an `MsarError` (one-line user error); any other
exception is a bug, and so is an accepted external-data path outside the model's
folder.

    .venv/bin/pip install atheris
    .venv/bin/python scripts/fuzz_loaders.py -max_total_time=60
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from msar_export.checkpoint import load_checkpoint
    from msar_export.config import MSARConfig
    from msar_export.errors import MsarError
    from msar_export.graph_file import ExportedGraph
    from msar_export.untrusted import contained
    from msar_export.engines.profiles import MAX_DIM, parse_profile
    from msar_export.numbers import Kind
    from msar_export.serving.triton.front_rules import Refused, check_http_infer

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GOOD_CONFIG = MSARConfig(vocab_size=11, d_model=8, n_blocks=1, n_heads=2, n_kv_heads=1, mlp_hidden=8,
                         max_seq_len=16, stream_kernels=(1, 2)).to_json()
WORK = Path(tempfile.mkdtemp(prefix="msar-fuzz-"))
(WORK / "model").mkdir()
(WORK / "model" / "w.data").write_bytes(b"\0" * 64)  # a real data file for the fuzzer to find
(WORK / "outside.data").write_bytes(b"\0" * 64)      # and one outside the model's folder, never to be accepted


def onnx_with(metadata: str, entries: list[tuple[str, str]]) -> Path:
    """A one-node ONNX file whose W has `entries` as its external-data table."""
    w = numpy_helper.from_array(np.zeros(4, np.float32), "W")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in entries:
        e = w.external_data.add()
        e.key, e.value = k, v
    graph = helper.make_graph([helper.make_node("Add", ["X", "W"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])], [w])
    model = helper.make_model(graph)
    helper.set_model_props(model, {"msar.config": metadata})
    path = WORK / "model" / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def onnx_input(fdp) -> None:
    meta = fdp.ConsumeUnicodeNoSurrogates(512)
    entries = [(fdp.PickValueInList(["location", "offset", "length", "checksum"]), fdp.ConsumeUnicodeNoSurrogates(64))
               for _ in range(fdp.ConsumeIntInRange(0, 4))]
    path = onnx_with(meta, entries)
    for text, what in ((meta, "msar.config metadata"),):
        try:
            MSARConfig.from_json(text, what)
        except MsarError as e:
            if "\n" in str(e):
                raise AssertionError(f"multi-line user error: {e!r}") from None
    try:
        ExportedGraph.open(path, weights=True)
    except MsarError as e:
        if "\n" in str(e):
            raise AssertionError(f"multi-line user error: {e!r}") from None
        return
    for k, v in entries:  # accepted: every location must be inside the model's folder
        if k == "location":
            contained(path.parent, v, "fuzz")


def _numeric_kinds() -> list:
    import argparse

    from msar_export.cli import build_parser

    out, stack = [], [build_parser()]
    while stack:
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif isinstance(action.type, Kind):
                out.append((action.option_strings[-1], action.type))
    return out


KINDS = _numeric_kinds()


def numeric_input(fdp) -> None:
    """Every numeric CLI option's converter: a value inside its bounds, or one argparse line."""
    option, kind = fdp.PickValueInList(KINDS)
    text = fdp.ConsumeUnicodeNoSurrogates(48)
    try:
        value = kind(text)
    except argparse.ArgumentTypeError as e:
        if "\n" in str(e):
            raise AssertionError(f"{option}: multi-line error {e!r}") from None
    else:
        if not (kind.lo <= value <= kind.upper) or value != value or isinstance(value, bool):
            raise AssertionError(f"{option} accepted {text!r} as {value!r}, outside [{kind.lo}, {kind.upper}]")
    try:
        ranges = parse_profile(fdp.ConsumeUnicodeNoSurrogates(64))
    except MsarError as e:
        if "\n" in str(e):
            raise AssertionError(f"--profile: multi-line error {e!r}") from None
    else:
        for name, r in ranges.items():
            if r.max > MAX_DIM or (name != "past" and r.min < 1):
                raise AssertionError(f"--profile accepted {name}={r}")


GOOD_REQUEST = {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}]}


def request_input(fdp) -> None:
    """Infer bodies: arbitrary text, and a good body with one key repeated (fuzzed value first)."""
    body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 512))
    try:
        check_http_infer(body, None, 1 << 12)
    except Refused as e:
        if "\n" in str(e):
            raise AssertionError(f"multi-line refusal {e!r}") from None
    else:  # accepted: no key may be read differently by a first-wins parser (Triton)
        firsts = json.loads(body, object_pairs_hook=lambda kv: dict(reversed(kv)))
        if firsts != json.loads(body):
            raise AssertionError(f"accepted a body with a duplicate key: {body!r}")
    key = fdp.PickValueInList(["shape", "data", "datatype", "name", "inputs", "parameters"])
    value = json.dumps(fdp.PickValueInList([[1, 10**12], [2**32 + 5], "INT32", "x", [], {}, None]))
    text = json.dumps(GOOD_REQUEST)
    where = '"' + key + '": '
    if where in text:
        dup = text.replace(where, f"{where}{value}, {where}", 1).encode()
        try:
            check_http_infer(dup, None, 1 << 12)
        except Refused:
            return
        raise AssertionError(f"duplicate key {key!r} accepted: {dup!r}")


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 4)
    if which == 2:
        return onnx_input(fdp)
    if which == 3:
        return numeric_input(fdp)
    if which == 4:
        return request_input(fdp)
    ckpt = WORK / "ckpt"
    ckpt.mkdir(exist_ok=True)
    if which == 0:  # arbitrary config text, valid-looking weights file absent or garbage
        (ckpt / "config.json").write_text(fdp.ConsumeUnicodeNoSurrogates(4096), encoding="utf-8")
        (ckpt / "model.safetensors").write_bytes(fdp.ConsumeBytes(256))
    else:  # a valid config, arbitrary safetensors bytes (header length, JSON header, data)
        (ckpt / "config.json").write_text(GOOD_CONFIG)
        (ckpt / "model.safetensors").write_bytes(fdp.ConsumeBytes(fdp.remaining_bytes()))
    try:
        load_checkpoint(ckpt)
    except MsarError as e:
        if "\n" in str(e):
            raise AssertionError(f"multi-line user error: {e!r}") from None


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
