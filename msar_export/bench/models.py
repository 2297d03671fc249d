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


def native_available() -> bool:
    from ..runners.ort_runner import native_library

    return native_library() is not None
