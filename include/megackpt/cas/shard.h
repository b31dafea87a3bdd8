// Xet MDB shard, format version 2: the binary record of file reconstructions
// and xorb chunk lists exchanged with Xet-style servers (shard upload, global
// dedup answers) and used by `megackpt cas` to export/import a store's files.
//
//   header  48 B   tag[32] "HFRepoMetaData\0"+17 magic bytes | u64 version=2 | u64 footer_size
//   file info section: per file
//     FileDataSequenceHeader 48 B  file_hash[32] | u32 flags | u32 num_entries | 8 B reserved
//     num_entries × FileDataSequenceEntry 48 B
//                                  xorb_hash[32] | u32 flags | u32 unpacked_bytes |
//                                  u32 chunk_start | u32 chunk_end (exclusive)
//     if flags & 1<<31: num_entries × FileVerificationEntry  range_hash[32] | 16 B reserved
//     if flags & 1<<30: one FileMetadataExt                  sha256[32] | 16 B reserved
//                       (sha256 as a Xet hash: each 8-byte group of the digest byte-reversed)
//   bookend 48 B (32 × 0xFF, 16 × 0x00)
//   CAS info section: per xorb
//     CASChunkSequenceHeader 48 B  xorb_hash[32] | u32 flags | u32 num_entries |
//                                  u32 bytes_in_xorb (unpacked) | u32 bytes_on_disk
//     num_entries × CASChunkSequenceEntry 48 B
//                                  chunk_hash[32] | u32 unpacked_offset | u32 unpacked_bytes | 8 B
//                                  reserved
//   bookend 48 B
//   footer 200 B (optional; header.footer_size = 200 or 0), see docs/cas.md.
// All integers little-endian. Hashes are raw 32-byte values (the SHA-256 of
// FileMetadataExt excepted, see above; ShardFileInfo::sha256 is the digest).
#ifndef MEGACKPT_CAS_SHARD_H_
#define MEGACKPT_CAS_SHARD_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "megackpt/cas/hash.h"
#include "megackpt/cas/reconstruction.h"
#include "megackpt/core/status.h"

namespace megackpt::cas {

class CasBackend;

inline constexpr size_t kShardHeaderSize = 48;
inline constexpr size_t kShardEntrySize = 48;
inline constexpr size_t kShardFooterSize = 200;
inline constexpr uint64_t kShardHeaderVersion = 2;
inline constexpr uint64_t kShardFooterVersion = 1;
inline constexpr uint32_t kShardFileFlagWithVerification = 1u << 31;
inline constexpr uint32_t kShardFileFlagWithMetadataExt = 1u << 30;

struct ShardFileInfo {
  FileReconstruction reconstruction;              // terms' verification_hash used when present
  std::optional<std::array<uint8_t, 32>> sha256;  // FileMetadataExt: the SHA-256 digest bytes
  friend bool operator==(const ShardFileInfo&, const ShardFileInfo&) = default;
};

struct ShardXorbChunk {
  MerkleHash hash;
  uint32_t unpacked_offset = 0;  // sum of the previous chunks' unpacked bytes
  uint32_t unpacked_bytes = 0;
  friend bool operator==(const ShardXorbChunk&, const ShardXorbChunk&) = default;
};

struct ShardXorbInfo {
  MerkleHash xorb_hash;
  uint32_t unpacked_bytes = 0;  // "num_bytes_in_cas"
  uint32_t bytes_on_disk = 0;   // serialized size
  std::vector<ShardXorbChunk> chunks;
  friend bool operator==(const ShardXorbInfo&, const ShardXorbInfo&) = default;
};

struct Shard {
  std::vector<ShardFileInfo> files;
  std::vector<ShardXorbInfo> xorbs;
  // Footer fields (kept when parsed; written when with_footer).
  MerkleHash chunk_hash_hmac_key;
  uint64_t creation_timestamp = 0;
  uint64_t key_expiry = ~0ull;
  friend bool operator==(const Shard&, const Shard&) = default;
};

struct ShardWriteOptions {
  // Write a FileVerificationEntry per term (Xet requires them on upload);
  // each holds the term's verification_hash as given (uploads always set it).
  bool with_verification = true;
  bool with_footer = true;
};

// Serializes a shard. Files with a sha256 get a FileMetadataExt.
std::string SerializeShard(const Shard& shard, const ShardWriteOptions& options = {});

struct ShardParseLimits {
  uint64_t max_files = 1u << 20;
  uint64_t max_xorbs = 1u << 20;
  uint64_t max_entries_per_record = 1u << 24;
};

// Parses a shard, validating everything: tag, versions, footer size (0 or
// 200) and offsets, record counts against the buffer, bookends, each file's
// term ranges (end > start) and that its size fits. DataLoss "shard offset N:
// ..." on malformed input; never reads out of bounds.
Result<Shard> ParseShard(std::span<const std::byte> data, const ShardParseLimits& limits = {});

// The shard form of a stored xorb's chunk list.
ShardXorbInfo ShardXorbInfoFromLayout(const XorbLayout& layout);

// A shard describing `file_hashes` (read from the backend) and, with
// `include_xorbs`, every xorb they reference.
Result<std::string> ExportShard(CasBackend& backend, std::span<const MerkleHash> file_hashes,
                                bool include_xorbs = true);

struct ShardImportResult {
  uint64_t files_imported = 0;
  uint64_t files_already_present = 0;
};
// Stores every file reconstruction of the shard in the backend. The xorbs
// they reference must already be stored (FailedPrecondition naming the xorb);
// each term is checked against the xorb's layout (chunk range within the xorb,
// unpacked bytes and verification hash match) and the file hash is recomputed
// from the chunk hashes with `file_hash_salt`: DataLoss naming the file
// otherwise. Nothing is stored unless every file checks out.
Result<ShardImportResult> ImportShard(CasBackend& backend, std::span<const std::byte> shard,
                                      const MerkleHash& file_hash_salt = MerkleHash{});

}  // namespace megackpt::cas

#endif  // MEGACKPT_CAS_SHARD_H_
