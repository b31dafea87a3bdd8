// The records a CAS keeps besides chunk bytes: how a file is rebuilt from xorb
// chunk ranges (FileReconstruction) and where each chunk sits inside a xorb
// (XorbLayout). These are exactly the two kinds of record of a Xet MDB shard
// (see shard.h and docs/cas.md).
#ifndef MEGACKPT_CAS_RECONSTRUCTION_H_
#define MEGACKPT_CAS_RECONSTRUCTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "megackpt/cas/hash.h"
#include "megackpt/core/status.h"

namespace megackpt::cas {

// One piece of a file: chunks [chunk_start, chunk_end) of one xorb, whose
// decompressed bytes are `unpacked_bytes` long. Adjacent terms never describe
// contiguous ranges of the same xorb (uploads merge them).
struct ReconstructionTerm {
  MerkleHash xorb_hash;
  uint32_t chunk_start = 0;
  uint32_t chunk_end = 0;  // exclusive; > chunk_start
  uint64_t unpacked_bytes = 0;
  // blake3_keyed(VERIFICATION_KEY, chunk hashes of the range) — Xet's per-term
  // verification entry. Zero when unknown.
  MerkleHash verification_hash;
  friend bool operator==(const ReconstructionTerm&, const ReconstructionTerm&) = default;
};

// An ordered list of terms whose concatenated bytes are the file.
struct FileReconstruction {
  MerkleHash file_hash;
  uint64_t size = 0;  // == sum of terms' unpacked_bytes
  std::vector<ReconstructionTerm> terms;
  friend bool operator==(const FileReconstruction&, const FileReconstruction&) = default;

  // InvalidArgument/DataLoss naming the file when: size != sum of term bytes,
  // a term has chunk_end <= chunk_start or unpacked_bytes == 0, or the file is
  // empty but has terms.
  Status Validate() const;
};

// One chunk of a xorb as stored.
struct XorbChunk {
  MerkleHash hash;              // chunk hash of the uncompressed bytes
  uint32_t byte_offset = 0;     // offset of the chunk's 8-byte record header in the xorb
  uint32_t unpacked_bytes = 0;  // uncompressed length
  friend bool operator==(const XorbChunk&, const XorbChunk&) = default;
};

// Where every chunk of a xorb lives: lets a reader fetch only the byte range
// of chunks [a, b): [chunks[a].byte_offset, RecordEnd(b-1)).
struct XorbLayout {
  MerkleHash xorb_hash;
  std::vector<XorbChunk> chunks;
  uint32_t serialized_bytes = 0;  // length of the chunk records (no footer)

  // Byte offset one past chunk i's record (the next record's offset, or
  // serialized_bytes for the last chunk). REQUIRES: i < chunks.size().
  uint32_t RecordEnd(size_t i) const {
    return i + 1 < chunks.size() ? chunks[i + 1].byte_offset : serialized_bytes;
  }
  // Checks offsets are increasing, within serialized_bytes, each record at
  // least 8 bytes, and that xorb_hash equals the aggregation of the chunks.
  // DataLoss naming the xorb otherwise.
  Status Validate() const;
  friend bool operator==(const XorbLayout&, const XorbLayout&) = default;
};

// Where a chunk can be found: chunk `chunk_index` of xorb `xorb_hash`.
struct ChunkLocation {
  MerkleHash xorb_hash;
  uint32_t chunk_index = 0;
  friend bool operator==(const ChunkLocation&, const ChunkLocation&) = default;
};

}  // namespace megackpt::cas

#endif  // MEGACKPT_CAS_RECONSTRUCTION_H_
