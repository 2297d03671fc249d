from __future__ import annotations

import json
import os
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two workers share two cores (scripts/test.sh): one compute thread each, or torch's and ORT's
    # spinning pools oversubscribe them.  Child processes (the CLI, validation) inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch
from safetensors.torch import load_file, save_file

from msar_export.checkpoint import expected_shapes
from msar_export.config import MSARConfig

REPO = Path(__file__).resolve().parent.parent
TRAINED = REPO / "checkpoints" / "default"

# Odd sizes on purpose: 5 heads over 1 kv head, kernels that are not [1,4,8,12].
ODD = dict(vocab_size=61, d_model=40, n_blocks=2, n_heads=5, n_kv_heads=1, mlp_hidden=72, max_seq_len=128,
           stream_kernels=[1, 3, 5], tie_embeddings=True)


def random_tensors(cfg: MSARConfig, seed: int, query_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random weights with every parameter non-trivial (queries and gates too)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name.endswith(".query"):
            t = query_scale * torch.randn(shape, generator=g)
        elif ".conv." in name:
            t = 0.5 * torch.randn(shape, generator=g)
        elif name.endswith("gate_scale"):
            t = torch.tensor(1.0 + torch.rand((), generator=g).item())
        elif name == "embed.weight":
            t = torch.randn(shape, generator=g)
        else:
            fan_in = shape[-1] if len(shape) > 1 else 1
            t = torch.randn(shape, generator=g) / fan_in**0.5
        out[name] = t.float().contiguous()
    return out


def write_checkpoint(path: Path, cfg_dict: dict, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg_dict))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def make_checkpoint(path: Path, seed: int = 0, query_scale: float = 1.0, **overrides) -> tuple[Path, dict]:
    cfg = MSARConfig.from_dict({**MSARConfig().to_dict(), **ODD, **overrides})
    cfg_dict = cfg.to_dict()
    write_checkpoint(path, cfg_dict, random_tensors(cfg, seed, query_scale))
    return path, cfg_dict


@pytest.fixture
def odd_checkpoint(tmp_path):
    return make_checkpoint(tmp_path / "ckpt", seed=3)


def trained_checkpoint(kind: str) -> Path:
    path = TRAINED / kind
    if not (path / "model.safetensors").is_file():
        pytest.fail(f"trained checkpoint {path} is missing; run `msar-export train -o {TRAINED}`")
    return path


def load_tensors(path: Path) -> dict:
    return {k: v.float().numpy() for k, v in load_file(str(path / "model.safetensors")).items()}


def load_cfg(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


# The helper modules' session fixtures, registered once here: a test module that imports a fixture by
# name gets a copy of its own (one more export, one more Triton server per module that uses it).
from compare_fixtures import faithful, faithful_decode  # noqa: E402,F401
from serving_fixtures import graphs, refs, served, triton  # noqa: E402,F401
