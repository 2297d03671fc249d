"""Two graphs timed each in a process of its own, the processes alternated: the ratio a deployment
with one model per process sees, where the in-process pairs (prefill_pair.py, decode_pair.py, the
bench's goal rows) let each model's weights evict the other's from the cache between runs.

    python scripts/process_pair.py standard.onnx msar.onnx [--tokens 512]
    python scripts/process_pair.py standard.decode.onnx msar.decode.onnx --batch 8

Each process: one session (2 threads), 3 warm-up runs, then the median of `--runs` runs (a prefill
of 1 x tokens, or 16 decode steps after a 64-token prompt, in ms per step); the median of the
per-round ratios B / A. The bench reports the same for its goal rows (msar_export.bench.processes);
docs/ort_kernels.md has what it measured."""

from msar_export.bench.processes import main

if __name__ == "__main__":
    main()
