#include "megackpt/format/index_file.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "format/index_file_json.h"
#include "megackpt/core/file.h"
#include "megackpt/core/path_components.h"
#include "megackpt/core/path_safety.h"
#include "megackpt/core/text.h"

namespace megackpt::format {
namespace {

using nlohmann::json;

Status Malformed(std::string_view file, std::string_view what) {
  return DataLossError(std::string(file) + ": index " + std::string(what));
}

// total_size as written by various tools: an integer, or (rarely) an integral float.
std::optional<uint64_t> AsTotalSize(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return std::nullopt;
    return static_cast<uint64_t>(s);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!(d >= 0) || d >= 18446744073709551616.0 || std::floor(d) != d) return std::nullopt;
    return static_cast<uint64_t>(d);
  }
  return std::nullopt;
}

}  // namespace

std::optional<IndexKind> IndexKindFromPath(std::string_view path) {
  if (std::string_view(path).ends_with(kMegaIndexSuffix)) return IndexKind::kMega;
  if (std::string_view(path).ends_with(kSafetensorsIndexSuffix)) return IndexKind::kSafetensors;
  return std::nullopt;
}

std::vector<std::string> ShardIndex::ShardFiles() const {
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file);
  return {files.begin(), files.end()};
}

std::vector<std::string> ShardIndex::TensorsInShard(std::string_view shard) const {
  std::vector<std::string> out;
  for (const auto& [name, file] : weight_map) {
    if (file == shard) out.push_back(name);
  }
  return out;
}

Status ValidateShardFileName(std::string_view name) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("shard file name " + Quote(name) + " " + std::string(why));
  };
  if (name.empty()) return bad("is empty");
  if (name.front() == '/') return bad("is an absolute path (must be relative to the index folder)");
  if (name.find('\0') != std::string_view::npos) return bad("contains a NUL byte");
  if (name.find('\\') != std::string_view::npos) return bad("contains a backslash");
  for (std::string_view part : PathComponents(name)) {
    if (part.empty()) return bad("has an empty path component");
    if (part == "..") return bad("leaves the index folder ('..')");
  }
  // Everything else a checkpoint's file name must satisfy (control bytes,
  // UTF-8, '.' components, lengths): the one rule set of core/path_safety.h.
  if (Status s = ValidateRelativePath(name); !s.ok()) return InvalidArgumentError(s.message());
  return Status::OK();
}

Result<ShardIndex> ParseShardIndex(std::string_view index_name, std::string_view json_text) {
  MEGA_ASSIGN_OR_RETURN(json root, ParseJsonRejectingDuplicates(index_name, json_text, "index"));
  if (!root.is_object()) return Malformed(index_name, "root is not a JSON object");
  ShardIndex index;
  bool have_weight_map = false;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    if (key == "metadata") {
      if (!it->is_object()) return Malformed(index_name, "\"metadata\" is not a JSON object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (m.key() == "total_size") {
          auto total = AsTotalSize(*m);
          if (!total) {
            return Malformed(index_name, "\"metadata.total_size\" is not a non-negative integer");
          }
          index.total_size = *total;
        } else {
          index.extra_metadata.emplace(m.key(), m->dump());
        }
      }
    } else if (key == "weight_map") {
      if (!it->is_object()) return Malformed(index_name, "\"weight_map\" is not a JSON object");
      have_weight_map = true;
      for (auto w = it->begin(); w != it->end(); ++w) {
        if (!w->is_string()) {
          return Malformed(
              index_name, "\"weight_map\" entry for tensor " + Quote(w.key()) + " is not a string");
        }
        std::string file = w->get<std::string>();
        Status valid = ValidateShardFileName(file);
        if (!valid.ok()) {
          return Malformed(index_name, "\"weight_map\" entry for tensor " + Quote(w.key()) + ": " +
                                           valid.message());
        }
        if (w.key().find('\0') != std::string::npos) {
          return Malformed(index_name, "\"weight_map\" has a tensor name " + Quote(w.key()) +
                                           " that holds a NUL byte");
        }
        index.weight_map.emplace(w.key(), std::move(file));
      }
    } else {
      index.extra_fields.emplace(key, it->dump());
    }
  }
  if (!have_weight_map) return Malformed(index_name, "has no \"weight_map\" object");
  return index;
}

Result<std::string> SerializeShardIndex(const ShardIndex& index) {
  json root = json::object();
  json metadata = json::object();
  for (const auto& [key, text] : index.extra_metadata) {
    json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) {
      return InvalidArgumentError("index metadata member '" + key + "' is not valid JSON text");
    }
    metadata[key] = std::move(v);
  }
  if (index.total_size) metadata["total_size"] = *index.total_size;
  for (const auto& [key, text] : index.extra_fields) {
    if (key == "metadata" || key == "weight_map") {
      return InvalidArgumentError("index extra member '" + key + "' collides with the schema");
    }
    json v = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (v.is_discarded()) {
      return InvalidArgumentError("index member '" + key + "' is not valid JSON text");
    }
    root[key] = std::move(v);
  }
  json weight_map = json::object();
  for (const auto& [name, file] : index.weight_map) {
    Status valid = ValidateShardFileName(file);
    if (!valid.ok()) return valid.WithContext("index entry for tensor '" + name + "'");
    weight_map[name] = file;
  }
  root["metadata"] = std::move(metadata);
  root["weight_map"] = std::move(weight_map);
  try {
    return root.dump(2) + "\n";
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("cannot encode index (names must be valid UTF-8): ") +
                                e.what());
  }
}

void AddMegatensorsFields(ShardIndex* index) {
  index->extra_metadata["format"] = json(std::string(kMegaShardedIndexFormat)).dump();
  json shards = json::object();
  for (const auto& file : index->ShardFiles()) shards[file] = file;
  index->extra_fields["shards"] = shards.dump();
}

Result<ShardIndex> ReadShardIndexFile(const std::string& path) {
  MEGA_ASSIGN_OR_RETURN(std::string text, ReadLocalFile(path, kMaxIndexFileBytes));
  return ParseShardIndex(path, text);
}

Status WriteShardIndexFile(const std::string& path, const ShardIndex& index, bool sync) {
  MEGA_ASSIGN_OR_RETURN(std::string text, SerializeShardIndex(index));
  return WriteLocalFileAtomically(path, text, sync);
}

}  // namespace megackpt::format
