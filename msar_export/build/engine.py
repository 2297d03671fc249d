"""`msar-export build`: exported ONNX -> TensorRT engine (+ metadata JSON).

TensorRT is imported lazily, so the rest of msar-export works without it.
The network is strongly typed: precision comes from the ONNX file (export it
with `--dtype`), `dtype` here only checks that the file is what you expect.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BackendUnavailable, EngineError, InputError, OnnxModelError
from ..export.contracts import PLUGIN_NAMESPACE, PLUGIN_VERSION
from ..fileio import atomic_write_bytes
from .metadata import EngineMetadata, FileRecord, metadata_path, sha256_file, write_metadata
from .onnx_info import OnnxInfo, read_onnx
from .profiles import DIM_NAMES, DimRange, default_ranges, input_profiles, parse_shapes

DTYPES = ("float32", "float16", "bfloat16")


def import_tensorrt():
    """`import tensorrt`, or BackendUnavailable with what to do."""
    try:
        import tensorrt
    except Exception as e:  # ImportError, or OSError from a broken install's libraries
        raise BackendUnavailable(f"TensorRT is not installed (import tensorrt failed: {e}); "
                                 "build engines on a machine with TensorRT") from None
    return tensorrt


@dataclass
class BuildReport:
    plan: Path
    metadata: Path
    plan_bytes: int
    seconds: float
    plugin_layers: int
    meta: EngineMetadata

    def summary(self) -> str:
        shapes = ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in self.meta.shapes.items())
        return "\n".join([
            f"built {self.plan} ({self.meta.dtype}, TensorRT {self.meta.tensorrt_version}, "
            f"{self.plan_bytes / 1e6:.1f} MB, {self.seconds:.1f} s)",
            f"  plugin layers: {self.plugin_layers}   profile: {shapes}",
            f"  metadata: {self.metadata}",
        ])


def _creator(trt, name: str):
    registry = trt.get_plugin_registry()
    get = getattr(registry, "get_creator", None) or registry.get_plugin_creator
    return get(name, PLUGIN_VERSION, PLUGIN_NAMESPACE)


def load_plugins(trt, libs: list[Path], needed: list[str]) -> None:
    """Load plugin libraries and check that every op in `needed` has a creator.

    libmsar_plugins.so registers its creators when it is loaded (static
    registration); a library that only exports getCreators (the _dynamic
    flavour) is handed to the plugin registry's load_library instead."""
    for lib in libs:
        try:
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise EngineError(f"cannot load plugin library {lib}: {e}") from None
    missing = [op for op in needed if _creator(trt, op) is None]
    if missing:
        registry = trt.get_plugin_registry()
        for lib in libs:
            registry.load_library(str(lib))
        missing = [op for op in needed if _creator(trt, op) is None]
    if missing:
        raise EngineError(f"no TensorRT plugin for {', '.join(missing)} (version {PLUGIN_VERSION!r}, namespace "
                          f"{PLUGIN_NAMESPACE!r}) in {', '.join(map(str, libs))}; build libmsar_plugins.so "
                          "(docs/tensorrt.md)")


