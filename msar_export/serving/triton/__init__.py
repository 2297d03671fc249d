"""The Triton server itself: where it is installed, starting and stopping it, the
validating front, and clients."""
