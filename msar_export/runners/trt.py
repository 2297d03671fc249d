"""TensorRT (or TensorRT-RTX) through Polygraphy's `TrtRunner`.  The TensorRT
modules are imported only here and only when asked for, so a machine without
them runs everything else.

Engines are made by the same loader chain as `msar-export build`
(msar_export.engines.loaders: strongly typed, no precision flags, TF32 off, the
plugins loaded by LoadPlugins); Polygraphy only deserialises and runs them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from ..engines.backends import BACKENDS, TENSORRT, Backend, installed_backends
from ..errors import BackendUnavailable, InputError
from ..fileio import check_input_file
from ..graph_spec import LOGITS, GraphSpec


def tensorrt_unavailable() -> str | None:
    """None when a TensorRT engine can be built and run here (TensorRT or
    TensorRT-RTX imports, and a GPU it runs on is present), else the reason (used
    verbatim in reports)."""
    backend = choose_backend()
    if backend is None:
        return TENSORRT.unavailable()
    return engine_not_run_reason(None, None, backend)


def choose_backend() -> Backend | None:
    """The backend an in-memory check engine is built with: TensorRT, else TensorRT-RTX, else None."""
    have = installed_backends()
    return have[0] if have else None


def engine_not_run_reason(engine_path, meta, backend: Backend | None = None) -> str | None:
    """Why an engine (built, or about to be built) cannot run here; None when it can.

    For a built engine the reason says it was built and checked against its
    metadata, so `check --engine` reports in one line what it did and did not do."""
    from ..engines.cuda import cannot_run_reason

    backend = backend or meta.backend
    why = backend.unavailable() or cannot_run_reason(backend, meta.builder.get("compute_capabilities")
                                                     if meta is not None else None)
    if why is None:
        return None
    if engine_path is None:
        return f"{backend.label} cannot run an engine here: {why}"
    return (f"engine {Path(engine_path).name} ({backend.label} {meta.tensorrt_version}, {meta.dtype}, "
            f"{meta.builder.get('plugin_layers', 0)} plugin layers) matches its build record; built, not run: {why}")


def check_plugin_paths(plugins) -> list[str]:
    """Plugin libraries must exist before TensorRT tries (and fails obscurely) to dlopen them."""
    paths = [str(p) for p in plugins or ()]
    for p in paths:
        check_input_file(p, "--plugins: plugin library")
    return paths


def polygraphy_trt(backend: Backend):
    """polygraphy.backend.trt bound to the backend's module. Polygraphy picks
    tensorrt or tensorrt_rtx once per process (when polygraphy.backend.trt is
    first imported), so a process that already runs one cannot switch."""
    from polygraphy import config

    want = backend.polygraphy_rtx
    if "polygraphy.backend.trt" not in sys.modules:
        config.USE_TENSORRT_RTX = want
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1" if want else "0"
    elif bool(config.USE_TENSORRT_RTX) != want:
        running = next(b.label for b in BACKENDS.values() if b.polygraphy_rtx == bool(config.USE_TENSORRT_RTX))
        raise BackendUnavailable(f"this process already runs Polygraphy with {running}; run the {backend.name} "
                                 "check in its own process")
    import polygraphy.backend.trt as ptrt

    return ptrt


def trt_runner_from_engine(engine_path: str | os.PathLike, plugins=(), name: str = "tensorrt",
                           backend: Backend = TENSORRT):
    """TrtRunner over a serialised engine; the plugin libraries are loaded (LoadPlugins:
    static registration, else the registry's load_library) before it is deserialised."""
    from ..engines.loaders import LoadPlugins

    ptrt = polygraphy_trt(backend)
    backend.load()  # BackendUnavailable with the install hint, before Polygraphy fails to import it
    paths = check_plugin_paths(plugins)
    load = LoadPlugins(backend, [Path(p) for p in paths], [])

    def engine_bytes():
        load()
        return Path(engine_path).read_bytes()

    return ptrt.TrtRunner(ptrt.EngineFromBytes(engine_bytes), name=name)


def trt_runner_from_onnx(graph, outputs: list[str], precision: str, max_shape: tuple[int, int],
                         plugins=(), name: str = "tensorrt", backend: Backend | None = None):
    """TrtRunner over an engine built in memory by build's loader chain from `graph` (an opened
    ExportedGraph, handed on to the parser, or a path), with
    `outputs` marked (so every h_l can be compared) and one profile from (1, 1)
    to `max_shape`.

    The network is strongly typed, so the engine computes in the ONNX file's
    precision (msar.dtype), like the one `build` ships: `precision` must be that
    one (InputError otherwise, before TensorRT is imported). TF32 is off."""
    from ..engines.loaders import CreateConfig, EngineFromNetwork, LoadPlugins, NetworkFromOnnx, make_logger
    from ..engines.onnx_info import read_onnx
    from ..engines.profiles import DimRange, input_profiles

    info = read_onnx(graph)
    computes = info.dtype or "float32"
    if precision != computes:
        raise InputError(f"{info.path.name} computes in {computes} and an engine built from it is strongly "
                         f"typed, so it cannot run in {precision}; export the graph in {precision}")
    backend = backend or choose_backend() or TENSORRT
    ptrt = polygraphy_trt(backend)
    backend.load()  # BackendUnavailable with the install hint, before Polygraphy fails to import it
    B, T = (int(v) for v in max_shape)
    profiles = input_profiles(info.inputs, {"batch": DimRange(1, B, B), "seq": DimRange(1, T, T),
                                            "past": DimRange(0, 0, 0)})
    libs = [Path(p) for p in check_plugin_paths(plugins)]
    plugins = LoadPlugins(backend, libs, sorted(info.custom_ops)) if libs else None
    network = NetworkFromOnnx(backend, info, make_logger(backend), plugins, outputs=list(outputs))
    engine = EngineFromNetwork(network, CreateConfig(backend, profiles, tf32=False))
    return ptrt.TrtRunner(ptrt.EngineFromBytes(lambda: engine().plan), name=name)


class TrtDecoder:
    """The decode graph's engine: prefill with an empty cache, then one token per
    step, through the shared decode loop (msar_export.model.generate.decode_loop)
    - the same contract as runtime.OrtDecoder.

    The engine is checked against its build record (ONNX file, plugins, TensorRT
    version) first; where it cannot run here, BackendUnavailable says in one line
    that it was built and why it does not run. `runner`: anything with Polygraphy's
    runner interface (context manager + infer(feed_dict)); default a TrtRunner."""

    def __init__(self, engine_path, onnx_path, plugins=(), runner=None):
        from ..engines.metadata import verify_engine_metadata
        from ..errors import EngineError
        from ..graph_file import ExportedGraph
        from ..verdict import NUMPY_DTYPES

        self.meta = verify_engine_metadata(engine_path, onnx_path, check_plugin_paths(plugins))
        if self.meta.builder.get("graph") != "decode":
            raise EngineError(f"{Path(engine_path).name} was built from a {self.meta.builder.get('graph')} graph; "
                              "generate needs an engine of a decode graph (export --decode, then build)")
        if self.meta.dtype not in NUMPY_DTYPES:
            raise EngineError(f"{Path(engine_path).name} is {self.meta.dtype}: its cache cannot be fed from numpy; "
                              "build the float32 or float16 decode graph")
        self.cfg = ExportedGraph.open(onnx_path).config
        self.spec = GraphSpec(self.cfg, decode=True)
        self.cache_dtype = NUMPY_DTYPES[self.meta.dtype]
        if runner is None:
            why = engine_not_run_reason(engine_path, self.meta)
            if why is not None:
                raise BackendUnavailable(why)
            runner = trt_runner_from_engine(engine_path, plugins, backend=self.meta.backend)
        self.runner = runner

    def empty_cache(self, batch: int) -> dict:
        return self.spec.empty_cache(batch, self.cache_dtype)

    def step(self, input_ids, attention_mask, position_ids, cache):
        from ..engines.metadata import check_input_shapes

        feeds = self.spec.feeds(input_ids, attention_mask, position_ids, cache)
        check_input_shapes(self.meta, {k: tuple(v.shape) for k, v in feeds.items()})  # one line, before TensorRT
        outs = {k: np.asarray(v.cpu() if hasattr(v, "cpu") else v) for k, v in self.runner.infer(feeds).items()}
        return outs[LOGITS], self.spec.next_cache(outs)

    def generate(self, input_ids, attention_mask=None, **options):
        """Same contract and options as `msar_export.generate`, on the engine."""
        from ..model.generate import generate_decoder

        with self.runner:
            return generate_decoder(self, input_ids, attention_mask, **options)
