"""One contract for every runner (Polygraphy's BaseRunner): activate, input
metadata, infer -> dict of numpy arrays with the agreed names, deactivate."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from polygraphy import config as pg_config
from polygraphy.datatype import DataType
from polygraphy.exception import PolygraphyException

from msar_export.checkpoint import load_checkpoint
from msar_export.errors import InputError
from msar_export.runners import output_names
from msar_export.graph_spec import hidden_index
from msar_export.runners.common import layer_order
from msar_export.runners.eager import TorchRunner
from msar_export.runners.onnxrt import onnxrt_runner, uses_external_data
from msar_export.runners.trt import tensorrt_unavailable, trt_runner_from_onnx

RUNNERS = ["eager", "onnxrt", "tensorrt"]


@pytest.fixture(scope="module")
def exported(faithful):
    """The session's random checkpoint and its prefill graph (conftest.py)."""
    ckpt, onnx_path, _ = faithful
    return ckpt, onnx_path, load_checkpoint(ckpt).cfg


def make_runner(kind, exported):
    ckpt, onnx_path, cfg = exported
    if kind == "eager":
        return TorchRunner(lambda: load_checkpoint(ckpt), name="eager")
    if kind == "onnxrt":
        return onnxrt_runner(onnx_path, output_names(cfg), name="onnxrt")
    why = tensorrt_unavailable()
    if why is not None:
        pytest.skip(f"TensorRT runner not tested here: {why}")
    return trt_runner_from_onnx(onnx_path, output_names(cfg), "float32", (3, 64), name="tensorrt")


def ids(cfg, shape, seed=0):
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, size=shape, dtype=np.int64)


@pytest.mark.parametrize("kind", RUNNERS)
def test_runner_contract(kind, exported, monkeypatch):
    # Polygraphy then checks that deactivate() restores the runner's state exactly.
    monkeypatch.setattr(pg_config, "INTERNAL_CORRECTNESS_CHECKS", True)
    cfg = exported[2]
    runner = make_runner(kind, exported)
    assert not runner.is_active
    with pytest.raises(PolygraphyException):
        runner.infer({"input_ids": ids(cfg, (1, 4))})

    for round_ in range(2):  # a runner can be activated again after deactivation
        runner.activate()
        assert runner.is_active
        meta = runner.get_input_metadata(use_numpy_dtypes=False)
        assert list(meta.keys()) == ["input_ids"]
        dtype, shape = meta["input_ids"]
        assert DataType.from_dtype(dtype) == DataType.INT64
        assert len(shape) == 2 and not all(isinstance(d, int) and d > 0 for d in shape), "batch and seq are dynamic"

        for b, t in [(2, 11), (1, cfg.kmax + 4)]:
            out = runner.infer({"input_ids": ids(cfg, (b, t), seed=round_)})
            assert set(out.keys()) == set(output_names(cfg)), f"{kind}: outputs {list(out.keys())}"
            for name, arr in out.items():
                assert isinstance(arr, np.ndarray), f"{kind}: {name} is {type(arr).__name__}, not a numpy array"
                assert arr.dtype.kind == "f"
                assert np.isfinite(arr).all()
                width = cfg.vocab_size if name == "logits" else cfg.d_model
                assert arr.shape == (b, t, width), name
            assert isinstance(runner.last_inference_time(), float)
        runner.deactivate()
        assert not runner.is_active


def test_runners_agree_on_the_same_tokens(exported):
    """The contract's point: the same feed gives the same numbers in every available runner."""
    cfg = exported[2]
    feed = {"input_ids": ids(cfg, (2, 19), seed=4)}
    outs = {}
    for kind in RUNNERS:
        if kind == "tensorrt" and tensorrt_unavailable():
            continue
        with make_runner(kind, exported) as r:
            outs[kind] = {k: v.copy() for k, v in r.infer(feed).items()}
    ref = outs.pop("eager")
    for kind, got in outs.items():
        for name in output_names(cfg):
            err = np.abs(got[name].astype(np.float64) - ref[name]).max() / np.abs(ref[name]).max()
            assert err < 1e-4, f"{kind} {name}: {err:.2e}"


def test_torch_runner_refuses_tokens_outside_the_vocabulary(exported):
    cfg = exported[2]
    with TorchRunner(load_checkpoint(exported[0])) as r:
        with pytest.raises(InputError, match="outside the vocabulary"):
            r.infer({"input_ids": np.full((1, 3), cfg.vocab_size, dtype=np.int64)})


def test_onnxrt_runner_over_external_data_model(exported, tmp_path):
    """Graphs over 2 GB keep weights in a .data file; the runner then saves its
    modified copy with external data instead of serialising it to bytes."""
    cfg = exported[2]
    proto = onnx.load(str(exported[1]))
    big = tmp_path / "ext.onnx"
    onnx.save_model(proto, str(big), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.onnx.data", size_threshold=0)
    assert uses_external_data(big) and not uses_external_data(exported[1])
    feed = {"input_ids": ids(cfg, (1, 9))}
    with onnxrt_runner(exported[1], output_names(cfg)) as a, onnxrt_runner(big, output_names(cfg)) as b:
        want, got = a.infer(feed), b.infer(feed)
        for name in output_names(cfg):
            np.testing.assert_array_equal(got[name], want[name])


def test_names_agree_with_the_exporter(exported):
    cfg = exported[2]
    assert layer_order(cfg)[-1] == "logits" and layer_order(cfg)[0] == "hidden.1"
    assert [hidden_index(n) for n in layer_order(cfg)] == list(range(1, cfg.n_sublayers + 2)) + [None]
