"""Export without holding the weights (msar_export/export/weightless.py): the checkpoint
path traces a fake model and reads each weight from the memory-mapped file as it is
written.  Its file must be byte-identical to the export of the loaded model (the path
`export_model` still takes), and each large weight must be read once, while saving."""

from __future__ import annotations

import collections
import shutil

import pytest
import torch

from conftest import make_checkpoint
from msar_export.checkpoint import load_checkpoint, open_checkpoint
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.export.exporter import export_model
from msar_export.export.weightless import LazyWeights, fake_model


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("weightless") / "ckpt", seed=7, n_blocks=1)[0]


def _bf16_copy(src, dst):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    t = load_file(str(dst / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in t.items()}, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_each_lazy_weight_is_what_load_checkpoint_gives(ckpt, tmp_path, dtype):
    """The loader's values, dtype and bytes for every tensor and the conv bank, from a
    float32 and a bfloat16 checkpoint (conversion both ways)."""
    from msar_export.export.custom_paths import pack_conv_weights

    for src in (ckpt, _bf16_copy(ckpt, tmp_path / "bf16")):
        cfg, files = open_checkpoint(src)
        lazy = LazyWeights(files, cfg, dtype)
        model = load_checkpoint(src, dtype=dtype)
        for name, want in model.state_dict().items():
            got = lazy.loader("model." + name, name)()
            assert got.dtype.itemsize == want.element_size() and tuple(got.shape) == tuple(want.shape)
            assert got.tobytes() == want.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes(), name
        bank = lazy.loader("conv_bank", "conv_bank")()
        assert bank.tobytes() == pack_conv_weights(model).detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
        # --mixer-op scored: source i's queries are mixers i+1..L+1's, stacked in order
        L = cfg.n_sublayers
        for i in (0, L):
            want = torch.stack([model.mixers[str(j)].query for j in range(i + 1, L + 2)])
            got = lazy.loader(f"mixer_queries_{i}", "q")()
            assert tuple(got.shape) == (L + 1 - i, cfg.n_streams, cfg.d_model)
            assert got.tobytes() == want.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
    # Negative control: another checkpoint's weights give other bytes.
    other = make_checkpoint(tmp_path / "other", seed=8, n_blocks=1)[0]
    cfg, files = open_checkpoint(other)
    assert LazyWeights(files, cfg, dtype).loader("model.embed.weight", "e")().tobytes() != \
        load_checkpoint(ckpt, dtype=dtype).embed.weight.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


def test_an_initializer_of_unknown_origin_is_an_internal_error(ckpt):
    cfg, files = open_checkpoint(ckpt)
    with pytest.raises(RuntimeError, match="neither a checkpoint tensor"):
        LazyWeights(files, cfg, torch.float32).loader("model.rotary.inv_freq", "x")


def test_fake_model_holds_no_weight_memory(ckpt):
    from torch._subclasses.fake_tensor import FakeTensor

    cfg, _ = open_checkpoint(ckpt)
    model = fake_model(cfg, torch.float16)
    params = list(model.parameters())
    assert params and all(isinstance(p, FakeTensor) and p.dtype == torch.float16 for p in params)


def test_no_weight_is_held_before_saving_and_each_is_read_once_then(ckpt, tmp_path, monkeypatch):
    """When saving starts, every initializer over 1 KiB is still lazy (the Transposes the
    optimiser folds from weights included: optimize.py), and saving reads each weight once."""
    import onnx_ir as ir

    import msar_export.export.exporter as exporter

    saving: collections.Counter = collections.Counter()
    state = {"saving": False, "held": None}
    real_read = LazyWeights.read

    def read(self, name):
        if state["saving"]:
            saving[name] += 1
        return real_read(self, name)

    real_save = exporter.save_model

    def save(model, *a, **k):
        state["held"] = [(v.name, v.const_value.nbytes) for v in model.graph.initializers.values()
                         if v.const_value.nbytes > 1024 and not isinstance(v.const_value, ir.LazyTensor)]
        state["n_lazy"] = sum(isinstance(v.const_value, ir.LazyTensor) for v in model.graph.initializers.values())
        state["saving"] = True
        return real_save(model, *a, **k)

    monkeypatch.setattr(LazyWeights, "read", read)
    monkeypatch.setattr(exporter, "save_model", save)
    export_checkpoint(ckpt, tmp_path / "m.onnx", ExportOptions(), validate=False)
    assert state["held"] == [], state["held"]
    cfg, files = open_checkpoint(ckpt)
    big = [n for n, e in files.entries.items() if e.nbytes > 4096]
    assert len(big) >= 5 and state["n_lazy"] >= len(big)
    # embed.weight is read twice when tied: once for the embedding, once for its transpose (the head).
    assert all(saving[n] == 1 + (n == "embed.weight" and cfg.tie_embeddings) for n in big), saving


def _files(folder):
    """The export's bytes: the .onnx file and its data file, if any (same names in each folder:
    the data file's name is written in the model)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.slow
@pytest.mark.parametrize("flags", [{}, {"external_data": True}, {"decode": True, "dtype": "float16"},
                                   {"decomposed": True, "dtype": "bfloat16"}, {"mixer_op": "scored"}])
def test_weightless_file_is_byte_identical_to_the_loaded_models(ckpt, tmp_path, flags):
    opts = ExportOptions(**flags)
    new, old, changed = (tmp_path / d for d in ("new", "old", "changed"))
    export_checkpoint(ckpt, new / "m.onnx", opts, validate=False)
    export_model(load_checkpoint(ckpt, dtype=getattr(torch, opts.dtype)), old / "m.onnx", opts, ckpt.name,
                 validate=False)
    assert sorted(_files(new)) == (["m.onnx", "m.onnx.data"] if opts.external_data else ["m.onnx"])
    assert _files(new) == _files(old)
    # Negative control: the same comparison sees one changed weight.
    model = load_checkpoint(ckpt, dtype=getattr(torch, opts.dtype))
    with torch.no_grad():
        model.layers["2"].w_up.weight[0, 0] += 1
    export_model(model, changed / "m.onnx", opts, ckpt.name, validate=False)
    assert _files(changed) != _files(new)


@pytest.mark.parametrize("name", ["layers.1.wk.weight",  # read by the optimiser's folding (wrapped in PassErrors)
                                  pytest.param("sources.1.conv.1.weight", marks=pytest.mark.slow)])  # read when saving
def test_a_bad_value_met_while_exporting_is_one_line_and_writes_nothing(tmp_path, name):
    """--no-validate reads no value before tracing: a NaN is first met by a lazy loader."""
    from conftest import random_tensors, write_checkpoint
    from hostile_helpers import one_line_exit_2, run_main, tree
    from msar_export.config import MSARConfig

    path, cfg = make_checkpoint(tmp_path / "ckpt", seed=1, n_blocks=1)
    tensors = random_tensors(MSARConfig.from_dict(cfg), 1)
    tensors[name].view(-1)[0] = float("nan")
    write_checkpoint(path, cfg, tensors)
    before = tree(tmp_path)
    line = one_line_exit_2(run_main("export", path, "-o", tmp_path / "m.onnx", "--no-validate"))
    assert f"tensor '{name}' holds NaN or Inf values" in line
    assert tree(tmp_path) == before
