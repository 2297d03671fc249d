"""Microbenchmark of one mixer alone: eager PyTorch vs the FusedMixer node in
ONNX Runtime (its function body, and the native kernel when built), across sources, width and tokens, with the
bytes-moved floor (raw sources read once, h written once, at measured memcpy
bandwidth) next to each time.  The plugin kernel's numbers come from
scripts/gpu_check.sh on a GPU."""

from __future__ import annotations

import onnx_ir as ir
import torch

from ..log import silent
from ..contracts import (CONV_STATE, DEPTH_RETRIEVAL, DOMAIN, DOMAIN_VERSION, FUSED_MIXER, SCORED_MIXER, SOURCE_SCORES,
                         SOURCE_VIEWS, STREAM_GATE)
from ..export.custom_paths import pack_conv_rows
from ..export.functions import (conv_state_function, depth_retrieval_function, fused_mixer_function, ir_attributes,
                                scored_mixer_function, source_scores_function, source_views_function,
                                stream_gate_function)
from ..model.layers import rms_normalize
from ..model.mixing import SourceExpansion, depth_retrieval, stream_fusion
from ..verdict import rel_err
from .timing import copy_bandwidth_gbs, interleaved

KERNELS = (1, 4, 8, 12)


def _one_node_model(contract, n: int, fixed: dict, variadic: list, values: dict, function, dtype, opset: int,
                    out_shape: list | None = None) -> ir.Model:
    """One `contract` node: `fixed` inputs by name and shape, n variadic inputs x0.. of shape `variadic`;
    ports the contract types float32 or int64 have that type, the rest `dtype`; the output's shape is
    `out_shape` (default: `variadic`)."""
    fixed_types = {"float32": ir.DataType.FLOAT, "int64": ir.DataType.INT64}
    port_type = {p.name: ir.TensorType(fixed_types.get(p.dtype, dtype)) for p in contract.inputs + contract.outputs}
    t = ir.TensorType(dtype)
    inputs = [ir.Value(name=k, type=port_type[k], shape=ir.Shape(s)) for k, s in fixed.items()]
    inputs += [ir.Value(name=f"x{i}", type=t, shape=ir.Shape(variadic)) for i in range(n)]
    node = ir.Node(DOMAIN, contract.name, inputs, overload=contract.overload(n),
                   attributes=ir_attributes(contract, values))
    out, port = node.outputs[0], contract.outputs[0]
    out.name, out.type, out.shape = port.name, port_type[port.name], ir.Shape(out_shape or variadic)
    graph = ir.Graph(inputs, node.outputs, nodes=[node], opset_imports={"": opset, DOMAIN: DOMAIN_VERSION})
    return ir.Model(graph, ir_version=10, functions=[function])


def fused_mixer_model(n: int, d: int, eps: float = 1e-6, opset: int = 18, kernels=KERNELS,
                      dtype=ir.DataType.FLOAT, conv_rows: int | None = None) -> ir.Model:
    """A graph of one msar::FusedMixer node over n sources (inputs query, gate_weight, gate_bias,
    gate_scale, conv_weight with conv_rows >= n rows, x0..x{n-1}; output h), with its function body."""
    m, K = len(kernels), sum(kernels[1:])
    fixed = {"query": [m, d], "gate_weight": [m, m * d], "gate_bias": [m], "gate_scale": [],
             "conv_weight": [conv_rows or n, K, d]}
    values = FUSED_MIXER.attribute_values(stream_kernels=kernels, eps=eps)
    return _one_node_model(FUSED_MIXER, n, fixed, ["B", "T", d], values, fused_mixer_function(n, values, d, opset),
                           dtype, opset)


def depth_retrieval_model(n: int, m: int, d: int, eps: float = 1e-6, opset: int = 18,
                          dtype=ir.DataType.FLOAT) -> ir.Model:
    """A graph of one msar::DepthRetrieval node over n view tensors (inputs query, x0..x{n-1}; output z)."""
    values = DEPTH_RETRIEVAL.attribute_values(eps=eps)
    return _one_node_model(DEPTH_RETRIEVAL, n, {"query": [m, d]}, ["B", "T", m, d], values,
                           depth_retrieval_function(n, values, opset), dtype, opset)


def source_views_model(d: int, kernels=KERNELS, opset: int = 18, dtype=ir.DataType.FLOAT) -> ir.Model:
    """A graph of one msar::SourceViews node (inputs conv_weight, state, index, source, mask; output views)."""
    values = SOURCE_VIEWS.attribute_values(stream_kernels=kernels)
    fixed = {"conv_weight": [sum(kernels[1:]), d], "state": ["S", "B", "H", d], "index": [], "source": ["B", "T", d],
             "mask": ["B", "T"]}
    return _one_node_model(SOURCE_VIEWS, 0, fixed, ["B", "T", len(kernels), d], values,
                           source_views_function(values, d, opset), dtype, opset)


def conv_state_model(n: int, d: int, opset: int = 18, dtype=ir.DataType.FLOAT) -> ir.Model:
    """A graph of one msar::ConvState node (inputs past, mask, x0..x{n-1}; output present)."""
    return _one_node_model(CONV_STATE, n, {"past": [n, "B", "H", d], "mask": ["B", "T"]}, ["B", "T", d], {},
                           conv_state_function(n, opset), dtype, opset, out_shape=[n, "B", "H", d])


