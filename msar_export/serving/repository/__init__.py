"""Triton model repositories: config.pbtxt from the graph, checked against Triton's
ModelConfig schema, the Python-backend model.py, written atomically."""
