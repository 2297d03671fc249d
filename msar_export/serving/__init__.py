"""Serving exported MSAR models on Triton Inference Server.

- `repo`: model repositories: stock backends (`onnxruntime` for ONNX, `tensorrt`
  for an engine, `msar-export triton-repo`) and the Python-backend `logits` /
  `generate` models that `msar-export serve` runs (`triton_model.py` over ONNX
  Runtime, with dynamic batching across requests of different lengths).
- `modelconfig` / `pbtxt_check`: config.pbtxt from the ONNX graph's I/O, validated
  with Triton's ModelConfig schema.
- `env` / `server`: the `tritonserver` binary from nvidia-pytriton in .venv-triton
  (scripts/setup_triton_env.sh), started on 127.0.0.1 and stopped cleanly.
- `client` / `loadtest`: tritonclient over HTTP and gRPC; a bounded load test
  whose every answer is compared with a batch-1 ONNX Runtime run.

Nothing heavy is imported here: the main venv has no tritonclient (it pins
protobuf<7) and the Triton venv has no export toolchain.
"""
