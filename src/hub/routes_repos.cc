// megahub routes on repositories (native MEGA routes, spec/mega-hub-protocol.md
// §4): /api/repos (create, list), /api/repos/{ns}/{name} (info, delete),
// .../resolve, .../commits, .../files, .../refs, .../blobs/{sha256},
// PUT/DELETE .../files/{path}, POST .../copy; and the HF-style download URLs
// /[datasets/|spaces/]{ns}/{name}/resolve/{rev}/{path}.
#include "hub/server_internal.h"
#include "hub/util.h"
#include "megackpt/cas/hash.h"

namespace megackpt::hub {
namespace {

std::string RepoId(const Call& c) { return c.p(0) + "/" + c.p(1); }

// Authorises a write to the route's repo ({ns}/{name}) and loads it. The
// error answer is in *error.
std::optional<RepoInfo> LoadRepoForWrite(const Call& c, Response* error) {
  Status s = CheckWrite(c.who, c.p(0));
  if (!s.ok()) {
    *error = ErrorFrom(s);
    return std::nullopt;
  }
  auto r = c.store().GetRepo(RepoId(c));
  if (!r.ok()) {
    *error = ErrorFrom(r.status(), "RepoNotFound");
    return std::nullopt;
  }
  return *r;
}

// Streams a request body into a CAS upload (blob and file PUTs); `then`
// answers with the stored content's entry.
class UploadBody final : public httpd::BodyReader {
 public:
  UploadBody(ServerContext& ctx, std::unique_ptr<ContentUpload> upload, uint64_t limit,
             std::function<Result<Response>(const FileEntry&)> then)
      : ctx_(ctx), upload_(std::move(upload)), limit_(limit), then_(std::move(then)) {
    upload_->set_on_close(nullptr);  // recorded by `then` after its checks
  }
  Status Append(std::span<const std::byte> data) override {
    ctx_.counters.blob_bytes_received += data.size();
    got_ += data.size();
    if (got_ > limit_) {
      return ResourceExhaustedError("body exceeds " + std::to_string(limit_) + " bytes");
    }
    return upload_->Append(data);
  }
  Result<Response> Finish(const Status& status) override {
    MEGA_RETURN_IF_ERROR(status);
    MEGA_RETURN_IF_ERROR(upload_->Close());
    return then_(upload_->entry());
  }

 private:
  ServerContext& ctx_;
  std::unique_ptr<ContentUpload> upload_;
  uint64_t limit_, got_ = 0;
  std::function<Result<Response>(const FileEntry&)> then_;
};

// ---- /api/repos ----

Routed CreateRepoRoute(Call& c) {
  // The namespace is in the body: a write token is required before reading it.
  MEGA_RETURN_IF_ERROR(CheckAnyWrite(c.who));
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    MEGA_ASSIGN_OR_RETURN(std::string repo_id, StringField(j, "repo_id"));
    MEGA_ASSIGN_OR_RETURN(auto parts, SplitRepoId(repo_id));
    MEGA_RETURN_IF_ERROR(CheckWrite(c.who, parts.first));
    RepoSpec spec;
    spec.ns = parts.first;
    spec.name = parts.second;
    MEGA_ASSIGN_OR_RETURN(std::string type_name, StringField(j, "repo_type", "model"));
    MEGA_ASSIGN_OR_RETURN(spec.type, RepoTypeFromName(type_name));
    MEGA_ASSIGN_OR_RETURN(spec.is_private, BoolField(j, "private"));
    spec.description = j.contains("description") && j["description"].is_string()
                           ? j["description"].get<std::string>()
                           : "";
    MEGA_ASSIGN_OR_RETURN(bool exist_ok, BoolField(j, "exist_ok"));
    MEGA_ASSIGN_OR_RETURN(auto repo, c.store().CreateRepo(spec, exist_ok));
    return JsonResponse(RepoJson(repo), 201);
  });
}

