#!/usr/bin/python3
"""Writes the MEGA v1 golden files in this folder, with an independent writer.

This script shares no code with the C++ library: it encodes the format from
docs/format/mega-v1.md with struct/numpy/zlib/hashlib only, so the C++ reader
(and, for tensorplay_dict.mega, the C++ writer) are cross-checked against a
second implementation. zstd payloads are built by hand from RAW and RLE blocks
(a valid zstd frame per RFC 8878), so no zstd Python module is needed.

Each NAME.mega comes with NAME.expect.json, written from this script's own
inputs (never by parsing the output), in the schema of
tests/testdata/mega-reference/*.expect.json plus chunk/segment/MoE/overlay
details.

Run:  /usr/bin/python3 tests/testdata/mega/make_golden.py   (from anywhere)
"""
import hashlib
import json
import os
import struct
import zlib

import numpy as np

OUT = os.path.dirname(os.path.abspath(__file__))

MAGIC = 0x4147454D
FOOTER_MAGIC = 0x4654474D

# Metadata value types.
U8, I8, U16, I16, U32, I32, U64, I64, F32, F64, BOOL, STRING, ARRAY = range(13)
TYPE_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64",
              "FLOAT32", "FLOAT64", "BOOL", "STRING", "ARRAY"]
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", U64: "<Q",
              I64: "<q", F32: "<f", F64: "<d", BOOL: "<B"}

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
              "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
              "I64": 8, "U64": 8, "F64": 8}

CK_NONE, CK_CRC32, CK_SHA256 = 0, 1, 2
CK_NAMES = ["NONE", "CRC32", "SHA256"]
COMPRESSED, SHUFFLED = 1, 2


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def string(s):
    b = s.encode("utf-8")
    return u64(len(b)) + b


def cstring(s):
    b = s.encode("utf-8")
    return u32(len(b)) + b


def encode_value(t, v):
    """v is a Python value; arrays are (element_type, [values])."""
    if t in SCALAR_FMT:
        return struct.pack(SCALAR_FMT[t], int(v) if t == BOOL else v)
    if t == STRING:
        return string(v)
    elem, items = v
    return u32(elem) + u64(len(items)) + b"".join(encode_value(elem, x) for x in items)


def json_value(t, v):
    if t == ARRAY:
        elem, items = v
        return [json_value(elem, x) for x in items]
    if t == F32:
        return float(np.float32(v))
    if t == BOOL:
        return bool(v)
    return v


def encode_entries(md):
    return b"".join(string(k) + u32(t) + encode_value(t, v) for k, t, v in md)


def align_up(v, a):
    return (v + a - 1) // a * a


def checksum_field(kind, data):
    if kind == CK_CRC32:
        return u32(zlib.crc32(data) & 0xFFFFFFFF) + bytes(28)
    if kind == CK_SHA256:
        return hashlib.sha256(data).digest()
    return bytes(32)


def shuffle(data, elem_size):
    a = np.frombuffer(data, dtype=np.uint8).reshape(-1, elem_size)
    return a.T.copy().tobytes()


def zstd_frame(data):
    """A zstd frame of RAW and RLE blocks with the content size in the header."""
    out = bytearray(u32(0xFD2FB528))
    out.append(0xE0)  # FCS field 8 bytes, single segment, no checksum, no dictionary
    out += u64(len(data))
    blocks = []  # (type, payload, regenerated size)
    i, n = 0, len(data)
    raw_start = 0
    max_block = 128 * 1024

    def flush_raw(end):
        s = raw_start
        while s < end:
            e = min(end, s + max_block)
            blocks.append((0, data[s:e], e - s))
            s = e

    while i < n:
        j = i
        while j < n and data[j] == data[i] and j - i < max_block:
            j += 1
        if j - i >= 16:
            flush_raw(i)
            blocks.append((1, data[i:i + 1], j - i))
            raw_start = j
        i = j
    flush_raw(n)
    if not blocks:
        blocks.append((0, b"", 0))
    for k, (btype, payload, size) in enumerate(blocks):
        last = 1 if k == len(blocks) - 1 else 0
        header = last | (btype << 1) | (size << 3)
        out += struct.pack("<I", header)[:3] + payload
    return bytes(out)


