// Incremental saves for the checkpoint manager (docs/checkpoint-manager.md,
// "Incremental saves"): a StorageWriter that wraps a FileSystemWriter and does
// not write again an item whose bytes equal those of the same item in a base
// checkpoint (a kept earlier step). Equality: XXH3-128 of every fixed block of
// the item, computed from the caller's (or the staged) memory before the write;
// the base's hashes come from its .metadata. An unchanged item is referenced
// from the base's data file, which is hard-linked into the new checkpoint
// folder, so every file a checkpoint names is inside its own folder, each
// checkpoint loads on its own through FileSystemReader, and removing a step
// never breaks another one (the filesystem counts the links).
#ifndef MEGACKPT_SRC_DCP_INCREMENTAL_H_
#define MEGACKPT_SRC_DCP_INCREMENTAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/storage.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

// The hash record of an item kept in StorageInfo::extra:
//   "xxh3-128/<block_size>/<32 hex digits per block>"
// (ceil(length / block_size) blocks, the last may be short; one block for an
// empty item). Blocks are of the item's stored (dense, row-major) bytes.
inline constexpr std::string_view kBlockHashPrefix = "xxh3-128/";

struct BlockHashes {
  uint64_t block_size = 0;
  std::vector<std::pair<uint64_t, uint64_t>> digests;  // (high, low) per block
  friend bool operator==(const BlockHashes&, const BlockHashes&) = default;
};

std::string EncodeBlockHashes(const BlockHashes& hashes);
// nullopt when `extra` is not a hash record (or is malformed).
std::optional<BlockHashes> DecodeBlockHashes(std::string_view extra);

// XXH3-128 of every block_size bytes of `data`.
BlockHashes HashBlocks(std::span<const std::byte> data, uint64_t block_size);

struct IncrementalWriterOptions {
  // Folder of the base checkpoint (a complete step); "" = a full save that only
  // records hashes for the next one.
  std::string base_dir;
  uint64_t block_size = 1ull << 20;
  int thread_count = 2;  // hashing threads
};

// What an incremental save did on this rank (summed over its WriteData calls).
struct IncrementalStats {
  uint64_t items_written = 0, items_referenced = 0;
  uint64_t bytes_written = 0, bytes_referenced = 0;
};

// Wraps `inner` (a FileSystemWriter writing into `dir` through `fs`).
// REQUIRES: fs supports Link when options.base_dir is set.
std::unique_ptr<StorageWriter> NewIncrementalWriter(std::unique_ptr<StorageWriter> inner,
                                                    std::string dir, std::shared_ptr<fs::FileSystem> fs,
                                                    IncrementalWriterOptions options,
                                                    std::shared_ptr<IncrementalStats> stats = nullptr);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_SRC_DCP_INCREMENTAL_H_
