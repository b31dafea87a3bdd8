#!/usr/bin/env python3
"""An independent safetensors reader (struct + json + numpy; no megackpt code),
used by the C++ tests to check that files megackpt writes are readable by
others.

  read_safetensors.py FILE   -> prints {"metadata": {...}, "tensors": {name:
                                {"dtype", "shape", "data_offsets", "sha256"}}}
Exit status 1 with a message on stderr when the file breaks the format: header
cap, '{' start, data_offsets tiling the data buffer exactly, nbytes matching
dtype x shape. Numeric tensors are also decoded with numpy (little-endian) and
reshaped, to prove the bytes are laid out as numpy expects.
"""
import hashlib
import json
import struct
import sys

import numpy as np

BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16,
        "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64,
        "U64": 64, "F64": 64, "F4": 4}
NUMPY = {"BOOL": "?", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
         "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8"}


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(1)


def main(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > 100_000_000 or 8 + n > len(blob):
        fail(f"bad header length {n}")
    text = blob[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        fail("header does not start with '{'")

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            fail("duplicate key in header")
        return dict(pairs)

    header = json.loads(text, object_pairs_hook=no_dups)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    if not all(isinstance(v, str) for v in meta.values()):
        fail("__metadata__ values must be strings")
    out = {}
    spans = []
    for name, e in header.items():
        dtype, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        if count * BITS[dtype] % 8:
            fail(f"{name}: not a whole number of bytes")
        if end - b != count * BITS[dtype] // 8:
            fail(f"{name}: data_offsets do not match dtype and shape")
        raw = data[b:end]
        if dtype in NUMPY:
            arr = np.frombuffer(raw, dtype=NUMPY[dtype]).reshape(shape)
            assert arr.shape == tuple(shape)
        spans.append((b, end, name))
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [b, end],
                     "sha256": hashlib.sha256(raw).hexdigest()}
    pos = 0
    for b, end, name in sorted(spans):
        if b != pos:
            fail(f"{name}: gap or overlap at {pos}")
        pos = end
    if pos != len(data):
        fail(f"data buffer of {len(data)} bytes not covered (tensors end at {pos})")
    print(json.dumps({"metadata": meta, "tensors": out}, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1])
