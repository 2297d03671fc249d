"""Our ONNX files through the ecosystem's tools.

The `msar` functions are overloads of one name per op (`FusedMixer` with
`overload="n{sources}"`): the op is variadic and an ONNX function's input
list is not.  That is legal ONNX and ONNX Runtime and TensorRT handle it,
but tools that key functions by name alone do not:

- `onnx.reference.ReferenceEvaluator` runs the last overload for every node
  -> `reference.reference_evaluator` resolves overloads itself;
- `onnx.version_converter` drops every function
  -> `opset.convert_opset` converts the bodies too and keeps them;
- onnx-graphsurgeon (and `polygraphy surgeon`) write functions and nodes back
  without their overload -> `overloads.restore_overloads` puts them back from
  each function's and node's arity, and `surgeon.sanitize` is Polygraphy's
  sanitize with that repair applied.

`msar-export onnx ...` is the command-line face (docs/interop.md).  Every command
opens a file through graph_file.ExportedGraph.open, which names a file one of these
tools broke and the `msar-export onnx repair` command that mends it; `repair`
rebuilds bodies a tool deleted (onnxslim keeps one per name) from msar.config.

`genai.py` (`msar-export genai`) writes the folder ONNX Runtime GenAI loads.
"""