def make_logger(trt, verbose: bool = False):
    """A trt.ILogger that prints warnings (everything if verbose) and keeps errors for the exception message."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg):
            level = int(severity)  # INTERNAL_ERROR 0, ERROR 1, WARNING 2, INFO 3, VERBOSE 4
            if level <= 1:
                self.errors.append(msg)
            if level <= (4 if verbose else 2):
                print(f"[TensorRT] {msg}", flush=True)

    return Logger()


def _check_dtype(info: OnnxInfo, dtype: str | None) -> str:
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype is not None and info.dtype is not None and dtype != info.dtype:
        raise OnnxModelError(f"{info.path.name} was exported as {info.dtype}, not {dtype}: engines are strongly typed "
                             f"and take their precision from the ONNX file; re-export with "
                             f"`msar-export export --dtype {dtype}` or drop --dtype")
    return dtype or info.dtype or "float32"


def _ranges(info: OnnxInfo, shapes) -> dict[str, DimRange]:
    ranges = default_ranges(info.graph, info.max_seq_len)
    ranges.update(shapes if isinstance(shapes, dict) else parse_shapes(shapes))
    return ranges


def build_engine(onnx_path: str | os.PathLike, out_plan: str | os.PathLike, dtype: str | None = None,
                 shapes: dict[str, DimRange] | list[str] | str | None = None,
                 plugin_libs: list[str | os.PathLike] | tuple = (), timing_cache: str | os.PathLike | None = None,
                 workspace_gb: float | None = None, verbose: bool = False,
                 progress: Callable[[str], None] | None = None) -> BuildReport:
    """Build `out_plan` from `onnx_path` and write `<out_plan>.json` next to it.

    shapes: min/opt/max per dim name (batch, seq, past), as DimRange objects or
    "batch=1/4/8,seq=1/128/512" strings; unspecified dims get defaults.
    plugin_libs: libmsar_plugins.so (needed when the file has msar custom nodes).
    timing_cache: read if it exists, written back after the build.
    """
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    onnx_path, out_plan = Path(onnx_path), Path(out_plan)
    if not onnx_path.is_file():
        raise OnnxModelError(f"ONNX file {onnx_path} does not exist")
    libs = [Path(p).resolve() for p in plugin_libs]
    for lib in libs:
        if not lib.is_file():
            raise InputError(f"plugin library {lib} does not exist; build it with cmake (docs/tensorrt.md)")
    if out_plan.resolve() == onnx_path.resolve():
        raise InputError("the engine path is the ONNX path; choose another -o")
    if isinstance(shapes, (str, list)):
        parse_shapes(shapes)  # user errors before the slow parts
    trt = import_tensorrt()

    info = read_onnx(onnx_path)
    dtype = _check_dtype(info, dtype)
    if info.custom_ops and not libs:
        ops = ", ".join(f"msar::{k} x{v}" for k, v in sorted(info.custom_ops.items()))
        raise OnnxModelError(f"{onnx_path.name} has msar custom nodes ({ops}); pass --plugins path/to/libmsar_plugins.so "
                             "or export with --decomposed")
    ranges = _ranges(info, shapes)
    profiles = input_profiles(info.inputs, ranges)
    if libs:
        load_plugins(trt, libs, sorted(info.custom_ops))

    logger = make_logger(trt, verbose)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # always on from TensorRT 11
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if hasattr(trt, "OnnxParserFlag") and hasattr(trt.OnnxParserFlag, "ENABLE_PLUGIN_OVERRIDE"):
        parser.set_flag(trt.OnnxParserFlag.ENABLE_PLUGIN_OVERRIDE)

    say(f"parsing {onnx_path} ({info.graph}, {dtype})")
    if not parser.parse(info.parser_bytes, str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineError(f"TensorRT could not parse {onnx_path.name}: " + " | ".join(errors[:3])
                          + (f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""))
    plugin_layers = sum(network.get_layer(i).type == trt.LayerType.PLUGIN_V3 for i in range(network.num_layers))
    expected = sum(info.custom_ops.values())
    if plugin_layers != expected:
        raise EngineError(f"{onnx_path.name} has {expected} msar custom nodes but the parsed network has "
                          f"{plugin_layers} plugin layers; the parser did not map every node to its plugin")

    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, p in profiles.items():
        profile.set_shape(name, p["min"], p["opt"], p["max"])
    config.add_optimization_profile(profile)
    if workspace_gb is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    if timing_cache is not None:
        cache_bytes = Path(timing_cache).read_bytes() if Path(timing_cache).is_file() else b""
        config.set_timing_cache(config.create_timing_cache(cache_bytes), ignore_mismatch=False)

    say("building the engine (this takes a while)")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError("TensorRT failed to build the engine: " + (" | ".join(logger.errors[-3:]) or "no message"))
    plan_data = bytes(memoryview(serialized))

    atomic_write_bytes(out_plan, plan_data)
    if timing_cache is not None:
        atomic_write_bytes(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    from .. import __version__

    meta = EngineMetadata(
        tensorrt_version=trt.__version__, dtype=dtype, onnx=FileRecord.of(onnx_path),
        plugins=[FileRecord.of(lib) for lib in libs], plan_sha256=sha256_file(out_plan), profiles=profiles,
        shapes={k: ranges[k].as_list() for k in DIM_NAMES if k in ranges},
        builder={"msar_export": __version__, "graph": info.graph, "plugin_layers": plugin_layers,
                 "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    write_metadata(out_plan, meta)
    return BuildReport(out_plan, metadata_path(out_plan), len(plan_data), time.perf_counter() - t0, plugin_layers, meta)
