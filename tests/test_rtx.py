"""Every exported graph kind meets a real TensorRT: the TensorRT-RTX parser and
builder (`pip install -e '.[rtx]'`, no GPU needed), and the plugins' own rules.

Graphs: odd-size models (d_model 40, 2 blocks, kernels [1, 3, 5]) of all three
residual kinds; prefill (FusedMixer, --mixer-op retrieval, --decomposed) and
decode (KV cache + conv state, past length 0..max); float32/float16/bfloat16.

- Every msar node of every graph satisfies the plugins' attribute, type and
  shape rules, computed by the plugins' TensorRT-free rule code
  (plugins/tests/nodeRules.cpp, built through plugins/CMakeLists.txt; needs g++,
  cmake and ninja).
- Graphs without msar nodes build; the engine's I/O tensors and their types
  (from the builder's layer report) are compared with the ONNX file's.
- Graphs with msar nodes: without the plugin library the parser's own error
  names the op; with it (needs TensorRT headers in TENSORRT_INCLUDE_DIR, nvcc
  and cmake, so not in CI) they build with one plugin layer per msar node in
  the network and in the engine, each with the output type the ONNX file declares.
Engines are built, never run (that needs an RTX-class GPU).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from msar_export.engines import build_engine
from msar_export.engines.backends import TENSORRT_RTX
from msar_export.engines.cuda import cannot_run_reason
from msar_export.engines.targets import parse_compute_capabilities
from msar_export import kernels as K
from msar_export.errors import EngineError, InputError
from msar_export.contracts import CONTRACTS, DOMAIN
from msar_export.export.exporter import ExportOptions, export_checkpoint

sys.path.insert(0, str(Path(__file__).parent))
from conftest import make_checkpoint  # noqa: E402
from plugin_build import built  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "plugins"
HAVE_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
needs_rtx = pytest.mark.skipif(not HAVE_RTX, reason="tensorrt_rtx is not installed (pip install -e '.[rtx]')")

# (kind, graph, variant, dtype); variant: fused / retrieval / decomposed for msar
# prefill, custom / decomposed otherwise, plain for standard (no msar node ever).
GRAPHS = [
    ("msar", "prefill", "fused", "float32"),
    ("msar", "prefill", "fused", "float16"),
    ("msar", "prefill", "retrieval", "bfloat16"),
    ("msar", "prefill", "decomposed", "float32"),
    ("msar", "decode", "custom", "float32"),
    ("msar", "decode", "custom", "float16"),
    ("msar", "decode", "decomposed", "bfloat16"),
    ("attnres", "prefill", "custom", "float16"),
    ("attnres", "prefill", "decomposed", "bfloat16"),
    ("attnres", "decode", "custom", "bfloat16"),
    ("attnres", "decode", "decomposed", "float32"),
    ("standard", "prefill", "plain", "float32"),
    ("standard", "decode", "plain", "float16"),
]
IDS = ["-".join(g) for g in GRAPHS]
# One graph per op and path in the default tier; the other precisions and kinds are the slow tier.
FAST = {("msar", "prefill", "fused", "float32"), ("msar", "decode", "custom", "float16"),
        ("msar", "prefill", "decomposed", "float32"), ("attnres", "decode", "custom", "bfloat16"),
        ("attnres", "decode", "decomposed", "float32"), ("standard", "prefill", "plain", "float32")}
pytestmark = pytest.mark.trt


def graph_params(variants) -> list:
    return [pytest.param(g, id=i, marks=() if g in FAST else pytest.mark.slow)
            for g, i in zip(GRAPHS, IDS) if g[2] in variants]
PROFILE = {"prefill": "batch=1/1/2,seq=1/8/16", "decode": "batch=1/1/2,seq=1/1/4,past=0/8/16"}
TRT_DTYPE = {onnx.TensorProto.FLOAT: "Float", onnx.TensorProto.FLOAT16: "Half",
             onnx.TensorProto.BFLOAT16: "BFloat16", onnx.TensorProto.INT64: "Int64"}
PLUGIN_DTYPE = {onnx.TensorProto.FLOAT: "FLOAT", onnx.TensorProto.FLOAT16: "HALF",
                onnx.TensorProto.BFLOAT16: "BF16"}
RULE_DTYPE = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
              onnx.TensorProto.BFLOAT16: "bfloat16"}


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """graphs[(kind, graph, variant, dtype)] -> ONNX path, exported on first use; graphs["ckpt", kind] -> checkpoint."""
    root = tmp_path_factory.mktemp("rtx")

    class Graphs(dict):
        def __missing__(self, key):
            if key[0] == "ckpt":
                self[key] = make_checkpoint(root / key[1], seed=5, residual=key[1])[0]
                return self[key]
            kind, graph, variant, dtype = key
            opts = ExportOptions(decode=graph == "decode", decomposed=variant == "decomposed", dtype=dtype,
                                 mixer_op="retrieval" if variant == "retrieval" else "fused")
            path = root / f"{kind}-{graph}-{variant}-{dtype}.onnx"
            export_checkpoint(self["ckpt", kind], path, opts, validate=False)
            self[key] = path
            return path

    return Graphs()


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The msar nodes a plugin implements (SourceViews has none: the parser imports its body)."""
    return [n for n in model.graph.node if n.domain == DOMAIN and CONTRACTS[n.op_type].plugin]


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type for v in [*g.value_info, *g.input, *g.output]}
    for t in g.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
    return types


