// `mega://` URIs: repositories (models, datasets, spaces) at a revision, and
// buckets (mutable, no revision).
//
// Grammar (spec/mega-uri-and-hub.md §1, as HfFileSystem parses its paths):
//
//   mega://[<type>/]<namespace>/<name>[@<revision>][/<path>]     type ∈ datasets, spaces
//   mega://buckets/<namespace>/<name>[/<path>]                   (no revision)
//
//  - No type prefix means a model repository.
//  - <revision> defaults to "main". `refs/pr/<N>` and `refs/convert/<name>` are
//    recognised although they contain '/'; any other revision containing '/'
//    is written percent-encoded (`feature%2Fx`). The revision is stored decoded.
//  - <namespace> and <name>: 1..96 characters of [A-Za-z0-9._-], neither "." nor
//    "..". Empty segments (`//`) and an empty revision (`@` or `@/`) are errors.
//  - <path> segments must not be empty, "." or ".." (no traversal); a single
//    trailing '/' is ignored. The path is stored without leading/trailing '/'.
// Every parse error is InvalidArgument and names the offending part.
#ifndef MEGACKPT_HUB_MEGA_URI_H_
#define MEGACKPT_HUB_MEGA_URI_H_

#include <string>
#include <string_view>

#include "megackpt/core/status.h"

namespace megackpt::hub {

enum class RepoType { kModel, kDataset, kSpace };

// "model", "dataset", "space".
std::string_view RepoTypeName(RepoType type);
// "models", "datasets", "spaces" (the URL segment of the HF-style routes).
std::string_view RepoTypePlural(RepoType type);
// Accepts the singular or plural name. InvalidArgument otherwise.
Result<RepoType> RepoTypeFromName(std::string_view name);

struct MegaUri {
  bool is_bucket = false;
  RepoType type = RepoType::kModel;  // kModel for buckets
  std::string ns;                    // namespace
  std::string name;
  std::string revision;       // decoded; "main" when not given; "" for buckets
  bool has_revision = false;  // the URI spelled `@<revision>`
  std::string path;           // inside the repo; "" = root; no leading/trailing '/'

  // "namespace/name".
  std::string repo_id() const { return ns + "/" + name; }

  // The canonical URI text: the type prefix, `@<revision>` when has_revision
  // (percent-encoded as the grammar requires), and the path.
  std::string ToString() const;

  // This URI with `path` replaced (validated like a parsed path).
  Result<MegaUri> WithPath(std::string_view new_path) const;

  // The URI of the repository/bucket root (same revision, empty path).
  MegaUri Root() const;

  friend bool operator==(const MegaUri&, const MegaUri&) = default;
};

// True when `s` starts with "mega://".
bool IsMegaUri(std::string_view s);

// Parses a mega:// URI. InvalidArgument naming the bad part on any error.
Result<MegaUri> ParseMegaUri(std::string_view uri);

// Checks a repository-relative file path: non-empty, no leading '/', no empty,
// "." or ".." segment, no backslash, no control characters, at most 1024 bytes,
// each segment at most 255 bytes.
// `what` names the path in the error ("path 'a/../b': segment '..' ...").
Status ValidateRepoPath(std::string_view path);

// Checks a namespace or repo name (see the grammar above). `what` is "namespace"
// or "name", used in the message.
Status ValidateRepoNamePart(std::string_view part, std::string_view what);

// Checks a revision (branch, tag or commit id): non-empty, at most 255 bytes,
// no control characters, spaces, "..", '\\', '~', '^', ':', '?', '*', '[',
// no leading or trailing '/', no empty segment.
Status ValidateRevision(std::string_view revision);

// Percent-encodes every byte outside [A-Za-z0-9._~-] (also '/').
std::string PercentEncode(std::string_view s);
// Percent-encodes like PercentEncode but keeps '/'.
std::string PercentEncodePath(std::string_view s);
// Decodes %XX escapes ('+' is kept as is). InvalidArgument on a bad escape.
Result<std::string> PercentDecode(std::string_view s);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_MEGA_URI_H_
