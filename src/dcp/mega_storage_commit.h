// The commit protocol of the MEGA storage backend (docs/mega-storage.md,
// "Commit protocol"), shared by MegaStorageWriter::Finish and consolidation:
//   1. every shard is complete and fsynced (the writers did that);
//   2. fsync the folder (the shards' directory entries are durable);
//   3. write the index atomically (temp + fsync + rename + folder fsync);
//   4. write .metadata atomically: its rename is THE commit point;
//   5. remove what the previous checkpoint and crashed saves left behind.
// Before step 4 the folder still loads as the previous checkpoint (the reader
// trusts .metadata; no file it references was touched); after it, as the new one.
#ifndef MEGACKPT_SRC_DCP_MEGA_STORAGE_COMMIT_H_
#define MEGACKPT_SRC_DCP_MEGA_STORAGE_COMMIT_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "megackpt/dcp/metadata.h"
#include "megackpt/fs/filesystem.h"
#include "megackpt/format/index_file.h"
#include "megackpt/core/status.h"

namespace megackpt::dcp::mega_storage {

// What the folder holds before a commit.
struct PreviousState {
  // Files the committed checkpoint references (from .metadata, else its index).
  std::set<std::string> files;
  // Text of the index we are about to replace (to restore it if the commit fails).
  std::optional<std::string> index_text;
};

struct CommitRequest {
  std::string dir;
  std::string metadata_name;  // ".metadata" or ".metadata.rank<r>"
  std::string index_name;     // "model.mega.index.json", "model.safetensors.index.json", ...
  // The index of the other format, removed after the commit when it described
  // the previous checkpoint ("" = none).
  std::string other_index_name;
  format::ShardIndex index;
  Metadata metadata;
  bool sync = true;
  // Remove only rank-tagged shard names of this rank (saves without
  // collectives); -1: any shard name.
  int rank_tag = -1;
};

// Reads the previous state of `dir` (missing or unreadable files count as empty).
PreviousState ReadPreviousState(fs::FileSystem& fs, const std::string& dir,
                                const std::string& metadata_name, const std::string& index_name);

// True when any of `names` exists in `dir`.
Result<bool> AnyExists(fs::FileSystem& fs, const std::string& dir, const std::vector<std::string>& names);

// Step 5's choice, given the folder's files (`listing`, read at `dir`): the
// names to remove after committing `request` over `previous` (files of the
// previous checkpoint and shard-named or temp leftovers that the new one does
// not reference), and whether the other format's index became stale.
struct CleanupPlan {
  std::set<std::string> remove;
  bool remove_other_index = false;
};
CleanupPlan PlanCleanup(fs::FileSystem& fs, const std::string& dir, const std::vector<fs::FileInfo>& listing,
                        const CommitRequest& request, const PreviousState& previous);

// Steps 2-5. On a failure before the commit point the previous index is put
// back. Cleanup failures after the commit are ignored (the next save retries).
Status Commit(fs::FileSystem& fs, const CommitRequest& request, const PreviousState& previous);

// The index describing `metadata`: weight_map of whole entries (one chunk covering
// the tensor, or bytes), sharded tensors under tensorplay.dcp.sharded, total_size
// = stored tensor bytes. `mega_fields`: add megatensors' format/shards members.
Result<format::ShardIndex> BuildIndex(const Metadata& metadata, bool mega_fields);

}  // namespace megackpt::dcp::mega_storage

#endif  // MEGACKPT_SRC_DCP_MEGA_STORAGE_COMMIT_H_
