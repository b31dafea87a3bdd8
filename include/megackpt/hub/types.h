// Value types of the MEGA hub's data model (docs/hub.md): repositories with
// branches, tags and immutable commits; buckets (mutable path -> entry); file
// entries naming content in the CAS; bearer tokens.
#ifndef MEGACKPT_HUB_TYPES_H_
#define MEGACKPT_HUB_TYPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/hub/mega_uri.h"

namespace megackpt::hub {

// The Xet file hash of an empty file (64 zeros); empty files have no CAS object.
inline constexpr const char* kEmptyXetHash =
    "0000000000000000000000000000000000000000000000000000000000000000";

struct RepoInfo {
  RepoType type = RepoType::kModel;
  std::string ns, name;
  bool is_private = false;
  std::string description;
  int64_t created_ms = 0, updated_ms = 0;  // Unix milliseconds
  std::string id() const { return ns + "/" + name; }
};

struct RepoSpec {
  RepoType type = RepoType::kModel;
  std::string ns, name;
  bool is_private = false;
  std::string description;
};

// A file as a commit or bucket records it. The content lives in the CAS under
// `xet_hash` (Xet text form; kEmptyXetHash for empty files).
struct FileEntry {
  std::string path;
  uint64_t size = 0;
  std::string sha256;    // lowercase hex of the content's SHA-256 ("" when unknown)
  std::string xet_hash;  // Xet file hash, text form
  friend bool operator==(const FileEntry&, const FileEntry&) = default;
};

// One path changed by a commit.
struct FileChange {
  std::string path;
  std::string change;  // "add", "modify" or "delete"
  uint64_t size = 0;
  std::string sha256;           // new content ("" for delete)
  std::string previous_sha256;  // "" for add
};

struct CommitInfo {
  // HubStore::Commit only: true when the request changed nothing on an
  // existing branch, so no commit was made and `id` is the unchanged head.
  bool no_change = false;
  std::string id;                     // 40 lowercase hex
  std::optional<std::string> parent;  // none for a repo's first commit
  std::string message, description, author;
  int64_t created_ms = 0;
  std::vector<FileChange> changes;  // filled by GetCommit only
};

struct RefInfo {
  std::string name;  // "main", "v1.0"
  bool is_tag = false;
  std::string target;  // commit id
  std::optional<std::string> message;
  int64_t updated_ms = 0;
};

struct CommitOperation {
  enum class Kind {
    kAdd,           // path -> entry (content must be in the CAS)
    kDelete,        // path (NotFound when absent, unless the request says otherwise)
    kDeleteFolder,  // every path under path + "/"
    kCopy,          // path <- source_path of source_revision (same repo or source_repo)
  };
  Kind kind = Kind::kAdd;
  std::string path;
  FileEntry entry;              // kAdd: size, sha256, xet_hash (entry.path is ignored)
  std::string source_repo;      // kCopy: "" = same repo
  std::string source_path;      // kCopy
  std::string source_revision;  // kCopy: "" = the parent commit
};

// Which content a caller may name by hash (sha256 or Xet hash) in a commit
// or bucket batch. A hash the caller may not read is treated exactly like an
// unknown one (same error), so hashes cannot be probed.
struct ContentAccess {
  // nullopt: any stored content (in-process callers, unrestricted tokens).
  // A namespace: only content that a public repo or bucket, or a repo or
  // bucket of that namespace, references (in any commit), or that was
  // uploaded with a grant to that namespace (HubStore::RecordContent).
  std::optional<std::string> ns;
};

struct CommitRequest {
  std::string repo;             // "ns/name"
  std::string branch = "main";  // must exist unless create_branch
  std::string message, description, author;
  // Compare-and-swap: the commit applies only when the branch head is still
  // this commit. Unset: applies on whatever the head is.
  std::optional<std::string> parent;
  // When the head moved past `parent`: apply on the new head anyway, provided
  // no path this commit touches changed between parent and head.
  bool rebase = false;
  // Create `branch` (at `parent`, or as a root commit when parent is unset)
  // when it does not exist.
  bool create_branch = false;
  // Deleting a missing path is an error (NotFound) unless this is set.
  bool ignore_missing_deletes = false;
  // Content the added entries may name (kAdd; copies are checked by the
  // caller against the source repo).
  ContentAccess access;
  std::vector<CommitOperation> ops;
};

struct BucketInfo {
  std::string ns, name;
  bool is_private = false;
  int64_t created_ms = 0;
  uint64_t size = 0;         // sum of entry sizes
  uint64_t total_files = 0;  // number of entries
  std::string id() const { return ns + "/" + name; }
};

struct BucketEntry {
  std::string path;
  uint64_t size = 0;
  std::string xet_hash;
  std::string sha256;  // "" when the writer did not give it
  std::string content_type;
  int64_t mtime_ms = 0;     // as given by the writer
  int64_t uploaded_ms = 0;  // when the hub recorded it
};

struct BucketOperation {
  enum class Kind { kAdd, kDelete };
  Kind kind = Kind::kAdd;
  BucketEntry entry;  // kAdd: path, xet_hash, size (taken from the CAS when 0), mtime_ms
                      // kDelete: path
};

enum class TokenScope { kRead, kWrite };

struct TokenInfo {
  std::string id;  // short public id (first characters of the hash)
  TokenScope scope = TokenScope::kRead;
  std::optional<std::string> ns;  // limited to this namespace; unset = all
  std::string description;
  int64_t created_ms = 0;
};

// Unix milliseconds now.
int64_t NowMs();
// "2026-11-29T17:42:46.635Z".
std::string FormatTimestamp(int64_t unix_ms);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_TYPES_H_