def dims_text(tp: onnx.TypeProto) -> str:
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tp.tensor_type.shape.dim]
    return "x".join(map(str, dims)) if dims else "scalar"


# ---------------------------------------------------------------------------
# The plugins' own rules, on every msar node of every graph


@pytest.fixture(scope="module")
def node_rules() -> Path:
    return built("nodeRules")


def rule_lines(model: onnx.ModelProto) -> list[str]:
    types = value_types(model)
    lines = []
    for node in custom_nodes(model):
        fields = [node.op_type]
        for a in node.attribute:
            if a.type == onnx.AttributeProto.INTS:
                fields.append(f"i {a.name}={','.join(map(str, a.ints))}")
            elif a.type == onnx.AttributeProto.FLOAT:
                fields.append(f"f {a.name}={a.f!r}")
            elif a.type == onnx.AttributeProto.STRING:
                fields.append(f"s {a.name}={a.s.decode()}")
        for name in node.input:
            tp = types[name]
            fields.append(f"t {RULE_DTYPE.get(tp.tensor_type.elem_type, 'other')} {dims_text(tp)}")
        lines.append(";".join(fields))
    return lines


def run_rules(exe: Path, lines: list[str]) -> list[str]:
    r = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_rule_checker_refuses_mixed_types_and_bad_shapes(node_rules):
    """Negative control: the float16 query with float32 views that the decode and
    attnres exports used to write, a wrong view width, an unknown attribute."""
    out = run_rules(node_rules, [
        "DepthRetrieval;f eps=1e-06;t float16 3x40;t float32 -1x-1x3x40",
        "DepthRetrieval;f eps=1e-06;t float32 3x40;t float32 -1x-1x3x41",
        "FusedMixer;i stream_kernels=1,3,5;f eps=1e-06;i width=4;t float32 3x40;t float32 3x120;t float32 3;"
        "t float32 scalar;t float32 5x8x40;t float32 -1x-1x40",
    ])
    assert out[0] == "error DepthRetrieval: all inputs must share one data type (input 1 is float32, input 0 is float16)"
    assert out[1].startswith("error DepthRetrieval:") and "views_0" in out[1]
    assert out[2].startswith("error FusedMixer:") and "width" in out[2]