class Tensor:
    def __init__(self, name, dtype, shape, data, recipe, checksum=CK_NONE, zstd=False,
                 shuffle_elem=0, chunks=None):
        self.name, self.dtype, self.shape = name, dtype, list(shape)
        self.data = bytes(data)  # decoded bytes
        self.recipe = recipe
        self.checksum = checksum
        self.zstd = zstd
        self.shuffle_elem = shuffle_elem
        # chunks: list of dicts {chunk_id, lo, hi, zstd, shuffle, checksum}; None = raw_dense
        self.chunks = chunks

    def encode_stored(self, raw, zstd, shuffled):
        b = raw
        if shuffled:
            b = shuffle(b, self.shuffle_elem)
        if zstd:
            b = zstd_frame(b)
        return b


def build(name, md, tensors, alignment, segments=(), moe=(), chunk_record_order=None,
          overlays=(), description=""):
    """Lays out and writes NAME.mega and NAME.expect.json."""
    payload = bytearray()
    dir_entries = []
    chunk_records = []  # (tensor_id, chunk dict with payload offsets)
    tensor_exp = []
    for tid, t in enumerate(tensors):
        logical = len(t.data)
        exp = {"tensor_id": tid, "name": t.name, "dtype": t.dtype, "shape": t.shape,
               "logical_nbytes": logical, "decoded_nbytes": logical,
               "decoded_sha256": hashlib.sha256(t.data).hexdigest(), "recipe": t.recipe}
        if t.chunks is None:
            stored = t.encode_stored(t.data, t.zstd, t.shuffle_elem > 0)
            offset = len(payload)
            payload += stored
            flags = (COMPRESSED if t.zstd else 0) | (SHUFFLED if t.shuffle_elem else 0)
            codec = 1 if t.zstd else 0
            ck = checksum_field(t.checksum, stored)
            storage, chunks_exp = "raw_dense", []
            ck_type = t.checksum
            stored_n = len(stored)
        else:
            storage, ck_type, ck = "chunked_raw_dense", CK_NONE, bytes(32)
            offset = len(payload)
            flags, codec, stored_n, chunks_exp = 0, 0, 0, []
            for c in t.chunks:
                raw = t.data[c["lo"]:c["hi"]]
                sb = t.encode_stored(raw, c["zstd"], c["shuffle"])
                cflags = (COMPRESSED if c["zstd"] else 0) | (SHUFFLED if c["shuffle"] else 0)
                rec = {"tensor_id": tid, "chunk_id": c["chunk_id"], "logical_offset": c["lo"],
                       "logical_size": c["hi"] - c["lo"], "payload_offset": len(payload),
                       "stored_size": len(sb), "codec": 1 if c["zstd"] else 0, "flags": cflags,
                       "checksum_type": c["checksum"],
                       "checksum_hex": checksum_field(c["checksum"], sb).hex()}
                payload += sb
                chunk_records.append(rec)
                chunks_exp.append(rec)
                flags |= cflags
                codec = 1 if c["zstd"] else codec
                stored_n += len(sb)
            chunks_exp.sort(key=lambda r: r["logical_offset"])
        shuffle_elem = t.shuffle_elem if (flags & SHUFFLED) else 0
        dir_flags = ((1 if storage != "raw_dense" else 0) | (2 if stored_n != logical else 0) |
                     (4 if flags else 0) | (8 if codec else 0) | (16 if shuffle_elem else 0) |
                     (32 if ck_type else 0))
        e = cstring(t.name) + u32(dir_flags) + u32(len(t.shape))
        e += b"".join(u64(d) for d in reversed(t.shape))
        e += cstring(t.dtype) + u64(offset)
        if dir_flags & 1:
            e += cstring(storage)
        if dir_flags & 2:
            e += u64(stored_n)
        if dir_flags & 4:
            e += u32(flags)
        if dir_flags & 8:
            e += u32(codec)
        if dir_flags & 16:
            e += u32(shuffle_elem)
        if dir_flags & 32:
            e += u32(ck_type) + ck
        dir_entries.append(e)
        exp.update({"storage_format": storage, "payload_offset": offset, "stored_nbytes": stored_n,
                    "flags": flags, "codec": codec, "codec_name": ["NONE", "ZSTD"][codec],
                    "shuffle_elem_size": shuffle_elem, "checksum_type": ck_type,
                    "checksum_type_name": CK_NAMES[ck_type], "checksum_hex": ck.hex(),
                    "dir_flags": dir_flags, "chunks": chunks_exp})
        tensor_exp.append(exp)

    if chunk_record_order is not None:
        chunk_records = [chunk_records[i] for i in chunk_record_order]
    records = b""
    for r in chunk_records:
        records += (u32(r["tensor_id"]) + u32(r["chunk_id"]) + u64(r["logical_offset"]) +
                    u64(r["logical_size"]) + u64(r["payload_offset"]) + u64(r["stored_size"]) +
                    u32(r["codec"]) + u32(r["flags"]) + u32(r["checksum_type"]) + u32(0) +
                    bytes.fromhex(r["checksum_hex"]))
    for s in segments:
        records += b"".join(u32(s[k]) for k in ("segment_id", "kind", "priority", "flags",
                                                "layer_start", "layer_end", "expert_start",
                                                "expert_end"))
        records += u64(s["payload_offset"]) + u64(s["payload_size"])
        records += b"".join(u32(s[k]) for k in ("first_tensor_id", "tensor_count",
                                                "prefetch_group", "device_hint", "cache_policy"))
        records += u32(0)
    for m in moe:
        records += b"".join(u32(m[k]) for k in ("tensor_id", "layer_id", "expert_id",
                                                "expert_role", "segment_id", "prefetch_group",
                                                "cache_policy"))
        records += u32(0)

    head = u32(MAGIC) + u32(1) + u64(len(tensors)) + u64(len(md)) + encode_entries(md)
    head += b"".join(dir_entries) + records
    header_length = align_up(len(head), alignment)
    base = head + bytes(header_length - len(head)) + bytes(payload)
    data = base
    overlay_exp = {"present": False, "generation": 0, "overlay_offset": 0, "overlay_size": 0,
                   "base_size": 0, "checksum_hex": "", "metadata": {}, "metadata_key_order": []}
    for gen, entries in enumerate(overlays, start=1):
        ov = u32(FOOTER_MAGIC) + u64(len(entries)) + encode_entries(entries)
        sha = hashlib.sha256(ov).digest()
        offset = len(data)
        data = data + ov + u32(FOOTER_MAGIC) + u64(gen) + u64(offset) + u64(len(ov)) + \
            u64(len(base)) + sha
        overlay_exp = {"present": True, "generation": gen, "overlay_offset": offset,
                       "overlay_size": len(ov), "base_size": len(base), "checksum_hex": sha.hex(),
                       "metadata": {k: {"type": TYPE_NAMES[t], "value": json_value(t, v)}
                                    for k, t, v in entries},
                       "metadata_key_order": [k for k, _, _ in entries]}

    def md_json(entries):
        return {k: {"type": TYPE_NAMES[t], "value": json_value(t, v)} for k, t, v in entries}

    effective = list(md)
    if overlays:
        keys = [k for k, _, _ in effective]
        for k, t, v in overlays[-1]:
            if k in keys:
                effective[keys.index(k)] = (k, t, v)
            else:
                effective.append((k, t, v))
                keys.append(k)
    expect = {
        "schema": "mega-golden-expectation/1",
        "file": name + ".mega",
        "description": description,
        "generator": "tests/testdata/mega/make_golden.py",
        "file_size": len(data),
        "file_sha256": hashlib.sha256(data).hexdigest(),
        "parse_ok": True,
        "version": 1,
        "header_length": header_length,
        "payload_end": len(base),
        "alignment": alignment,
        "header_metadata": md_json(md),
        "header_metadata_key_order": [k for k, _, _ in md],
        "metadata": md_json(effective),
        "metadata_key_order": [k for k, _, _ in effective],
        "tensors": tensor_exp,
        "segments": list(segments),
        "moe_experts": list(moe),
        "footer_overlay": overlay_exp,
    }
    with open(os.path.join(OUT, name + ".mega"), "wb") as f:
        f.write(data)
    with open(os.path.join(OUT, name + ".expect.json"), "w") as f:
        json.dump(expect, f, indent=1)
        f.write("\n")


