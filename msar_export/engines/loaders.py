"""The one way msar-export makes a TensorRT network and engine: a chain of lazy
loaders in Polygraphy's style (each is a callable that does its work when
called, taking the loaders before it), for TensorRT and TensorRT-RTX alike.

    plugins = LoadPlugins(backend, libs, needed_ops)
    network = NetworkFromOnnx(backend, info, logger, plugins, outputs=None)   # strongly typed
    config = CreateConfig(backend, profiles, tf32=False, compute_capabilities=[...])
    engine = EngineFromNetwork(network, config)                          # -> BuiltEngine
    SaveEngine(engine, "model.plan")()

`msar-export build` (build_engine) and `msar-export check` (runners.trt) both
use it, so the engine a check builds in memory is typed, profiled and
configured like the one `build` ships. No precision builder flags are set: the
network is strongly typed and takes its precision from the ONNX file. TF32 is
cleared unless asked for (float32 stays float32), and the choice is recorded.

Polygraphy's own loaders are not used for the build because Polygraphy picks
`tensorrt` or `tensorrt_rtx` once per process (POLYGRAPHY_USE_TENSORRT_RTX at
import), while this chain takes the backend it is given (engines.backends.Backend).
"""

from __future__ import annotations

import ctypes
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EngineError
from ..contracts import PLUGIN_NAMESPACE, PLUGIN_VERSION
from ..fileio import atomic_paths
from .backends import Backend
from .onnx_info import OnnxInfo
from .rtx_parser import prepare_rtx_parser
from .targets import apply_compute_capabilities


def make_logger(backend: Backend, verbose: bool = False, echo=None):
    """A trt.ILogger that keeps every message (the engine inspection reads the
    builder's layer report from them), keeps errors for exception messages, and
    hands warnings (everything if verbose) to `echo` (none: kept only)."""
    trt = backend.load()

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []
            self.messages: list[str] = []

        def log(self, severity, msg):
            level = int(severity)  # INTERNAL_ERROR 0, ERROR 1, WARNING 2, INFO 3, VERBOSE 4
            self.messages.append(msg)
            if level <= 1:
                self.errors.append(msg)
            if echo is not None and level <= (4 if verbose else 2):
                echo(f"[{backend.label}] {msg}")

    return Logger()


def _creator(trt, name: str):
    registry = trt.get_plugin_registry()
    get = getattr(registry, "get_creator", None) or registry.get_plugin_creator
    return get(name, PLUGIN_VERSION, PLUGIN_NAMESPACE)


class LoadPlugins:
    """Load plugin libraries; check that every op in `needed` has a creator.

    libmsar_plugins.so registers its creators when it is dlopen-ed (static
    registration); a library that only exports getCreators (the _dynamic
    flavour) is handed to the plugin registry's load_library instead."""

    def __init__(self, backend: Backend, libs: list[Path], needed: list[str]):
        self.backend, self.libs, self.needed = backend, [Path(p) for p in libs], list(needed)

    def __call__(self) -> list[Path]:
        trt = self.backend.load()
        for lib in self.libs:
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            except OSError as e:
                raise EngineError(f"cannot load plugin library {lib}: {e}") from None
        missing = [op for op in self.needed if _creator(trt, op) is None]
        if missing:
            registry = trt.get_plugin_registry()
            for lib in self.libs:
                registry.load_library(str(lib))
            missing = [op for op in self.needed if _creator(trt, op) is None]
        if missing:
            raise EngineError(f"no TensorRT plugin for {', '.join(missing)} (version {PLUGIN_VERSION!r}, namespace "
                              f"{PLUGIN_NAMESPACE!r}) in {', '.join(map(str, self.libs))}; build libmsar_plugins.so "
                              "(docs/tensorrt.md)")
        return self.libs


@dataclass
class PluginLayer:
    """A plugin layer of the parsed network, with what the plugin itself said
    its output is (getOutputDataTypes / getOutputShapes)."""

    name: str
    plugin: str  # creator name, e.g. FusedMixer
    input_dtypes: list[str]
    output_dtype: str
    output_shape: list[int]  # -1: dynamic


@dataclass
class ParsedNetwork:
    builder: object
    network: object
    parser: object
    logger: object
    num_layers: int
    plugin_layers: list[PluginLayer]
    inputs: dict[str, str]  # name -> dtype
    outputs: dict[str, str]


def _dtype_name(t) -> str:
    return str(t).rsplit(".", 1)[-1]