def stream_gate_model(m: int, d: int, opset: int = 18, dtype=ir.DataType.FLOAT) -> ir.Model:
    """A graph of one msar::StreamGate node (inputs gate_weight, gate_bias, gate_scale, z; output h)."""
    fixed = {"gate_weight": [m, m * d], "gate_bias": [m], "gate_scale": [], "z": ["B", "T", m, d]}
    return _one_node_model(STREAM_GATE, 0, fixed, ["B", "T", d], {}, stream_gate_function({}, d, m, opset), dtype, opset)


def source_scores_model(m: int, d: int, eps: float = 1e-6, kernels=KERNELS, opset: int = 18,
                        dtype=ir.DataType.FLOAT) -> ir.Model:
    """A graph of one msar::SourceScores node (inputs conv_weight, queries, source; output scores, float32)."""
    values = SOURCE_SCORES.attribute_values(stream_kernels=kernels, eps=eps)
    fixed = {"conv_weight": [sum(kernels[1:]), d], "queries": ["P", m, d], "source": ["B", "T", d]}
    return _one_node_model(SOURCE_SCORES, 0, fixed, None, values, source_scores_function(values, d, opset), dtype,
                           opset, out_shape=["P", "B", "T", m])


def scored_mixer_model(n: int, d: int, kernels=KERNELS, opset: int = 18, dtype=ir.DataType.FLOAT,
                       conv_rows: int | None = None) -> ir.Model:
    """A graph of one msar::ScoredMixer node over n sources (inputs gate_weight, gate_bias, gate_scale,
    conv_weight, scores (float32), x0..x{n-1}; output h), with its function body."""
    m, K = len(kernels), sum(kernels[1:])
    fixed = {"gate_weight": [m, m * d], "gate_bias": [m], "gate_scale": [], "conv_weight": [conv_rows or n, K, d],
             "scores": [n, "B", "T", m]}
    values = SCORED_MIXER.attribute_values(stream_kernels=kernels)
    return _one_node_model(SCORED_MIXER, n, fixed, ["B", "T", d], values, scored_mixer_function(n, values, d, opset),
                           dtype, opset)


def run_mixer_bench(sources=(4, 9, 17), widths=(256, 512), tokens=(512, 2048), threads: int = 2,
                    repeats: int = 5, log=None) -> dict:
    log = log or silent
    from ..runners.ort_runner import native_library, open_session

    torch.set_num_threads(threads)
    bw = copy_bandwidth_gbs()
    rows = []
    for n in sources:
        for d in widths:
            for T in tokens:
                g = torch.Generator().manual_seed(0)
                m = len(KERNELS)
                xs = [torch.randn(1, T, d, generator=g) for _ in range(n)]
                expansions = [SourceExpansion(d, KERNELS[1:]) for _ in range(n)]
                q, W = torch.randn(m, d, generator=g), torch.randn(m, m * d, generator=g) / d
                b, a = torch.randn(m, generator=g), torch.tensor(1.0)

                def eager():
                    with torch.inference_mode():
                        V = torch.stack([e(x) for e, x in zip(expansions, xs)])
                        return stream_fusion(depth_retrieval(q, V, rms_normalize(V, 1e-6)), W, b, a)

                conv = pack_conv_rows((e.conv.values() for e in expansions), d, torch.float32)
                proto = ir.serde.serialize_model(fused_mixer_model(n, d)).SerializeToString()
                sessions = {"ort": open_session(proto, providers=["cpu"], threads=threads, ort_ops="function")}
                if native_library() is not None:
                    sessions["ort_native"] = open_session(proto, providers=["cpu"], threads=threads, ort_ops="native")
                feeds = {"query": q.numpy(), "gate_weight": W.numpy(), "gate_bias": b.numpy(),
                         "gate_scale": a.numpy(), "conv_weight": conv.detach().numpy(),
                         **{f"x{i}": x.numpy() for i, x in enumerate(xs)}}
                ref = eager().numpy()
                row = {"sources": n, "d_model": d, "tokens": T}
                fns = {"eager": eager, **{k: (lambda s=s: s.run(["h"], feeds)) for k, s in sessions.items()}}
                t = interleaved(fns, 1, repeats)
                for k in fns:
                    row[f"{k}_ms"] = round(t[k].median_s * 1e3, 3)
                for k, s in sessions.items():  # ort: the function body; ort_native: the native kernel
                    row[f"{k}_vs_eager_rel_err"] = rel_err(s.run(["h"], feeds)[0], ref)
                row["floor_ms"] = round((n + 1) * T * d * 4 / (bw * 1e9) * 1e3, 6)
                rows.append(row)
                log(f"  n={n:2d} d={d:4d} T={T:5d}: " + "  ".join(f"{k} {row[f'{k}_ms']:8.2f} ms" for k in fns)
                    + f"  floor {row['floor_ms']:6.3f} ms")
    return {"copy_bandwidth_gbs": round(bw, 2), "rows": rows}
