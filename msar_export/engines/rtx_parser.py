"""The one packaging gap of the TensorRT-RTX wheel found so far: its ONNX parser dlopens
a runtime library name the wheel does not ship (`prepare_rtx_parser`)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from ..errors import EngineError
from .backends import TENSORRT_RTX, Backend

RTX_RUNTIME = "libtensorrt_rtx.so"


def prepare_rtx_parser(backend: Backend, say=None) -> Path | None:
    """Make `libtensorrt_rtx.so` loadable by the TensorRT-RTX ONNX parser.

    The parser (libtensorrt_onnxparser_rtx.so.1) dlopens the runtime by its
    unversioned name `libtensorrt_rtx.so` to look up `getPrivateApi_INTERNAL`
    the first time it creates a plugin layer; the wheel ships only
    `libtensorrt_rtx.so.1`, the dlopen fails, the parser throws from a path that
    cannot throw, and the process dies with "terminate called without an active
    exception" (docs/tensorrt.md section 6). The parser searches its own folder
    first (RPATH $ORIGIN), so a symlink there named `libtensorrt_rtx.so` is
    enough. It is made atomically; returns its path (None: nothing to do).
    """
    if backend != TENSORRT_RTX:
        return None
    try:
        libs = importlib.import_module("tensorrt_rtx_libs")
        folder = Path(libs.__file__).resolve().parent
    except Exception:
        return None  # not the pip layout (a tarball install has the unversioned name)
    if not (folder / "libtensorrt_onnxparser_rtx.so.1").is_file():
        return None
    link = folder / RTX_RUNTIME
    if link.exists():
        return link
    for directory in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if directory and (Path(directory) / RTX_RUNTIME).exists():
            return Path(directory) / RTX_RUNTIME
    target = folder / f"{RTX_RUNTIME}.1"
    tmp = folder / f".{RTX_RUNTIME}.{os.getpid()}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target.name)
        os.replace(tmp, link)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"the TensorRT-RTX ONNX parser needs {link} (it dlopens that name for plugin layers and "
                          f"aborts the process without it) and it cannot be created ({e}); run "
                          f"`ln -s {target.name} {link}`") from None
    if say is not None:
        say(f"created {link} -> {target.name} (the TensorRT-RTX parser loads that name for plugin layers)")
    return link