class NetworkFromOnnx:
    """Parse the ONNX file (msar function bodies stripped, see onnx_info) into a
    strongly typed network, with ENABLE_PLUGIN_OVERRIDE where it exists and the
    model path (external data). Checks that every msar node became a plugin
    layer. `outputs`: extra tensors to mark as outputs (e.g. every hidden.{l})."""

    def __init__(self, backend: Backend, info: OnnxInfo, logger, plugins: LoadPlugins | None = None, outputs=None,
                 say=None):
        self.backend, self.info, self.logger, self.plugins = backend, info, logger, plugins
        self.outputs, self.say = list(outputs or ()), say

    def __call__(self) -> ParsedNetwork:
        trt, info = self.backend.load(), self.info
        if self.plugins is not None:
            self.plugins()
        if info.custom_ops:
            prepare_rtx_parser(self.backend, self.say)
        builder = trt.Builder(self.logger)
        flags = 0
        if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # always on from TensorRT 11 / RTX
            flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self.logger)
        if hasattr(trt, "OnnxParserFlag") and hasattr(trt.OnnxParserFlag, "ENABLE_PLUGIN_OVERRIDE"):
            parser.set_flag(trt.OnnxParserFlag.ENABLE_PLUGIN_OVERRIDE)
        if not parser.parse(info.parser_bytes, str(info.path)):
            errors = [" ".join(str(parser.get_error(i)).split()) for i in range(parser.num_errors)]
            raise EngineError(f"TensorRT could not parse {info.path.name}: " + " | ".join(errors[:3])
                              + (f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""))
        if self.outputs:
            self._mark(network)
        plugin_layers = []
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if layer.type == trt.LayerType.PLUGIN_V3:
                out = layer.get_output(0)
                plugin_layers.append(PluginLayer(
                    layer.name, _plugin_name(trt, layer), [_dtype_name(layer.get_input(j).dtype) for j in
                                                      range(layer.num_inputs)],
                    _dtype_name(out.dtype), list(out.shape)))
        expected = sum(info.custom_ops.values())
        if len(plugin_layers) != expected:
            raise EngineError(f"{info.path.name} has {expected} msar custom nodes but the parsed network has "
                              f"{len(plugin_layers)} plugin layers; the parser did not map every node to its plugin")
        io = lambda get, n: {get(i).name: _dtype_name(get(i).dtype) for i in range(n)}  # noqa: E731
        return ParsedNetwork(builder, network, parser, self.logger, network.num_layers, plugin_layers,
                             io(network.get_input, network.num_inputs), io(network.get_output, network.num_outputs))

    def _mark(self, network):
        have = {network.get_output(i).name for i in range(network.num_outputs)}
        tensors = {}
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            for j in range(layer.num_outputs):
                t = layer.get_output(j)
                tensors.setdefault(t.name, t)
        missing = [n for n in self.outputs if n not in have and n not in tensors]
        if missing:
            raise EngineError(f"cannot mark {', '.join(missing)} as outputs: no such tensor in the parsed network")
        for n in self.outputs:
            if n not in have:
                network.mark_output(tensors[n])


def _plugin_name(trt, layer) -> str:
    """The plugin's own name (IPluginV3OneCore.plugin_name) behind a PLUGIN_V3 layer."""
    try:
        layer.__class__ = trt.IPluginV3Layer  # the bindings hand out ILayer; downcast as Polygraphy does
        core = layer.plugin.get_capability_interface(trt.PluginCapabilityType.CORE)
        return str(core.plugin_name)
    except Exception:
        return ""


class CreateConfig:
    """The builder config: one optimisation profile, TF32 cleared unless `tf32`,
    no precision flags, optional workspace limit, timing cache and (TensorRT-RTX)
    target compute capabilities, already checked (targets.check_compute_capabilities); detailed
    profiling so the builder reports its layers."""

    def __init__(self, backend: Backend, profiles: dict, tf32: bool = False, workspace_gb: float | None = None,
                 timing_cache: Path | None = None, compute_capabilities: list[str] | None = None):
        self.backend, self.profiles, self.tf32 = backend, profiles, tf32
        self.workspace_gb, self.timing_cache = workspace_gb, timing_cache
        self.compute_capabilities = list(compute_capabilities or [])

    def __call__(self, builder, network):
        trt = self.backend.load()
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        for name, p in self.profiles.items():
            profile.set_shape(name, p["min"], p["opt"], p["max"])
        config.add_optimization_profile(profile)
        if hasattr(getattr(trt, "BuilderFlag", None), "TF32"):
            (config.set_flag if self.tf32 else config.clear_flag)(trt.BuilderFlag.TF32)
        if hasattr(trt, "ProfilingVerbosity"):
            config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        if self.workspace_gb is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(self.workspace_gb * (1 << 30)))
        if self.timing_cache is not None:
            data = Path(self.timing_cache).read_bytes() if Path(self.timing_cache).is_file() else b""
            config.set_timing_cache(config.create_timing_cache(data), ignore_mismatch=False)
        apply_compute_capabilities(trt, config, self.compute_capabilities)
        return config


