"""What `serve` and `loadtest --compare-batching` serve: a checkpoint (both graphs
exported into the work folder, and reused while neither the checkpoint nor the
exporter changed) or one or two exported ONNX files, classified by their graph kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..cli_common import say
from ..errors import InputError, MsarError
from ..untrusted import loads_json

if TYPE_CHECKING:
    from ..graph_file import ExportedGraph


def exporter_fingerprint() -> str:
    """sha256 of the exporter's and the model's sources (as installed): an edited exporter
    in a checkout re-exports even though the version string did not change."""
    import hashlib

    from .. import export, model

    code = hashlib.sha256()
    for pkg in (export, model):
        for src in sorted(Path(pkg.__file__).parent.glob("*.py")):
            code.update(src.name.encode() + src.read_bytes())
    return code.hexdigest()


def is_checkpoint(p: Path) -> bool:
    return p.is_dir() and (p / "config.json").is_file()


def resolve_sources(srcs: list[str], workdir: Path | None, trust_pickle: bool = False,
                    progress=say) -> tuple[ExportedGraph | None, ExportedGraph | None, Path]:
    """CKPT -> (prefill, decode) exported into workdir (cached); ONNX files -> classified. Each
    graph is opened here, once, and handed on (the repository writer and `serve` read it)."""
    from ..graph_file import ExportedGraph

    paths = [Path(s) for s in srcs]
    if len(paths) == 1 and is_checkpoint(paths[0]):
        ckpt = paths[0]
        workdir = workdir or Path("runs") / "serve" / (ckpt.resolve().name or "model")
        prefill, decode = export_for_serving(ckpt, workdir, trust_pickle, progress)
        return ExportedGraph.open(prefill), ExportedGraph.open(decode), workdir
    if len(paths) > 2 or any(p.is_dir() for p in paths):
        raise InputError("give one checkpoint directory, or one or two ONNX files (prefill and/or decode graph)")
    prefill = decode = None
    for p in paths:
        graph = ExportedGraph.open(p)
        if graph.kind == "decode":
            if decode:
                raise InputError(f"two decode graphs given ({decode.path}, {p}); give at most one of each kind")
            decode = graph
        else:
            if prefill:
                raise InputError(f"two prefill graphs given ({prefill.path}, {p}); give at most one of each kind")
            prefill = graph
    workdir = workdir or Path("runs") / "serve" / (decode or prefill).path.stem
    return prefill, decode, workdir


def export_for_serving(ckpt: Path, workdir: Path, trust_pickle: bool, progress=say) -> tuple[str, str]:
    """Export both graphs once per checkpoint content (export.json records what they came from)."""
    from .. import __version__
    from ..fileio import atomic_write_text, file_sha256

    files = {p.name: file_sha256(p) for p in sorted(ckpt.iterdir()) if p.is_file() and p.suffix in
             (".json", ".safetensors", ".pt", ".bin") and p.name != "train_history.json"}
    stamp = {"checkpoint": str(ckpt.resolve()), "files": files, "msar_export": __version__,
             "exporter_sha256": exporter_fingerprint()}
    prefill, decode, stamp_path = workdir / "prefill.onnx", workdir / "decode.onnx", workdir / "export.json"
    try:
        if loads_json(stamp_path.read_text(), str(stamp_path)) == stamp and prefill.is_file() and decode.is_file():
            progress(f"reusing {prefill} and {decode} (exported from this checkpoint before)")
            return str(prefill), str(decode)
    except (OSError, MsarError):
        pass
    from ..export import ExportOptions, export_checkpoint

    workdir.mkdir(parents=True, exist_ok=True)
    stamp_path.unlink(missing_ok=True)
    for path, opts in ((prefill, ExportOptions()), (decode, ExportOptions(decode=True))):
        progress(f"exporting {ckpt} -> {path} ...")
        report = export_checkpoint(ckpt, path, opts, trust_pickle=trust_pickle, validate=True)
        progress(report.summary().splitlines()[0] + (f"; {report.validation.summary()}" if report.validation else ""))
        if report.validation is not None and not getattr(report.validation, "passed", True):
            raise InputError(f"{path}: the export does not match the checkpoint ({report.validation.summary()})")
    atomic_write_text(stamp_path, json.dumps(stamp, indent=2) + "\n")
    return str(prefill), str(decode)
