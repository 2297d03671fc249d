"""`msar-export build` and msar_export.engines without TensorRT: CLI behaviour,
shape profiles, ONNX preparation, engine metadata checks, and the
build_engine flow against a stand-in `tensorrt` module (the real API calls
were checked against TensorRT's Python bindings; they run only on a GPU
machine).
"""

from __future__ import annotations

import enum
import importlib.util
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from msar_export import cli
from msar_export.config import MSARConfig
from msar_export.engines import DimRange, build_engine, parse_profile, read_metadata, verify_engine_metadata
from msar_export.engines.backends import TENSORRT
from msar_export.engines import loaders as loaders_mod
from msar_export.engines.metadata import EngineMetadata, FileRecord, metadata_path, write_metadata
from msar_export.engines.onnx_info import read_onnx
from msar_export.engines.profiles import default_ranges, input_profiles
from msar_export.fileio import file_sha256
from msar_export.errors import BackendUnavailable, EngineError, InputError, OnnxModelError


def tiny_onnx(path: Path, custom: bool = True, dtype: str = "float32") -> Path:
    """input x [batch, seq, 8] -> msar::FusedMixer (two sources) or Identity; with a local
    function body per overload, as the exporter writes them."""
    d = 8
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "past + seq"])
    h = helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", "seq", d])
    inits = [helper.make_tensor(name, TensorProto.FLOAT, dims, [0.0] * math.prod(dims))
             for name, dims in (("q", [2, d]), ("gw", [2, 2 * d]), ("gb", [2]), ("gs", []), ("cw", [3, 3, d]))]
    functions = []
    if custom:
        node = helper.make_node("FusedMixer", ["q", "gw", "gb", "gs", "cw", "x", "x"], ["h"], domain="msar",
                                stream_kernels=[1, 3], eps=1e-6, plugin_version="1", plugin_namespace="")
        node.overload = "n2"
        for n in (1, 2):
            ins = ["query", "gate_weight", "gate_bias", "gate_scale", "conv_weight"] + [f"sources_{i}" for i in range(n)]
            functions.append(helper.make_function("msar", "FusedMixer", ins, ["h"],
                                                  [helper.make_node("Identity", ["sources_0"], ["h"])],
                                                  [helper.make_opsetid("", 18)], overload=f"n{n}"))
    else:
        node = helper.make_node("Identity", ["x"], ["h"])
    graph = helper.make_graph([node], "g", [x, mask], [h], initializer=inits)
    opsets = [helper.make_opsetid("", 18)] + ([helper.make_opsetid("msar", 1)] if custom else [])
    model = helper.make_model(graph, opset_imports=opsets, functions=functions, ir_version=10)
    for k, v in {"msar.graph": "prefill", "msar.dtype": dtype, "msar.config": MSARConfig(max_seq_len=64).to_json()}.items():
        model.metadata_props.add(key=k, value=v)
    onnx.save(model, str(path))
    return path


# ---------------------------------------------------------------------------
# CLI without TensorRT


