"""The peak-memory formulas of a validated export (README, "Export memory"), as numbers for a
config, and each bench row checked against them.  A validated export runs three phases one
after the other in one process (the validating one exec'd: same process id), so its peak is
the highest of the three:

    reference  baseline + 8 B x (P_unit + P_tensor + P_mixers) + 8 B x T x ((L+1) m d + V)
    export     baseline + 1 GiB + the largest tensor (float32)
    ORT        ORT_IMAGE + the file's bytes (inline: read into memory; external data: the data
               file's pages, file-backed) [+ 4 B x parameters for a float16 file: ORT's CPU
               provider converts the weights to float32 when the session is made]

P_unit: the largest unit the streamed reference loads at once (the embedding or head, or one
sublayer, or one source's convolutions), P_tensor the largest tensor (its mapped pages and the
finiteness check's temporary), P_mixers every mixer's parameters (kept loaded), T the
validation tokens, L the sublayers, m the streams, V the vocabulary.  The anonymous part of
the peak has the same bound except that external data's pages are not in it: they are the
kernel's to drop (a row whose data file is larger than the machine's memory is bounded by
that part)."""

from __future__ import annotations

import math

from ..config import MSARConfig

GIB = 2**30
# The validating process's own memory (python, onnx, onnxruntime, numpy; no torch) with its
# session's arena at the validation input's size: 105 MiB of interpreter and libraries at
# 128 M parameters, 205 MiB beyond a 488 MiB inline file (README), rounded up.
ORT_IMAGE_MIB = 256


def _tensors(cfg: MSARConfig) -> dict[str, int]:
    from ..checkpoint import iter_expected

    return {name: math.prod(shape) for name, shape in iter_expected(cfg)}


def _unit(name: str) -> str:
    """The streamed reference's unit a tensor belongs to (export/reference.py)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] in ("layers", "sources", "mixers") else parts[0]


def largest_tensor_bytes(cfg: MSARConfig) -> int:
    return 4 * max(_tensors(cfg).values())


def checkpoint_bytes(cfg: MSARConfig) -> int:
    return 4 * sum(_tensors(cfg).values())


def export_bound_mib(base_mib: float, cfg: MSARConfig) -> float:
    """Issue 26's bound on the export's peak (validation excluded): the interpreter's
    baseline + 1 GiB + the largest single tensor (float32), whatever the checkpoint's size."""
    return base_mib + 1024 + largest_tensor_bytes(cfg) / 2**20


def reference_bound_mib(base_mib: float, cfg: MSARConfig) -> float:
    from ..export.validate import validation_ids

    sizes = _tensors(cfg)
    units: dict[str, int] = {}
    for name, n in sizes.items():
        if not name.startswith("mixers."):
            units[_unit(name)] = units.get(_unit(name), 0) + n
    mixers = sum(n for name, n in sizes.items() if name.startswith("mixers."))
    tokens = math.prod(validation_ids(cfg).shape)
    acts = tokens * ((cfg.n_sublayers + 1) * max(cfg.n_streams, 1) * cfg.d_model + cfg.vocab_size)
    return base_mib + 8 * (max(units.values()) + max(sizes.values()) + mixers + acts) / 2**20


def ort_bound_mib(file_mib: float, parameters: int, float16: bool, anonymous: bool, external: bool) -> float:
    """The validating process: its image, the file's bytes (not for the anonymous part when the
    weights are external data, which ORT maps), ORT's float32 copy of a float16 file's weights."""
    weights = 0.0 if anonymous and external else file_mib
    return ORT_IMAGE_MIB + weights + (4 * parameters / 2**20 if float16 else 0.0)


def row_bounds(row: dict, cfg: MSARConfig) -> dict:
    """The bound on a row's whole peak and on its anonymous part (MiB), from the formulas above;
    a --no-validate row has the export phase only."""
    base, flags = row["baseline_mib"], row["variant"].split()
    phases = [export_bound_mib(base, cfg)]
    validated = "--no-validate" not in flags
    if validated:
        phases.append(reference_bound_mib(base, cfg))
    # before validation: the reference and the export (the VmHWM the export reports then)
    out = {"export_bound_mib": round(phases[0], 1), "pre_validation_bound_mib": round(max(phases), 1)}
    for key, anonymous in (("bound_mib", False), ("anon_bound_mib", True)):
        ort = [ort_bound_mib(row["file_mib"], row["parameters"], "float16" in flags, anonymous,
                             "--external-data" in flags or row.get("external_data", False))] if validated else []
        out[key] = round(max(phases + ort), 1)
    return out


def within(row: dict) -> bool:
    """Both peaks at or under their bounds; a row that failed or was killed is not."""
    anon = row.get("tree_peak_anon_mib")
    return (row["returncode"] == 0 and row["peak_mib"] <= row["bound_mib"]
            and (anon is None or anon <= row["anon_bound_mib"]))
