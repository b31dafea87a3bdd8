// Incremental saves for the checkpoint manager (docs/checkpoint-manager.md,
// "Incremental saves"): a StorageWriter that wraps a FileSystemWriter and does
// not write again an item whose bytes equal those of the same item in a base
// checkpoint (a kept earlier step). Equality: XXH3-128 of every fixed block of
// the item (dcp/block_hashes.h); the base's hashes come from its .metadata, the
// new item's from the caller's (or the staged) memory, compared block by block
// and given up at the first block that differs. Written items are hashed by the
// wrapped writer while it writes them (FileSystemWriterOptions::hash_block_size),
// so a full save makes no separate pass over the state. An unchanged item is
// referenced from the base's data file, which is hard-linked into the new
// checkpoint folder, so every file a checkpoint names is inside its own folder,
// each checkpoint loads on its own through FileSystemReader, and removing a step
// never breaks another one (the filesystem counts the links).
#ifndef MEGACKPT_SRC_DCP_INCREMENTAL_H_
#define MEGACKPT_SRC_DCP_INCREMENTAL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "dcp/block_hashes.h"
#include "megackpt/dcp/checkpoint_manager.h"  // IncrementalStats
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/storage.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

struct IncrementalWriterOptions {
  // Folder of the base checkpoint (a complete step); "" = a full save that only
  // records hashes for the next one.
  std::string base_dir;
  uint64_t block_size = 1ull << 20;
  int thread_count = 2;  // comparing threads
};

// Wraps `inner`, a FileSystemWriter writing into `dir` through `fs` with
// hash_block_size == options.block_size (an item written without a hash record
// is simply written again by the next save). `stats` (optional) is added to.
// REQUIRES: fs supports Link when options.base_dir is set.
std::unique_ptr<StorageWriter> NewIncrementalWriter(
    std::unique_ptr<StorageWriter> inner, std::string dir, std::shared_ptr<fs::FileSystem> fs,
    IncrementalWriterOptions options, std::shared_ptr<IncrementalStats> stats = nullptr);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_SRC_DCP_INCREMENTAL_H_
