// DCP metadata: what a distributed checkpoint contains and where each piece is
// stored, plus its portable encoding (docs/dcp.md, "Metadata encoding").
//
// Model (spec/dcp.md §1): a checkpoint holds entries by fully qualified name
// (fqn). A tensor entry has a global shape and dtype and is stored as one or more
// chunks (boxes of the global tensor given by per-dim offsets and sizes); a bytes
// entry is an opaque byte string. Every stored piece is addressed by a
// MetadataIndex (fqn + chunk offsets) and has a StorageInfo saying where the
// storage backend put it.
#ifndef MEGACKPT_DCP_METADATA_H_
#define MEGACKPT_DCP_METADATA_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"

namespace megackpt::dcp {

// Addresses one stored piece: a tensor chunk (fqn + the chunk's per-dim offsets
// in the global tensor) or a bytes entry (fqn, no offset). A whole tensor is the
// chunk at offsets {0, ..., 0}; a 0-d tensor has an empty (but present) offset.
// `index` is a hint (position of the chunk in TensorStorageMetadata::chunks)
// that speeds up look-ups; equality, ordering and hashing ignore it.
struct MetadataIndex {
  std::string fqn;
  std::optional<Shape> offset;
  std::optional<int64_t> index;

  MetadataIndex() = default;
  explicit MetadataIndex(std::string fqn_in, std::optional<Shape> offset_in = std::nullopt,
                         std::optional<int64_t> index_in = std::nullopt)
      : fqn(std::move(fqn_in)), offset(std::move(offset_in)), index(index_in) {}

