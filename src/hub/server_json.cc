// megahub's JSON: views of the data model as the routes answer them
// (spec/mega-hub-protocol.md), and typed access to fields of client JSON.
#include "hub/server_internal.h"

namespace megackpt::hub {
namespace {

json NullableString(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }

Status WrongType(const char* key, const char* want) {
  return InvalidArgumentError(std::string("field \"") + key + "\" must be " + want);
}

}  // namespace

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Result<std::string> StringField(const json& j, const char* key, std::string def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_string()) return WrongType(key, "a string");
  return it->get<std::string>();
}

Result<uint64_t> U64Field(const json& j, const char* key, uint64_t def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    return WrongType(key, "a non-negative integer");
  }
  return it->get<uint64_t>();
}

Result<bool> BoolField(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) return WrongType(key, "true or false");
  return it->get<bool>();
}

Result<size_t> SizeParam(const Request& req, const char* name, size_t def, size_t lo, size_t hi) {
  if (!req.HasParam(name) || req.Param(name).empty()) return def;
  std::string v = req.Param(name);
  char* end = nullptr;
  unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || !end || *end || v[0] == '-') {
    return InvalidArgumentError(std::string("query parameter ") + name + "='" + v.substr(0, 40) +
                                "' is not a number");
  }
  return static_cast<size_t>(std::clamp<unsigned long long>(n, lo, hi));
}

json RepoJson(const RepoInfo& r, const std::optional<std::string>& sha) {
  json j = {{"repo_id", r.id()},
            {"id", r.id()},
            {"repo_type", std::string(RepoTypeName(r.type))},
            {"private", r.is_private},
            {"owner", r.ns},
            {"created_at", FormatTimestamp(r.created_ms)},
            {"updated_at", FormatTimestamp(r.updated_ms)},
            {"description", r.description},
            {"tags", json::array()},
            {"license", ""},
            {"likes", 0},
            {"downloads", 0}};
  if (sha) j["sha"] = *sha;
  return j;
}

json CommitJson(const CommitInfo& c, bool with_files) {
  json j = {{"revision", c.id},
            {"id", c.id},
            {"parent_revision", NullableString(c.parent)},
            {"message", c.message},
            {"title", c.message},
            {"author", c.author},
            {"authors", json::array({c.author})},
            {"created_at", FormatTimestamp(c.created_ms)},
            {"description", c.description}};
  if (with_files) {
    json files = json::array();
    for (const auto& f : c.changes) {
      files.push_back({{"path", f.path},
                       {"change", f.change},
                       {"size", f.size},
                       {"sha256", f.sha256.empty() ? json(nullptr) : json(f.sha256)},
                       {"previous_sha256",
                        f.previous_sha256.empty() ? json(nullptr) : json(f.previous_sha256)}});
    }
    j["files"] = std::move(files);
  }
  if (c.no_change) j["no_change"] = true;
  return j;
}

json RefJson(const RefInfo& r) {
  return {{"name", r.name},
          {"ref", (r.is_tag ? "refs/tags/" : "refs/heads/") + r.name},
          {"target_revision", r.target},
          {"targetCommit", r.target},
          {"message", NullableString(r.message)},
          {"updated_at", FormatTimestamp(r.updated_ms)}};
}

json BucketEntryJson(const BucketEntry& e) {
  json j = {{"type", "file"},
            {"path", e.path},
            {"size", e.size},
            {"xetHash", e.xet_hash},
            {"mtime", e.mtime_ms ? json(FormatTimestamp(e.mtime_ms)) : json(nullptr)},
            {"uploadedAt", FormatTimestamp(e.uploaded_ms)}};
  if (!e.sha256.empty()) j["sha256"] = e.sha256;
  if (!e.content_type.empty()) j["contentType"] = e.content_type;
  return j;
}

std::string GuessContentType(std::string_view path) {
  if (path.ends_with(".json")) return "application/json";
  if (path.ends_with(".md")) return "text/markdown";
  if (path.ends_with(".txt")) return "text/plain";
  return "application/octet-stream";
}

}  // namespace megackpt::hub
