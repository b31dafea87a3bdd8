// Consolidation: turn a sharded checkpoint into whole tensors, one entry per fqn,
// as `model-NNNNN-of-MMMMM.mega` + `model.mega.index.json` or
// `model-NNNNN-of-MMMMM.safetensors` + `model.safetensors.index.json` (a single
// output file is named model.mega / model.safetensors). Afterwards the index's
// weight_map is truthful: every fqn maps to the one file that holds its whole
// tensor, so Hugging Face / megatensors / TensorPlay consumers read it directly.
//
// Streaming: each output tensor is assembled from its stored chunks (reading
// only their byte ranges), written, and its buffer reused for the next one, so
// memory is bounded by the largest tensor (per worker thread), not the model.
// Output files are written in parallel (threads, and ranks when a group is given).
//
// The destination gets the same commit protocol as a save (docs/mega-storage.md):
// data files are written and synced, then the index, then `.metadata` is renamed
// into place; files of the previous content are removed only after that. So
// SRC == DST consolidates in place, and a crash leaves the old or the new layout.
#ifndef MEGACKPT_DCP_CONSOLIDATE_H_
#define MEGACKPT_DCP_CONSOLIDATE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

struct ConsolidateOptions {
  ConsolidateFormat format = ConsolidateFormat::kMega;
  // Largest output file in tensor bytes (a tensor larger than this gets a file
  // of its own). 0: no limit.
  uint64_t max_shard_size = 0;
  // When set, output files follow the buckets (fqn -> 1..N; absent -> 1), each
  // bucket further split by max_shard_size.
  std::optional<FqnToIndexMapping> fqn_to_index_mapping;
  // Output files written concurrently per rank.
  int thread_count = 2;
  bool sync = true;
  // Checksum stored in MEGA outputs (safetensors has none).
  format::MegaChecksumType checksum = format::MegaChecksumType::kCrc32;
  // Filesystem for SRC and DST; nullptr: FileSystemForPath of each.
  std::shared_ptr<fs::FileSystem> fs;
};

struct ConsolidateResult {
  std::vector<std::string> files;  // output file names (relative to DST), in order
  uint64_t total_size = 0;         // tensor bytes written (the index's total_size)
  size_t entries = 0;              // fqns written
  std::string index_file;          // index name (relative to DST)
};

// Consolidates the checkpoint at `src` (anything MegaStorageReader reads, or an
// fs checkpoint: .metadata + .distcp data files, read verified through
// FileSystemReader) into the
// folder `dst` (may equal src). With a process group, every rank must call it
// with the same arguments; rank r writes output files r, r + world, ...; rank 0
// commits; every rank returns the same status. Errors: those of
// MegaStorageReader::ReadMetadata; DataLoss (with file and tensor) when a stored
// chunk fails its checksum; InvalidArgument when a tensor cannot be represented
// in the output format (e.g. an odd-length F4 tensor in safetensors).
Result<ConsolidateResult> Consolidate(const std::string& src, const std::string& dst,
                                      const ConsolidateOptions& options = {},
                                      dist::ProcessGroup* group = nullptr);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_CONSOLIDATE_H_