Routed ListReposRoute(Call& c) {
  const Request& req = c.req;
  std::string owner = req.Param("owner");
  std::string after = req.Param("cursor");
  MEGA_ASSIGN_OR_RETURN(size_t limit, SizeParam(req, "limit", 100, 1, 1000));
  // Optional filters: type (model|dataset|space, also plural) and q
  // (case-insensitive substring of the repo id).
  std::optional<RepoType> type;
  if (!req.Param("type").empty()) {
    std::string t = req.Param("type");
    if (t.size() > 1 && t.back() == 's') t.pop_back();
    MEGA_ASSIGN_OR_RETURN(type, RepoTypeFromName(t));
  }
  std::string q = ToLower(req.Param("q"));
  json arr = json::array();
  std::optional<std::string> next;
  std::string cursor = after;
  bool exhausted = false;
  // Page through the store until `limit` visible matches (+1 to know
  // whether there is more) or the end.
  while (!exhausted && !next) {
    MEGA_ASSIGN_OR_RETURN(auto repos, c.store().ListRepos(owner, cursor, 256));
    exhausted = repos.size() < 256;
    for (const RepoInfo& r : repos) {
      cursor = r.id();
      if (r.is_private && !CheckRead(c.who, true, r.ns).ok()) continue;
      if (type && r.type != *type) continue;
      if (!q.empty() && ToLower(r.id()).find(q) == std::string::npos) continue;
      if (arr.size() == limit) {
        next = arr.back()["repo_id"].get<std::string>();
        break;
      }
      arr.push_back(RepoJson(r));
    }
  }
  return (JsonResponse({{"repos", arr}, {"next_cursor", next ? json(*next) : json(nullptr)}}));
}

// ---- /api/repos/{ns}/{name} ----

Routed RepoInfoRoute(Call& c) {
  auto repo = LoadRepoForRead(c, c.p(0), c.p(1));
  if (!repo.ok()) return RepoError(repo.status());
  auto head = c.store().ResolveRevision(RepoId(c), "main");
  return (
      JsonResponse(RepoJson(*repo, head.ok() ? std::optional<std::string>(*head) : std::nullopt)));
}

Routed DeleteRepoRoute(Call& c) {
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, c.p(0)));
  Status s = c.store().DeleteRepo(RepoId(c));
  if (!s.ok()) return ErrorFrom(s, "RepoNotFound");
  return (JsonResponse(json::object()));
}

Result<Response> ServeResolve(const Call& c, const RepoInfo& repo, const std::string& revision,
                              const std::string& path) {
  MEGA_RETURN_IF_ERROR(ValidateRepoPath(path));
  auto commit = c.store().ResolveRevision(repo.id(), revision);
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  auto entry = c.store().GetFile(repo.id(), *commit, path);
  if (!entry.ok()) return ErrorFrom(entry.status(), "EntryNotFound");
  Response res;
  res.SetHeader("X-Repo-Commit", *commit);
  res.SetHeader("ETag", "\"" + entry->sha256 + "\"");
  res.SetHeader("X-Linked-Etag", "\"" + entry->sha256 + "\"");
  res.SetHeader("X-Linked-Size", std::to_string(entry->size));
  if (entry->size > 0) {
    res.SetHeader("X-Xet-Hash", entry->xet_hash);
    res.SetHeader("Link", "<" + c.ctx.Endpoint(c.req) + "/api/" +
                              std::string(RepoTypePlural(repo.type)) + "/" + repo.id() +
                              "/xet-read-token/" + *commit + ">; rel=\"xet-auth\"");
  }
  return ServeContent(c, *entry, repo.id() + "@" + *commit + "/" + path, std::move(res));
}

// /resolve/{path...}?revision=R or /resolve?revision=R&path=P.
Routed ResolveRoute(Call& c) {
  auto repo = LoadRepoForRead(c, c.p(0), c.p(1));
  if (!repo.ok()) return RepoError(repo.status());
  std::string path = c.tail().empty() ? c.req.Param("path") : c.tail();
  return ServeResolve(c, *repo, c.req.Param("revision", "main"), path);
}

Routed GetCommitRoute(Call& c) {
  auto repo = LoadRepoForRead(c, c.p(0), c.p(1));
  if (!repo.ok()) return RepoError(repo.status());
  auto commit = c.store().GetCommit(RepoId(c), c.p(2), true);
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  return (JsonResponse(CommitJson(*commit, true)));
}