def arr(dtype, values):
    return np.asarray(values, dtype=dtype).tobytes()


def every_metadata_type():
    return [
        ("general.architecture", STRING, "mega-golden-py"),
        ("general.alignment", U32, 64),
        ("mega.tensor_info.format", STRING, "self_describing"),
        ("t.u8", U8, 250), ("t.i8", I8, -7), ("t.u16", U16, 65000), ("t.i16", I16, -32000),
        ("t.u32", U32, 4000000000), ("t.i32", I32, -2000000000),
        ("t.u64", U64, 2 ** 64 - 2), ("t.i64", I64, -(2 ** 62)),
        ("t.f32", F32, 0.1), ("t.f64", F64, -2.5e-300), ("t.bool", BOOL, True),
        ("t.str", STRING, "naïve ✓"),
        ("t.arr.u32", ARRAY, (U32, [1, 2, 4294967295])),
        ("t.arr.str", ARRAY, (STRING, ["a", "", "ccc"])),
        ("t.arr.i16", ARRAY, (I16, [-1, 2])),
        ("t.arr.f64", ARRAY, (F64, [0.5, -1.0])),
        ("t.arr.bool", ARRAY, (BOOL, [True, False, True])),
        ("t.arr.empty", ARRAY, (U8, [])),
        ("t.arr.nested", ARRAY, (ARRAY, [(U32, [1, 2]), (STRING, ["x"])])),
    ]