  friend bool operator==(const MetadataIndex& a, const MetadataIndex& b) {
    return a.fqn == b.fqn && a.offset == b.offset;
  }
  // Orders by fqn, then "no offset" before any offset, then offsets
  // lexicographically. Ignores `index`.
  friend bool operator<(const MetadataIndex& a, const MetadataIndex& b);
};

// "w[0, 128]" or "w" (for messages).
std::string ToString(const MetadataIndex& index);

struct MetadataIndexHash {
  size_t operator()(const MetadataIndex& index) const;
};

// A box of a global tensor: elements [offsets[d], offsets[d] + sizes[d]) in every dim.
struct ChunkStorageMetadata {
  Shape offsets;
  Shape sizes;
  friend bool operator==(const ChunkStorageMetadata&, const ChunkStorageMetadata&) = default;
};

// Properties of a stored tensor (the reference's TensorProperties; only dtype
// matters to storage, the rest is informational).
struct TensorProperties {
  DType dtype = DType::kF32;
  bool requires_grad = false;
  friend bool operator==(const TensorProperties&, const TensorProperties&) = default;
};

struct TensorStorageMetadata {
  TensorProperties properties;
  Shape size;  // global shape
  std::vector<ChunkStorageMetadata> chunks;
  friend bool operator==(const TensorStorageMetadata&, const TensorStorageMetadata&) = default;
};

struct BytesStorageMetadata {
  friend bool operator==(const BytesStorageMetadata&, const BytesStorageMetadata&) = default;
};

using StorageMetadata = std::variant<TensorStorageMetadata, BytesStorageMetadata>;

// Who wrote / reads the checkpoint. Strings may be empty (unknown).
struct StorageMeta {
  std::string checkpoint_id;  // the path or URI the checkpoint lives at
  std::string save_id;        // unique per save (the FileSystemWriter puts it in data file names)
  std::string load_id;        // set by readers; never persisted meaningfully
  std::vector<std::string> modules;
  friend bool operator==(const StorageMeta&, const StorageMeta&) = default;
};

// Where a backend stored one piece. The framework treats it as opaque and only
// copies it from WriteResult into Metadata::storage_data and back to readers.
//  - relative_path/offset/length: a byte range [offset, offset + length) of a file
//    relative to the checkpoint folder (the FileSystemWriter's layout; other
//    backends may use relative_path alone, e.g. a shard file name).
//  - checksum: "crc32:<8 lowercase hex>" or "sha256:<64 lowercase hex>" of the
//    whole stored piece, or empty.
//  - block_size: optional CRC32 of every block_size bytes of the piece (the
//    last block may be short) so a partial read can be verified block-wise;
//    0 means none. The ceil(length/block_size) CRCs are stored either
//      * in the data file (block_table_offset set): little-endian u32 each, at
//        [*block_table_offset, + 4 * blocks) of relative_path (the
//        FileSystemWriter puts each item's table right after its bytes), or
//      * inline (block_crc32, block_table_offset unset): how checkpoints
//        written before tables moved into the data files record them.
//    Exactly one of the two when block_size != 0 and the piece is not empty.
//  - extra: backend-defined text (e.g. JSON), carried verbatim.
struct StorageInfo {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::string checksum;
  uint64_t block_size = 0;
  std::vector<uint32_t> block_crc32;
  std::string extra;
  std::optional<uint64_t> block_table_offset;  // last: older aggregate initializers stay valid
  friend bool operator==(const StorageInfo&, const StorageInfo&) = default;
};

// One step of the path from a state dict's root to a value inside nested
// containers: a map key or a list index.
struct PathKey {
  std::variant<std::string, int64_t> key;
  friend bool operator==(const PathKey&, const PathKey&) = default;
};
using ObjectPath = std::vector<PathKey>;

// Data a planner keeps in plans and in the checkpoint.
//  - object_paths: flattened fqn -> its path in the original nesting
//    ("a.b.0" -> ["a", "b", 0]); fqns absent from it are top-level keys.
//  - extra: planner-defined text, carried verbatim.
struct PlannerData {
  std::map<std::string, ObjectPath> object_paths;
  std::string extra;
  bool empty() const { return object_paths.empty() && extra.empty(); }
  friend bool operator==(const PlannerData&, const PlannerData&) = default;
};

struct Metadata {
  std::map<std::string, StorageMetadata> state_dict_metadata;
  PlannerData planner_data;
  std::map<MetadataIndex, StorageInfo> storage_data;
  std::optional<StorageMeta> storage_meta;
  // The producer's version string (e.g. "megackpt 0.1.0"); informational. The
  // encoding's own version is kMetadataFormatVersion.
  std::string version;
  friend bool operator==(const Metadata&, const Metadata&) = default;
};

// Encoding: UTF-8 JSON, {"format": "megackpt-dcp-metadata", "version": 1, ...};
// field by field in docs/dcp.md. Decoders accept versions <= their own and
// reject anything else.
inline constexpr std::string_view kMetadataFormat = "megackpt-dcp-metadata";
inline constexpr int kMetadataFormatVersion = 1;
// Largest encoded metadata a decoder accepts.
inline constexpr uint64_t kMaxMetadataBytes = 1ull << 30;

std::string EncodeMetadata(const Metadata& metadata);

// Parses and validates an encoded Metadata. Returns DataLoss naming the field
// (e.g. "metadata: state_dict_metadata[3].chunks[1].sizes: expected 2 dims, got 3")
// for malformed input: bad JSON, wrong format tag, unknown version, wrong types,
// unknown dtype, negative sizes, chunks out of bounds, storage_data entries for
// unknown fqns, duplicate keys. Never crashes on any input.
Result<Metadata> DecodeMetadata(std::string_view encoded);

// Validates the internal consistency of a Metadata (what DecodeMetadata checks
// after parsing): chunk dims match, chunks lie inside the global shape, sizes
// are non-negative, storage_data keys name known entries. InvalidArgument.
Status ValidateMetadata(const Metadata& metadata);

// Number of checksum blocks of a stored piece: ceil(length / block_size), 0
// when block_size is 0.
uint64_t BlockCount(const StorageInfo& info);

// Bytes of a chunk of `dtype` with `sizes` (F4 rounds up). InvalidArgument on overflow.
Result<uint64_t> ChunkNbytes(DType dtype, const Shape& sizes);

}  // namespace megackpt::dcp

namespace std {
template <>
struct hash<megackpt::dcp::MetadataIndex> : megackpt::dcp::MetadataIndexHash {};
}  // namespace std

#endif  // MEGACKPT_DCP_METADATA_H_