Routed ListCommitsRoute(Call& c) {
  auto repo = LoadRepoForRead(c, c.p(0), c.p(1));
  if (!repo.ok()) return RepoError(repo.status());
  std::string rev = c.req.Param("revision", "main");
  MEGA_ASSIGN_OR_RETURN(size_t limit, SizeParam(c.req, "limit", 100, 1, 1000));
  MEGA_ASSIGN_OR_RETURN(size_t offset, SizeParam(c.req, "cursor", 0, 0, SIZE_MAX / 2));
  auto list = c.store().ListCommits(RepoId(c), rev, offset, limit + 1);
  if (!list.ok()) return ErrorFrom(list.status(), "RevisionNotFound");
  json arr = json::array();
  for (size_t i = 0; i < list->size() && i < limit; ++i)
    arr.push_back(CommitJson((*list)[i], false));
  json next = list->size() > limit ? json(std::to_string(offset + limit)) : json(nullptr);
  return (JsonResponse({{"commits", arr}, {"next_cursor", next}}));
}

Routed PostCommitRoute(Call& c) {
  Response error;
  auto repo = LoadRepoForWrite(c, &error);
  if (!repo) return error;
  return WithJsonBody(
      c, c.ctx.options.max_json_bytes,
      [&c, repo = *repo](json j) -> Result<Response> { return NativeCommit(c, repo, j); });
}

Routed ListFilesRoute(Call& c) {
  auto repo = LoadRepoForRead(c, c.p(0), c.p(1));
  if (!repo.ok()) return RepoError(repo.status());
  auto commit = c.store().ResolveRevision(RepoId(c), c.req.Param("revision", "main"));
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  MEGA_ASSIGN_OR_RETURN(size_t limit, SizeParam(c.req, "limit", 1000, 1, 10000));
  MEGA_ASSIGN_OR_RETURN(auto files, c.store().ListFiles(RepoId(c), *commit, c.req.Param("prefix"),
                                                        c.req.Param("cursor"), limit + 1));
  json arr = json::array();
  for (size_t i = 0; i < files.size() && i < limit; ++i) {
    const auto& f = files[i];
    arr.push_back({{"path", f.path},
                   {"size", f.size},
                   {"sha256", f.sha256},
                   {"xet_hash", f.xet_hash},
                   {"content_type", GuessContentType(f.path)}});
  }
  json next = files.size() > limit ? json(files[limit - 1].path) : json(nullptr);
  return (JsonResponse({{"revision", *commit}, {"files", arr}, {"next_cursor", next}}));
}

Routed ListRefsRoute(Call& c) {
  auto repo = LoadRepoForRead(c, c.p(0), c.p(1));
  if (!repo.ok()) return RepoError(repo.status());
  MEGA_ASSIGN_OR_RETURN(auto refs, c.store().ListRefs(RepoId(c)));
  json branches = json::array(), tags = json::array();
  for (const auto& r : refs) (r.is_tag ? tags : branches).push_back(RefJson(r));
  return (JsonResponse({{"branches", branches},
                        {"tags", tags},
                        {"converts", json::array()},
                        {"pullRequests", json::array()}}));
}

Routed CreateRefRoute(Call& c) {
  Response error;
  auto repo = LoadRepoForWrite(c, &error);
  if (!repo) return error;
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    MEGA_ASSIGN_OR_RETURN(std::string tag, StringField(j, "tag"));
    MEGA_ASSIGN_OR_RETURN(std::string rname, StringField(j, "name", tag));
    MEGA_ASSIGN_OR_RETURN(std::string rev, StringField(j, "revision", "main"));
    MEGA_ASSIGN_OR_RETURN(bool exist_ok, BoolField(j, "exist_ok"));
    std::optional<std::string> msg;
    if (j.contains("message") && j["message"].is_string()) msg = j["message"].get<std::string>();
    auto ref = c.store().CreateRef(RepoId(c), rname, rev, c.p(2) == "tags", exist_ok, msg);
    if (!ref.ok()) {
      return ErrorFrom(ref.status(),
                       ref.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
    }
    return JsonResponse(RefJson(*ref), 201);
  });
}