@pytest.mark.parametrize("key", graph_params(("fused", "retrieval", "custom")))
def test_every_custom_node_meets_the_plugin_rules(graphs, node_rules, key):
    model = onnx.load(str(graphs[key]))
    nodes = custom_nodes(model)
    assert nodes, "a custom-op export without msar nodes"
    types = value_types(model)
    results = run_rules(node_rules, rule_lines(model))
    assert len(results) == len(nodes)
    for node, res in zip(nodes, results):
        assert res.startswith("ok "), f"{node.name} ({node.op_type}): {res}"
        _, dtype, shape = res.split(" ")
        declared = types[node.output[0]]
        assert dtype == RULE_DTYPE[declared.tensor_type.elem_type] == key[3], (node.name, res)  # views too
        want = dims_text(declared).split("x")
        for got_d, want_d in zip(shape.split("x"), want):
            assert want_d == "-1" or got_d == want_d, (node.name, res, want)
        assert len(shape.split("x")) == len(want)


# ---------------------------------------------------------------------------
# The real TensorRT-RTX parser and builder


def expected_io(model: onnx.ModelProto) -> dict[str, tuple[str, str]]:
    inits = {t.name for t in model.graph.initializer}
    io = {v.name: ("Input", TRT_DTYPE[v.type.tensor_type.elem_type]) for v in model.graph.input if v.name not in inits}
    io.update({v.name: ("Output", TRT_DTYPE[v.type.tensor_type.elem_type]) for v in model.graph.output})
    return io


@needs_rtx
@pytest.mark.parametrize("key", graph_params(("decomposed", "plain")))
def test_graphs_without_msar_nodes_build(graphs, tmp_path, key):
    path = graphs[key]
    model = onnx.load(str(path))
    assert not custom_nodes(model)
    plan = tmp_path / "m.plan"
    report = build_engine(path, plan, shapes=PROFILE[key[1]], backend="tensorrt-rtx", compute_capabilities=["8.6"])
    ins = report.inspection
    assert plan.stat().st_size == report.plan_bytes > 10_000
    assert ins.plugin_layers == [] and ins.engine_plugin_layers == []
    assert len(ins.engine_layers) >= 5 and ins.network_layers > 50
    assert ins.io == expected_io(model)
    meta = report.meta
    assert meta.dtype == key[3] and meta.builder["backend"] == "tensorrt-rtx" and meta.builder["tf32"] is False
    assert meta.builder["compute_capabilities"] == ["SM86"]
    if key[1] == "decode":  # past length 0..max in the profile, for every cache input
        past = [n for n in meta.profiles if n.startswith("past_key_values")]
        assert past and all(meta.profiles[n]["min"][2] == 0 and meta.profiles[n]["max"][2] == 16 for n in past)
        assert meta.profiles["attention_mask"]["max"] == [2, 20]


@needs_rtx
@pytest.mark.parametrize("key", [("msar", "prefill", "fused", "float32"), ("attnres", "decode", "custom", "bfloat16")],
                         ids=["msar-prefill-fused", "attnres-decode-custom"])
def test_msar_nodes_without_plugins_fail_with_the_parsers_error(graphs, key):
    from msar_export.engines.loaders import NetworkFromOnnx, make_logger
    from msar_export.engines.onnx_info import read_onnx

    info = read_onnx(graphs[key])
    op = sorted(info.custom_ops)[0]
    msgs = []
    with pytest.raises(EngineError) as e:
        NetworkFromOnnx(TENSORRT_RTX, info, make_logger(TENSORRT_RTX, echo=msgs.append))()
    text = str(e.value)
    assert text.startswith(f"TensorRT could not parse {graphs[key].name}: ")
    assert op in text and "plugin" in text.lower(), text


def test_build_refuses_msar_nodes_without_plugins_before_tensorrt(graphs, tmp_path):
    from msar_export.errors import OnnxModelError

    with pytest.raises(OnnxModelError, match=r"msar::FusedMixer x5.*--plugins"):
        build_engine(graphs[("msar", "prefill", "fused", "float32")], tmp_path / "m.plan", backend="tensorrt-rtx")


# ---------------------------------------------------------------------------
# With the plugin library (TensorRT headers needed: not in CI)


