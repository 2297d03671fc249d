from .generate import generate
from .lm import DecodeCache, DepthPath, MSARLM

__all__ = ["MSARLM", "DecodeCache", "DepthPath", "generate"]
