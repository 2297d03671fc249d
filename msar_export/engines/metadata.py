"""The metadata written next to an engine (`model.plan` -> `model.plan.json`)
and the check that an engine still matches its ONNX file and plugin libraries.

A TensorRT plan is only valid for the TensorRT version and plugin code it was
built with; the metadata records both, plus the ONNX file it came from, so a
stale engine is refused with a message instead of failing (or silently
computing something else) at run time. Pure Python: no TensorRT needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import EngineError
from ..fileio import atomic_write_text, check_input_file, file_sha256
from ..untrusted import loads_json
from .backends import BACKENDS, TENSORRT, Backend

METADATA_FORMAT = 1
_INSTALLED = "installed"


def metadata_path(plan: str | os.PathLike) -> Path:
    plan = Path(plan)
    return plan.with_name(plan.name + ".json")


@dataclass
class FileRecord:
    path: str
    sha256: str

    @classmethod
    def of(cls, path: str | os.PathLike) -> "FileRecord":
        return cls(str(Path(path).resolve()), file_sha256(path))


@dataclass
class EngineMetadata:
    tensorrt_version: str
    dtype: str
    onnx: FileRecord
    plugins: list[FileRecord]
    plan_sha256: str
    profiles: dict = field(default_factory=dict)  # input -> {min, opt, max}
    shapes: dict = field(default_factory=dict)  # batch/seq/past -> [min, opt, max]
    builder: dict = field(default_factory=dict)
    format: int = METADATA_FORMAT

    @property
    def backend(self) -> Backend:
        """The backend the engine was built with (records older than the field: TensorRT)."""
        name = self.builder.get("backend", TENSORRT.name)
        if not isinstance(name, str) or name not in BACKENDS:
            raise EngineError(f"the engine's build record names the backend {name!r}, which this msar-export does "
                              f"not know (it knows {', '.join(BACKENDS)}); rebuild the engine")
        return BACKENDS[name]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "EngineMetadata":
        d = loads_json(text, "the build record", EngineError)
        if d.get("format") != METADATA_FORMAT:
            raise ValueError(f"metadata format {d.get('format')!r}, this msar-export reads {METADATA_FORMAT}")
        d["onnx"] = FileRecord(**d["onnx"])
        d["plugins"] = [FileRecord(**p) for p in d["plugins"]]
        return cls(**d)


def write_metadata(plan: str | os.PathLike, meta: EngineMetadata) -> Path:
    path = metadata_path(plan)
    atomic_write_text(path, meta.to_json())
    return path


def read_metadata(plan: str | os.PathLike) -> EngineMetadata:
    path = metadata_path(plan)
    if not path.is_file():
        raise EngineError(f"{path} is missing: {Path(plan).name} has no build record; rebuild it with "
                          f"`msar-export build MODEL.onnx -o {plan}`")
    try:
        return EngineMetadata.from_json(path.read_text())
    except (ValueError, KeyError, TypeError, AttributeError, EngineError) as e:
        raise EngineError(f"{path} is not valid engine metadata ({e}); rebuild the engine") from None


def _short(sha: str) -> str:
    return sha[:12]


def verify_engine_metadata(plan: str | os.PathLike, onnx_path: str | os.PathLike,
                           plugin_libs: list[str | os.PathLike] | tuple = (),
                           tensorrt_version: str | None = _INSTALLED) -> EngineMetadata:
    """Check that `plan` was built from `onnx_path` with `plugin_libs` (and the
    given or installed TensorRT version); raise EngineError saying what differs.

    tensorrt_version: "installed" compares with `tensorrt.__version__` when
    TensorRT is importable; None skips that check; a string compares with it.
    """
    plan = Path(plan)
    if not plan.is_file():
        raise EngineError(f"engine {plan} does not exist")
    meta = read_metadata(plan)
    rebuild = f"rebuild it with `msar-export build {onnx_path} -o {plan}`"
    problems = []

    plan_sha = file_sha256(plan)
    if plan_sha != meta.plan_sha256:
        problems.append(f"the engine file changed after it was built (sha256 {_short(plan_sha)}, "
                        f"recorded {_short(meta.plan_sha256)})")
    if not Path(onnx_path).is_file():
        raise EngineError(f"ONNX file {onnx_path} does not exist")
    onnx_sha = file_sha256(onnx_path)
    if onnx_sha != meta.onnx.sha256:
        problems.append(f"it was built from a different ONNX file ({Path(meta.onnx.path).name} sha256 "
                        f"{_short(meta.onnx.sha256)}; {Path(onnx_path).name} is {_short(onnx_sha)})")

    for lib in plugin_libs:
        check_input_file(lib, "plugin library", EngineError)
    given = {file_sha256(lib): str(lib) for lib in plugin_libs}
    recorded = {p.sha256: p.path for p in meta.plugins}
    for sha, path in given.items():
        if sha not in recorded:
            problems.append(f"plugin library {Path(path).name} (sha256 {_short(sha)}) is not the one it was built with"
                            + (f" (recorded: {', '.join(Path(p).name + ' ' + _short(s) for s, p in recorded.items())})"
                               if recorded else " (it was built without plugins)"))
    for sha, path in recorded.items():
        if sha not in given:
            problems.append(f"it was built with plugin library {Path(path).name} (sha256 {_short(sha)}), "
                            "which was not given")

    backend = meta.backend
    if tensorrt_version == _INSTALLED:
        tensorrt_version = None if backend.unavailable() else getattr(backend.load(), "__version__", None)
    if tensorrt_version is not None and tensorrt_version != meta.tensorrt_version:
        problems.append(f"it was built with {backend.label} {meta.tensorrt_version}, this is {backend.label} "
                        f"{tensorrt_version}")

    if problems:
        raise EngineError(f"engine {plan} does not match: " + "; ".join(problems) + f"; {rebuild}")
    return meta


def check_input_shapes(meta: EngineMetadata, shapes: dict[str, tuple[int, ...]]) -> None:
    """Refuse inputs outside the engine's optimisation profile, naming the input,
    the axis and the range, before TensorRT sees them."""
    for name, shape in shapes.items():
        prof = meta.profiles.get(name)
        if prof is None:
            raise EngineError(f"input {name!r} is not an input of this engine (inputs: {sorted(meta.profiles)})")
        lo, hi = prof["min"], prof["max"]
        if len(shape) != len(lo):
            raise EngineError(f"input {name!r} has rank {len(shape)}, the engine expects rank {len(lo)}")
        for axis, (n, a, b) in enumerate(zip(shape, lo, hi)):
            if not a <= n <= b:
                raise EngineError(f"input {name!r} axis {axis} is {n}, outside the engine's optimisation profile "
                                  f"[{a}, {b}]; rebuild with wider --profile")
