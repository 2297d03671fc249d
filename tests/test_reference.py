"""The validation reference streamed from the checkpoint (msar_export/export/reference.py):
the same logits as the loaded model's reference, the same verdict on both graphs, and
float64 weights of one unit (embedding, sublayer, head) at a time besides the mixers'."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import make_checkpoint, random_tensors, write_checkpoint
from msar_export import load_checkpoint, save_checkpoint
from msar_export.checkpoint import open_checkpoint
from msar_export.config import MSARConfig
from msar_export.export.reference import streamed_reference
from msar_export.export.validate import reference_logits, validate_file
from msar_export.verdict import rel_err

SAME = 1e-12  # issue 26: identical, or this close


def _both(ckpt, dtype="float32"):
    whole = reference_logits(load_checkpoint(ckpt, dtype=torch.float32).eval(), dtype)
    cfg, files = open_checkpoint(ckpt)
    return whole, streamed_reference(files, cfg, dtype)


@pytest.mark.parametrize("kind,tie", [("msar", False), ("attnres", True), ("standard", False)])
def test_streamed_reference_is_the_loaded_models(tmp_path, kind, tie):
    ckpt = make_checkpoint(tmp_path / kind, seed=11, residual=kind, tie_embeddings=tie)[0]
    for dtype in ("float32", "float16"):
        whole, streamed = _both(ckpt, dtype)
        assert np.array_equal(whole.ids, streamed.ids)
        assert streamed.ref64.dtype == np.float64 and streamed.eager.dtype == np.float32
        assert rel_err(streamed.ref64, whole.ref64) <= SAME and rel_err(streamed.eager, whole.eager) <= SAME
    # float16's eager logits are not float64's: the two passes are told apart
    assert rel_err(streamed.eager, streamed.ref64) > 1e-5
    # Negative control: one weight of one sublayer 1e-6 off is seen by the same comparison.
    cfg = MSARConfig.from_dict(dict(load_checkpoint(ckpt).cfg.to_dict()))
    tensors = random_tensors(cfg, 11)
    tensors["layers.2.w_up.weight"][0, 0] *= 1 + 1e-6
    write_checkpoint(tmp_path / "changed", cfg.to_dict(), tensors)
    cfg, files = open_checkpoint(tmp_path / "changed")
    assert rel_err(streamed_reference(files, cfg, "float32").ref64, whole.ref64) > 1e3 * SAME


def test_sharded_checkpoint_and_bfloat16(tmp_path):
    ckpt = make_checkpoint(tmp_path / "one", seed=12)[0]
    sharded = save_checkpoint(load_checkpoint(ckpt), tmp_path / "sharded", max_shard_size=4096)
    assert len(list(sharded.glob("*.safetensors"))) > 3
    whole = reference_logits(load_checkpoint(ckpt, dtype=torch.float32).eval(), "float32")
    cfg, files = open_checkpoint(sharded)
    assert np.array_equal(streamed_reference(files, cfg, "float32").ref64, whole.ref64)
    assert streamed_reference(files, cfg, "bfloat16") is None  # ORT is not run on bfloat16


@pytest.mark.parametrize("graph", ["prefill", "decode"])
def test_verdict_on_both_graphs_is_unchanged(graphs, graph):
    whole, streamed = _both(graphs["ckpt"])
    got = [validate_file(graphs[graph], ref, graph == "decode", "float32") for ref in (whole, streamed)]
    assert all(r.passed for r in got), [r.summary() for r in got]
    assert got[0].verdict == got[1].verdict and got[0].summary() == got[1].summary()


class _Float64Copies(TorchDispatchMode):
    """The most float64 bytes converted from float32 (`Tensor.to`: the weights, and at these
    shapes nothing else) alive at once, followed by their storage (a Parameter or `.data`
    made of a conversion shares it; torch keeps a storage's Python object while it lives)."""

    def __init__(self):
        super().__init__()
        self.alive: list[tuple[weakref.ref, int]] = []
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if (func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 and out.dtype == torch.float64
                and out.device.type == "cpu"):  # not the skeleton's meta tensors, which hold nothing
            storage = out.untyped_storage()
            self.alive = [(r, n) for r, n in self.alive if r() is not None] + [(weakref.ref(storage), storage.nbytes())]
            self.peak = max(self.peak, sum(n for _, n in self.alive))
        return out


def test_float64_weights_of_one_unit_at_a_time(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c", seed=13, vocab_size=256)[0]
    model = load_checkpoint(ckpt)
    units = [model.embed, *model.layers.values()]  # the head is the tied embedding
    largest = 8 * max(sum(p.numel() for p in u.parameters()) for u in units)
    mixers = 8 * sum(p.numel() for p in model.mixers.parameters())
    cfg, files = open_checkpoint(ckpt)
    with _Float64Copies() as streamed:
        streamed_reference(files, cfg, "float32")
    assert largest < streamed.peak <= largest + mixers
    # Control: the loaded model's reference (the whole float64 model less its sublayers) is over it.
    with _Float64Copies() as whole:
        reference_logits(model.eval(), "float32")
    assert whole.peak > largest + mixers