Routed DeleteRefRoute(Call& c) {
  Response error;
  auto repo = LoadRepoForWrite(c, &error);
  if (!repo) return error;
  Status s = c.store().DeleteRef(RepoId(c), c.tail(), c.p(2) == "tags");
  if (!s.ok()) return ErrorFrom(s, "RevisionNotFound");
  return (JsonResponse(json::object()));
}

// PUT .../blobs/{sha256}: stages an object (X-Mega-Size or Content-Length).
Routed PutBlobRoute(Call& c) {
  Response error;
  auto repo = LoadRepoForWrite(c, &error);
  if (!repo) return error;
  std::string want = ToLower(c.p(2));
  if (!IsSha256Hex(want))
    return (ErrorResponse(400, "blob id '" + c.p(2) + "' is not a sha256 hex digest"));
  const uint64_t max = c.ctx.options.max_object_bytes;
  uint64_t declared = c.req.HasHeader("X-Mega-Size")
                          ? std::strtoull(c.req.Header("X-Mega-Size").c_str(), nullptr, 10)
                          : c.req.content_length.value_or(0);
  if (declared > max || c.req.content_length.value_or(0) > max) {
    return (ErrorResponse(
        413, "blob of " + std::to_string(std::max(declared, c.req.content_length.value_or(0))) +
                 " bytes exceeds " + std::to_string(max)));
  }
  MEGA_ASSIGN_OR_RETURN(auto upload, c.store().BeginUpload("blob " + want));
  ContentAccess access = AccessOf(c.who);
  return Action(std::make_unique<UploadBody>(
      c.ctx, std::move(upload), max,
      [&c, want, declared, access](const FileEntry& e) -> Result<Response> {
        if (e.sha256 != want) {
          return ErrorResponse(
              400, "blob sha256 mismatch: body hashes to " + e.sha256 + ", URL says " + want);
        }
        if (e.size != declared) {
          return ErrorResponse(400, "blob size mismatch: received " + std::to_string(e.size) +
                                        " bytes, X-Mega-Size says " + std::to_string(declared));
        }
        MEGA_RETURN_IF_ERROR(c.store().RecordContent(e, /*sha256_verified=*/true, access.ns));
        return JsonResponse({{"sha256", e.sha256}, {"size", e.size}, {"xet_hash", e.xet_hash}});
      }));
}