@pytest.fixture(scope="module")
def plugin_library() -> Path:
    inc = os.environ.get("TENSORRT_INCLUDE_DIR")
    if not HAVE_RTX:
        pytest.skip("tensorrt_rtx is not installed")
    if not inc or not (Path(inc) / "NvInferRuntime.h").is_file():
        pytest.skip("TENSORRT_INCLUDE_DIR is not set to TensorRT headers (they cannot be fetched in CI): "
                    "the plugin library cannot be built, so custom-op engines are not built here")
    if shutil.which("nvcc") is None or shutil.which("cmake") is None:
        pytest.skip("nvcc and cmake are needed to build the plugin library")
    import tensorrt_rtx_libs

    lib = Path(tensorrt_rtx_libs.__file__).parent / "libtensorrt_rtx.so.1"
    build = K.CMakeBuild(PLUGINS, tensorrt_include=inc, cuda_architectures="86", defines={"TensorRT_NVINFER": lib})
    return build.built("msar_plugins")


@pytest.mark.parametrize("key", graph_params(("fused", "retrieval", "custom")))
def test_custom_op_graphs_build_with_plugin_layers(graphs, plugin_library, tmp_path, key):
    """In a subprocess: a parser that aborts (the crash this fixed) fails the test
    instead of killing pytest."""
    path, plan = graphs[key], tmp_path / "m.plan"
    code = (f"from msar_export.engines import build_engine\n"
            f"import json, sys\n"
            f"r = build_engine({str(path)!r}, {str(plan)!r}, shapes={PROFILE[key[1]]!r}, "
            f"plugin_libs=[{str(plugin_library)!r}], backend='tensorrt-rtx')\n"
            f"json.dump({{'inspection': r.inspection.summary(), 'engine_plugin_layers': r.inspection.engine_plugin_layers, "
            f"'plan_plugin_names': r.inspection.plan_plugin_names}}, sys.stdout)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    model = onnx.load(str(path))
    nodes = custom_nodes(model)
    types = value_types(model)
    layers = got["inspection"]["plugin_layers"]
    assert len(layers) == len(nodes)
    for layer, node in zip(layers, nodes):  # the parser keeps node order
        assert layer["plugin"] == node.op_type
        assert layer["output_dtype"] == PLUGIN_DTYPE[types[node.output[0]].tensor_type.elem_type], layer
        want = dims_text(types[node.output[0]]).split("x")
        assert len(layer["output_shape"]) == len(want)
        assert all(w == "-1" or int(w) == g for g, w in zip(layer["output_shape"], want)), (layer, want)
    assert len(got["engine_plugin_layers"]) == len(nodes)
    assert {k: tuple(v) for k, v in got["inspection"]["io"].items()} == expected_io(model)
    assert all(got["plan_plugin_names"][op] >= 1 for op in {n.op_type for n in nodes})


# ---------------------------------------------------------------------------
# check --engine on a TensorRT-RTX engine, on a machine that cannot run it


@needs_rtx
@pytest.mark.parametrize("key", [("msar", "prefill", "decomposed", "float32"),
                                 ("attnres", "decode", "decomposed", "float32")], ids=["prefill", "decode"])
def test_check_engine_verifies_metadata_and_says_it_did_not_run(graphs, tmp_path, capsys, key):
    from msar_export.cli import main

    reason = cannot_run_reason(TENSORRT_RTX)
    if reason is None:
        pytest.skip("an RTX-class GPU is present: the engine would run")
    onnx_path, plan = graphs[key], tmp_path / "m.plan"
    shapes = "batch=1/1/4,seq=1/8/64" if key[1] == "prefill" else PROFILE["decode"]
    assert main(["build", str(onnx_path), "-o", str(plan), "--backend", "tensorrt-rtx", "--profile", shapes]) == 0
    out = capsys.readouterr().out
    assert "TensorRT-RTX 1." in out and "tf32: off" in out
    ckpt = graphs[("ckpt", key[0])]
    rc = main(["check", str(ckpt), "--onnx", str(onnx_path), "--engine", str(plan)])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if "TensorRT" in ln and "skipped" in ln]
    assert len(lines) == 1, out
    assert (f"engine m.plan (TensorRT-RTX 1.7.1.116, {key[3]}, 0 plugin layers) matches its build record; "
            f"built, not run: {reason}") in lines[0]
    plan.write_bytes(plan.read_bytes() + b"x")  # an edited plan: refused, whatever the machine
    assert main(["check", str(ckpt), "--onnx", str(onnx_path), "--engine", str(plan)]) == 2
    err = capsys.readouterr().err
    assert "engine file changed after it was built" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------
