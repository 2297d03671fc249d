"""Seeded inputs for any msar-export graph, read from the file's own metadata."""

from __future__ import annotations

import numpy as np

from ..config import MSARConfig
from ..graph_file import ExportedGraph


def config_of_model(model) -> MSARConfig:
    """The config in a loaded model's msar.config metadata (ExportedGraph reads it)."""
    return ExportedGraph.from_proto(model).config


def seeded_feeds(model, batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    """input_ids (and, for a decode graph, a full mask, positions and empty caches)."""
    from ..graph_spec import ATTENTION_MASK, GraphSpec

    cfg = config_of_model(model)
    names = {i.name for i in model.graph.input}
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (batch, seq)).astype(np.int64)
    spec = GraphSpec(cfg, decode=ATTENTION_MASK in names)
    feeds = spec.fresh_feeds(ids, _float_input_dtype(model) if spec.decode else None)
    return {k: v for k, v in feeds.items() if k in names}


def _float_input_dtype(model):
    from onnx import helper

    for i in model.graph.input:
        if i.name.startswith("past_"):
            return helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
    return np.float32
