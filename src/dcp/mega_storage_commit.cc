// Commit protocol and index building (see the header).
#include "dcp/mega_storage_commit.h"

#include <nlohmann/json.hpp>

#include "dcp/mega_storage_files.h"
#include "dcp/mega_storage_shard.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp::mega_storage {
namespace {

using json = nlohmann::json;

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

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

Result<bool> AnyExists(fs::FileSystem& fs, const std::string& dir, const std::vector<std::string>& names) {
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

CleanupPlan PlanCleanup(fs::FileSystem& fs, const std::string& dir, const std::vector<fs::FileInfo>& listing,
                        const CommitRequest& req, const PreviousState& previous) {
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
    bool temp = name.starts_with(req.metadata_name + ".tmp.") ||
                name.starts_with(req.index_name + ".tmp.");
    if (previous.files.count(name) || ours || temp) plan.remove.insert(name);
  }
  if (!req.other_index_name.empty() && present.count(req.other_index_name)) {
    auto other = format::ReadShardIndex(fs, fs::JoinPath(dir, req.other_index_name));
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

Status Commit(fs::FileSystem& fs, const CommitRequest& req, const PreviousState& previous) {
  const std::string index_path = fs::JoinPath(req.dir, req.index_name);
  MEGA_ASSIGN_OR_RETURN(std::string index_text, SerializeShardIndex(req.index));
  // 2. The shards' directory entries must be durable before anything refers to them.
  if (req.sync) MEGA_RETURN_IF_ERROR(fs.SyncDirectory(req.dir).WithContext("commit"));
  // 3. Index (an index-only consumer now sees the new checkpoint; all its files
  //    are complete).
  MEGA_RETURN_IF_ERROR(fs.WriteAtomically(index_path, index_text, req.sync)
                           .WithContext(req.dir + ": writing " + req.index_name));
  // 4. The commit point.
  Status committed = fs.WriteAtomically(fs::JoinPath(req.dir, req.metadata_name),
                                        EncodeMetadata(req.metadata), req.sync);
  if (!committed.ok()) {
    // Put the previous index back so index-only consumers keep a consistent view
    // once this save's files are removed by Abort.
    if (previous.index_text) {
      fs.WriteAtomically(index_path, *previous.index_text, req.sync).IgnoreError();
    } else {
      fs.Remove(index_path).IgnoreError();
    }
    return committed.WithContext(req.dir + ": commit of " + req.metadata_name);
  }
  // 5. Cleanup: files the previous checkpoint used, shard-named files of
  //    crashed saves, temp files of interrupted atomic writes.
  auto listing = fs.List(req.dir);
  if (!listing.ok()) return Status::OK();
  const CleanupPlan cleanup = PlanCleanup(fs, req.dir, *listing, req, previous);
  // The other format's index goes first when it described files we remove.
  if (cleanup.remove_other_index) fs.Remove(fs::JoinPath(req.dir, req.other_index_name)).IgnoreError();
  for (const auto& name : cleanup.remove) fs.Remove(fs::JoinPath(req.dir, name)).IgnoreError();
  // Files of another layout (an fs save's .distcp files) go too.
  RemoveOtherLayouts(fs, req.dir, StorageLayout::kMega);
  return Status::OK();
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
      chunks.push_back({{"file", it->second.relative_path}, {"offsets", c.offsets}, {"sizes", c.sizes}});
    }
    sharded[fqn] = {{"dtype", std::string(DTypeName(t.properties.dtype))},
                    {"shape", t.size},
                    {"chunks", std::move(chunks)}};
  }
  if (mega_fields) format::AddMegatensorsFields(&index);
  index.extra_metadata["tensorplay.dcp.layout"] = json(sharded.empty() ? "whole" : "sharded").dump();
  if (!sharded.empty()) index.extra_fields[std::string(kDcpIndexShardedKey)] = sharded.dump();
  return index;
}

}  // namespace megackpt::dcp::mega_storage
