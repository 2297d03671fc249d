"""The commands that rewrite a user's ONNX file (`msar-export onnx sanitize`, `convert-opset`,
`repair`) keep its model fields: metadata_props (msar.config among them, which every later
command reads) and producer, doc_string, model_version, domain."""

from __future__ import annotations

import onnx
import pytest
from hostile_helpers import run_main

from msar_export.errors import OnnxModelError
from msar_export.graph_file import ExportedGraph
from msar_export.interop import model_fields, surgeon

COMMANDS = {"sanitize": [], "convert-opset": ["--opset", "21"], "repair": []}
USER_PROPS = {"user.owner": "team-a", "user.note": "ünïcode, and = signs"}


def fields(model) -> dict:
    return {"metadata_props": {p.key: p.value for p in model.metadata_props},
            **{name: getattr(model, name) for name in model_fields.SCALAR_FIELDS}}


@pytest.fixture(scope="module")
def user_file(faithful, tmp_path_factory):
    """The session's fused graph with a user's metadata, doc string, version, domain and producer."""
    model = onnx.load(faithful[1])
    for key, value in USER_PROPS.items():
        model.metadata_props.add(key=key, value=value)
    model.doc_string, model.model_version, model.domain = "a user's model", 7, "com.example"
    model.producer_name, model.producer_version = "someone", "3.1"
    path = tmp_path_factory.mktemp("rewrites") / "user.onnx"
    onnx.save(model, path)
    return path


def rewrite(command, path, out):
    r = run_main("onnx", command, path, *COMMANDS[command], "-o", out, text=True)
    assert r.returncode == 0, r.stderr
    return onnx.load(out)


@pytest.mark.parametrize("command", COMMANDS)
def test_model_fields_survive(user_file, command, tmp_path):
    want = fields(onnx.load(user_file))
    assert USER_PROPS.items() <= want["metadata_props"].items() and "msar.config" in want["metadata_props"]
    out = rewrite(command, user_file, tmp_path / "out.onnx")
    assert fields(out) == want
    assert ExportedGraph.open(tmp_path / "out.onnx").config.d_model == 40  # msar.config still read


@pytest.mark.parametrize("command", COMMANDS)
def test_a_file_without_them_stays_without(faithful, command, tmp_path):
    """Control: the exported file as written (no doc string, version or domain, no user keys):
    nothing is invented."""
    want = fields(onnx.load(faithful[1]))
    assert want["doc_string"] == "" and want["model_version"] == 0 and not USER_PROPS.keys() & want["metadata_props"].keys()
    assert fields(rewrite(command, faithful[1], tmp_path / "out.onnx")) == want


def test_sanitize_loses_them_without_the_helper(user_file, tmp_path, monkeypatch):
    """Negative control: with the copy bypassed, sanitize (graphsurgeon writes a new model) drops
    the metadata, doc string, version and domain, and the file no longer opens as an msar file."""
    monkeypatch.setattr(model_fields, "copy_model_fields", lambda source, target: target)
    monkeypatch.setattr(surgeon, "copy_model_fields", lambda source, target: target)
    got = fields(rewrite("sanitize", user_file, tmp_path / "out.onnx"))
    want = fields(onnx.load(user_file))
    assert got != want
    assert not got["metadata_props"] and got["doc_string"] == "" and got["model_version"] == 0 and got["domain"] == ""
    with pytest.raises(OnnxModelError, match="no msar.config metadata"):
        ExportedGraph.open(tmp_path / "out.onnx").config


def test_copy_model_fields_exactly():
    """The helper alone: fields are replaced, not merged; empty ones are cleared; source may be target."""
    source, target = onnx.ModelProto(), onnx.ModelProto()
    source.metadata_props.add(key="a", value="1")
    source.producer_name = "p"
    target.metadata_props.add(key="stale", value="x")
    target.doc_string, target.model_version = "stale", 3
    model_fields.copy_model_fields(source, target)
    assert fields(target) == fields(source) == {"metadata_props": {"a": "1"}, "producer_name": "p",
                                                  "producer_version": "", "doc_string": "", "model_version": 0,
                                                  "domain": ""}
    assert fields(model_fields.copy_model_fields(target, target)) == fields(source)
