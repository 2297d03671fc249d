"""ONNX Runtime over an exported graph, from the package's side: the file is opened
once (`ExportedGraph`: a clear error for an unusable file, its external data
checked), then the one runner (`ort_runner`) gets the path or, for the parity
check, the parsed graph with every `hidden.{l}` marked as an extra output."""

from __future__ import annotations

import os

from ..graph_file import ExportedGraph
from .ort_runner import OrtGraph, OrtRunner


def _opened(graph) -> ExportedGraph:
    return graph if isinstance(graph, ExportedGraph) else ExportedGraph.open(graph)


def uses_external_data(path: str | os.PathLike) -> bool:
    """Whether the model at `path` keeps its weights in a separate file (> 2 GB exports)."""
    return _opened(path).uses_external_data


def open_graph(path, **session) -> tuple[ExportedGraph, OrtGraph]:
    """(the file opened once, an ONNX Runtime session over it); OnnxModelError, one line,
    for a file that is unusable or that ONNX Runtime cannot load."""
    graph = _opened(path)
    return graph, OrtGraph(graph.path, label=str(graph.path), **session)


def onnxrt_runner(graph, outputs: list[str], providers=("cpu",), name: str = "onnxrt",
                  ort_ops: str | None = None) -> OrtRunner:
    """OrtRunner whose outputs are exactly `outputs` (e.g. logits and hidden.1..L+1); `graph`:
    an ExportedGraph or a path.  The session reads the weights from the model's folder.
    ort_ops: the msar nodes' implementation (ort_runner.resolve_ort_ops)."""
    graph = _opened(graph)
    return OrtRunner(lambda: graph.model_bytes(extra_outputs=outputs), name=name, outputs=list(outputs), providers=list(providers),
                     external_folder=graph.path.parent, label=str(graph.path), what="graph", ort_ops=ort_ops)
