"""TensorRT through Polygraphy's `TrtRunner`.  `tensorrt` is imported only here
and only when asked for, so a machine without it runs everything else."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError


def tensorrt_unavailable() -> str | None:
    """None when `import tensorrt` works, else the reason (used verbatim in reports)."""
    try:
        import tensorrt  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising OSError on its libraries
        return f"import tensorrt failed: {type(e).__name__}: {e}"
    return None


def check_plugin_paths(plugins) -> list[str]:
    """Plugin libraries must exist before TensorRT tries (and fails obscurely) to dlopen them."""
    paths = [str(p) for p in plugins or ()]
    for p in paths:
        if not Path(p).is_file():
            raise InputError(f"--plugins: {p}: no such file (give the path to the built plugin library, e.g. libmsar_plugins.so)")
    return paths


def trt_runner_from_engine(engine_path: str | os.PathLike, plugins=(), name: str = "tensorrt"):
    """TrtRunner over a serialised engine; plugin libraries are loaded before it is deserialised."""
    from polygraphy.backend.trt import EngineFromPath, LoadPlugins, TrtRunner

    return TrtRunner(LoadPlugins(plugins=check_plugin_paths(plugins), obj=EngineFromPath(str(engine_path))), name=name)


def trt_runner_from_onnx(onnx_path: str | os.PathLike, outputs: list[str], precision: str, max_shape: tuple[int, int],
                         plugins=(), name: str = "tensorrt"):
    """TrtRunner over an engine built in memory from the ONNX graph with `outputs`
    marked (so every h_l can be compared), one profile from (1, 1) to `max_shape`.

    TF32 stays off for float32 (Polygraphy's default), so the float32 preset applies."""
    from polygraphy.backend.trt import (CreateConfig, EngineFromNetwork, LoadPlugins, ModifyNetworkOutputs,
                                        NetworkFromOnnxBytes, Profile, TrtRunner)

    from ..build.onnx_info import read_onnx

    profile = Profile().add("input_ids", min=(1, 1), opt=tuple(max_shape), max=tuple(max_shape))
    config = CreateConfig(fp16=precision == "float16", bf16=precision == "bfloat16", tf32=False, profiles=[profile])
    # The parser would import a node's local function before looking for a
    # plugin, so it gets the graph without the msar function bodies (see
    # msar_export.build.onnx_info); the plugins then implement every msar node.
    network = ModifyNetworkOutputs(NetworkFromOnnxBytes(read_onnx(onnx_path).parser_bytes), outputs=list(outputs))
    engine = EngineFromNetwork(network, config=config)
    return TrtRunner(LoadPlugins(plugins=check_plugin_paths(plugins), obj=engine), name=name)
