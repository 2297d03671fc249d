"""The peak-memory formulas of a validated export (README, "Export memory"), as numbers for a
config, and each bench row checked against them.  A validated export runs three phases one
after the other in one process (the validating one exec'd: same process id), so its peak is
the highest of the three:

    reference  baseline + 8 B x (P_unit + P_tensor + P_mixers) + 8 B x T x ((L+1) m d + V)
    export     baseline + 1 GiB + the largest tensor (float32)
    ORT        ORT_IMAGE + 12 B x T V + the weights [+ the small tensors' parsed copies]
               + max(the load's tensor in flight, the run)

ORT_IMAGE: python, numpy, onnx and onnxruntime with the session's graph (ORT_IMAGE_MIB + the
sublayers x ORT_GRAPH_MIB); 12 B x T V: the reference's float64 and eager float32 logits,
loaded before the session; the weights: the file's bytes (inline: read into memory; external
data: the data file's pages, file-backed) [+ 4 B x parameters for a float16 file: ORT's CPU
provider converts the weights to float32 when the session is made]; the load's tensor in
flight: inline, ORT moves each initializer out of the parsed file into its own buffer and frees
the parsed copy, one tensor at a time (the largest, float32); the parsed copies of the tensors
under glibc's mmap threshold were in its heap, which keeps what is freed there (inline only:
external data is mapped, `heap_kept_bytes`); the run: ORT's activations at the
validation input (`ort_activations_mib`).  The load ends before the run starts.

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
# The validating process before any weight, reference or activation: python, numpy, onnx and
# onnxruntime after the checker and shape inference, with an open session, and per sublayer the
# session's share of the graph (nodes, kernels, plans).  Measured apart (README, "What ONNX
# Runtime holds while validating"): 96 MiB at 4 sublayers, 96-101 at 16, 112-121 at 48, i.e.
# 0.47 MiB (fused) to 0.63 MiB (decomposed) per sublayer, rounded up to 0.75.
ORT_IMAGE_MIB = 96
ORT_GRAPH_MIB = 0.75


def _tensors(cfg: MSARConfig) -> dict[str, int]:
    from ..checkpoint import iter_expected

    return {name: math.prod(shape) for name, shape in iter_expected(cfg)}


def _unit(name: str) -> str:
    """The streamed reference's unit a tensor belongs to (export/reference.py)."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] in ("layers", "sources", "mixers") else parts[0]


def heap_kept_bytes(cfg: MSARConfig) -> int:
    """The float32 tensors under the validating image's mmap threshold (export/handoff.py sets it):
    an inline file's parsed copies of them are freed into the heap, which keeps the pages."""
    from ..memory import MMAP_THRESHOLD

    return 4 * sum(n for n in _tensors(cfg).values() if 4 * n < MMAP_THRESHOLD)


def largest_tensor_bytes(cfg: MSARConfig) -> int:
    return 4 * max(_tensors(cfg).values())


def checkpoint_bytes(cfg: MSARConfig) -> int:
    return 4 * sum(_tensors(cfg).values())


def export_bound_mib(base_mib: float, cfg: MSARConfig) -> float:
    """Issue 26's bound on the export's peak (validation excluded): the interpreter's
    baseline + 1 GiB + the largest single tensor (float32), whatever the checkpoint's size."""
    return base_mib + 1024 + largest_tensor_bytes(cfg) / 2**20


def reference_bound_mib(base_mib: float, cfg: MSARConfig) -> float:
    sizes = _tensors(cfg)
    units: dict[str, int] = {}
    for name, n in sizes.items():
        if not name.startswith("mixers."):
            units[_unit(name)] = units.get(_unit(name), 0) + n
    mixers = sum(n for name, n in sizes.items() if name.startswith("mixers."))
    acts = validation_tokens(cfg) * ((cfg.n_sublayers + 1) * max(cfg.n_streams, 1) * cfg.d_model + cfg.vocab_size)
    return base_mib + 8 * (max(units.values()) + max(sizes.values()) + mixers + acts) / 2**20


def validation_tokens(cfg: MSARConfig) -> int:
    from ..export.validate import validation_ids

    return math.prod(validation_ids(cfg).shape)


def ort_activations_mib(cfg: MSARConfig, decomposed: bool) -> float:
    """ORT's float32 activations at the validation input, T tokens, from what the graph holds at
    once per token.  Every source's output (L+1 of them) is read by every later mixer, so all
    stay alive.  Decomposed, each source's m stream views (m d) are what stays, and one mixer
    over n <= L+1 sources adds its stack of them (n m d), the stack's float32 Cast and one
    elementwise product of it: 4 (L+1) m d.  Fused (also the decode graph), the sources (d each)
    stay, and one FusedMixer node adds the stack X, its channels-first transpose, m views, a
    convolution's output and one product, n d each: (m + 4)(L+1) d.  Besides: the logits (V)
    and an MLP's three hidden tensors (3 mlp_hidden)."""
    m = max(cfg.n_streams, 1)
    sources = (cfg.n_sublayers + 1) * cfg.d_model * (4 * m if decomposed else m + 4)
    return 4 * validation_tokens(cfg) * (sources + cfg.vocab_size + 3 * cfg.mlp_hidden) / 2**20


def ort_bound_mib(file_mib: float, cfg: MSARConfig, float16: bool, anonymous: bool, external: bool,
                  decomposed: bool) -> float:
    """The validating process (the formula above); the anonymous part leaves out the file's bytes
    when the weights are external data, which ORT maps and uses in place."""
    image = ORT_IMAGE_MIB + ORT_GRAPH_MIB * cfg.n_sublayers
    references = 12 * validation_tokens(cfg) * cfg.vocab_size / 2**20
    weights = (0.0 if anonymous and external else file_mib) + (checkpoint_bytes(cfg) / 2**20 if float16 else 0.0)
    parsed = 0.0 if external else heap_kept_bytes(cfg) / 2**20
    in_flight = 0.0 if external else largest_tensor_bytes(cfg) / 2**20
    return image + references + weights + parsed + max(in_flight, ort_activations_mib(cfg, decomposed))


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
        ort = [ort_bound_mib(row["file_mib"], cfg, "float16" in flags, anonymous,
                             "--external-data" in flags or row.get("external_data", False),
                             "decomposed" in flags)] if validated else []
        out[key] = round(max(phases + ort), 1)
    return out


def within(row: dict) -> bool:
    """Both peaks at or under their bounds; a row that failed or was killed is not."""
    anon = row.get("tree_peak_anon_mib")
    return (row["returncode"] == 0 and row["peak_mib"] <= row["bound_mib"]
            and (anon is None or anon <= row["anon_bound_mib"]))
