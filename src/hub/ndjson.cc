#include "hub/ndjson.h"

#include <nlohmann/json.hpp>

#include "hub/util.h"
#include "megackpt/hub/mega_uri.h"

namespace megackpt::hub {
namespace {

using json = nlohmann::json;

// Splits on '\n', dropping a trailing '\r'; calls fn(line_number, line) for
// each non-blank line. Stops at the first error.
template <typename Fn>
Status ForEachLine(std::string_view body, Fn&& fn) {
  size_t line_no = 0;
  size_t start = 0;
  while (start < body.size()) {
    size_t nl = body.find('\n', start);
    std::string_view line = body.substr(start, nl == std::string_view::npos ? nl : nl - start);
    start = nl == std::string_view::npos ? body.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool blank = true;
    for (char c : line) {
      if (c != ' ' && c != '\t') {
        blank = false;
        break;
      }
    }
    if (blank) continue;
    MEGA_RETURN_IF_ERROR(fn(line_no, line));
  }
  return Status::OK();
}

Status LineError(size_t line, const std::string& what) {
  return InvalidArgumentError("NDJSON line " + std::to_string(line) + ": " + what);
}

Result<json> ParseObject(size_t line_no, std::string_view line) {
  json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return LineError(line_no, "not valid JSON");
  if (!j.is_object()) return LineError(line_no, "not a JSON object");
  return j;
}

// A required string member.
Result<std::string> Str(const json& obj, const char* key, size_t line_no) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return LineError(line_no, std::string("missing string field '") + key + "'");
  }
  return it->get<std::string>();
}

// An optional string member ("" when absent or null).
Result<std::string> OptStr(const json& obj, const char* key, size_t line_no) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string())
    return LineError(line_no, std::string("field '") + key + "' is not a string");
  return it->get<std::string>();
}

Result<uint64_t> OptUint(const json& obj, const char* key, size_t line_no) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return uint64_t{0};
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
    return LineError(line_no, std::string("field '") + key + "' is not a non-negative integer");
  }
  return it->get<uint64_t>();
}

Result<std::string> CheckedPath(const json& value, size_t line_no) {
  MEGA_ASSIGN_OR_RETURN(std::string path, Str(value, "path", line_no));
  Status s = ValidateRepoPath(path);
  if (!s.ok()) return LineError(line_no, s.message());
  return path;
}

}  // namespace

