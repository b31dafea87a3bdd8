#!/usr/bin/env python3
"""Writes the golden safetensors files of this folder with an independent writer
(struct + json + numpy; no megackpt code), plus golden.expect.json describing
what a conforming reader must see in them.

  python3 tests/testdata/safetensors/make_golden.py   # rewrites the files in place

Files:
  reference.safetensors  laid out as the reference `safetensors.serialize` does:
                         tensors sorted by descending dtype alignment, then name;
                         compact JSON header ("__metadata__" first) padded with
                         spaces to a multiple of 8. One tensor of every dtype,
                         a 0-d tensor and an empty tensor.
  unaligned.safetensors  legal but unusual: header entries in arbitrary order and
                         data in yet another order, no 8-byte padding (the data
                         buffer starts at an odd offset, so F32/F64 data is
                         unaligned), two or three trailing spaces after the JSON.
"""
import hashlib
import json
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# The reference's dtype ranking (its Dtype enum order); higher is written first.
RANK = {"BOOL": 0, "F4": 1, "U8": 4, "I8": 5, "F8_E5M2": 6, "F8_E4M3": 7, "F8_E8M0": 8,
        "I16": 9, "U16": 10, "F16": 11, "BF16": 12, "I32": 13, "U32": 14, "F32": 15,
        "F64": 17, "I64": 18, "U64": 19}


def tensors():
    """name -> (dtype, shape, little-endian bytes)."""
    rng = np.random.default_rng(20240501)
    t = {}
    t["embed.weight"] = ("F32", [4, 3], np.arange(12, dtype="<f4").reshape(4, 3) / 8)
    t["layer.0.bias"] = ("F16", [5], np.linspace(-1, 1, 5).astype("<f2"))
    t["scalar"] = ("F64", [], np.array(3.25, dtype="<f8"))
    t["empty"] = ("F32", [0, 4], np.zeros((0, 4), dtype="<f4"))
    t["ids"] = ("I64", [2, 2], np.array([[1, -2], [3, -(2 ** 40)]], dtype="<i8"))
    t["u64"] = ("U64", [2], np.array([0, 2 ** 63 + 5], dtype="<u8"))
    t["i32"] = ("I32", [3], np.array([-7, 0, 2 ** 31 - 1], dtype="<i4"))
    t["u32"] = ("U32", [3], np.array([1, 2, 2 ** 32 - 1], dtype="<u4"))
    t["i16"] = ("I16", [2, 1], np.array([[-300], [300]], dtype="<i2"))
    t["u16"] = ("U16", [2], np.array([65535, 7], dtype="<u2"))
    t["i8"] = ("I8", [4], np.array([-128, -1, 0, 127], dtype="i1"))
    t["u8"] = ("U8", [7], np.arange(7, dtype="u1") * 30)
    t["mask"] = ("BOOL", [3], np.array([True, False, True]))
    # Types numpy has no name for: raw bit patterns.
    t["bf16"] = ("BF16", [2, 2], np.array([0x3F80, 0xC000, 0x0000, 0x7F80], dtype="<u2"))
    t["fp8.e4m3"] = ("F8_E4M3", [3], np.array([0x38, 0xB8, 0x7E], dtype="u1"))
    t["fp8.e5m2"] = ("F8_E5M2", [3], np.array([0x3C, 0xBC, 0x7B], dtype="u1"))
    t["fp8.e8m0"] = ("F8_E8M0", [2], np.array([127, 128], dtype="u1"))
    # F4: 6 elements packed two per byte (3 bytes).
    t["f4"] = ("F4", [2, 3], np.array([0x21, 0x43, 0x65], dtype="u1"))
    t["random"] = ("F32", [3, 5], rng.standard_normal((3, 5)).astype("<f4"))
    return {k: (d, s, np.ascontiguousarray(a).tobytes()) for k, (d, s, a) in t.items()}


def write(path, order_header, order_data, metadata, pad_to_8, trailing=""):
    ts = tensors()
    offsets, data, off = {}, b"", 0
    for name in order_data:
        raw = ts[name][2]
        offsets[name] = [off, off + len(raw)]
        data += raw
        off += len(raw)
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for name in order_header:
        dtype, shape, _ = ts[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": offsets[name]}
    text = json.dumps(header, separators=(",", ":")) + trailing
    if trailing and len(text) % 2 == 0:
        text += " "  # keep the data buffer at an odd file offset
    if pad_to_8:
        text += " " * ((8 - len(text) % 8) % 8)
    blob = struct.pack("<Q", len(text)) + text.encode("utf-8") + data
    with open(path, "wb") as f:
        f.write(blob)
    return {
        "header_bytes": len(text),
        "metadata": metadata or {},
        "tensors": [
            {"name": n, "dtype": ts[n][0], "shape": ts[n][1], "data_offsets": offsets[n],
             "sha256": hashlib.sha256(ts[n][2]).hexdigest()}
            for n in order_data
        ],
        "file_sha256": hashlib.sha256(blob).hexdigest(),
    }


def main():
    names = list(tensors())
    ts = tensors()
    ref_order = sorted(names, key=lambda n: (-RANK[ts[n][0]], n))
    expect = {}
    expect["reference.safetensors"] = write(
        os.path.join(HERE, "reference.safetensors"), ref_order, ref_order,
        {"format": "pt", "source": "make_golden.py"}, pad_to_8=True)
    header_order = sorted(names, key=lambda n: n[::-1])   # arbitrary but fixed
    data_order = sorted(names, key=lambda n: (len(n), n))  # another fixed order
    expect["unaligned.safetensors"] = write(
        os.path.join(HERE, "unaligned.safetensors"), header_order, data_order,
        {"note": "unaligned"}, pad_to_8=False, trailing="  ")
    hb = expect["unaligned.safetensors"]["header_bytes"]
    assert (8 + hb) % 2 == 1, "the unaligned file must start its data at an odd offset"
    with open(os.path.join(HERE, "golden.expect.json"), "w") as f:
        json.dump(expect, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
