// Parsers for the hub's NDJSON request bodies (hostile input: every error is
// InvalidArgument naming the line, nothing throws):
//  - the Hugging Face style commit (`POST /api/{type}s/{id}/commit/{rev}`,
//    spec/mega-hub-protocol.md §5.3): a header line, then deletedFile /
//    deletedFolder / file (base64 content) / lfsFile lines;
//  - the bucket batch (`POST /api/buckets/{id}/batch`, §5.5): addFile /
//    copyFile / deleteFile lines.
#ifndef MEGACKPT_HUB_NDJSON_H_
#define MEGACKPT_HUB_NDJSON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::hub {

struct NdjsonCommit {
  std::string summary, description;
  std::optional<std::string> parent_commit;  // 40-hex when given
  struct Op {
    enum class Kind { kDeletedFile, kDeletedFolder, kFile, kLfsFile };
    Kind kind = Kind::kFile;
    std::string path;     // validated (no '..', not absolute)
    std::string content;  // kFile: decoded bytes
    std::string oid;      // kLfsFile: sha256 hex (lowercase)
    uint64_t size = 0;    // kLfsFile
  };
  std::vector<Op> ops;
};

struct NdjsonLimits {
  size_t max_lines = 100000;
  size_t max_inline_bytes = 64u << 20;  // sum of decoded `file` contents
};

// Lines are separated by '\n' (a '\r' before it is ignored); blank lines are
// skipped. The first non-blank line must be the header.
Result<NdjsonCommit> ParseNdjsonCommit(std::string_view body, const NdjsonLimits& limits = {});

struct BucketBatchOp {
  enum class Kind { kAddFile, kCopyFile, kDeleteFile };
  Kind kind = Kind::kAddFile;
  std::string path;
  std::string xet_hash;  // addFile / copyFile
  int64_t mtime_ms = 0;  // addFile (integer milliseconds)
  std::string content_type;
  uint64_t size = 0;   // extension: optional "size" (0 = from the content)
  std::string sha256;  // extension: optional "sha256"
  std::string source_repo_type, source_repo_id;  // copyFile
};

Result<std::vector<BucketBatchOp>> ParseBucketBatch(std::string_view body, size_t max_ops = 1000);

// Standard base64 (RFC 4648, '=' padding optional, no whitespace).
Result<std::string> Base64Decode(std::string_view in);
std::string Base64Encode(std::string_view in);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_NDJSON_H_
