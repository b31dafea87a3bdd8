// Block hashes of stored items: XXH3-128 of every fixed block of an item's
// stored (dense, row-major) bytes, and their record in StorageInfo::extra
// (docs/checkpoint-manager.md, "Incremental saves"). The one implementation:
// FileSystemWriter computes them while it writes (FileSystemWriterOptions::
// hash_block_size), IncrementalWriter to compare an item with its base.
#ifndef MEGACKPT_SRC_DCP_BLOCK_HASHES_H_
#define MEGACKPT_SRC_DCP_BLOCK_HASHES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megackpt::dcp {

// The hash record of an item kept in StorageInfo::extra:
//   "xxh3-128/<block_size>/<32 hex digits per block>"
// (ceil(length / block_size) blocks, the last may be short; one block for an
// empty item). Blocks are of the item's stored (dense, row-major) bytes.
inline constexpr std::string_view kBlockHashPrefix = "xxh3-128/";

using BlockDigest = std::pair<uint64_t, uint64_t>;  // (high, low) of XXH3-128

struct BlockHashes {
  uint64_t block_size = 0;
  std::vector<BlockDigest> digests;  // one per block
  friend bool operator==(const BlockHashes&, const BlockHashes&) = default;
};

std::string EncodeBlockHashes(const BlockHashes& hashes);
// nullopt when `extra` is not a hash record (or is malformed).
std::optional<BlockHashes> DecodeBlockHashes(std::string_view extra);

// Hashes a byte stream fed in pieces of any size, cut at block boundaries.
class BlockHasher {
 public:
  // REQUIRES: block_size > 0.
  explicit BlockHasher(uint64_t block_size);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  void Add(std::span<const std::byte> data);
  // Digests of the blocks completed so far (a block is complete once
  // block_size bytes of it were added).
  const std::vector<BlockDigest>& completed() const { return out_.digests; }
  // Completes the last (short) block, or the single block of an empty stream.
  BlockHashes Finish();

 private:
  void Close();
  uint64_t block_size_;
  void* state_;  // XXH3_state_t, created on the first partial block
  uint64_t in_block_ = 0;
  uint64_t total_ = 0;
  BlockHashes out_;
};

// XXH3-128 of every block_size bytes of `data` (BlockHasher over one piece).
BlockHashes HashBlocks(std::span<const std::byte> data, uint64_t block_size);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_SRC_DCP_BLOCK_HASHES_H_
