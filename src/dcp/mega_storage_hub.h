// MegaStorageWriter/Reader over `mega://` (docs/mega-storage.md, "mega://"):
// a whole save, from any number of ranks, lands as ONE hub commit.
//
//  - The coordinator begins a HubTransaction on the checkpoint folder in
//    PrepareGlobalPlan and ships its base commit in every rank's layout.
//  - Every rank begins its own HubTransaction object on the same root and
//    base (no shared MegaFileSystem transaction routing, so thread ranks of
//    one process never share a transaction) and streams its shards straight
//    into the hub's CAS (no local temp copy).
//  - A rank's staged entries (path, size, sha256, xet hash) travel to the
//    coordinator inside the `extra` of its WriteResults' storage data
//    (EncodeStagedExtra); the coordinator stages them with the index, the
//    .metadata and the deletion of the previous checkpoint's stale files,
//    and commits once (parent-checked: a concurrent commit -> Aborted).
//  - Readers pin the revision once (PinnedHubPath) so every file of a load
//    comes from one commit.
#ifndef MEGACKPT_SRC_DCP_MEGA_STORAGE_HUB_H_
#define MEGACKPT_SRC_DCP_MEGA_STORAGE_HUB_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/mega_storage_commit.h"
#include "megackpt/dcp/planner.h"
#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/transaction.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/core/status.h"

namespace megackpt::dcp::mega_storage {

// Where a hub save goes: the connection of the path's MegaFileSystem and the
// checkpoint folder as a transaction root.
struct HubTarget {
  std::shared_ptr<hub::HubConnection> hub;
  hub::MegaUri root;
};

// The hub target of `path` when `fs` is a mega:// filesystem and `path` a
// mega:// URI; nullopt for other filesystems. InvalidArgument for a mega://
// path naming a repository root (a checkpoint needs a folder) or a malformed URI.
Result<std::optional<HubTarget>> HubTargetFor(const std::string& path, fs::FileSystem* fs);

// Begins this rank's transaction. `base_commit` "" = the branch head (the
// coordinator); ranks pass the coordinator's base. `rebase`: land on a moved
// head when no staged path changed there (saves without collectives, whose
// ranks commit separately to disjoint names).
Result<std::unique_ptr<hub::HubTransaction>> BeginHubSave(const HubTarget& target,
                                                          const std::string& base_commit,
                                                          const std::string& save_id, bool rebase);

// The storage-data `extra` carrying a staged file to the coordinator, and
// its inverse. DecodeStagedExtra returns nullopt for an `extra` that is not
// one of ours.
std::string EncodeStagedExtra(const hub::StagedEntry& entry);
Result<std::optional<hub::StagedEntry>> DecodeStagedExtra(std::string_view extra);

// The coordinator's commit: stages every rank's entries found in `results`,
// checks that every file the metadata references is staged, deletes the
// previous checkpoint's files that the new one does not rewrite (same rule as
// the local commit), stages the index and .metadata, and commits once.
// `request.metadata` must not carry staged extras any more
// (StripStagedExtras). Aborted naming the branch when the branch moved.
Result<hub::CommitInfo> CommitHubSave(hub::HubTransaction& txn, fs::FileSystem& fs,
                                      const CommitRequest& request,
                                      const std::vector<std::vector<WriteResult>>& results);

// Removes our staged extras from the storage data of `metadata`.
void StripStagedExtras(Metadata* metadata);

// `path` with its branch/tag revision replaced by the commit it names now
// (repo URIs); buckets and commit-id revisions are returned unchanged.
Result<std::string> PinnedHubPath(const std::string& path, fs::FileSystem* fs);

}  // namespace megackpt::dcp::mega_storage

#endif  // MEGACKPT_SRC_DCP_MEGA_STORAGE_HUB_H_
