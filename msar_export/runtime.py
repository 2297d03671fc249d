"""Prefill logits and `generate()` over exported graphs in ONNX Runtime, on the one
runner (runners/ort_runner.py, which decides every session option).

Execution providers: whatever is installed, CUDA first when `onnxruntime-gpu`
is present, CPU otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import OnnxModelError
from .graph_spec import GraphSpec
from .runners.onnxrt import open_graph
from .runners.ort_runner import open_session as _open_session


def _running(path, fn, *args):
    """fn(*args), with ONNX Runtime's own failure while running the graph (an index past the
    embedding, a shape the graph does not take) as one line naming the file: the file, not
    msar-export, is at fault."""
    try:
        return fn(*args)
    except Exception as e:
        if not type(e).__module__.startswith("onnxruntime"):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise OnnxModelError(f"{path}: ONNX Runtime failed running this graph ({first[:300]})") from None


def open_session(path, providers=None, threads: int | None = None, optimization: str = "all",
                 low_memory: bool = False):
    """An InferenceSession over the exported file at `path`, which is opened (checked) first."""
    from .graph_file import ExportedGraph

    path = ExportedGraph.open(path).path
    return _open_session(path, providers, threads, optimization, low_memory, label=str(path))


class _OrtFile:
    """An exported graph opened once, with its ONNX Runtime session."""

    def __init__(self, path, providers=None, threads: int | None = None, optimization: str = "all",
                 low_memory: bool = False, ort_ops: str | None = None):
        self.path = Path(path)
        self.graph, self.ort = open_graph(path, providers=providers, threads=threads, optimization=optimization,
                                          low_memory=low_memory, ort_ops=ort_ops)
        self.session = self.ort.session
        self.cfg = self.graph.config


class OrtModel(_OrtFile):
    """The prefill graph: input_ids -> logits."""

    def logits(self, input_ids) -> np.ndarray:
        import torch  # not at module level: export validation runs ORT in a process without torch

        from .model.generate import check_token_batch

        ids = torch.as_tensor(input_ids)
        check_token_batch(ids, None, self.cfg.vocab_size, self.cfg.max_seq_len)
        return _running(self.path, self.ort.logits, ids.long().numpy())


class OrtDecoder(_OrtFile):
    """The decode graph: prefill with an empty cache, then one token per step."""

    def __init__(self, path, **session):
        super().__init__(path, **session)
        self.spec = GraphSpec(self.cfg, decode=True)
        first_cache = self.spec.cache_inputs[0].name
        if first_cache not in self.ort.input_names:
            raise OnnxModelError(f"{path}: not a decode graph (no {first_cache} input); export it with --decode")
        self.input_names, self.output_names = self.ort.input_names, self.ort.output_names
        if self.ort.cache_dtype is None:
            kv_type = self.ort.inputs[first_cache].type
            raise OnnxModelError(f"{path}: cache dtype {kv_type} cannot be fed from numpy; use a float32 or float16 export")
        self.cache_dtype = self.ort.cache_dtype

    def empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        return self.ort.empty_cache(batch)

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray,
             cache: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return _running(self.path, self.ort.step, input_ids, attention_mask, position_ids, cache)

    def generate(self, input_ids, attention_mask=None, **options) -> torch.Tensor:
        """Same contract and options as `msar_export.generate` (left-padded batches)."""
        from .model.generate import generate_decoder

        return generate_decoder(self, input_ids, attention_mask, **options)


__all__ = ["OrtModel", "OrtDecoder", "open_session"]
