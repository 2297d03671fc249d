"""Issue 23 defect 7: the decision on the decode views' storage dtype (docs/kernels.md) rests on what
scripts/views_dtype.py measures: DepthRetrieval over views stored in bfloat16 against float64 over the
views as computed (float32), on the emulated CUDA kernel and in ONNX Runtime (native kernel and
function body). It must stay well inside the bar a bfloat16 model's backends are judged by
(verdict.bound, with eager's error = the output's own bfloat16 rounding); views with 2 mantissa bits
(float8_e5m2) must fail that bar (the comparison can fail). The export applies the decision: a float16
decode graph's DepthRetrieval nodes read views that keep every float16 bit (checked in float64 against the
views recomputed from the graph's own sources), and the check fails on views rounded to bfloat16 in the graph."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import make_checkpoint
from onnx import TensorProto, helper
from plugin_build import emulation

from msar_export import kernels as K
from msar_export import verdict
from msar_export.checkpoint import load_checkpoint
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.runners.ort_runner import OrtGraph

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import views_dtype  # noqa: E402

PROMPT = b"def main(argv):\n    return 0\n"


@pytest.fixture(scope="module")
def cases():
    ckpt = list(views_dtype.checkpoint_cases(views_dtype.REPO / "checkpoints/default/msar", PROMPT))
    return [ckpt[-1], next(views_dtype.random_cases())]  # the deepest mixer of the checkpoint; n = 97, d = 512


def test_bf16_views_within_a_quarter_of_the_bf16_bar(cases):
    try:
        from ort_ops_fixtures import native_library
        native_library()
        ort = True
    except pytest.skip.Exception:
        ort = False  # the emulation rows still decide; ORT's native kernel is not built here
    for row in views_dtype.measure(emulation(), cases, ort=ort):
        assert row["emulation float32"] < 1e-5, row  # a float32 model's views: float32 arithmetic alone
        bf16 = [k for k in row if k.endswith("bfloat16")]
        assert len(bf16) == (3 if ort else 1), row
        for k in bf16:
            assert row["emulation float32"] < row[k] <= row["bf16_bound"] / 4, (k, row)


def test_two_mantissa_bits_fail_the_bar(cases):
    lib = emulation()
    for _, q, views in cases:
        ref = K.reference_depth_retrieval64(q, views, views_dtype.EPS)
        err = views_dtype.emulation_error(lib, q, views, ref, lambda v: v.to(torch.float8_e5m2).bfloat16())
        assert err > views_dtype.bf16_bar(ref)[1], err


# float16's unit roundoff: rounding a value to float16 moves it by at most 2^-11 of itself, so by at most
# 2^-11 of the largest view; the float32 conv arithmetic before it adds ~1e-7. bfloat16 (2^-8) is 8x over.
FLOAT16_STORAGE = 2.0**-11 + 1e-6


@pytest.fixture(scope="module")
def decode_fp16(tmp_path_factory):
    root = tmp_path_factory.mktemp("views-dtype")
    ckpt = make_checkpoint(root / "ckpt", seed=4, n_blocks=1)[0]  # 1 block: a quick export, 3 DepthRetrieval nodes
    path = root / "decode.onnx"
    export_checkpoint(ckpt, path, ExportOptions(decode=True, dtype="float16"), validate=False)
    return ckpt, onnx.load(str(path))


def views_read(model: onnx.ModelProto, round_to: int | None = None) -> list[np.ndarray]:
    """The views the last DepthRetrieval node reads (every source's), as ONNX Runtime computes them in the
    graph at a prefill from the empty cache. round_to: first put a Cast to that type and back in front of
    every DepthRetrieval node (the fault the check must see)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = [n for n in model.graph.node if n.op_type == "DepthRetrieval"]
    views = list(nodes[-1].input[1:])
    if round_to is not None:
        order = []
        for n in model.graph.node:  # each view's Casts right after the node that makes it
            order.append(n)
            order += [helper.make_node("Cast", [v], [v + "_narrow"], to=round_to) for v in n.output if v in views]
            order += [helper.make_node("Cast", [v + "_narrow"], [v + "_kept"], to=TensorProto.FLOAT16)
                      for v in n.output if v in views]
        for n in nodes:
            n.input[1:] = [v + "_kept" for v in n.input[1:]]
        del model.graph.node[:]
        model.graph.node.extend(order)
        views = [v + "_kept" for v in views]
    model.graph.output.extend(helper.make_tensor_value_info(v, TensorProto.FLOAT16, None) for v in views)
    graph = OrtGraph(model.SerializeToString(), providers=["cpu"], threads=1, ort_ops="function")
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0)).numpy()
    feeds = dict(zip(graph.input_names, [ids, np.ones_like(ids), np.broadcast_to(np.arange(9), ids.shape).copy()]))
    return list(graph.run({**feeds, **graph.empty_cache(2)}, views).values())


def storage_errors(ckpt, views: list[np.ndarray]) -> list[float]:
    """Each source's views against float64 ones recomputed from its identity stream (view 0: the float16
    source itself, exact) with the float16 model's weights: the error is the views' storage rounding."""
    model = load_checkpoint(ckpt, dtype=torch.float16).double()
    with torch.no_grad():
        return [verdict.rel_err(v, model.sources[str(i)](torch.from_numpy(v[:, :, 0].astype(np.float64))))
                for i, v in enumerate(views)]


def test_exported_decode_views_keep_every_float16_bit(decode_fp16):
    ckpt, model = decode_fp16
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    for node in (n for n in model.graph.node if n.op_type == "DepthRetrieval"):
        assert {types[v] for v in node.input[1:]} == {TensorProto.FLOAT16}, node.name  # not float32 any more
    errs = storage_errors(ckpt, views_read(model))
    assert len(errs) == 3 and max(errs) <= FLOAT16_STORAGE, errs
    assert max(errs) > 2.0**-14, errs  # rounded to float16, not carried in float32 under a float16 name


def test_views_rounded_to_bfloat16_in_the_graph_fail(decode_fp16):
    ckpt, model = decode_fp16
    errs = storage_errors(ckpt, views_read(model, round_to=TensorProto.BFLOAT16))
    assert max(errs) > 2 * FLOAT16_STORAGE, errs