// PUT /api/repos/{ns}/{name}/files/{path}?revision=R&commit_message=M
//   body = the file; X-Mega-Sha256 / X-Mega-Size checked when sent.
// DELETE /api/repos/{ns}/{name}/files/{path}?revision=R&commit_message=M
// Both make exactly one commit on branch R (default main) via NativeCommit;
// an optional parent_revision query parameter is a compare-and-swap (409).
Routed FileRoute(Call& c) {
  Response error;
  auto repo_opt = LoadRepoForWrite(c, &error);
  if (!repo_opt) return error;
  const RepoInfo repo = *repo_opt;
  const Request& req = c.req;
  std::string path = c.tail();
  MEGA_RETURN_IF_ERROR(ValidateRepoPath(path));
  std::string branch = req.Param("revision", "main");
  if (branch.empty()) return (ErrorResponse(400, "empty revision"));
  bool put = req.method == "PUT";
  // The target must be an existing branch (tags and commit ids are not writable).
  MEGA_ASSIGN_OR_RETURN(auto refs, c.store().ListRefs(repo.id()));
  std::optional<std::string> head;
  for (const auto& r : refs) {
    if (!r.is_tag && r.name == branch) head = r.target;
  }
  if (!head) {
    return (ErrorResponse(404, "branch '" + branch + "' not found in " + repo.id(),
                          "RevisionNotFound"));
  }
  json body = {{"revision", branch},
               {"commit_message", req.HasParam("commit_message")
                                      ? req.Param("commit_message")
                                      : std::string(put ? "Upload " : "Delete ") + path}};
  if (req.HasParam("commit_description"))
    body["commit_description"] = req.Param("commit_description");
  if (req.HasParam("parent_revision")) body["parent_revision"] = req.Param("parent_revision");
  json extra = {{"repo_id", repo.id()}, {"path", path}};
  if (!put) {
    auto entry = c.store().GetFile(repo.id(), *head, path);
    if (!entry.ok()) return ErrorFrom(entry.status(), "EntryNotFound");
    body["operations"] = json::array({{{"operation", "delete"}, {"path", path}}});
    return NativeCommit(c, repo, body, extra);
  }
  std::string want_sha;
  if (req.HasHeader("X-Mega-Sha256")) {
    want_sha = ToLower(req.Header("X-Mega-Sha256"));
    if (!IsSha256Hex(want_sha))
      return (ErrorResponse(400, "X-Mega-Sha256 is not a sha256 hex digest"));
  }
  std::optional<uint64_t> want_size;
  if (req.HasHeader("X-Mega-Size")) {
    std::string v = req.Header("X-Mega-Size");
    char* end = nullptr;
    uint64_t n = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || !end || *end)
      return (ErrorResponse(400, "X-Mega-Size '" + v + "' is not a number"));
    want_size = n;
  }
  const uint64_t max = c.ctx.options.max_object_bytes;
  const uint64_t length = req.content_length.value_or(0);
  uint64_t declared = want_size ? *want_size : length;
  if (declared > max || length > max) {
    return (ErrorResponse(413, "file of " + std::to_string(std::max(declared, length)) +
                                   " bytes exceeds " + std::to_string(max) +
                                   " (use /api/uploads for large files)"));
  }
  MEGA_ASSIGN_OR_RETURN(auto upload, c.store().BeginUpload("file " + repo.id() + "/" + path));
  ContentAccess access = AccessOf(c.who);
  return Action(std::make_unique<UploadBody>(
      c.ctx, std::move(upload), max,
      [&c, repo, path, want_sha, want_size, body, extra,
       access](const FileEntry& e) mutable -> Result<Response> {
        if (!want_sha.empty() && e.sha256 != want_sha) {
          return ErrorResponse(400, "sha256 mismatch: body hashes to " + e.sha256 +
                                        ", X-Mega-Sha256 says " + want_sha);
        }
        if (want_size && e.size != *want_size) {
          return ErrorResponse(400, "size mismatch: received " + std::to_string(e.size) +
                                        " bytes, X-Mega-Size says " + std::to_string(*want_size));
        }
        MEGA_RETURN_IF_ERROR(c.store().RecordContent(e, /*sha256_verified=*/true, access.ns));
        body["operations"] = json::array({{{"operation", "add"},
                                           {"path", path},
                                           {"size", e.size},
                                           {"sha256", e.sha256},
                                           {"xet_hash", e.xet_hash}}});
        extra["size"] = e.size;
        extra["sha256"] = e.sha256;
        return NativeCommit(c, repo, body, extra);
      }));
}

// POST /api/repos/{ns}/{name}/copy
//   {"source_path", "path", "revision"?, "source_revision"?, "source_repo_id"?,
//    "commit_message"?, "commit_description"?, "parent_revision"?}
// One commit on `revision` (default main) adding `path` with the content of
// `source_path` (same repo at the branch head unless source_repo_id /
// source_revision say otherwise); no bytes are copied (content-addressed).
Result<Response> Copy(const Call& c, const RepoInfo& repo, const json& body) {
  auto str = [&](const char* key) -> std::string {
    return body.contains(key) && body[key].is_string() ? body[key].get<std::string>() : "";
  };
  std::string path = str("path"), source_path = str("source_path");
  if (path.empty() || source_path.empty())
    return ErrorResponse(400, "copy needs \"source_path\" and \"path\"");
  for (const std::string* p : {&path, &source_path}) MEGA_RETURN_IF_ERROR(ValidateRepoPath(*p));
  std::string branch = body.contains("revision") ? str("revision") : "main";
  if (branch.empty()) return ErrorResponse(400, "revision must be a non-empty string");
  std::string source_repo = str("source_repo_id");
  if (source_repo.empty()) source_repo = repo.id();
  auto src = c.store().GetRepo(source_repo);
  if (!src.ok()) return ErrorFrom(src.status(), "RepoNotFound");
  MEGA_RETURN_IF_ERROR(CheckRead(c.who, src->is_private, src->ns));
  std::string source_rev = str("source_revision");
  auto src_commit =
      c.store().ResolveRevision(source_repo, source_rev.empty() ? branch : source_rev);
  if (!src_commit.ok()) return ErrorFrom(src_commit.status(), "RevisionNotFound");
  auto entry = c.store().GetFile(source_repo, *src_commit, source_path);
  if (!entry.ok()) return ErrorFrom(entry.status(), "EntryNotFound");
  json commit = {
      {"revision", branch},
      {"commit_message", body.contains("commit_message") && body["commit_message"].is_string()
                             ? body["commit_message"].get<std::string>()
                             : "Copy " + source_path + " to " + path}};
  if (body.contains("commit_description"))
    commit["commit_description"] = body["commit_description"];
  if (body.contains("parent_revision")) commit["parent_revision"] = body["parent_revision"];
  // Pin the source to the commit resolved above, so a concurrent commit
  // cannot change what is copied.
  commit["operations"] = json::array({{{"operation", "copy"},
                                       {"path", path},
                                       {"source_repo_id", source_repo},
                                       {"source_path", source_path},
                                       {"source_revision", *src_commit}}});
  return NativeCommit(c, repo, commit,
                      {{"repo_id", repo.id()},
                       {"path", path},
                       {"source_path", source_path},
                       {"source_revision", *src_commit},
                       {"size", entry->size},
                       {"sha256", entry->sha256}});
}

