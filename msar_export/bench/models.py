"""What every benchmark builds on: random models of a config, and whether the native msar
kernels for ONNX Runtime are here (bench rows on them are left out when not)."""

from __future__ import annotations

import torch

from ..config import MSARConfig
from ..model import MSARLM


def random_model(cfg: MSARConfig, seed: int = 0) -> MSARLM:
    torch.manual_seed(seed)
    model = MSARLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.5 if name.endswith(".query") else 0.02)
            if name.endswith("norm.weight") or name.endswith("gate_scale"):
                p.fill_(1.0)
    return model.eval()


def export_random(cfg: MSARConfig, files: dict, folder) -> dict:
    """files[(kind, name)]: the ExportOptions of a graph of `cfg`'s random model of that residual kind,
    written to folder/KIND.NAME.onnx (unvalidated); each kind's model is built once. The paths, by key."""
    import dataclasses
    from pathlib import Path

    from ..export import export_model

    paths = {}
    for kind in dict.fromkeys(k for k, _ in files):
        model = random_model(dataclasses.replace(cfg, residual=kind))
        for (k, name), opts in files.items():
            if k == kind:
                paths[(k, name)] = Path(folder) / f"{k}.{name}.onnx"
                export_model(model, paths[(k, name)], opts, validate=False)
        del model
    return paths


def native_available() -> bool:
    from ..runners.ort_runner import native_library

    return native_library() is not None


def random_checkpoint(cfg: MSARConfig, path, seed: int = 0, max_shard_size: int | None = None):
    """A checkpoint of random weights (random_model's distributions) written shard by shard,
    without a model: each tensor is made as its shard is written, so a checkpoint larger
    than memory can be made (bench --export-memory's sharded row).  Returns the path."""
    from ..checkpoint import iter_expected, save_weights
    from ..weights import SHARD_SIZE

    shapes = dict(iter_expected(cfg))
    sizes = {n: 4 * _numel(s) for n, s in shapes.items()}
    g = torch.Generator().manual_seed(seed)

    def tensors():
        for name, shape in shapes.items():
            if name.endswith("norm.weight") or name.endswith("gate_scale"):
                yield name, torch.ones(shape)
            else:
                yield name, torch.empty(shape).normal_(0.0, 0.5 if name.endswith(".query") else 0.02, generator=g)

    save_weights(path, cfg, tensors(), sizes, max_shard_size or SHARD_SIZE)
    return path


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
