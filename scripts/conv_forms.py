"""How ONNX Runtime runs the source expansion's depthwise convolution in each form the exporter could
write (docs/ort_kernels.md, "The decode graph's shape"): one Conv per source with the conv streams as
its depth multiplier (1-D or 2-D), or one Conv per stream (1-D or 2-D, one output per channel).
Same taps (right-aligned in a kmax-wide kernel), outputs checked equal, best of 3 interleaved rounds.

    python scripts/conv_forms.py [--d 512] [--kmax 12] [--streams 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

FORMS = ("merged1d", "merged2d", "split1d", "split2d")


def form_model(kind: str, w: np.ndarray):
    """x (B, L, d) -> the conv streams; w (d, streams, kmax)."""
    d, streams, kmax = w.shape
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1])]
    inits = []
    two_d = kind.endswith("2d")
    if two_d:
        inits.append(numpy_helper.from_array(np.array([2], np.int64), "axis"))
        nodes.append(helper.make_node("Unsqueeze", ["xt", "axis"], ["planes"]))
    src = "planes" if two_d else "xt"
    if kind.startswith("merged"):
        inits.append(numpy_helper.from_array(w.reshape(d * streams, 1, *([1] if two_d else []), kmax), "w"))
        nodes.append(helper.make_node("Conv", [src, "w"], ["y"], group=d))
    else:
        for r in range(streams):
            taps = np.ascontiguousarray(w[:, r:r + 1].reshape(d, 1, *([1] if two_d else []), kmax))
            inits.append(numpy_helper.from_array(taps, f"w{r}"))
            nodes.append(helper.make_node("Conv", [src, f"w{r}"], [f"y{r}"], group=d))
        nodes.append(helper.make_node("Concat", [f"y{r}" for r in range(streams)], ["y"], axis=1))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "L", d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def streams_last(kind: str, y: np.ndarray, B: int, d: int, streams: int) -> np.ndarray:
    """Every form's output as (B, d, streams, T)."""
    return y.reshape(B, d, streams, -1) if kind.startswith("merged") else \
        y.reshape(B, streams, d, -1).transpose(0, 2, 1, 3)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--kmax", type=int, default=12)
    p.add_argument("--streams", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((a.d, a.streams, a.kmax)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    sessions = {k: ort.InferenceSession(form_model(k, w).SerializeToString(), so, providers=["CPUExecutionProvider"])
                for k in FORMS}
    for B, L in ((1, a.kmax), (8, a.kmax), (1, 512 + a.kmax - 1)):
        x = rng.standard_normal((B, L, a.d)).astype(np.float32)
        outs = {k: streams_last(k, s.run(None, {"x": x})[0], B, a.d, a.streams) for k, s in sessions.items()}
        for k in FORMS[1:]:
            np.testing.assert_allclose(outs[k], outs[FORMS[0]], rtol=1e-4, atol=1e-4)
        best = dict.fromkeys(FORMS, float("inf"))
        calls = 200 if L < 100 else 20
        for _ in range(3):
            for k, s in sessions.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    s.run(None, {"x": x})
                best[k] = min(best[k], (time.perf_counter() - t0) / calls)
        print(f"B {B}, window {L} ({L - a.kmax + 1} tokens): "
              + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in best.items()))


if __name__ == "__main__":
    main()