Result<std::string> Base64Decode(std::string_view in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return InvalidArgumentError("base64: bad length");
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    int v = value(in[i]);
    if (v < 0) return InvalidArgumentError("base64: bad character at offset " + std::to_string(i));
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string Base64Encode(std::string_view in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) |
                 static_cast<uint8_t>(in[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<NdjsonCommit> ParseNdjsonCommit(std::string_view body, const NdjsonLimits& limits) {
  NdjsonCommit out;
  bool have_header = false;
  size_t lines = 0;
  size_t inline_bytes = 0;
  Status s = ForEachLine(body, [&](size_t line_no, std::string_view line) -> Status {
    if (++lines > limits.max_lines) {
      return LineError(line_no, "more than " + std::to_string(limits.max_lines) + " lines");
    }
    MEGA_ASSIGN_OR_RETURN(json obj, ParseObject(line_no, line));
    MEGA_ASSIGN_OR_RETURN(std::string key, Str(obj, "key", line_no));
    auto vit = obj.find("value");
    if (vit == obj.end() || !vit->is_object())
      return LineError(line_no, "missing object field 'value'");
    const json& value = *vit;
    if (!have_header) {
      if (key != "header")
        return LineError(line_no, "the first line must be the header, got '" + key + "'");
      have_header = true;
      MEGA_ASSIGN_OR_RETURN(out.summary, OptStr(value, "summary", line_no));
      MEGA_ASSIGN_OR_RETURN(out.description, OptStr(value, "description", line_no));
      MEGA_ASSIGN_OR_RETURN(std::string parent, OptStr(value, "parentCommit", line_no));
      if (!parent.empty()) {
        std::string lower = ToLower(parent);
        if (!IsCommitId(lower)) {
          return LineError(line_no, "parentCommit '" + parent + "' is not a 40-hex commit id");
        }
        out.parent_commit = lower;
      }
      return Status::OK();
    }
    NdjsonCommit::Op op;
    if (key == "deletedFile" || key == "deletedFolder") {
      op.kind = key == "deletedFile" ? NdjsonCommit::Op::Kind::kDeletedFile
                                     : NdjsonCommit::Op::Kind::kDeletedFolder;
      std::string raw;
      MEGA_ASSIGN_OR_RETURN(raw, Str(value, "path", line_no));
      while (op.kind == NdjsonCommit::Op::Kind::kDeletedFolder && !raw.empty() &&
             raw.back() == '/') {
        raw.pop_back();
      }
      Status ps = ValidateRepoPath(raw);
      if (!ps.ok()) return LineError(line_no, ps.message());
      op.path = raw;
    } else if (key == "file") {
      op.kind = NdjsonCommit::Op::Kind::kFile;
      MEGA_ASSIGN_OR_RETURN(op.path, CheckedPath(value, line_no));
      MEGA_ASSIGN_OR_RETURN(std::string encoding, OptStr(value, "encoding", line_no));
      if (!encoding.empty() && encoding != "base64") {
        return LineError(line_no, "unsupported encoding '" + encoding + "'");
      }
      MEGA_ASSIGN_OR_RETURN(std::string content, Str(value, "content", line_no));
      auto decoded = Base64Decode(content);
      if (!decoded.ok()) return LineError(line_no, "content: " + decoded.status().message());
      op.content = *std::move(decoded);
      inline_bytes += op.content.size();
      if (inline_bytes > limits.max_inline_bytes) {
        return LineError(line_no, "inline file content exceeds " +
                                      std::to_string(limits.max_inline_bytes) + " bytes");
      }
    } else if (key == "lfsFile") {
      op.kind = NdjsonCommit::Op::Kind::kLfsFile;
      MEGA_ASSIGN_OR_RETURN(op.path, CheckedPath(value, line_no));
      MEGA_ASSIGN_OR_RETURN(std::string algo, OptStr(value, "algo", line_no));
      if (!algo.empty() && algo != "sha256")
        return LineError(line_no, "unsupported algo '" + algo + "'");
      MEGA_ASSIGN_OR_RETURN(std::string oid, Str(value, "oid", line_no));
      op.oid = ToLower(oid);
      if (!IsSha256Hex(op.oid))
        return LineError(line_no, "oid '" + oid + "' is not a sha256 hex digest");
      MEGA_ASSIGN_OR_RETURN(op.size, OptUint(value, "size", line_no));
    } else if (key == "header") {
      return LineError(line_no, "a second header line");
    } else {
      return LineError(line_no, "unknown key '" + key + "'");
    }
    out.ops.push_back(std::move(op));
    return Status::OK();
  });
  if (!s.ok()) return s;
  if (!have_header) return InvalidArgumentError("NDJSON commit: no header line");
  return out;
}

Result<std::vector<BucketBatchOp>> ParseBucketBatch(std::string_view body, size_t max_ops) {
  std::vector<BucketBatchOp> out;
  Status s = ForEachLine(body, [&](size_t line_no, std::string_view line) -> Status {
    if (out.size() >= max_ops) {
      return LineError(line_no, "more than " + std::to_string(max_ops) + " operations");
    }
    MEGA_ASSIGN_OR_RETURN(json obj, ParseObject(line_no, line));
    MEGA_ASSIGN_OR_RETURN(std::string type, Str(obj, "type", line_no));
    BucketBatchOp op;
    MEGA_ASSIGN_OR_RETURN(op.path, CheckedPath(obj, line_no));
    if (type == "deleteFile") {
      op.kind = BucketBatchOp::Kind::kDeleteFile;
    } else if (type == "addFile" || type == "copyFile") {
      op.kind = type == "addFile" ? BucketBatchOp::Kind::kAddFile : BucketBatchOp::Kind::kCopyFile;
      MEGA_ASSIGN_OR_RETURN(op.xet_hash, Str(obj, "xetHash", line_no));
      if (!IsXetHashText(op.xet_hash)) {
        return LineError(line_no, "xetHash '" + op.xet_hash + "' is not 64 hex digits");
      }
      op.xet_hash = ToLower(op.xet_hash);
      auto mt = obj.find("mtime");
      if (mt != obj.end() && !mt->is_null()) {
        if (!mt->is_number_integer())
          return LineError(line_no, "mtime is not integer milliseconds");
        op.mtime_ms = mt->get<int64_t>();
      }
      MEGA_ASSIGN_OR_RETURN(op.content_type, OptStr(obj, "contentType", line_no));
      MEGA_ASSIGN_OR_RETURN(op.size, OptUint(obj, "size", line_no));
      MEGA_ASSIGN_OR_RETURN(op.sha256, OptStr(obj, "sha256", line_no));
      if (!op.sha256.empty() && !IsSha256Hex(ToLower(op.sha256))) {
        return LineError(line_no, "sha256 '" + op.sha256 + "' is not a sha256 hex digest");
      }
      op.sha256 = ToLower(op.sha256);
      MEGA_ASSIGN_OR_RETURN(op.source_repo_type, OptStr(obj, "sourceRepoType", line_no));
      MEGA_ASSIGN_OR_RETURN(op.source_repo_id, OptStr(obj, "sourceRepoId", line_no));
    } else {
      return LineError(line_no, "unknown operation type '" + type + "'");
    }
    out.push_back(std::move(op));
    return Status::OK();
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace megackpt::hub
