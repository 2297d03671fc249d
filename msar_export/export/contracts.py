"""The `msar` custom ops, written once.

The torch export path, the ONNX function bodies, the TensorRT plugin creators'
field names and docs/custom_ops.md all follow these records; tests check that
the plugin READMEs and the exported nodes agree with them.
"""

from __future__ import annotations

from dataclasses import dataclass

DOMAIN = "msar"
DOMAIN_VERSION = 1
PLUGIN_VERSION = "1"
PLUGIN_NAMESPACE = ""


@dataclass(frozen=True)
class Port:
    name: str
    shape: str
    dtype: str
    doc: str
    variadic: bool = False


@dataclass(frozen=True)
class Attr:
    name: str
    type: str  # ONNX attribute type: INT, INTS, FLOAT, STRING
    default: object
    doc: str


@dataclass(frozen=True)
class OpContract:
    name: str
    doc: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    attributes: tuple[Attr, ...]

    def overload(self, n_sources: int) -> str:
        """Function overload for a given number of sources: ONNX functions have a
        fixed input list, so each arity gets its own body under one op name."""
        return f"n{n_sources}"

    @property
    def n_fixed_inputs(self) -> int:
        return sum(not p.variadic for p in self.inputs)


COMMON_ATTRS = (
    Attr("plugin_version", "STRING", PLUGIN_VERSION, "TensorRT plugin version the ONNX parser looks up"),
    Attr("plugin_namespace", "STRING", PLUGIN_NAMESPACE, "TensorRT plugin namespace the ONNX parser looks up"),
)

FUSED_MIXER = OpContract(
    name="FusedMixer",
    doc=(
        "Mixer l of an msar model from the raw sources: causal depthwise conv views "
        "computed on the fly, per-stream RMS-normalised softmax retrieval over depth, "
        "sigmoid scalar gate per stream, sum of gated streams. Float32 inside."
    ),
    inputs=(
        Port("query", "[m, d]", "T", "pseudo-query per stream (a key-norm weight, if any, folded in)"),
        Port("gate_weight", "[m, m*d]", "T", "fusion projection W_l in nn.Linear layout"),
        Port("gate_bias", "[m]", "T", "fusion bias b_l"),
        Port("gate_scale", "[]", "T", "fusion scalar a_l"),
        Port("conv_weight", "[N, d, K]", "T",
             "taps of every source, N >= n; row i holds source i's streams r=1..m-1 back to back, "
             "each in Conv1d order (index j multiplies token t-(k_r-1-j)); K = sum(stream_kernels[1:])"),
        Port("sources", "[B, T, d]", "T", "x_0 .. x_{n-1}, n >= 1 (variadic)", variadic=True),
    ),
    outputs=(Port("h", "[B, T, d]", "T", "the mixer output h_l"),),
    attributes=(
        Attr("stream_kernels", "INTS", None, "kernel size per stream, first is 1 (identity)"),
        Attr("eps", "FLOAT", 1e-6, "mixer_eps of the parameter-free key RMSNorm"),
    ) + COMMON_ATTRS,
)

DEPTH_RETRIEVAL = OpContract(
    name="DepthRetrieval",
    doc=(
        "Per-stream depth retrieval over already-expanded views: each stream scores "
        "every source view against its own pseudo-query (q . RMSNorm(v)), takes a "
        "softmax over sources, and returns the weighted sum. Float32 inside."
    ),
    inputs=(
        Port("query", "[m, d]", "T", "pseudo-query per stream"),
        Port("views", "[B, T, m, d]", "T", "v_0 .. v_{n-1}: the m views of each source, n >= 1 (variadic)",
             variadic=True),
    ),
    outputs=(Port("z", "[B, T, m, d]", "T", "retrieved stream vectors z^(0..m-1)"),),
    attributes=(Attr("eps", "FLOAT", 1e-6, "mixer_eps of the parameter-free key RMSNorm"),) + COMMON_ATTRS,
)

CONTRACTS = {c.name: c for c in (FUSED_MIXER, DEPTH_RETRIEVAL)}


def render_markdown() -> str:
    """docs/custom_ops.md body: one section per op."""
    out = [f"# `{DOMAIN}` custom ops (domain version {DOMAIN_VERSION})", "",
           "Generated from `msar_export/export/contracts.py`; `T` is float32, float16 or bfloat16.", ""]
    for c in CONTRACTS.values():
        out += [f"## `{DOMAIN}::{c.name}`", "", c.doc, "", "| input | shape | dtype | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{p.name}`{' (variadic)' if p.variadic else ''} | `{p.shape}` | {p.dtype} | {p.doc} |" for p in c.inputs]
        out += ["", "| output | shape | dtype | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{p.name}` | `{p.shape}` | {p.dtype} | {p.doc} |" for p in c.outputs]
        out += ["", "| attribute | type | default | meaning |", "| --- | --- | --- | --- |"]
        out += [f"| `{a.name}` | {a.type} | {a.default!r} | {a.doc} |" for a in c.attributes]
        out += [""]
    return "\n".join(out)
