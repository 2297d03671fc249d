"""One exception hierarchy for user errors.

`MsarError` and its subclasses mean "the input is wrong": the CLI prints the
message on one line and exits 2.  Anything else escaping the CLI is a bug in
msar-export and keeps its traceback (exit 1).
"""


class MsarError(Exception):
    """A user error whose message says what is wrong and what to do."""


class ConfigError(MsarError):
    """config.json is malformed or contradicts itself."""


class CheckpointError(MsarError):
    """A checkpoint directory or its tensors cannot be used."""


class OnnxModelError(MsarError):
    """An ONNX file is unreadable or does not match what was asked."""


class EngineError(MsarError):
    """A TensorRT engine or its metadata cannot be used."""


class InputError(MsarError):
    """Token ids, masks or shapes given to a model are invalid."""


class OutputError(MsarError):
    """An output path cannot be written (not a regular file, not ours, unwritable, disk full)."""


class BackendUnavailable(MsarError):
    """A backend (TensorRT, CUDA, Triton) is not installed on this machine."""


def first_line(e: BaseException) -> str:
    """An exception's first non-empty line (its type name if it has no text), for one-line errors."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
