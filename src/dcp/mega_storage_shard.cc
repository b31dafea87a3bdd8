// Shard encoder options, shard entries codec and naming (see the header).
//
// Shards are written by format::MegaEncoder: the storage writer receives a
// shard's items in waves (async_save stages in pieces) and consolidation
// assembles one tensor at a time; both write a tensor and forget it, which the
// encoder's planned layout allows.
#include "dcp/mega_storage_shard.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "dcp/codec.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/text.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp::mega_storage {

using json = nlohmann::json;

format::MegaEncoderOptions ShardEncoderOptions(uint64_t tensor_alignment,
                                               format::MegaChecksumType checksum) {
  format::MegaEncoderOptions o;
  o.alignment = 4096;
  o.tensor_alignment = tensor_alignment;
  o.checksum = checksum;
  o.block_checksums = true;
  o.header_checksum = true;
  return o;
}

// ---- entries --------------------------------------------------------------------

std::string EncodeShardEntries(const std::map<std::string, ShardEntry>& entries) {
  json j = json::object();
  for (const auto& [fqn, e] : entries) {
    json v;
    v["kind"] = e.is_bytes ? "bytes" : "tensor";
    v["dtype"] = std::string(DTypeName(e.dtype));
    v["global_shape"] = e.global_shape;
    v["offsets"] = e.offsets;
    j[fqn] = std::move(v);
  }
  return j.dump();
}

namespace {

Result<Shape> ShapeFrom(const json& v, std::string_view file, const std::string& what) {
  if (!v.is_array()) return DataLossError(std::string(file) + ": " + what + " is not an array");
  Shape out;
  for (const json& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return DataLossError(std::string(file) + ": " + what +
                           " has a non-integer or negative value");
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

}  // namespace

Result<std::map<std::string, ShardEntry>> DecodeShardEntries(std::string_view file,
                                                             std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string f(file);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(f + ": " + std::string(kDcpEntriesKey) + " is not a JSON object");
  }
  std::map<std::string, ShardEntry> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string what = std::string(kDcpEntriesKey) + "[\"" + it.key() + "\"]";
    const json& v = it.value();
    if (!v.is_object() || !v.contains("kind") || !v["kind"].is_string()) {
      return DataLossError(f + ": " + what + " has no kind");
    }
    ShardEntry e;
    const std::string kind = v["kind"].get<std::string>();
    if (kind == "bytes") {
      e.is_bytes = true;
      e.dtype = DType::kU8;
    } else if (kind == "tensor") {
      if (!v.contains("dtype") || !v["dtype"].is_string()) {
        return DataLossError(f + ": " + what + " has no dtype");
      }
      auto dt = DTypeFromName(v["dtype"].get<std::string>());
      if (!dt.ok()) return DataLossError(f + ": " + what + ": " + dt.status().message());
      e.dtype = *dt;
      if (!v.contains("global_shape") || !v.contains("offsets")) {
        return DataLossError(f + ": " + what + " needs global_shape and offsets");
      }
      MEGA_ASSIGN_OR_RETURN(e.global_shape,
                            ShapeFrom(v["global_shape"], file, what + ".global_shape"));
      MEGA_ASSIGN_OR_RETURN(e.offsets, ShapeFrom(v["offsets"], file, what + ".offsets"));
      if (e.offsets.size() != e.global_shape.size()) {
        return DataLossError(f + ": " + what + ": offsets and global_shape differ in rank");
      }
    } else {
      return DataLossError(f + ": " + what + " has unknown kind \"" + kind + "\"");
    }
    out.emplace(it.key(), std::move(e));
  }
  return out;
}

std::string EncodeObjectPaths(const std::map<std::string, ObjectPath>& paths) {
  return internal::ObjectPathsJson(paths).dump();
}

Result<std::map<std::string, ObjectPath>> DecodeObjectPaths(std::string_view file,
                                                            std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(std::string(file) + ": " + std::string(kDcpObjectPathsKey) +
                         " is not a JSON object");
  }
  std::map<std::string, ObjectPath> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_array()) {
      return DataLossError(std::string(file) + ": object path of " + it.key() + " is not an array");
    }
    ObjectPath p;
    for (const json& k : it.value()) {
      if (k.is_string()) {
        p.push_back(PathKey{k.get<std::string>()});
      } else if (k.is_number_integer()) {
        p.push_back(PathKey{k.get<int64_t>()});
      } else {
        return DataLossError(std::string(file) + ": object path of " + it.key() +
                             " has a bad element");
      }
    }
    out.emplace(it.key(), std::move(p));
  }
  return out;
}

// ---- naming ---------------------------------------------------------------------

std::string ShardFileName(std::string_view ext, size_t number, size_t count,
                          std::string_view save_id, int rank_tag) {
  std::string name = "model";
  if (rank_tag >= 0) name += "-rank" + std::to_string(rank_tag);
  if (!save_id.empty()) {
    name += "-";
    name += save_id;
  }
  if (count > 1 || rank_tag >= 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", number, count);
    name += buf;
  }
  name += ext;
  return name;
}

namespace {

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool IsShardFileName(std::string_view name, int* rank_tag) {
  if (rank_tag) *rank_tag = -1;
  std::string_view rest;
  if (name.ends_with(".mega")) {
    rest = name.substr(0, name.size() - 5);
  } else if (name.ends_with(".safetensors")) {
    rest = name.substr(0, name.size() - 12);
  } else {
    return false;
  }
  if (!rest.starts_with("model")) return false;
  rest.remove_prefix(5);
  if (rest.starts_with("-rank")) {
    rest.remove_prefix(5);
    size_t n = 0;
    while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
    if (n == 0 || n > 7) return false;
    if (rank_tag) *rank_tag = std::stoi(std::string(rest.substr(0, n)));
    rest.remove_prefix(n);
  }
  // -<12 hex> id?
  if (rest.size() >= 13 && rest[0] == '-' && IsLowerHex(rest.substr(1, 12)) &&
      (rest.size() == 13 || rest[13] == '-')) {
    rest.remove_prefix(13);
  }
  if (rest.empty()) return true;
  // -NNNNN-of-MMMMM
  if (rest.size() != 15 || rest[0] != '-' || rest.substr(6, 4) != "-of-") return false;
  return AllDigits(rest.substr(1, 5)) && AllDigits(rest.substr(10, 5));
}

std::string NewSaveId() { return RandomHex(6); }

std::string CrcString(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "crc32:%08x", crc);
  return buf;
}

std::string MegaChecksumString(const format::MegaTensorInfo& t) {
  std::string out;
  switch (t.checksum_type) {
    case format::MegaChecksumType::kCrc32:
      return CrcString(t.crc32());
    case format::MegaChecksumType::kSha256:
      out = "sha256:";
      out += t.checksum_hex();
      return out;
    case format::MegaChecksumType::kNone:
      return out;
  }
  return out;
}

std::string Quote(std::string_view s) { return core::Quote(s); }

}  // namespace megackpt::dcp::mega_storage
