"""ExportedGraph is the one reader of an exported file: `check --engine` and `build` parse the
file and its msar.config once, and hand the opened graph on (to TensorRT's parser too)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

import msar_export.graph_file as graph_file
from msar_export.config import MSARConfig
from msar_export.errors import BackendUnavailable
from msar_export.graph_file import ExportedGraph

sys.path.insert(0, str(Path(__file__).parent))
from test_build import FakeTensorRT, tiny_onnx  # noqa: E402


@pytest.fixture
def parses(monkeypatch):
    """Counter of {('file', path) | ('config', None): times parsed}: every parse of an exported
    file goes through graph_file._parse, every msar.config through MSARConfig.from_json."""
    seen: Counter = Counter()
    real_parse, real_json = graph_file._parse, MSARConfig.from_json.__func__

    def parse(path, weights):
        seen["file", Path(path).resolve()] += 1
        return real_parse(path, weights)

    def from_json(cls, text, what="config.json"):
        seen["config", what] += 1
        return real_json(cls, text, what)

    monkeypatch.setattr(graph_file, "_parse", parse)
    monkeypatch.setattr(MSARConfig, "from_json", classmethod(from_json))
    return seen


def _control(seen: Counter, path: Path) -> None:
    """The counter sees a second open and a second config parse (negative control)."""
    before = Counter(seen)
    for _ in range(2):
        ExportedGraph.open(path).config
    assert seen["file", path.resolve()] - before["file", path.resolve()] == 2
    assert seen["config", "msar.config metadata"] - before["config", "msar.config metadata"] == 2


def test_check_engine_parses_the_graph_and_its_config_once(faithful, tmp_path, parses):
    from msar_export.compare import check_parity
    from msar_export.engines.metadata import EngineMetadata, FileRecord, write_metadata
    from msar_export.fileio import file_sha256
    from msar_export.runners.trt import tensorrt_unavailable, trt_runner_from_onnx

    ckpt, onnx_path, _ = faithful
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"an engine that cannot run here")
    write_metadata(plan, EngineMetadata("10.99.0", "float32", FileRecord.of(onnx_path), [], file_sha256(plan),
                                        profiles={"input_ids": {"min": [1, 1], "opt": [1, 8], "max": [2, 16]}},
                                        builder={"backend": "tensorrt", "graph": "prefill"}))
    result = check_parity(ckpt, onnx_path, engine=plan, shapes=[(1, 8)])
    assert result.backend("onnxrt").passed and result.backend("tensorrt").status == "skipped"
    assert parses["file", onnx_path.resolve()] == 1, parses
    assert parses["config", "msar.config metadata"] == 1, parses

    # An engine built here gets the opened graph: nothing is read again (the runner is lazy).
    graph = ExportedGraph.open(onnx_path)
    assert graph.config == graph.config  # parsed, once
    parses.clear()
    try:
        trt_runner_from_onnx(graph, ["logits"], "float32", (1, 8))
    except BackendUnavailable:
        assert tensorrt_unavailable() is not None
    assert not parses, parses
    _control(parses, onnx_path)


def test_build_parses_the_graph_and_its_config_once(tmp_path, monkeypatch, parses):
    from msar_export.engines import build_engine
    from msar_export.engines import loaders

    fake = FakeTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(loaders.ctypes, "CDLL", lambda path, mode=0: fake.registered.update({"FusedMixer"}))
    model = tiny_onnx(tmp_path / "m.onnx")
    plugin = tmp_path / "libmsar_plugins.so"
    plugin.write_bytes(b"plugin")
    parses.clear()
    report = build_engine(model, tmp_path / "m.plan", shapes="batch=1/2/4,seq=1/16/32", plugin_libs=[plugin])
    assert report.meta.shapes["seq"] == [1, 16, 32] and report.plugin_layers == 1
    assert parses["file", model.resolve()] == 1, parses
    assert parses["config", "msar.config metadata"] == 1, parses
    _, path = fake.calls["parsed"]
    assert Path(path) == model  # the parser reads the weights the skeleton left in the file
    _control(parses, model)


def test_serve_parses_each_graph_and_its_config_once(graphs, tmp_path, monkeypatch, parses):
    """`serve` opened each graph to classify it, again to write the repository and again for
    max_seq_len; now resolve_sources opens it and hands the ExportedGraph on."""
    from msar_export.cli import main
    from msar_export.serving.triton import server

    seen = {}

    class Server:  # stands in for tritonserver: started, then stopped as Ctrl-C would
        proc = None

        def __init__(self, repo, http, grpc, **kw):
            seen["max_elements"] = kw["max_elements"]

        def start(self, timeout):
            raise KeyboardInterrupt

        def stop(self):
            return 0

    monkeypatch.setattr(server, "TritonServer", Server)
    http, grpc = server.free_port(), server.free_port()
    parses.clear()
    assert main(["serve", str(graphs["prefill"]), str(graphs["decode"]), "--workdir", str(tmp_path),
                 "--port-http", str(http), "--port-grpc", str(grpc), "--max-batch", "3"]) == 0
    assert seen["max_elements"] == 3 * graphs["cfg"]["max_seq_len"]
    for kind in ("prefill", "decode"):
        assert parses["file", graphs[kind].resolve()] == 1, parses
    assert parses["config", "msar.config metadata"] == 2, parses  # one per graph
    _control(parses, graphs["decode"])