@dataclass
class EngineInspection:
    """What the builder reported about the engine it built (its detailed layer
    report) and what the parsed network said, without deserialising the engine
    (which needs a GPU)."""

    network_layers: int
    plugin_layers: list[PluginLayer]
    engine_layers: list[tuple[str, str]] = field(default_factory=list)  # (name, layer type) as the builder reports
    io: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (Input|Output, dtype)
    plan_plugin_names: dict[str, int] = field(default_factory=dict)  # plugin name -> occurrences in the plan

    @property
    def engine_plugin_layers(self) -> list[str]:
        """Engine layers that are plugins (TensorRT-RTX: custom_layer; TensorRT: PluginV3)."""
        return [n for n, t in self.engine_layers if t.lower() in ("custom_layer", "pluginv3", "plugin_v3", "plugin")]

    def summary(self) -> dict:
        return {"network_layers": self.network_layers, "engine_layers": len(self.engine_layers),
                "engine_plugin_layers": len(self.engine_plugin_layers),
                "plugin_layers": [{"name": p.name, "plugin": p.plugin, "output_dtype": p.output_dtype,
                                   "output_shape": p.output_shape} for p in self.plugin_layers],
                "io": {k: list(v) for k, v in self.io.items()}}


_RTX_LAYER = re.compile(r"^Name: (.*?), LayerType: (\w+),")
_TRT_LAYER = re.compile(r"^Layer\((\w+)\): (.*?), Tactic:")
_IO = re.compile(r"Name: (.*?), IOMode: (Input|Output), DataType: (\w+),")


def inspect_build_log(messages: list[str]) -> tuple[list[tuple[str, str]], dict[str, tuple[str, str]]]:
    """Engine layers and I/O tensors from the builder's detailed layer report."""
    layers, io = [], {}
    for msg in messages:
        for line in msg.splitlines():
            line = line.strip()
            m = _RTX_LAYER.match(line)
            if m:
                layers.append((m.group(1), m.group(2)))
                continue
            m = _TRT_LAYER.match(line)
            if m:
                layers.append((m.group(2), m.group(1)))
                continue
            m = _IO.search(line)
            if m:
                io[m.group(1)] = (m.group(2), m.group(3))
    return layers, io


@dataclass
class BuiltEngine:
    plan: bytes
    network: ParsedNetwork
    config: object
    inspection: EngineInspection
    seconds: float


class EngineFromNetwork:
    """Build the serialised engine; report what the builder built."""

    def __init__(self, network: NetworkFromOnnx, config: CreateConfig):
        self.network_loader, self.config_loader = network, config

    def __call__(self) -> BuiltEngine:
        net = self.network_loader()
        config = self.config_loader(net.builder, net.network)
        start = len(net.logger.messages)
        t0 = time.perf_counter()
        serialized = net.builder.build_serialized_network(net.network, config)
        seconds = time.perf_counter() - t0
        if serialized is None:
            raise EngineError("TensorRT failed to build the engine: "
                              + (" | ".join(" ".join(e.split()) for e in net.logger.errors[-3:]) or "no message"))
        plan = bytes(memoryview(serialized))
        layers, io = inspect_build_log(net.logger.messages[start:])
        names = {p.plugin for p in net.plugin_layers if p.plugin}
        inspection = EngineInspection(net.num_layers, net.plugin_layers, layers, io,
                                      {n: plan.count(n.encode()) for n in sorted(names)})
        return BuiltEngine(plan, net, config, inspection, seconds)


class SaveEngine:
    """Write the plan, its metadata file (`describe(built, plan_sha256)` gives the text) and the
    updated timing cache as one output set: temporaries renamed into place together, so a
    failure on one (a FIFO, a directory) leaves every old file as it was."""

    def __init__(self, engine: EngineFromNetwork, path: Path, timing_cache: Path | None = None,
                 describe=None, meta_path: Path | None = None, inputs=()):
        self.engine_loader, self.path, self.timing_cache = engine, Path(path), timing_cache
        self.describe, self.meta_path, self.inputs = describe, meta_path, list(inputs)

    def __call__(self) -> BuiltEngine:
        import hashlib

        built = self.engine_loader()
        files = {self.path: built.plan}
        if self.describe is not None:
            files[self.meta_path] = self.describe(built, hashlib.sha256(built.plan).hexdigest()).encode()
        if self.timing_cache is not None:
            files[self.timing_cache] = bytes(memoryview(built.config.get_timing_cache().serialize()))
        with atomic_paths(list(files), self.inputs) as tmps:
            for tmp, data in zip(tmps, files.values()):
                tmp.write_bytes(data)
        return built