def golden_chunked():
    w = (np.arange(128, dtype="<f4") // 8).astype("<f4")  # runs of equal values
    w[:32] = np.arange(32, dtype="<f4") * 0.37
    t = Tensor("w.chunked", "F32", [8, 16], w.tobytes(),
               "f = (np.arange(128, dtype='<f4') // 8); f[:32] = np.arange(32) * 0.37",
               shuffle_elem=4,
               chunks=[dict(chunk_id=3, lo=0, hi=128, zstd=False, shuffle=False, checksum=CK_CRC32),
                       dict(chunk_id=5, lo=128, hi=320, zstd=True, shuffle=True,
                            checksum=CK_SHA256),
                       dict(chunk_id=7, lo=320, hi=512, zstd=True, shuffle=False,
                            checksum=CK_NONE)])
    empty = Tensor("e.chunked_empty", "F16", [0, 4], b"", "np.zeros((0, 4), '<f2')", chunks=[])
    b = Tensor("b.raw", "U8", [5], arr("u1", [9, 8, 7, 6, 5]), "np.array([9,8,7,6,5], 'u1')",
               checksum=CK_CRC32)
    i16 = np.arange(300, dtype="<i2") * 3
    c2 = Tensor("i.chunked_shuffled_raw", "I16", [300], i16.tobytes(),
                "np.arange(300, dtype='<i2') * 3", shuffle_elem=2,
                chunks=[dict(chunk_id=0, lo=0, hi=400, zstd=False, shuffle=True,
                             checksum=CK_CRC32),
                        dict(chunk_id=1, lo=400, hi=600, zstd=True, shuffle=True,
                             checksum=CK_CRC32)])
    md = every_metadata_type() + [("mega.chunk_directory.count", U32, 5),
                                  ("mega.chunk_directory.format", STRING, "v1")]
    build("chunked", md, [t, empty, b, c2], alignment=64,
          chunk_record_order=[4, 2, 0, 3, 1],
          description="chunked_raw_dense tensors: raw / zstd+shuffle / zstd chunks with CRC32, "
                      "SHA-256 and no checksum, non-sequential chunk ids, records out of order; "
                      "an empty chunked tensor without chunks; every metadata value type.")


def golden_shuffle():
    f = (1.0 + np.arange(256, dtype="<f4") * 2 ** -10).astype("<f4")
    s1 = Tensor("s.zstd_shuffle.f32", "F32", [16, 16], f.tobytes(),
                "1 + np.arange(256, dtype='<f4') * 2**-10", checksum=CK_CRC32, zstd=True,
                shuffle_elem=4)
    i = (np.arange(10, dtype="<i2") * 1000 - 3000)
    s2 = Tensor("s.shuffle_only.i16", "I16", [2, 5], i.tobytes(),
                "np.arange(10, dtype='<i2') * 1000 - 3000", checksum=CK_SHA256, shuffle_elem=2)
    d = np.repeat(np.arange(8, dtype="<f8"), 8)
    s3 = Tensor("s.zstd.f64", "F64", [64], d.tobytes(), "np.repeat(np.arange(8, dtype='<f8'), 8)",
                zstd=True)
    bf = (np.arange(6, dtype="<u2") + 0x3F80)
    s4 = Tensor("s.plain.bf16", "BF16", [3, 2], bf.tobytes(), "np.arange(6, dtype='<u2') + 0x3F80")
    s5 = Tensor("s.zstd_shuffle.u64", "U64", [32], np.arange(32, dtype="<u8").tobytes(),
                "np.arange(32, dtype='<u8')", zstd=True, shuffle_elem=8, checksum=CK_SHA256)
    md = [("general.architecture", STRING, "mega-golden-py"), ("general.alignment", U32, 32)]
    build("shuffle", md, [s1, s2, s3, s4, s5], alignment=32,
          description="BYTE_SHUFFLED tensors (elem sizes 2, 4, 8), with and without zstd; "
                      "checksums over the stored (shuffled/compressed) bytes.")


def golden_overlay():
    a = Tensor("a.f32", "F32", [3], arr("<f4", [1.5, -2.0, 0.25]), "[1.5, -2.0, 0.25]",
               checksum=CK_CRC32)
    b = Tensor("b.i64", "I64", [2, 2], arr("<i8", [1, -1, 2 ** 40, -(2 ** 40)]),
               "[1, -1, 2**40, -2**40]", checksum=CK_SHA256)
    md = [("general.architecture", STRING, "mega-golden-py"), ("general.alignment", U32, 128),
          ("note", STRING, "header"), ("keep", U32, 7)]
    gen1 = [("note", STRING, "first"), ("sig.alg", STRING, "ed25519")]
    gen2 = [("note", STRING, "second"), ("sig.alg", STRING, "ed25519"),
            ("sig.value", STRING, hashlib.sha256(b"payload").hexdigest()),
            ("sig.time", U64, 1700000000)]
    build("overlay", md, [a, b], alignment=128, overlays=[gen1, gen2],
          description="Footer overlay appended twice: generation 2's overlay holds every "
                      "overlay key (complete), appended after generation 1's trailer; "
                      "base_size = the original file size.")


def golden_segments_moe():
    ts = []
    for e in range(4):
        v = np.full(8, e, dtype="<f4") + np.arange(8, dtype="<f4")
        ts.append(Tensor("layers.0.experts.%d.w" % e, "F32", [2, 4], v.tobytes(),
                         "np.full(8, %d) + np.arange(8)" % e, checksum=CK_CRC32))
    router = Tensor("layers.0.router", "F32", [4], arr("<f4", [0.1, 0.2, 0.3, 0.4]),
                    "[0.1, 0.2, 0.3, 0.4]")
    ts.append(router)
    seg = lambda sid, kind, first, count, off, size, es, ee: dict(
        segment_id=sid, kind=kind, priority=sid, flags=0, layer_start=0, layer_end=0,
        expert_start=es, expert_end=ee, payload_offset=off, payload_size=size,
        first_tensor_id=first, tensor_count=count, prefetch_group=sid, device_hint=0,
        cache_policy=1, reserved=0)
    segments = [seg(10, 1, 0, 2, 0, 64, 0, 1), seg(11, 1, 2, 2, 64, 64, 2, 3),
                seg(12, 2, 4, 1, 128, 16, 0, 0)]
    moe = []
    for e in range(4):
        moe.append(dict(tensor_id=e, layer_id=0, expert_id=e, expert_role=1,
                        segment_id=10 if e < 2 else 11, prefetch_group=e // 2,
                        cache_policy=1, reserved=0))
    moe[3]["segment_id"] = 0xFFFFFFFF
    md = [("general.architecture", STRING, "mega-golden-py"), ("general.alignment", U32, 32),
          ("mega.segment_directory.count", U32, 3), ("mega.segment_directory.format", STRING, "v1"),
          ("mega.moe.expert_table.count", U32, 4), ("mega.moe.expert_table.format", STRING, "v1"),
          ("mega.moe.n_experts", U32, 4)]
    build("segments_moe", md, ts, alignment=32, segments=segments, moe=moe,
          description="Segment table (3 records) and MoE expert table (4 records, one without "
                      "a segment) over 5 tensors; mega.moe.n_experts = 4.")


def golden_tensorplay():
    """What our MegaWriter's TensorPlay profile must write for a plain dict
    (default options: alignment 4096, CRC32, packed payload)."""
    tensors = [
        Tensor("model.embed.weight", "F32", [4, 3], (np.arange(12, dtype="<f4") / 7).tobytes(),
               "np.arange(12, dtype='<f4') / 7", checksum=CK_CRC32),
        Tensor("model.norm.bias", "BF16", [3], arr("<u2", [0x3F80, 0x4000, 0xBF80]),
               "bf16 [1, 2, -1]", checksum=CK_CRC32),
        Tensor('odd "name" é', "I8", [5], arr("i1", [-1, 0, 1, 2, 3]), "[-1, 0, 1, 2, 3]",
               checksum=CK_CRC32),
        Tensor("step", "I64", [], arr("<i8", [1000]), "np.int64(1000)", checksum=CK_CRC32),
    ]
    sums = {}
    for t in tensors:
        sums[t.name] = "%08x" % (zlib.crc32(t.data) & 0xFFFFFFFF)
    md = [("general.architecture", STRING, "tensorplay"), ("general.alignment", U32, 4096),
          ("mega.tensor_info.format", STRING, "self_describing"),
          ("tensorplay.container", STRING, "dict"), ("tensorplay.byteorder", STRING, "little"),
          ("tensorplay.tensor_devices", STRING, json.dumps({t.name: "cpu" for t in tensors})),
          ("tensorplay.checksum", STRING, "crc32"),
          ("tensorplay.tensor_checksums", STRING, json.dumps(sums))]
    build("tensorplay_dict", md, tensors, alignment=4096,
          description="TensorPlay profile for a plain dict (json.dumps defaults, CRC32 hex as "
                      "%08x of the u32, alignment 4096, packed payload).")


if __name__ == "__main__":
    golden_chunked()
    golden_shuffle()
    golden_overlay()
    golden_segments_moe()
    golden_tensorplay()
    print("wrote golden files to", OUT)
