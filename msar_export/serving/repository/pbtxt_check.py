"""Parse config.pbtxt files with Triton's ModelConfig schema (bundled, below).

Standalone on purpose (stdlib + protobuf, no package imports), so it also runs
as a script in any interpreter:

    python msar_export/serving/repository/pbtxt_check.py [--dump] FILE...

prints {file: null | "problem"} as JSON (with --dump: {file: the parsed config as
a dict, or {"error": problem}}); exit 0 when every file is valid.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path


# Triton's model_config.proto (BSD-3-Clause, triton-inference-server/common), as the
# serialized descriptor that tritonclient 2.73.0's model_config_pb2 carries: with it
# the main venv (protobuf 7, which tritonclient refuses) validates configs itself.
SCHEMA = Path(__file__).with_name("triton_model_config.desc")


@functools.lru_cache(maxsize=1)
def model_config_class():
    """Triton's ModelConfig message class, built from the bundled descriptor
    (works with any protobuf runtime; no generated code, no tritonclient)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(descriptor_pb2.FileDescriptorProto.FromString(SCHEMA.read_bytes()))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def parse_model_config(text: str):
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_class()())


def check_config(text: str, model_dir_name: str | None = None) -> str | None:
    """None if `text` is a valid ModelConfig for a model directory `model_dir_name`, else why not."""
    from google.protobuf import text_format

    try:
        cfg = parse_model_config(text)
    except text_format.ParseError as e:
        return f"does not parse as Triton ModelConfig: {e}"
    problems = []
    if model_dir_name is not None and cfg.name and cfg.name != model_dir_name:
        problems.append(f"name {cfg.name!r} differs from its directory {model_dir_name!r}")
    if not (cfg.backend or cfg.platform):
        problems.append("no backend or platform")
    if not cfg.input or not cfg.output:
        problems.append("no inputs or no outputs")
    for t in list(cfg.input) + list(cfg.output):
        if not t.name or t.data_type == 0:
            problems.append(f"tensor {t.name!r} has no name or no data_type")
        if not t.dims:
            problems.append(f"tensor {t.name!r} has no dims")
        if any(d == 0 or d < -1 for d in t.dims):
            problems.append(f"tensor {t.name!r} has invalid dims {list(t.dims)}")
    if cfg.max_batch_size < 0:
        problems.append("max_batch_size < 0")
    if cfg.HasField("dynamic_batching") and cfg.max_batch_size == 0:
        problems.append("dynamic_batching needs max_batch_size > 0")
    return "; ".join(problems) or None


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dump = "--dump" in args
    paths = [Path(p) for p in args if p != "--dump"]
    result = {str(p): check_config(p.read_text(), p.parent.name) for p in paths}
    if dump:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps({k: ({"error": v} if v else MessageToDict(parse_model_config(Path(k).read_text()),
                                                                  preserving_proto_field_name=True))
                          for k, v in result.items()}))
    else:
        print(json.dumps(result))
    return 0 if not any(result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
