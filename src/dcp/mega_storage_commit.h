// The commit protocol of the MEGA storage backend (docs/mega-storage.md,
// "Commit protocol"): ONE path for local folders and mega://, expressed over an
// fs::Transaction whose root is the checkpoint folder. MegaStorageWriter::Finish
// (CommitSave) and consolidation (Commit) share it:
//   1. every shard is complete (and fsynced) and staged in the transaction: the
//      coordinator imports every rank's export (WriteResult::commit_token);
//   2. the removals: files of the previous checkpoint (read at the transaction's
//      base) and leftovers of crashed saves that the new one does not reference;
//   3. Put the index, then .metadata;
//   4. Transaction::Commit. In place (local): the folder is fsynced, the index
//      written atomically, then .metadata -- its rename is THE commit point --
//      then the removals run. Isolated (mega://): all of it is one hub commit,
//      parent-checked.
// Before the commit point the folder still loads as the previous checkpoint (the
// reader trusts .metadata; no file it references was touched); after it, as the
// new one.
#ifndef MEGACKPT_SRC_DCP_MEGA_STORAGE_COMMIT_H_
#define MEGACKPT_SRC_DCP_MEGA_STORAGE_COMMIT_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/planner.h"
#include "megackpt/format/index_file.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp::mega_storage {

// What the folder holds before a commit.
struct PreviousState {
  // Files the committed checkpoint references (from .metadata, else its index).
  std::set<std::string> files;
  // Text of the index we are about to replace.
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
Result<bool> AnyExists(fs::FileSystem& fs, const std::string& dir,
                       const std::vector<std::string>& names);

// Step 5's choice, given the folder's files (`listing`, read at `dir`): the
// names to remove after committing `request` over `previous` (files of the
// previous checkpoint and shard-named or temp leftovers that the new one does
// not reference), and whether the other format's index became stale.
struct CleanupPlan {
  std::set<std::string> remove;
  bool remove_other_index = false;
};
CleanupPlan PlanCleanup(fs::FileSystem& fs, const std::string& dir,
                        const std::vector<fs::FileInfo>& listing, const CommitRequest& request,
                        const PreviousState& previous);

// Steps 2-4 inside `txn` (root = the checkpoint folder): stages the removals
// PlanCleanup picks from a listing of txn.base_root(), Puts the index and
// .metadata, and commits. Returns Transaction::Commit's id. On a failure before
// the commit point the transaction is discarded and the previous checkpoint
// stays (in place: the previous index is put back). Removal failures after the
// commit point are ignored (the next save retries).
Result<std::string> CommitInTransaction(fs::Transaction& txn, fs::FileSystem& fs,
                                        const CommitRequest& request,
                                        const PreviousState& previous);

// Steps 2-4 for files written in place through `fs` itself (consolidation): the
// in-place protocol (fs::FileSystem::BeginTransaction's default) over `fs`'s
// own methods at request.dir. Under a capturing transaction of an isolated store
// everything lands in that one.
Status Commit(fs::FileSystem& fs, const CommitRequest& request, const PreviousState& previous);

// The coordinator's commit of a save (Finish): step 1 -- imports every
// rank's commit_token from `results` into `txn` and checks that each file the
// metadata references was staged (Internal naming the file otherwise) -- then
// reads the previous checkpoint at txn.base_root() and CommitInTransaction.
Result<std::string> CommitSave(fs::Transaction& txn, fs::FileSystem& fs,
                               const CommitRequest& request,
                               const std::vector<std::vector<WriteResult>>& results);

// The index describing `metadata`: weight_map of whole entries (one chunk covering
// the tensor, or bytes), sharded tensors under tensorplay.dcp.sharded, total_size
// = stored tensor bytes. `mega_fields`: add megatensors' format/shards members.
Result<format::ShardIndex> BuildIndex(const Metadata& metadata, bool mega_fields);

}  // namespace megackpt::dcp::mega_storage

#endif  // MEGACKPT_SRC_DCP_MEGA_STORAGE_COMMIT_H_
