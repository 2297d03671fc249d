"""msar-export: reference model, ONNX export, TensorRT build and parity checks
for Multi-Stream Attention Residual language models."""

from .checkpoint import load_checkpoint, save_checkpoint
from .config import MSARConfig
from .errors import MsarError
from .model import MSARLM, generate

__version__ = "0.1.0"
__all__ = ["MSARConfig", "MSARLM", "MsarError", "generate", "load_checkpoint", "save_checkpoint"]