Routed CopyRoute(Call& c) {
  Response error;
  auto repo = LoadRepoForWrite(c, &error);
  if (!repo) return error;
  return WithJsonBody(c, c.ctx.options.max_json_bytes,
                      [&c, repo = *repo](json j) -> Result<Response> { return Copy(c, repo, j); });
}

// HF-style download URL: /{ns}/{name}/resolve/{rev}/{path} (also
// /datasets/... and /spaces/...).
Routed HfDownloadRoute(Call& c, size_t base) {
  auto repo = LoadRepoForRead(c, c.p(base), c.p(base + 1));
  if (!repo.ok()) return RepoError(repo.status());
  return ServeResolve(c, *repo, c.p(base + 2), c.tail());
}

}  // namespace

Result<RepoInfo> LoadRepoForRead(const Call& call, const std::string& ns, const std::string& name) {
  MEGA_ASSIGN_OR_RETURN(auto repo, call.store().GetRepo(ns + "/" + name));
  MEGA_RETURN_IF_ERROR(CheckRead(call.who, repo.is_private, ns));
  return repo;
}

Response RepoError(const Status& s) {
  return ErrorFrom(s, s.code() == StatusCode::kPermissionDenied ? "" : "RepoNotFound");
}

Result<Response> ServeContent(const Call& call, const FileEntry& entry, const std::string& name,
                              Response res) {
  res.SetHeader("Accept-Ranges", "bytes");
  RangeRequest range = ParseRange(call.req.Header("Range"), entry.size);
  if (range.kind == RangeRequest::Kind::kUnsatisfiable) {
    Response r = RangeNotSatisfiable(entry.size);
    for (const auto& [k, v] : res.headers) r.SetHeader(k, v);
    r.SetHeader("Content-Range", "bytes */" + std::to_string(entry.size));
    return r;
  }
  uint64_t first = 0, length = entry.size;
  res.status = 200;
  if (range.kind == RangeRequest::Kind::kRange) {
    first = range.range.first;
    length = range.range.last - first + 1;
    res.status = 206;
    res.SetHeader("Content-Range", "bytes " + std::to_string(first) + "-" +
                                       std::to_string(range.range.last) + "/" +
                                       std::to_string(entry.size));
  }
  res.SetHeader("Content-Type", GuessContentType(entry.path.empty() ? name : entry.path));
  if (call.req.method == "HEAD") {
    res.head_length = length;
    return res;
  }
  if (length == 0) return res;
  // Each block libmicrohttpd asks for is read from the CAS straight into its
  // send buffer (only the xorb ranges covering it are decoded).
  MEGA_ASSIGN_OR_RETURN(auto file, call.store().OpenContent(entry, name));
  std::shared_ptr<RandomAccessFile> shared(std::move(file));
  res.stream_length = length;
  res.stream = [shared, first](uint64_t offset, std::span<std::byte> dst) -> Result<size_t> {
    return shared->ReadAt(first + offset, dst);
  };
  return res;
}

