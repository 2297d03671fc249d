"""ONNX Runtime GenAI beside `msar-export generate --onnx` on the same decode graph:
greedy tokens/s (docs/interop.md's GenAI section).

    python scripts/bench_genai.py [CKPT] [--new-tokens 128] [--repeats 5]

Exports CKPT's float32 decode graph once, writes the GenAI folder from it (the same graph
with the conv-state reshapes), and times, interleaved, a batch-1 greedy run of each from
the same prompt; both use the native msar kernels when they are built, 2 threads."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from msar_export.bench.timing import interleaved, machine_description
from msar_export.export import ExportOptions, export_checkpoint
from msar_export.interop.genai import assemble
from msar_export.runtime import OrtDecoder

PROMPT = list(b"def parse(text):\n    ")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("checkpoint", nargs="?", default=str(Path(__file__).resolve().parent.parent / "checkpoints/default/msar"))
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    n = a.new_tokens
    with tempfile.TemporaryDirectory() as tmp:
        decode = Path(tmp) / "decode.onnx"
        export_checkpoint(a.checkpoint, decode, ExportOptions(decode=True), validate=False)
        folder = Path(tmp) / "genai"
        assemble(decode, Path(a.checkpoint), folder)
        config = og.Config(str(folder))
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": 2}}}}))
        model = og.Model(config)
        ours = OrtDecoder(decode, threads=2)
        got = {}

        def genai():
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(PROMPT) + n, do_sample=False)
            gen = og.Generator(model, params)
            gen.append_tokens(np.array([PROMPT], dtype=np.int32))
            while not gen.is_done():
                gen.generate_next_token()
            got["genai"] = [int(t) for t in gen.get_sequence(0)][len(PROMPT):]

        def generate_onnx():
            out = ours.generate(np.array([PROMPT]), max_new_tokens=n, eos_token_id=0)
            got["ours"] = out[0, len(PROMPT):].tolist()

        t = interleaved({"genai": genai, "generate --onnx": generate_onnx}, warmup=1, repeats=a.repeats)
        same = got["genai"] == got["ours"][: len(got["genai"])]
        for k, v in t.items():
            print(json.dumps({"runner": k, "new_tokens": n, "median_s": round(v.median_s, 4),
                              "tokens_per_s": round(n / v.median_s, 1), "iqr_s": round(v.iqr_s, 4)}))
        print(json.dumps({"same_tokens": same, "genai_tokens": len(got["genai"]), "machine": machine_description(2)}))


if __name__ == "__main__":
    main()
