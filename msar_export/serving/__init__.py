"""Serving exported MSAR models on Triton Inference Server.

- `repository/`: model repositories, written atomically: stock backends
  (`onnxruntime` for ONNX, `tensorrt` for an engine, `msar-export triton-repo`) and
  the Python-backend `logits` / `generate` models that `msar-export serve` runs
  (`triton_model.py` over the one ONNX Runtime runner, with dynamic batching across
  requests of different lengths); config.pbtxt from the graph's I/O, validated with
  Triton's ModelConfig schema.
- `triton/`: the `tritonserver` binary from nvidia-pytriton in .venv-triton
  (scripts/setup_triton_env.sh), started on 127.0.0.1 behind a validating front and
  stopped cleanly; tritonclient over HTTP and gRPC.
- `load/`: a bounded load test whose every answer is judged (float64 eager with
  `--checkpoint`, else the served file at batch 1), with malformed requests mixed in, and
  Triton's perf_analyzer beside it (`perf_analyzer.py`).
- `sources.py`: what to serve (a checkpoint, exported once, or ONNX files); `cli.py`:
  the `triton-repo`, `serve` and `loadtest` commands over all of this.

Nothing heavy is imported here: the main venv has no tritonclient (it pins
protobuf<7) and the Triton venv has no export toolchain.
"""
