"""The graph spec is what the exporter writes and what every runtime feeds."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from conftest import make_checkpoint
from msar_export.config import MSARConfig
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.graph_spec import GraphSpec, hidden_index, hidden_name
from msar_export.runtime import OrtDecoder


@pytest.mark.parametrize("residual", ["msar", pytest.param("attnres", marks=pytest.mark.slow)])
def test_exported_decode_graph_is_the_spec(tmp_path, residual, request):
    if residual == "msar":  # the session's 2-block msar decode graph (conftest.py)
        _, path, cfg_dict = request.getfixturevalue("faithful_decode")
    else:
        ckpt, cfg_dict = make_checkpoint(tmp_path / "ckpt", seed=4, residual=residual)
        path = tmp_path / "d.onnx"
        export_checkpoint(ckpt, path, ExportOptions(decode=True), validate=False)
    spec = GraphSpec(MSARConfig.from_dict(cfg_dict), decode=True)
    g = onnx.load(path).graph
    assert [v.name for v in g.input] == spec.input_names
    assert [v.name for v in g.output] == spec.output_names
    for port, v in zip(spec.inputs + spec.outputs, list(g.input) + list(g.output)):
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
        fixed = [a if isinstance(a, int) else None for a in port.axes]
        assert [d if isinstance(d, int) else None for d in dims] == fixed, port.name

    dec = OrtDecoder(path)
    cache = spec.empty_cache(2, np.float32)
    assert set(cache) == {p.name for p in spec.cache_inputs}
    # The standalone runner (Triton's copy has no graph_spec) goes by port order: the spec's.
    assert dec.ort.input_names == spec.input_names and dec.ort.output_names == spec.output_names
    assert dec.ort.next_cache_names == spec.past_of_present
    assert {k: v.shape for k, v in dec.ort.empty_cache(2).items()} == {k: v.shape for k, v in cache.items()}
    ids = np.zeros((2, 3), np.int64)
    logits, nxt = dec.step(ids, np.ones((2, 3), np.int64), np.tile(np.arange(3), (2, 1)), cache)
    assert set(nxt) == set(cache) and logits.shape == (2, 3, cfg_dict["vocab_size"])
    assert all(v.shape[spec.cache_inputs[0].axes.index("past")] == 3 for k, v in nxt.items() if "key" in k)


def test_prefill_spec_and_hidden_names():
    cfg = MSARConfig()
    spec = GraphSpec(cfg, decode=False)
    assert spec.input_names == ["input_ids"] and spec.output_names == ["logits"] and not spec.cache_inputs
    assert spec.hidden_names[0] == hidden_name(1) and hidden_index(spec.hidden_names[-1]) == cfg.n_sublayers + 1
    assert hidden_index("hidden.") is None and hidden_index("logits") is None and hidden_index("hidden.1x") is None
    assert spec.next_cache({"logits": 1}) == {}


@pytest.mark.parametrize("residual", ["msar", "standard"])
def test_feeds_and_torch_dims_follow_the_ports(residual):
    cfg = MSARConfig(n_blocks=3, residual=residual)
    dec, pre = GraphSpec(cfg, decode=True), GraphSpec(cfg, decode=False)
    ids = np.zeros((2, 5), np.int64)
    feeds = dec.fresh_feeds(ids, np.float16)
    assert list(feeds) == dec.input_names
    assert feeds["attention_mask"].shape == (2, 5) and feeds["position_ids"][1].tolist() == [0, 1, 2, 3, 4]
    assert all(feeds[p.name].dtype == np.float16 for p in dec.cache_inputs)
    assert all(feeds[p.name].shape[2] == 0 for p in dec.cache_inputs if p.name.startswith("past_key_values"))
    assert list(pre.fresh_feeds(ids, None)) == ["input_ids"]
    with pytest.raises(KeyError):  # a cache the spec names but the caller lacks
        dec.feeds(ids, feeds["attention_mask"], feeds["position_ids"], {})
    dims = dec.torch_dynamic_shapes()
    assert len(dims) == 4 and set(dims[0]) == {0, 1} and len(dims[3]) == len(dec.cache_inputs)
    assert all(set(d) == ({1} if p.name == "past_conv_state" else {0, 2}) for d, p in zip(dims[3], dec.cache_inputs))
    assert len(pre.torch_dynamic_shapes()) == 1