def test_build_without_tensorrt_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    model = tiny_onnx(tmp_path / "m.onnx")
    plan = tmp_path / "out" / "m.plan"
    rc = cli.main(["build", str(model), "-o", str(plan), "--plugins", str(model)])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("msar-export build: error: TensorRT is not installed (import tensorrt failed:")
    assert lines[0].endswith("use --backend tensorrt-rtx (pip install -e '.[rtx]': its builder needs no GPU)")
    assert not plan.exists() and not metadata_path(plan).exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["m.onnx"]


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
def test_build_cli_process_without_tensorrt(tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx")
    r = subprocess.run([sys.executable, "-m", "msar_export.cli", "build", str(model), "-o", str(tmp_path / "m.plan")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1
    assert "TensorRT is not installed" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_build_user_errors_come_before_tensorrt(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    model = tiny_onnx(tmp_path / "m.onnx")
    assert cli.main(["build", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "m.plan")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["build", str(model), "-o", str(tmp_path / "m.plan"), "--profile", "batch=1/8/4"]) == 2
    assert "min <= opt <= max" in capsys.readouterr().err
    assert cli.main(["build", str(model), "-o", str(tmp_path / "m.plan"), "--plugins", "nope.so"]) == 2
    assert "plugin library" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# Profiles and ONNX preparation


def test_parse_profile():
    assert parse_profile(["batch=1/4/8,seq=1/128/512", "past=0/0/16"]) == {
        "batch": DimRange(1, 4, 8), "seq": DimRange(1, 128, 512), "past": DimRange(0, 0, 16)}
    for bad in ("batch=1/4", "width=1/2/3", "batch=a/b/c", "seq=4/2/8", "batch"):
        with pytest.raises(InputError):
            parse_profile(bad)


def test_input_profiles_follow_dim_names():
    ranges = {**default_ranges("decode", 64), **parse_profile("batch=1/2/4,seq=1/1/16,past=0/32/48")}
    p = input_profiles([("input_ids", ["batch", "seq"]), ("attention_mask", ["batch", "past + seq"]),
                        ("past_conv_state", [5, "batch", 11, 40])], ranges)
    assert p["input_ids"] == {"min": [1, 1], "opt": [2, 1], "max": [4, 16]}
    assert p["attention_mask"] == {"min": [1, 1], "opt": [2, 33], "max": [4, 64]}
    assert p["past_conv_state"] == {"min": [5, 1, 11, 40], "opt": [5, 2, 11, 40], "max": [5, 4, 11, 40]}
    with pytest.raises(OnnxModelError, match="width"):
        input_profiles([("x", ["width"])], ranges)


def test_read_onnx_counts_custom_nodes_and_strips_their_functions(tmp_path):
    info = read_onnx(tiny_onnx(tmp_path / "m.onnx"))
    assert info.custom_ops == {"FusedMixer": 1}
    assert info.inputs == [("x", ["batch", "seq", 8]), ("attention_mask", ["batch", "past + seq"])]
    assert (info.graph, info.dtype, info.max_seq_len) == ("prefill", "float32", 64)
    stripped = onnx.load_from_string(info.parser_bytes)
    assert list(stripped.functions) == []
    assert [n.op_type for n in stripped.graph.node] == ["FusedMixer"]
    assert len(onnx.load(str(tmp_path / "m.onnx")).functions) == 2  # the file itself is untouched


# ---------------------------------------------------------------------------
# Engine metadata


def make_engine(tmp_path: Path, trt_version: str = "10.9.0") -> tuple[Path, Path, Path]:
    model = tiny_onnx(tmp_path / "m.onnx")
    plugin = tmp_path / "libmsar_plugins.so"
    plugin.write_bytes(b"plugin v1")
    plan = tmp_path / "m.plan"
    plan.write_bytes(b"engine bytes")
    write_metadata(plan, EngineMetadata(tensorrt_version=trt_version, dtype="float32", onnx=FileRecord.of(model),
                                        plugins=[FileRecord.of(plugin)], plan_sha256=file_sha256(plan)))
    return plan, model, plugin


def test_metadata_roundtrip_and_verify(tmp_path):
    plan, model, plugin = make_engine(tmp_path)
    meta = verify_engine_metadata(plan, model, [plugin], tensorrt_version="10.9.0")
    assert meta == read_metadata(plan)
    assert json.loads(metadata_path(plan).read_text())["onnx"]["sha256"] == file_sha256(model)


def test_verify_refuses_a_different_onnx(tmp_path):
    plan, model, plugin = make_engine(tmp_path)
    other = tiny_onnx(tmp_path / "other.onnx", custom=False)
    with pytest.raises(EngineError, match="different ONNX file") as e:
        verify_engine_metadata(plan, other, [plugin], tensorrt_version=None)
    assert "msar-export build" in str(e.value) and "\n" not in str(e.value)


def test_verify_refuses_a_different_plugin(tmp_path):
    plan, model, plugin = make_engine(tmp_path)
    plugin.write_bytes(b"plugin v2")
    with pytest.raises(EngineError, match="libmsar_plugins.so .*is not the one it was built with"):
        verify_engine_metadata(plan, model, [plugin], tensorrt_version=None)
    with pytest.raises(EngineError, match="which was not given"):
        verify_engine_metadata(plan, model, [], tensorrt_version=None)


def test_verify_refuses_a_changed_plan_or_tensorrt(tmp_path):
    plan, model, plugin = make_engine(tmp_path)
    with pytest.raises(EngineError, match="built with TensorRT 10.9.0, this is TensorRT 10.10.0"):
        verify_engine_metadata(plan, model, [plugin], tensorrt_version="10.10.0")
    plan.write_bytes(b"another engine")
    with pytest.raises(EngineError, match="engine file changed"):
        verify_engine_metadata(plan, model, [plugin], tensorrt_version=None)
    metadata_path(plan).unlink()
    with pytest.raises(EngineError, match="is missing"):
        verify_engine_metadata(plan, model, [plugin], tensorrt_version=None)


def test_verify_refuses_a_record_of_an_unknown_backend(tmp_path):
    # It passed, and `check --engine` then failed with "--backend must be one of ...", an option check has not.
    plan, model, plugin = make_engine(tmp_path)
    meta = read_metadata(plan)
    meta.builder["backend"] = "tensorrt-llm"
    write_metadata(plan, meta)
    with pytest.raises(EngineError, match=r"names the backend 'tensorrt-llm', which .*; rebuild the engine"):
        verify_engine_metadata(plan, model, [plugin], tensorrt_version=None)
    meta.builder["backend"] = "tensorrt-rtx"  # the control: a backend it knows
    write_metadata(plan, meta)
    assert verify_engine_metadata(plan, model, [plugin], tensorrt_version=None).backend.label == "TensorRT-RTX"


# ---------------------------------------------------------------------------
# build_engine against a stand-in tensorrt module


class FakeTensorRT(types.ModuleType):
    """The slice of the TensorRT Python API that build_engine uses, recording calls."""

    def __init__(self, parse_ok=True, plugin_layers=None):
        super().__init__("tensorrt")
        self.__version__ = "10.99.0"
        self.calls: dict = {"profiles": {}, "flags": set()}
        self.registered: set[str] = set()
        fake = self

        class ILogger:
            def __init__(self):
                pass

        class Tensor:
            def __init__(self, name, dtype="DataType.FLOAT", shape=(-1, -1, 8)):
                self.name, self.dtype, self.shape = name, dtype, shape

        class Layer:
            def __init__(self, type_):
                self.type = type_
                self.name = f"layer_{type_}"
                self.num_inputs = 1
                self.num_outputs = 1

            def get_input(self, i):
                return Tensor("x")

            def get_output(self, i):
                return Tensor("h")

        class Network:
            def __init__(self, flags):
                fake.calls["network_flags"] = flags
                self.layers = []

            @property
            def num_layers(self):
                return len(self.layers)

            def get_layer(self, i):
                return self.layers[i]

            num_inputs = num_outputs = 1

            def get_input(self, i):
                return Tensor("x")

            def get_output(self, i):
                return Tensor("h")

        class Parser:
            def __init__(self, network, logger):
                self.network, self.logger = network, logger
                self.num_errors = 0 if parse_ok else 1

            def set_flag(self, flag):
                fake.calls["flags"].add(flag)

            def parse(self, data, path):
                fake.calls["parsed"] = (onnx.load_from_string(data), path)
                self.logger.log(2, "a parser warning")  # WARNING
                model = fake.calls["parsed"][0]
                n = sum(node.domain == "msar" for node in model.graph.node) if plugin_layers is None else plugin_layers
                self.network.layers = [Layer("plugin_v3")] * n + [Layer("other")]
                return parse_ok

            def get_error(self, i):
                return "In node 0 (importFallbackPluginImporter): UNSUPPORTED_NODE: Plugin not found"

        class Profile:
            def set_shape(self, name, mn, opt, mx):
                fake.calls["profiles"][name] = (list(mn), list(opt), list(mx))

        class Cache:
            def serialize(self):
                return b"timing cache"

        class Config:
            def add_optimization_profile(self, p):
                fake.calls["profile_added"] = True

            def create_timing_cache(self, data):
                fake.calls["cache_in"] = bytes(data)
                return Cache()

            def set_timing_cache(self, cache, ignore_mismatch):
                return True

            def get_timing_cache(self):
                return Cache()

            def set_memory_pool_limit(self, pool, size):
                fake.calls["workspace"] = size

            def set_flag(self, flag):
                fake.calls["flags"].add(("set", flag))

            def clear_flag(self, flag):
                fake.calls["flags"].add(("clear", flag))

        class Builder:
            def __init__(self, logger):
                self.logger = logger

            def create_network(self, flags):
                return Network(flags)

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                return b"serialized engine"

        class Registry:
            def get_creator(self, name, version, namespace):
                return object() if (name, version, namespace) in {(r, "1", "") for r in fake.registered} else None

            def load_library(self, path):
                fake.calls["load_library"] = path

        self.ILogger, self.Builder, self.OnnxParser = ILogger, Builder, Parser
        self.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 5})
        self.OnnxParserFlag = enum.IntEnum("OnnxParserFlag", {"NATIVE_INSTANCENORM": 0, "ENABLE_PLUGIN_OVERRIDE": 3})
        self.LayerType = types.SimpleNamespace(PLUGIN_V3="plugin_v3")
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE="workspace")
        self.BuilderFlag = types.SimpleNamespace(TF32="tf32")
        self._registry = Registry()
        self.get_plugin_registry = lambda: self._registry


@pytest.fixture
def fake_trt(monkeypatch):
    fake = FakeTensorRT()
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    # Loading a plugin library registers its creators (static registration).
    monkeypatch.setattr(loaders_mod.ctypes, "CDLL", lambda path, mode=0: fake.registered.update(
        {"FusedMixer", "DepthRetrieval"}))
    return fake


def test_build_engine_flow(tmp_path, fake_trt):
    model = tiny_onnx(tmp_path / "m.onnx")
    plugin = tmp_path / "libmsar_plugins.so"
    plugin.write_bytes(b"plugin")
    plan = tmp_path / "engines" / "m.plan"
    messages = []
    report = build_engine(model, plan, dtype="float32", shapes="batch=1/2/4,seq=1/16/32", plugin_libs=[plugin],
                          timing_cache=tmp_path / "cache.bin", workspace_gb=1, progress=messages.append)
    assert plan.read_bytes() == b"serialized engine"
    assert (tmp_path / "cache.bin").read_bytes() == b"timing cache"
    assert report.plugin_layers == 1 and len(messages) == 2 and messages[1] == "[TensorRT] a parser warning"
    calls = fake_trt.calls
    assert calls["network_flags"] == 1 << 5  # strongly typed
    # plugin override on the parser; TF32 cleared (float32 stays float32); no other builder flag
    assert calls["flags"] == {fake_trt.OnnxParserFlag.ENABLE_PLUGIN_OVERRIDE, ("clear", "tf32")}
    parsed, path = calls["parsed"]
    assert list(parsed.functions) == [] and path == str(model)  # bodies stripped, path kept for external data
    assert calls["profiles"] == {"x": ([1, 1, 8], [2, 16, 8], [4, 32, 8]),
                                 "attention_mask": ([1, 1], [2, 16], [4, 32])}
    assert calls["workspace"] == 1 << 30
    meta = verify_engine_metadata(plan, model, [plugin], tensorrt_version="10.99.0")
    assert meta.shapes == {"batch": [1, 2, 4], "seq": [1, 16, 32], "past": [0, 0, 0]}
    assert meta.dtype == "float32" and meta.builder["plugin_layers"] == 1
    assert meta.builder["backend"] == "tensorrt" and meta.builder["tf32"] is False
    assert "built" in report.summary()


def test_build_engine_reports_through_progress_and_never_prints(tmp_path, fake_trt, capsys):
    # TensorRT's warnings went to print(), past the caller's progress callback.
    model = tiny_onnx(tmp_path / "m.onnx", custom=False)
    messages = []
    build_engine(model, tmp_path / "m.plan", progress=messages.append)
    assert capsys.readouterr() == ("", "")
    assert "[TensorRT] a parser warning" in messages
    build_engine(model, tmp_path / "n.plan")  # no callback: nothing said, nothing printed
    assert capsys.readouterr() == ("", "")


def test_build_engine_needs_plugins_for_custom_nodes(tmp_path, fake_trt):
    with pytest.raises(OnnxModelError, match="msar::FusedMixer x1.*--plugins"):
        build_engine(tiny_onnx(tmp_path / "m.onnx"), tmp_path / "m.plan")
    build_engine(tiny_onnx(tmp_path / "d.onnx", custom=False), tmp_path / "d.plan")  # decomposed: no plugin needed
    assert (tmp_path / "d.plan").is_file()


def test_build_engine_refuses_a_dtype_mismatch(tmp_path, fake_trt):
    model = tiny_onnx(tmp_path / "m.onnx", custom=False, dtype="float16")
    with pytest.raises(OnnxModelError, match="exported as float16, not bfloat16"):
        build_engine(model, tmp_path / "m.plan", dtype="bfloat16")
    assert not (tmp_path / "m.plan").exists()


def test_build_engine_reports_missing_creators_and_parse_errors(tmp_path, fake_trt, monkeypatch):
    model = tiny_onnx(tmp_path / "m.onnx")
    plugin = tmp_path / "lib.so"
    plugin.write_bytes(b"x")
    monkeypatch.setattr(loaders_mod.ctypes, "CDLL", lambda path, mode=0: None)  # registers nothing
    with pytest.raises(EngineError, match="no TensorRT plugin for FusedMixer"):
        build_engine(model, tmp_path / "m.plan", plugin_libs=[plugin])
    assert fake_trt.calls["load_library"] == str(plugin.resolve())  # the getCreators route was tried

    broken = FakeTensorRT(parse_ok=False)
    broken.registered.update({"FusedMixer"})
    monkeypatch.setitem(sys.modules, "tensorrt", broken)
    with pytest.raises(EngineError, match="could not parse m.onnx: In node 0"):
        build_engine(model, tmp_path / "m.plan", plugin_libs=[plugin])
    inlined = FakeTensorRT(plugin_layers=0)
    inlined.registered.update({"FusedMixer"})
    monkeypatch.setitem(sys.modules, "tensorrt", inlined)
    with pytest.raises(EngineError, match="1 msar custom nodes but the parsed network has 0 plugin layers"):
        build_engine(model, tmp_path / "m.plan", plugin_libs=[plugin])
    assert not (tmp_path / "m.plan").exists()


def test_tensorrt_import_error_is_backend_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(BackendUnavailable, match=r"^TensorRT is not installed \(import tensorrt failed: "):
        TENSORRT.load()


def test_inputs_outside_the_profile_are_refused():
    from msar_export.engines.metadata import EngineMetadata, FileRecord, check_input_shapes
    from msar_export.errors import EngineError

    meta = EngineMetadata("10.0", "float32", FileRecord("m.onnx", "0" * 64), [], "0" * 64,
                          profiles={"input_ids": {"min": [1, 1], "opt": [1, 64], "max": [4, 128]}})
    check_input_shapes(meta, {"input_ids": (4, 128)})
    with pytest.raises(EngineError, match="axis 1 is 129, outside the engine's optimisation profile"):
        check_input_shapes(meta, {"input_ids": (1, 129)})
    with pytest.raises(EngineError, match="rank 3"):
        check_input_shapes(meta, {"input_ids": (1, 2, 3)})
    with pytest.raises(EngineError, match="not an input"):
        check_input_shapes(meta, {"attention_mask": (1, 2)})
