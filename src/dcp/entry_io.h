// Reading one entry of a committed checkpoint whole, through the storage's own
// reader (so every byte is verified), for tools that walk a checkpoint entry
// by entry with memory bounded by the largest entry: the checkpoint manager's
// full verification and DiffCheckpoints.
#ifndef MEGACKPT_SRC_DCP_ENTRY_IO_H_
#define MEGACKPT_SRC_DCP_ENTRY_IO_H_

#include <string>
#include <string_view>

#include "megackpt/core/status.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/state_dict.h"
#include "megackpt/dcp/storage_factory.h"

namespace megackpt::dcp {

// "fs" when the metadata's pieces live in FileSystemWriter data files
// (.distcp), "mega" otherwise; `fallback` for a checkpoint with no pieces.
std::string StorageKindOf(const Metadata& metadata, std::string_view fallback = "fs");

// Reads and decodes `dir`/.metadata. NotFound when missing; DataLoss naming
// the file when it does not decode.
Result<Metadata> ReadCheckpointMetadata(const std::string& dir);

// Entry `fqn` of the checkpoint at `dir` (storage `kind`, metadata `metadata`)
// read whole: a tensor of its global shape (assembled from its chunks) or a
// bytes value. Errors of the load (DataLoss naming file, entry and range).
Result<StateValue> LoadEntryWhole(const std::string& kind, const std::string& dir,
                                  const Metadata& metadata, const std::string& fqn,
                                  const StorageFactoryOptions& options = {});

}  // namespace megackpt::dcp

#endif  // MEGACKPT_SRC_DCP_ENTRY_IO_H_
