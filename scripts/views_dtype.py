"""What storing the decode graph's views in bfloat16 (or float16) instead of float32 costs in accuracy
(issue 23, defect 7: why the export stores them in the model's dtype): DepthRetrieval over the same
views, stored in each dtype, against the float64 reference over the views as computed (float32), on
- the CUDA kernel's source run on the CPU emulation (plugins/tests/cudaHostEmulation.h),
- ONNX Runtime's native msar kernel and the op's function body,
next to what a bfloat16 graph loses anyway (the exact output rounded to bfloat16) and the bar every
backend of a bfloat16 model is judged by (verdict.bound with eager's error = that rounding).

Cases: the retrieval of every mixer of the default checkpoint (real queries and views, the last token
of a prompt), and random views at decode sizes (n = 97; queries at two sharpnesses).

    python scripts/views_dtype.py --emulation build/.../libmsar_emulation.so [--ort-lib libmsar_ort_ops.so]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch

from msar_export import kernels as K
from msar_export import load_checkpoint, verdict
from msar_export.bench.mixer import depth_retrieval_model

REPO = Path(__file__).resolve().parent.parent
EPS = 1e-6
IR = {torch.float32: ir.DataType.FLOAT, torch.float16: ir.DataType.FLOAT16, torch.bfloat16: ir.DataType.BFLOAT16}


def checkpoint_cases(path: Path, prompt: bytes):
    """(name, query, views) per mixer of the checkpoint at the prompt's last token, views float32 as computed."""
    model = load_checkpoint(path).float().eval()
    views: dict[int, torch.Tensor] = {}
    hooks = [model.sources[str(i)].register_forward_hook(lambda mod, a, out, i=i: views.__setitem__(i, out))
             for i in range(model.cfg.n_sublayers + 1)]
    with torch.no_grad():
        model(torch.tensor([list(prompt)]))
    for h in hooks:
        h.remove()
    for l in range(1, model.cfg.n_sublayers + 2):
        vs = [views[i][:, -1:].contiguous() for i in range(l)]
        yield f"ckpt mixer {l} (n={l}, d={vs[0].shape[-1]})", model.mixers[str(l)].query.detach().float(), vs


def random_cases(n: int = 97, d: int = 512, m: int = 4):
    for sharp in (2.0, 8.0):
        g = torch.Generator().manual_seed(int(sharp))
        q = sharp / math.sqrt(d) * torch.randn(m, d, generator=g)
        yield f"random n={n} d={d} q x{sharp:g}", q, [torch.randn(1, 1, m, d, generator=g) for _ in range(n)]


def _float_io(model_bytes: bytes, dtype: int) -> bytes:
    """The one-node graph with float32 inputs and output around it (Casts to and from `dtype`): ONNX Runtime's
    Python API takes no bfloat16 arrays. Cast rounds to nearest even, as torch's .to() does."""
    import onnx
    from onnx import TensorProto, helper

    mp = onnx.load_from_string(model_bytes)
    g = mp.graph
    casts = []
    for inp in g.input:
        name, inp.name = inp.name, inp.name + "_f32"
        inp.type.tensor_type.elem_type = TensorProto.FLOAT
        casts.append(helper.make_node("Cast", [inp.name], [name], to=dtype))
    out = g.output[0]
    for node in g.node:
        node.output[:] = [o + "_stored" if o == out.name else o for o in node.output]
    nodes = [*casts, *g.node, helper.make_node("Cast", [out.name + "_stored"], [out.name], to=TensorProto.FLOAT)]
    out.type.tensor_type.elem_type = TensorProto.FLOAT
    del g.node[:]
    g.node.extend(nodes)
    return mp.SerializeToString()


def ort_run(q, views, dtype, ort_ops: str) -> torch.Tensor:
    from msar_export.runners.ort_runner import open_session

    model = depth_retrieval_model(len(views), q.shape[0], q.shape[1], eps=EPS, dtype=IR[dtype])
    s = open_session(_float_io(ir.serde.serialize_model(model).SerializeToString(), IR[dtype].value),
                     providers=["cpu"], threads=2, ort_ops=ort_ops)
    feeds = {"query_f32": q.numpy(), **{f"x{i}_f32": v.numpy() for i, v in enumerate(views)}}
    return torch.from_numpy(np.asarray(s.run(None, feeds)[0], dtype=np.float64))


def bf16_bar(ref) -> tuple[float, float]:
    """A bfloat16 graph's own output rounding (the exact output rounded) and the bar verdict.bound makes of it."""
    floor = verdict.rel_err(ref.to(torch.bfloat16).double(), ref)
    return floor, verdict.bound(floor, "bfloat16")


def emulation_error(lib, q, views, ref, store) -> float:
    """rel_err against `ref` of the kernel (emulated) over the views as `store` keeps them; the query in their dtype."""
    kept = [store(v) for v in views]
    got = lib.depth_retrieval(q.to(kept[0].dtype), kept, EPS)
    return verdict.rel_err(got.double(), ref)


def measure(lib, cases, ort: bool) -> list[dict]:
    rows = []
    for name, q, views in cases:
        ref = K.reference_depth_retrieval64(q, views, EPS)
        floor, bar = bf16_bar(ref)
        row = dict(case=name, bf16_output_rounding=floor, bf16_bound=bar)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            tag = str(dtype).removeprefix("torch.")
            row[f"emulation {tag}"] = emulation_error(lib, q, views, ref, lambda v, dtype=dtype: v.to(dtype))
            if ort:
                for ops in ("native", "function"):
                    try:
                        row[f"ort-{ops} {tag}"] = verdict.rel_err(ort_run(q, views, dtype, ops), ref)
                    except Exception as e:  # noqa: BLE001 - a runtime without that type is a row, not a crash
                        row[f"ort-{ops} {tag}"] = f"n/a ({type(e).__name__})"
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--emulation", required=True, help="libmsar_emulation.so")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--d", type=int, default=512, help="width of the random cases")
    args = ap.parse_args()
    lib = K.KernelLibrary(args.emulation)
    cases = [*checkpoint_cases(REPO / "checkpoints/default/msar", b"def main(argv):\n    return 0\n"),
             *random_cases(d=args.d)]
    for row in measure(lib, cases, not args.no_ort):
        print(row.pop("case"))
        for k, v in row.items():
            print(f"  {k:28s} {v:.2e}" if isinstance(v, float) else f"  {k:28s} {v}")


if __name__ == "__main__":
    main()
