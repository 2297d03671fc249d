#!/usr/bin/env python3
"""Coverage-guided fuzzing (atheris) of the untrusted-input loaders: config.json
text and model.safetensors bytes.  The only acceptable outcomes are a loaded
model or an `MsarError` (one-line user error); any other exception is a bug.

    .venv/bin/pip install atheris
    .venv/bin/python scripts/fuzz_loaders.py -max_total_time=60
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from msar_export.checkpoint import load_checkpoint
    from msar_export.config import MSARConfig
    from msar_export.errors import MsarError

GOOD_CONFIG = MSARConfig(vocab_size=11, d_model=8, n_blocks=1, n_heads=2, n_kv_heads=1, mlp_hidden=8,
                         max_seq_len=16, stream_kernels=(1, 2)).to_json()
WORK = Path(tempfile.mkdtemp(prefix="msar-fuzz-"))


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 1)
    ckpt = WORK / "ckpt"
    ckpt.mkdir(exist_ok=True)
    if which == 0:  # arbitrary config text, valid-looking weights file absent or garbage
        (ckpt / "config.json").write_text(fdp.ConsumeUnicodeNoSurrogates(4096), encoding="utf-8")
        (ckpt / "model.safetensors").write_bytes(fdp.ConsumeBytes(256))
    else:  # a valid config, arbitrary safetensors bytes (header length, JSON header, data)
        (ckpt / "config.json").write_text(GOOD_CONFIG)
        (ckpt / "model.safetensors").write_bytes(fdp.ConsumeBytes(fdp.remaining_bytes()))
    try:
        load_checkpoint(ckpt)
    except MsarError as e:
        if "\n" in str(e):
            raise AssertionError(f"multi-line user error: {e!r}") from None


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
