// Commit protocol and index building (see the header).
#include "dcp/mega_storage_commit.h"

#include <nlohmann/json.hpp>

#include "dcp/mega_storage_files.h"
#include "dcp/mega_storage_shard.h"
#include "megackpt/core/file.h"  // BaseName, ParentOf
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/index_io.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp::mega_storage {
namespace {

using json = nlohmann::json;

std::set<std::string> IndexFiles(const format::ShardIndex& index) {
  std::set<std::string> out;
  for (const auto& [fqn, f] : index.weight_map) out.insert(f);
  auto it = index.extra_fields.find(std::string(kDcpIndexShardedKey));
  if (it != index.extra_fields.end()) {
    json j = json::parse(it->second, nullptr, false);
    if (j.is_object()) {
      for (auto e = j.begin(); e != j.end(); ++e) {
        if (!e.value().is_object() || !e.value().contains("chunks")) continue;
        for (const json& c : e.value()["chunks"]) {
          if (c.is_object() && c.contains("file") && c["file"].is_string()) {
            out.insert(c["file"].get<std::string>());
          }
        }
      }
    }
  }
  return out;
}

}  // namespace

PreviousState ReadPreviousState(fs::FileSystem& fs, const std::string& dir,
                                const std::string& metadata_name, const std::string& index_name) {
  PreviousState prev;
  auto index_text = fs.ReadWhole(fs::JoinPath(dir, index_name), format::kMaxIndexFileBytes);
  if (index_text.ok()) prev.index_text = *index_text;
  auto md_text = fs.ReadWhole(fs::JoinPath(dir, metadata_name), kMaxMetadataBytes);
  if (md_text.ok()) {
    auto md = DecodeMetadata(*md_text);
    if (md.ok()) {
      prev.files = ReferencedFiles(*md);
      return prev;
    }
  }
  // No readable .metadata (e.g. TensorPlay's pickle): the index says what the
  // previous checkpoint was.
  if (prev.index_text) {
    auto index = format::ParseShardIndex(index_name, *prev.index_text);
    if (index.ok()) prev.files = IndexFiles(*index);
  }
  return prev;
}

Result<bool> AnyExists(fs::FileSystem& fs, const std::string& dir,
                       const std::vector<std::string>& names) {
  auto listing = fs.List(dir);
  if (!listing.ok()) {
    if (listing.status().code() == StatusCode::kNotFound) return false;
    return listing.status();
  }
  std::set<std::string> present;
  for (const fs::FileInfo& fi : *listing) present.insert(BaseName(fi.path));
  for (const auto& n : names) {
    if (present.count(n)) return true;
  }
  return false;
}

CleanupPlan PlanCleanup(fs::FileSystem& fs, const std::string& dir,
                        const std::vector<fs::FileInfo>& listing, const CommitRequest& req,
                        const PreviousState& previous) {
  CleanupPlan plan;
  const std::set<std::string> keep = ReferencedFiles(req.metadata);
  std::set<std::string> present;
  for (const fs::FileInfo& fi : listing) {
    if (fi.is_directory) continue;
    const std::string name = BaseName(fi.path);
    present.insert(name);
    if (keep.count(name)) continue;
    int tag = -1;
    bool ours = IsShardFileName(name, &tag) && (req.rank_tag < 0 ? true : tag == req.rank_tag);
    bool temp =
        name.starts_with(req.metadata_name + ".tmp.") || name.starts_with(req.index_name + ".tmp.");
    if (previous.files.count(name) || ours || temp) plan.remove.insert(name);
  }
  if (!req.other_index_name.empty() && present.count(req.other_index_name)) {
    auto other = ReadShardIndex(fs, fs::JoinPath(dir, req.other_index_name));
    bool stale = true;
    if (other.ok()) {
      for (const auto& f : IndexFiles(*other)) {
        if (present.count(f) && !plan.remove.count(f)) stale = false;
      }
    }
    plan.remove_other_index = stale;
  }
  return plan;
}

Result<std::string> CommitInTransaction(fs::Transaction& txn, fs::FileSystem& fs,
                                        const CommitRequest& req, const PreviousState& previous) {
  auto fail = [&](Status s) {
    txn.Abort();
    return s;
  };
  MEGA_ASSIGN_OR_RETURN(std::string index_text, SerializeShardIndex(req.index));
  // 2. What to remove once the new checkpoint is committed.
  const std::string& base = txn.base_root();
  auto listing = fs.List(base);
  if (listing.ok()) {
    const CleanupPlan cleanup = PlanCleanup(fs, base, *listing, req, previous);
    // The other format's index goes first when it described files we remove.
    if (cleanup.remove_other_index) {
      if (Status s = txn.Remove(req.other_index_name); !s.ok()) return fail(s);
    }
    for (const std::string& name : cleanup.remove) {
      if (Status s = txn.Remove(name); !s.ok()) return fail(s);
    }
  } else if (listing.status().code() != StatusCode::kNotFound) {
    return fail(listing.status().WithContext("listing the previous checkpoint at " + base));
  }
  // Files of another layout (an fs save's .distcp files) go too; like every
  // removal of the transaction, only after the commit point.
  if (auto other = OtherLayoutFiles(fs, base, StorageLayout::kMega); other.ok()) {
    for (const std::string& name : *other) {
      if (Status s = txn.Remove(name); !s.ok()) return fail(s);
    }
  }
  // 3. Index (an index-only consumer then sees the new checkpoint; all its files
  //    are complete), then .metadata: the commit point of in-place stores.
  if (Status s = txn.Put(req.index_name, index_text); !s.ok()) {
    return fail(s.WithContext(req.dir + ": writing " + req.index_name));
  }
  if (Status s = txn.Put(req.metadata_name, EncodeMetadata(req.metadata)); !s.ok()) {
    return fail(s.WithContext(req.dir + ": writing " + req.metadata_name));
  }
  // 4.
  return txn.Commit();
}

Status Commit(fs::FileSystem& fs, const CommitRequest& req, const PreviousState& previous) {
  fs::TransactionOptions o;
  o.sync = req.sync;
  // Qualified: the in-place protocol over `fs`'s own methods, also for an
  // isolated store (whose capturing transaction then holds it all).
  MEGA_ASSIGN_OR_RETURN(auto txn, fs.::megackpt::fs::FileSystem::BeginTransaction(req.dir, o));
  return CommitInTransaction(*txn, fs, req, previous).status();
}

Result<std::string> CommitSave(fs::Transaction& txn, fs::FileSystem& fs, const CommitRequest& req,
                               const std::vector<std::vector<WriteResult>>& results) {
  // 1. Every rank's staged shards (each export holds all of that rank's so far).
  for (size_t r = 0; r < results.size(); ++r) {
    std::set<std::string> imported;
    for (const WriteResult& wr : results[r]) {
      if (wr.commit_token.empty() || !imported.insert(wr.commit_token).second) continue;
      Status s = txn.Import(wr.commit_token);
      if (!s.ok()) {
        txn.Abort();
        return s.WithContext("write results of rank " + std::to_string(r));
      }
    }
  }
  const std::vector<std::string> staged = txn.staged_files();
  const std::set<std::string> have(staged.begin(), staged.end());
  for (const std::string& f : ReferencedFiles(req.metadata)) {
    if (!have.count(f)) {
      txn.Abort();
      return InternalError(req.dir + ": shard " + f + " was written by no rank of this save");
    }
  }
  const PreviousState prev =
      ReadPreviousState(fs, txn.base_root(), req.metadata_name, req.index_name);
  return CommitInTransaction(txn, fs, req, prev);
}

Result<format::ShardIndex> BuildIndex(const Metadata& md, bool mega_fields) {
  format::ShardIndex index;
  uint64_t total = 0;
  for (const auto& [key, info] : md.storage_data) total += info.length;
  index.total_size = total;
  json sharded = json::object();
  for (const auto& [fqn, value] : md.state_dict_metadata) {
    if (std::holds_alternative<BytesStorageMetadata>(value)) {
      auto it = md.storage_data.find(MetadataIndex(fqn));
      if (it == md.storage_data.end()) return InternalError("no storage for bytes entry " + fqn);
      index.weight_map[fqn] = it->second.relative_path;
      continue;
    }
    const auto& t = std::get<TensorStorageMetadata>(value);
    if (t.chunks.size() == 1 && t.chunks[0].sizes == t.size) {
      auto it = md.storage_data.find(MetadataIndex(fqn, t.chunks[0].offsets));
      if (it == md.storage_data.end()) return InternalError("no storage for tensor " + fqn);
      index.weight_map[fqn] = it->second.relative_path;
      continue;
    }
    json chunks = json::array();
    for (const auto& c : t.chunks) {
      auto it = md.storage_data.find(MetadataIndex(fqn, c.offsets));
      if (it == md.storage_data.end()) return InternalError("no storage for a chunk of " + fqn);
      chunks.push_back(
          {{"file", it->second.relative_path}, {"offsets", c.offsets}, {"sizes", c.sizes}});
    }
    sharded[fqn] = {{"dtype", std::string(DTypeName(t.properties.dtype))},
                    {"shape", t.size},
                    {"chunks", std::move(chunks)}};
  }
  if (mega_fields) format::AddMegatensorsFields(&index);
  index.extra_metadata["tensorplay.dcp.layout"] =
      json(sharded.empty() ? "whole" : "sharded").dump();
  if (!sharded.empty()) index.extra_fields[std::string(kDcpIndexShardedKey)] = sharded.dump();
  return index;
}

}  // namespace megackpt::dcp::mega_storage