# generate --engine: the shared decode loop over a TensorRT runner


class OrtAsRunner:
    """Polygraphy's runner interface over an ONNX Runtime session of the same graph,
    so TrtDecoder's feeds, cache bookkeeping and loop run for real here."""

    def __init__(self, path):
        from msar_export.runtime import open_session

        self.session = open_session(path, None, 2, "all")
        self.names = [o.name for o in self.session.get_outputs()]
        self.active = False

    def __enter__(self):
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False

    def infer(self, feed_dict):
        assert self.active, "used outside its context"
        return dict(zip(self.names, self.session.run(self.names, feed_dict)))


@needs_rtx
def test_generate_engine_decode_loop(graphs, tmp_path, capsys):
    from msar_export.cli import main
    from msar_export.runners.trt import TrtDecoder
    from msar_export.runtime import OrtDecoder

    onnx_path, plan = graphs[("attnres", "decode", "decomposed", "float32")], tmp_path / "d.plan"
    assert main(["build", str(onnx_path), "-o", str(plan), "--backend", "tensorrt-rtx",
                 "--profile", "batch=1/1/2,seq=1/1/8,past=0/8/24"]) == 0
    capsys.readouterr()
    ids = [[3, 14, 15, 9, 26]]
    dec = TrtDecoder(plan, onnx_path, runner=OrtAsRunner(onnx_path))
    got = dec.generate(ids, max_new_tokens=6)
    want = OrtDecoder(onnx_path).generate(ids, max_new_tokens=6)
    assert got.tolist() == want.tolist() and got.shape == (1, 11)
    from msar_export.errors import EngineError

    with pytest.raises(EngineError, match="outside the engine's optimisation profile"):
        dec.generate([[1] * 20], max_new_tokens=8)  # prompt 20 > seq max 8
    reason = cannot_run_reason(TENSORRT_RTX)
    if reason is not None:  # no GPU: one line, exit 2, after the build record was checked
        rc = main(["generate", "--onnx", str(onnx_path), "--engine", str(plan), "--max-new-tokens", "2"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
        assert err.endswith(f"matches its build record; built, not run: {reason}")


# ---------------------------------------------------------------------------
# Small pieces


def test_parse_compute_capabilities():
    assert parse_compute_capabilities(["8.6,12.0", "86"]) == ["SM86", "SM120"]
    assert parse_compute_capabilities(None) == []
    with pytest.raises(InputError, match="MAJOR.MINOR"):
        parse_compute_capabilities("sm_86")


@needs_rtx
def test_build_refuses_an_unknown_compute_capability_in_one_line(graphs, tmp_path, capsys):
    from msar_export.cli import main

    onnx_path = graphs[("standard", "prefill", "plain", "float32")]
    rc = main(["build", str(onnx_path), "-o", str(tmp_path / "m.plan"), "--backend", "tensorrt-rtx",
               "--compute-capability", "9.0"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("msar-export build: error: --compute-capability: 9.0 is not a target of this TensorRT-RTX")
    assert "8.6" in err and not list(tmp_path.iterdir())
    assert main(["build", str(onnx_path), "-o", str(tmp_path / "m.plan"), "--compute-capability", "8.6"]) == 2
    assert "add --backend tensorrt-rtx" in capsys.readouterr().err


def test_no_gpu_here_is_named():
    reason = cannot_run_reason(TENSORRT_RTX)
    if reason is None:
        pytest.skip("an RTX-class GPU is present")
    assert reason and "\n" not in reason
