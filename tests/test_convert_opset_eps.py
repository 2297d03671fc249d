"""`msar-export onnx convert-opset` keeps the function bodies' attribute references (a
Constant's value_float = @eps): onnx.version_converter reads a body as a graph and writes
them back as plain 0.0, so the converted file's bodies computed with eps = 0.

The checkpoint's mixer_eps is 0.5, large enough that eps = 0 moves the logits far past the
bar; the converted file runs in stock ONNX Runtime (function bodies, no native library) and
is judged against the float64 reference."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import load_cfg, load_tensors, make_checkpoint
from hostile_helpers import run_main

from msar_export.checkpoint import load_checkpoint
from msar_export.errors import InputError
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.interop import opset
from msar_export.interop.run import seeded_feeds
from msar_export.verdict import judge
from reference64 import reference_logits

EPS = 0.5
KINDS = {"fused": ExportOptions(), "retrieval": ExportOptions(mixer_op="retrieval"),
         "scored": ExportOptions(mixer_op="scored")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """files[kind] -> (onnx path, feeds, float64 logits, eager float32 logits), exported on first use."""
    root = tmp_path_factory.mktemp("eps")
    ckpt, cfg = make_checkpoint(root / "ckpt", seed=7, mixer_eps=EPS)
    assert cfg["mixer_eps"] == EPS

    class Exports(dict):
        def __missing__(self, kind):
            path = root / f"{kind}.onnx"
            export_checkpoint(ckpt, path, KINDS[kind], validate=False)
            feeds = seeded_feeds(onnx.load(path), 2, 9, seed=2)
            ref64 = reference_logits(load_cfg(ckpt), load_tensors(ckpt), feeds["input_ids"])
            with torch.no_grad():
                eager = load_checkpoint(ckpt).eval()(torch.from_numpy(feeds["input_ids"])).numpy()
            self[kind] = (path, feeds, ref64, eager)
            return self[kind]

    return Exports()


def body_logits(path, feeds) -> np.ndarray:
    """Stock ONNX Runtime, no msar library: every msar node runs its function body."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}})[0]


def attribute_refs(model) -> set:
    """(function, overload, node outputs, attribute, referenced name) of every attribute reference."""
    return {(f.name, f.overload, tuple(n.output), a.name, a.ref_attr_name)
            for f in model.functions for n in f.node for a in n.attribute if a.ref_attr_name}


@pytest.mark.parametrize("kind", ["fused", "retrieval", pytest.param("scored", marks=pytest.mark.slow)])
def test_converted_bodies_keep_eps(files, kind, tmp_path):
    path, feeds, ref64, eager = files[kind]
    out = tmp_path / "o21.onnx"
    r = run_main("onnx", "convert-opset", path, "--opset", "21", "-o", out, text=True)
    assert r.returncode == 0, r.stderr
    original, converted = onnx.load(path), onnx.load(out)
    refs = attribute_refs(original)
    assert any(ref[-1] == "eps" for ref in refs)
    assert attribute_refs(converted) == refs
    v = judge(body_logits(out, feeds), eager, ref64, "float32")
    assert v.passed, v.describe(f"convert-opset 21 on {kind}, function bodies")


@pytest.mark.parametrize("kind", ["fused", "retrieval"])
def test_bodies_without_their_refs_fail(files, kind, tmp_path, monkeypatch):
    """Negative control: the same conversion with the references left as the converter writes
    them (eps = 0 in every body) fails the same judge."""
    path, feeds, ref64, eager = files[kind]
    monkeypatch.setattr(opset, "restore_attribute_refs", lambda original, converted: 0)
    out = tmp_path / "o21.onnx"
    assert run_main("onnx", "convert-opset", path, "--opset", "21", "-o", out, text=True).returncode == 0
    assert not any(ref[-1] == "eps" for ref in attribute_refs(onnx.load(out)))
    assert not judge(body_logits(out, feeds), eager, ref64, "float32").passed


def test_a_reference_the_converter_rewrote_is_refused(files, tmp_path, monkeypatch):
    """A converter that replaced the node holding @eps (here: renamed its output): one line,
    exit 2, nothing written, the input untouched."""
    path, *_ = files["fused"]
    before = path.read_bytes()
    real = onnx.version_converter.convert_version

    def rewriting(model, target):
        out = real(model, target)
        for node in out.graph.node:
            if node.op_type == "Constant" and any(a.name == "value_float" for a in node.attribute):
                old, new = node.output[0], node.output[0] + "_rewritten"
                node.output[0] = new
                for user in out.graph.node:
                    user.input[:] = [new if i == old else i for i in user.input]
        return out

    monkeypatch.setattr(onnx.version_converter, "convert_version", rewriting)
    r = run_main("onnx", "convert-opset", path, "--opset", "21", "-o", tmp_path / "o21.onnx", text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "@eps" in lines[0] and "cannot be restored" in lines[0], r.stderr
    assert not (tmp_path / "o21.onnx").exists() and path.read_bytes() == before


def test_restore_attribute_refs_counts_and_refuses():
    """The helper alone: a body whose ref became a plain value gets it back; a missing node is refused."""
    from onnx import helper

    ref = helper.make_attribute_ref("value_float", onnx.AttributeProto.FLOAT)
    ref.ref_attr_name = "eps"
    const = helper.make_node("Constant", [], ["e"])
    const.attribute.append(ref)
    fn = helper.make_function("msar", "F", ["x"], ["y"], [const, helper.make_node("Add", ["x", "e"], ["y"])],
                              [helper.make_opsetid("", 18)], attributes=[], attribute_protos=[
                                  helper.make_attribute("eps", 0.25)])
    plain = onnx.FunctionProto()
    plain.CopyFrom(fn)
    plain.node[0].ClearField("attribute")
    plain.node[0].attribute.append(helper.make_attribute("value_float", 0.0))
    assert opset.restore_attribute_refs(fn, plain) == 1
    assert plain.node[0].attribute[0].ref_attr_name == "eps" and len(plain.node[0].attribute) == 1
    plain.node[0].output[0] = "other"
    with pytest.raises(InputError, match="@eps"):
        opset.restore_attribute_refs(fn, plain)