Result<Response> NativeCommit(const Call& call, const RepoInfo& repo, const json& body,
                              const json& extra) {
  HubStore& store = call.store();
  CommitRequest cr;
  cr.repo = repo.id();
  MEGA_ASSIGN_OR_RETURN(cr.branch, StringField(body, "revision", "main"));
  MEGA_ASSIGN_OR_RETURN(cr.message, StringField(body, "commit_message"));
  cr.description = body.contains("commit_description") && body["commit_description"].is_string()
                       ? body["commit_description"].get<std::string>()
                       : "";
  cr.author = call.who.name;
  cr.access = AccessOf(call.who);
  MEGA_ASSIGN_OR_RETURN(cr.rebase, BoolField(body, "rebase"));
  // megahub extensions used by megackpt's own client.
  MEGA_ASSIGN_OR_RETURN(cr.create_branch, BoolField(body, "create_branch"));
  MEGA_ASSIGN_OR_RETURN(cr.ignore_missing_deletes, BoolField(body, "ignore_missing_deletes"));
  if (body.contains("parent_revision")) {
    const json& p = body["parent_revision"];
    if (p.is_null()) {
      // "The branch must not exist yet."
      auto head = store.ResolveRevision(cr.repo, cr.branch);
      if (head.ok()) {
        return ErrorResponse(
            409, "conflict: branch '" + cr.branch + "' already exists (parent_revision is null)");
      }
      cr.create_branch = true;
    } else if (p.is_string()) {
      cr.parent = ToLower(p.get<std::string>());
      if (!IsCommitId(*cr.parent)) {
        // Accept a branch/tag name by resolving it.
        auto resolved = store.ResolveRevision(cr.repo, p.get<std::string>());
        if (!resolved.ok()) return ErrorFrom(resolved.status(), "RevisionNotFound");
        cr.parent = *resolved;
      }
    } else {
      return ErrorResponse(400, "parent_revision must be a string or null");
    }
  }
  if (body.contains("operations") && !body["operations"].is_array()) {
    return ErrorResponse(400, "operations must be an array");
  }
  const json ops = body.contains("operations") ? body["operations"] : json::array();
  for (size_t i = 0; i < ops.size(); ++i) {
    const json& o = ops[i];
    const std::string at = "operations[" + std::to_string(i) + "]";
    if (!o.is_object()) return ErrorResponse(400, at + " is not an object");
    auto kind = StringField(o, "operation");
    auto path = StringField(o, "path");
    if (!kind.ok()) return ErrorResponse(400, at + ": " + kind.status().message());
    if (!path.ok()) return ErrorResponse(400, at + ": " + path.status().message());
    CommitOperation op;
    op.path = *path;
    Status ps = ValidateRepoPath(op.path);
    if (!ps.ok()) return ErrorResponse(400, at + ": " + ps.message());
    if (*kind == "add") {
      op.kind = CommitOperation::Kind::kAdd;
      auto sha = StringField(o, "sha256");
      auto size = U64Field(o, "size");
      if (!sha.ok() || !size.ok()) {
        return ErrorResponse(400, at + ": " + (sha.ok() ? size.status() : sha.status()).message());
      }
      std::string xet = o.contains("xet_hash") && o["xet_hash"].is_string()
                            ? o["xet_hash"].get<std::string>()
                            : "";
      if (!xet.empty()) {
        op.entry.xet_hash = ToLower(xet);
        op.entry.size = *size;
        op.entry.sha256 = ToLower(*sha);
      } else {
        std::string lower = ToLower(*sha);
        if (!IsSha256Hex(lower)) return ErrorResponse(400, at + ": sha256 missing or malformed");
        // Unknown and unreadable objects answer alike (no existence oracle).
        MEGA_ASSIGN_OR_RETURN(auto found, store.FindBySha256(lower, cr.access));
        if (!found) {
          return ErrorResponse(400, at + ": object " + lower + " for '" + op.path +
                                        "' was not staged (PUT blobs/{sha256} first)");
        }
        if (found->size != *size) {
          return ErrorResponse(400, at + ": size " + std::to_string(*size) +
                                        " does not match the staged object (" +
                                        std::to_string(found->size) + " bytes)");
        }
        op.entry = *found;
      }
    } else if (*kind == "delete") {
      op.kind = CommitOperation::Kind::kDelete;
    } else if (*kind == "delete_folder" || *kind == "deleteFolder") {
      op.kind = CommitOperation::Kind::kDeleteFolder;
    } else if (*kind == "copy") {
      op.kind = CommitOperation::Kind::kCopy;
      op.source_repo = o.contains("source_repo_id") && o["source_repo_id"].is_string()
                           ? o["source_repo_id"].get<std::string>()
                           : "";
      op.source_path = o.contains("source_path") && o["source_path"].is_string()
                           ? o["source_path"].get<std::string>()
                           : "";
      op.source_revision = o.contains("source_revision") && o["source_revision"].is_string()
                               ? o["source_revision"].get<std::string>()
                               : "";
      if (!op.source_repo.empty() && op.source_repo != cr.repo) {
        auto src = store.GetRepo(op.source_repo);
        if (!src.ok()) return ErrorFrom(src.status(), "RepoNotFound");
        MEGA_RETURN_IF_ERROR(CheckRead(call.who, src->is_private, src->ns));
      }
    } else {
      return ErrorResponse(400, at + ": unknown operation '" + *kind + "'");
    }
    cr.ops.push_back(std::move(op));
  }
  auto c = store.Commit(cr);
  if (!c.ok()) {
    return ErrorFrom(c.status(),
                     c.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
  }
  if (!c->no_change) ++call.ctx.counters.commits;
  json j = CommitJson(*c, true);
  j["commit_url"] = "/" + cr.repo + "/commit/" + c->id;
  for (const auto& [k, v] : extra.items()) j[k] = v;
  // Nothing changed: 200 with the unchanged head and "no_change": true.
  return JsonResponse(j, c->no_change ? 200 : 201);
}

void AddRepoRoutes(HubRouter& r) {
  r.Add("POST", "/api/repos", CreateRepoRoute);
  r.Add("GET", "/api/repos", ListReposRoute);
  r.Add("*", "/api/repos",
        [](Call&) -> Routed { return (ErrorResponse(405, "method not allowed")); });
  r.Add("GET", "/api/repos/{ns}/{name}", RepoInfoRoute);
  r.Add("DELETE", "/api/repos/{ns}/{name}", DeleteRepoRoute);
  r.Add("*", "/api/repos/{ns}/{name}",
        [](Call&) -> Routed { return (ErrorResponse(405, "method not allowed")); });
  r.Add("GET", "/api/repos/{ns}/{name}/resolve/*?", ResolveRoute);
  r.Add("GET", "/api/repos/{ns}/{name}/commits/{rev}", GetCommitRoute);
  r.Add("GET", "/api/repos/{ns}/{name}/commits", ListCommitsRoute);
  r.Add("POST", "/api/repos/{ns}/{name}/commits", PostCommitRoute);
  r.Add("GET", "/api/repos/{ns}/{name}/files", ListFilesRoute);
  r.Add("PUT|DELETE", "/api/repos/{ns}/{name}/files/*", FileRoute);
  r.Add("GET", "/api/repos/{ns}/{name}/refs", ListRefsRoute);
  r.Add("POST", "/api/repos/{ns}/{name}/refs/(branches|tags)", CreateRefRoute);
  r.Add("DELETE", "/api/repos/{ns}/{name}/refs/(branches|tags)/*", DeleteRefRoute);
  r.Add("PUT", "/api/repos/{ns}/{name}/blobs/{sha256}", PutBlobRoute);
  r.Add("POST", "/api/repos/{ns}/{name}/copy", CopyRoute);
}

void AddDownloadRoutes(HubRouter& r) {
  r.Add("GET", "/(datasets|spaces)/{ns}/{name}/resolve/{rev}/*",
        [](Call& c) { return HfDownloadRoute(c, 1); });
  r.Add("GET", "/{ns}/{name}/resolve/{rev}/*", [](Call& c) { return HfDownloadRoute(c, 0); });
}

}  // namespace megackpt::hub
