"""ONNX Runtime through Polygraphy: `OnnxrtRunner` over a copy of the graph with
every `hidden.{l}` marked as an extra output (Polygraphy's `ModifyOutputs`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from polygraphy.backend.base import BaseLoader


def uses_external_data(path: str | os.PathLike) -> bool:
    """Whether the model at `path` keeps its weights in a separate file (> 2 GB exports)."""
    import onnx
    from onnx.external_data_helper import uses_external_data as tensor_uses

    proto = onnx.load(str(path), load_external_data=False)
    return any(tensor_uses(t) for t in proto.graph.initializer)


class SessionFromOnnxCopy(BaseLoader):
    """Lazy: a (modified) ONNX model too big for bytes -> saved with external data
    into a temporary directory -> onnxruntime.InferenceSession.  ONNX Runtime reads
    the files while the session is created, so the directory is removed right after."""

    def __init__(self, model, providers=None):
        self.model = model
        self.providers = providers

    def call_impl(self):
        from polygraphy.backend.onnx import SaveOnnx
        from polygraphy.backend.onnxrt import SessionFromOnnx

        with tempfile.TemporaryDirectory(prefix="msar-check-") as tmp:
            path = str(Path(tmp) / "model.onnx")
            SaveOnnx(self.model, path=path, external_data_path="model.onnx.data")()
            return SessionFromOnnx(path, providers=self.providers)()


class SessionOrModelError(BaseLoader):
    """A session loader whose failure is the graph's fault (ORT cannot load it): an
    OnnxModelError (one line, exit 2), not a backend verdict or a traceback."""

    def __init__(self, loader, path):
        self.loader, self.path = loader, path

    def call_impl(self):
        from ..errors import OnnxModelError, first_line

        try:
            return self.loader()
        except Exception as e:
            raise OnnxModelError(f"{self.path}: ONNX Runtime cannot load this graph ({first_line(e)[:300]})") from None


def onnxrt_runner(onnx_path: str | os.PathLike, outputs: list[str], providers=("cpu",), name: str = "onnxrt"):
    """OnnxrtRunner whose outputs are exactly `outputs` (e.g. logits and hidden.1..L+1)."""
    from polygraphy.backend.onnx import BytesFromOnnx, ModifyOutputs, OnnxFromPath
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    model = ModifyOutputs(OnnxFromPath(str(onnx_path)), outputs=list(outputs))
    if uses_external_data(onnx_path):
        session = SessionFromOnnxCopy(model, providers=list(providers))
    else:
        session = SessionFromOnnx(BytesFromOnnx(model), providers=list(providers))
    return OnnxrtRunner(SessionOrModelError(session, onnx_path), name=name)
