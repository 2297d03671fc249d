"""What `msar-export export` was asked for and what it did: torch-free, so the
process that validates a large export (handoff.py) can print the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from ..contracts import DOMAIN
from ..verdict import PRECISIONS


MIXER_OPS = ("fused", "retrieval", "scored")  # ExportOptions.mixer_op, `export --mixer-op`


@dataclass(frozen=True)
class ExportOptions:
    decode: bool = False
    decomposed: bool = False
    dtype: str = "float32"
    opset: int = 18
    # msar prefill: "fused" = one FusedMixer node per mixer (views recomputed from
    # raw sources inside the op: the TensorRT plugin's fast path); "retrieval" =
    # views expanded once per source in standard ops + DepthRetrieval nodes
    # (faster in ONNX Runtime, whose inlined function bodies cannot share work);
    # "scored" = each source's scores against every later mixer made once
    # (SourceScores) + one ScoredMixer node per mixer (ONNX Runtime; TensorRT
    # has no plugin for them: `build` refuses the file).  Decode graphs and
    # attnres/standard models keep their one form whatever this says.
    mixer_op: str = "fused"
    # Weights in `<output>.data` beside the .onnx file; always so over protobuf's 2 GB.
    external_data: bool = False

    def __post_init__(self):
        if self.mixer_op not in MIXER_OPS:
            raise InputError(f"--mixer-op must be one of {', '.join(MIXER_OPS)}, got {self.mixer_op!r}")
        if self.dtype not in PRECISIONS:
            raise InputError(f"--dtype must be one of {list(PRECISIONS)}, got {self.dtype!r}")
        if not 18 <= self.opset <= 23:
            raise InputError(f"--opset {self.opset} is not supported; use 18..23")


@dataclass
class ExportReport:
    path: Path
    options: ExportOptions
    custom_ops: dict[str, int] = field(default_factory=dict)
    parameters: int = 0
    file_bytes: int = 0
    export_seconds: float = 0.0
    peak_rss_mb: float = 0.0  # load, reference (when validating), trace + save
    validation: object | None = None
    peak_rss_validated_mb: float | None = None  # the whole run, validation included
    external_data: bool = False
    # validate.Reference: the eager logits validation compares ONNX Runtime with (not printed)
    reference: object | None = field(default=None, repr=False, compare=False)

    def summary(self) -> str:
        ops = ", ".join(f"{DOMAIN}::{k} x{v}" for k, v in sorted(self.custom_ops.items())) or "none"
        kind = ("decode" if self.options.decode else "prefill") + (", decomposed" if self.options.decomposed else "")
        if self.custom_ops and not self.options.decode:
            kind += f", mixer-op {self.options.mixer_op}"
        if self.external_data:
            kind += f", weights in {self.path.name}.data"
        lines = [
            f"exported {self.path} ({kind}, {self.options.dtype}, opset {self.options.opset})",
            f"  custom ops: {ops}",
            f"  parameters: {self.parameters:,}   file: {self.file_bytes / 1e6:.2f} MB   "
            f"export: {self.export_seconds:.1f} s   peak RSS: {self.peak_rss_mb:.0f} MB"
            + ("" if self.peak_rss_validated_mb is None else f" ({self.peak_rss_validated_mb:.0f} MB with validation)"),
        ]
        if self.validation is not None:
            lines.append("  " + self.validation.summary())
        return "\n".join(lines)



def _status_mb(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith(field)) / 1024
    except (OSError, StopIteration, ValueError):
        return None


def rss_mb() -> float:
    """This process's resident memory now (0 where /proc is missing)."""
    return _status_mb("VmRSS:") or 0.0


def peak_rss_mb() -> float:
    """This process's peak RSS.  VmHWM, not ru_maxrss: after fork+exec the latter
    still holds the parent's peak, which made a child's export look huge."""
    peak = _status_mb("VmHWM:")
    if peak is None:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return peak
