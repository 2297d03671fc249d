"""`msar-export build`: exported ONNX -> TensorRT engine (+ metadata JSON).

TensorRT is imported lazily, so the rest of msar-export works without it.
The network is strongly typed: precision comes from the ONNX file (export it
with `--dtype`), `dtype` here only checks that the file is what you expect.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..log import silent
from ..errors import InputError, OnnxModelError
from ..fileio import check_input_file, check_outputs
from ..graph_file import ExportedGraph
from ..verdict import PRECISIONS
from .backends import BACKENDS, Backend, get_backend
from .loaders import CreateConfig, EngineFromNetwork, EngineInspection, LoadPlugins, NetworkFromOnnx, SaveEngine
from .loaders import make_logger
from .metadata import EngineMetadata, FileRecord, metadata_path, read_metadata
from .onnx_info import OnnxInfo, read_onnx, unimportable
from .profiles import DIM_NAMES, DimRange, default_ranges, input_profiles, parse_profile
from .targets import cc_text, check_compute_capabilities, parse_compute_capabilities


@dataclass
class BuildReport:
    plan: Path
    metadata: Path
    plan_bytes: int
    seconds: float
    plugin_layers: int
    meta: EngineMetadata
    inspection: EngineInspection | None = None

    def summary(self) -> str:
        shapes = ", ".join(f"{k}={'/'.join(map(str, v))}" for k, v in self.meta.shapes.items())
        b = self.meta.builder
        lines = [
            f"built {self.plan} ({self.meta.dtype}, {self.meta.backend.label} {self.meta.tensorrt_version}, "
            f"{self.plan_bytes / 1e6:.1f} MB, {self.seconds:.1f} s)",
            f"  plugin layers: {self.plugin_layers}   profile: {shapes}   tf32: {'on' if b.get('tf32') else 'off'}"
            + (f"   targets: {', '.join(cc_text(n) for n in b['compute_capabilities'])}"
               if b.get("compute_capabilities") else ""),
        ]
        if self.inspection is not None:
            ins = self.inspection
            io = list(ins.io.items())
            if len(io) <= 4:
                io_text = ", ".join(f"{k} {v[0].lower()} {v[1]}" for k, v in io)
            else:
                counts: dict[str, int] = {}
                for _, (mode, t) in io:
                    counts[f"{mode.lower()} {t}"] = counts.get(f"{mode.lower()} {t}", 0) + 1
                io_text = f"{len(io)} I/O tensors (" + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")"
            lines.append(f"  engine: {len(ins.engine_layers)} layers ({len(ins.engine_plugin_layers)} plugin), "
                         + io_text)
        lines.append(f"  metadata: {self.metadata}")
        return "\n".join(lines)


def _check_dtype(info: OnnxInfo, dtype: str | None) -> str:
    if dtype is not None and dtype not in PRECISIONS:
        raise InputError(f"--dtype must be one of {', '.join(PRECISIONS)}, got {dtype!r}")
    if dtype is not None and info.dtype is not None and dtype != info.dtype:
        raise OnnxModelError(f"{info.path.name} was exported as {info.dtype}, not {dtype}: engines are strongly typed "
                             f"and take their precision from the ONNX file; re-export with "
                             f"`msar-export export --dtype {dtype}` or drop --dtype")
    return dtype or info.dtype or "float32"


def build_engine(onnx_path: str | os.PathLike, out_plan: str | os.PathLike, dtype: str | None = None,
                 shapes: dict[str, DimRange] | list[str] | str | None = None,
                 plugin_libs: list[str | os.PathLike] | tuple = (), timing_cache: str | os.PathLike | None = None,
                 workspace_gb: float | None = None, verbose: bool = False,
                 progress: Callable[[str], None] | None = None, backend: Backend | str = "tensorrt",
                 compute_capabilities: list[str] | str | None = None, tf32: bool = False) -> BuildReport:
    """Build `out_plan` from `onnx_path` and write `<out_plan>.json` next to it.

    shapes: min/opt/max per dim name (batch, seq, past), as DimRange objects (the CLI parses
    --profile) or "batch=1/4/8,seq=1/128/512" strings; unspecified dims get defaults.
    plugin_libs: libmsar_plugins.so (needed when the file has msar custom nodes).
    timing_cache: read if it exists, written back after the build.
    backend: a Backend or its name, "tensorrt" or "tensorrt-rtx" (builds without a GPU).
    compute_capabilities: TensorRT-RTX targets, e.g. ["8.6", "12.0"] or parsed ["SM86"] (default: the library's).
    progress: gets every line meant for a person (steps, TensorRT's warnings, with verbose
    its whole log); nothing is printed here.
    tf32: allow TF32 for float32 matmuls (off by default; recorded in the metadata).
    """
    say = progress or silent
    t0 = time.perf_counter()
    onnx_path, out_plan = Path(onnx_path), Path(out_plan)
    backend = get_backend(backend)
    if not onnx_path.is_file():
        raise OnnxModelError(f"ONNX file {onnx_path} does not exist")
    libs = [Path(p).resolve() for p in plugin_libs]
    for lib in libs:
        check_input_file(lib, "--plugins: plugin library")  # build it with cmake (docs/tensorrt.md)
    given = shapes if isinstance(shapes, dict) else parse_profile(shapes)  # user errors before the model is read
    targets = parse_compute_capabilities(compute_capabilities)
    if targets and not backend.targets:
        can = [b for b in BACKENDS.values() if b.targets]
        raise InputError(f"--compute-capability is a {'/'.join(b.label for b in can)} option; add --backend "
                         + " or ".join(b.name for b in can))
    # Opened once, without its weights (the parser reads them from the file): its checked
    # external-data files join the inputs no output may be.
    graph = ExportedGraph.open(onnx_path)
    unimportable(graph)  # a --mixer-op scored file: refused without TensorRT installed too
    inputs = [*graph.files, *libs]
    # The whole output set, before building: plan, metadata and timing cache are each a new or
    # regular file, none of them the ONNX model or a plugin (the cache once replaced the model).
    check_outputs([out_plan, metadata_path(out_plan), timing_cache], inputs)
    trt = backend.load()
    check_compute_capabilities(backend, targets)

    info = read_onnx(graph)
    dtype = _check_dtype(info, dtype)
    if info.custom_ops and not libs:
        ops = ", ".join(f"msar::{k} x{v}" for k, v in sorted(info.custom_ops.items()))
        raise OnnxModelError(f"{onnx_path.name} has msar custom nodes ({ops}); pass --plugins path/to/libmsar_plugins.so "
                             "or export with --decomposed")
    ranges = {**default_ranges(info.graph, info.max_seq_len), **given}
    profiles = input_profiles(info.inputs, ranges)

    logger = make_logger(backend, verbose, echo=say)
    plugins = LoadPlugins(backend, libs, sorted(info.custom_ops)) if libs else None
    network = NetworkFromOnnx(backend, info, logger, plugins, say=say)
    cache = Path(timing_cache) if timing_cache is not None else None
    config = CreateConfig(backend, profiles, tf32=tf32, workspace_gb=workspace_gb, timing_cache=cache,
                          compute_capabilities=targets)
    say(f"parsing {onnx_path} ({info.graph}, {dtype}) and building the engine with {backend.label} "
        f"{trt.__version__}")
    from .. import __version__

    def describe(built, plan_sha256: str) -> str:
        ins = built.inspection
        return EngineMetadata(
            tensorrt_version=trt.__version__, dtype=dtype, onnx=FileRecord.of(onnx_path),
            plugins=[FileRecord.of(lib) for lib in libs], plan_sha256=plan_sha256, profiles=profiles,
            shapes={k: ranges[k].as_list() for k in DIM_NAMES if k in ranges},
            builder={"msar_export": __version__, "graph": info.graph, "plugin_layers": len(ins.plugin_layers),
                     "backend": backend.name, "tf32": bool(tf32), "compute_capabilities": targets,
                     "strongly_typed": True, "inspection": ins.summary(),
                     "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}).to_json()

    built = SaveEngine(EngineFromNetwork(network, config), out_plan, cache, describe, metadata_path(out_plan),
                       inputs)()
    ins = built.inspection
    meta = read_metadata(out_plan)
    return BuildReport(out_plan, metadata_path(out_plan), len(built.plan), time.perf_counter() - t0,
                       len(ins.plugin_layers), meta, ins)
