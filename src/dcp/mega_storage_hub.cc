// MegaStorageWriter/Reader over mega:// (see the header).
#include "dcp/mega_storage_hub.h"

#include <set>

#include "dcp/mega_storage_files.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp::mega_storage {
namespace {

// Prefix of the storage-data `extra` that carries a staged file.
constexpr std::string_view kStagedExtraPrefix = "megackpt.hub.staged:";

bool IsCommitHex(std::string_view s) {
  if (s.size() != 40) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string RepoPath(const hub::MegaUri& root, const std::string& name) {
  return root.path.empty() ? name : root.path + "/" + name;
}

}  // namespace

Result<std::optional<HubTarget>> HubTargetFor(const std::string& path, fs::FileSystem* fs) {
  hub::MegaFileSystem* mfs = fs ? hub::AsMegaFileSystem(fs) : nullptr;
  if (!mfs || !hub::IsMegaUri(path)) return std::optional<HubTarget>();
  std::string clean = path;
  while (!clean.empty() && clean.back() == '/' && !clean.ends_with("://")) clean.pop_back();
  MEGA_ASSIGN_OR_RETURN(hub::MegaUri root, hub::ParseMegaUri(clean));
  if (root.path.empty()) {
    return InvalidArgumentError(path +
                                ": a checkpoint needs a folder inside the repository or bucket "
                                "(e.g. " + clean + "/ckpt/step-100)");
  }
  HubTarget t;
  t.hub = mfs->hub_ptr();
  t.root = std::move(root);
  return std::optional<HubTarget>(std::move(t));
}

Result<std::unique_ptr<hub::HubTransaction>> BeginHubSave(const HubTarget& target,
                                                          const std::string& base_commit,
                                                          const std::string& save_id, bool rebase) {
  hub::TransactionOptions o;
  o.message = "megackpt: save checkpoint " + target.root.path;
  o.description = "save id " + save_id;
  o.rebase = rebase;
  o.create = true;
  auto txn = hub::HubTransaction::Begin(target.hub, target.root, o, base_commit);
  if (!txn.ok()) return txn.status().WithContext("beginning the save to " + target.root.ToString());
  return txn;
}

std::string EncodeStagedExtra(const hub::StagedEntry& entry) {
  return std::string(kStagedExtraPrefix) + hub::SerializeStaged(std::span<const hub::StagedEntry>(&entry, 1));
}

Result<std::optional<hub::StagedEntry>> DecodeStagedExtra(std::string_view extra) {
  if (!extra.starts_with(kStagedExtraPrefix)) return std::optional<hub::StagedEntry>();
  extra.remove_prefix(kStagedExtraPrefix.size());
  MEGA_ASSIGN_OR_RETURN(auto entries, hub::ParseStaged(extra));
  if (entries.size() != 1) {
    return InvalidArgumentError("write result carries " + std::to_string(entries.size()) +
                                " staged hub files, expected 1");
  }
  return std::optional<hub::StagedEntry>(std::move(entries[0]));
}

void StripStagedExtras(Metadata* md) {
  for (auto& [key, info] : md->storage_data) {
    if (std::string_view(info.extra).starts_with(kStagedExtraPrefix)) info.extra.clear();
  }
}

Result<hub::CommitInfo> CommitHubSave(hub::HubTransaction& txn, fs::FileSystem& fs,
                                      const CommitRequest& req,
                                      const std::vector<std::vector<WriteResult>>& results) {
  const hub::MegaUri& root = txn.root();
  // 1. Every rank's shards.
  std::vector<hub::StagedEntry> entries;
  for (size_t r = 0; r < results.size(); ++r) {
    for (const WriteResult& wr : results[r]) {
      auto e = DecodeStagedExtra(wr.storage_data.extra);
      if (!e.ok()) return e.status().WithContext("write result of rank " + std::to_string(r));
      if (!*e) continue;
      if (!(*e)->entry.path.starts_with(root.path + "/")) {
        return InvalidArgumentError("rank " + std::to_string(r) + " staged " + (*e)->entry.path +
                                    ", outside the checkpoint folder " + root.path);
      }
      entries.push_back(std::move(**e));
    }
  }
  MEGA_RETURN_IF_ERROR(txn.Stage(entries));
  for (const std::string& f : ReferencedFiles(req.metadata)) {
    auto staged = txn.FindStaged(RepoPath(root, f));
    if (!staged || staged->deleted) {
      return InternalError(root.ToString() + ": shard " + f +
                           " was written by no rank of this save (no staged upload)");
    }
  }
  // 2. What the previous checkpoint in this folder looked like, at the base
  //    commit (buckets: now).
  hub::MegaUri base_dir = root;
  if (!root.is_bucket) {
    base_dir.revision = txn.base_commit();
    base_dir.has_revision = true;
  }
  const std::string base_path = base_dir.ToString();
  PreviousState prev = ReadPreviousState(fs, base_path, req.metadata_name, req.index_name);
  auto listing = fs.List(base_path);
  if (listing.ok()) {
    const CleanupPlan cleanup = PlanCleanup(fs, base_path, *listing, req, prev);
    if (cleanup.remove_other_index) MEGA_RETURN_IF_ERROR(txn.Delete(req.other_index_name));
    for (const std::string& name : cleanup.remove) MEGA_RETURN_IF_ERROR(txn.Delete(name));
  } else if (listing.status().code() != StatusCode::kNotFound) {
    return listing.status().WithContext("listing the previous checkpoint at " + base_path);
  }
  // 3. Index and .metadata, then the one commit.
  MEGA_ASSIGN_OR_RETURN(std::string index_text, format::SerializeShardIndex(req.index));
  MEGA_RETURN_IF_ERROR(txn.Put(req.index_name, index_text));
  MEGA_RETURN_IF_ERROR(txn.Put(req.metadata_name, EncodeMetadata(req.metadata)));
  auto commit = txn.Commit();
  if (!commit.ok()) {
    if (commit.status().code() == StatusCode::kAborted) {
      return AbortedError("conflict: branch '" + root.revision + "' of " + root.repo_id() +
                          " moved since this save began at " + txn.base_commit() +
                          " (a concurrent commit); the checkpoint at " + root.ToString() +
                          " was not saved and the branch is unchanged: " +
                          std::string(commit.status().message()));
    }
    return commit.status().WithContext("committing the checkpoint at " + root.ToString());
  }
  return commit;
}

Result<std::string> PinnedHubPath(const std::string& path, fs::FileSystem* fs) {
  hub::MegaFileSystem* mfs = fs ? hub::AsMegaFileSystem(fs) : nullptr;
  if (!mfs || !hub::IsMegaUri(path)) return path;
  MEGA_ASSIGN_OR_RETURN(hub::MegaUri u, hub::ParseMegaUri(path));
  if (u.is_bucket || IsCommitHex(u.revision)) return path;
  auto commit = mfs->hub().ResolveRevision(u.repo_id(), u.revision);
  if (!commit.ok()) return commit.status().WithContext(path);
  u.revision = *commit;
  u.has_revision = true;
  std::string pinned = u.ToString();
  if (path.size() > 1 && path.back() == '/' && !pinned.ends_with("/")) pinned += "/";
  return pinned;
}

}  // namespace megackpt::dcp::mega_storage
