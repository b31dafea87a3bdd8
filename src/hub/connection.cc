// HubConnection implementations: embedded (HubStore in-process) and remote
// (HTTP client of megahub), plus ConnectHub's endpoint resolution.
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "hub/http_client.h"
#include "hub/ndjson.h"
#include "hub/remote_cas.h"
#include "hub/util.h"
#include "megackpt/hub/client.h"

namespace megackpt::hub {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Embedded
// ---------------------------------------------------------------------------

class EmbeddedHub final : public HubConnection {
 public:
  explicit EmbeddedHub(std::unique_ptr<HubStore> store) : store_(std::move(store)) {}

  std::string Describe() const override { return "embedded hub " + store_->root(); }
  bool is_remote() const override { return false; }

  Result<RepoInfo> GetRepo(std::string_view repo) override { return store_->GetRepo(repo); }
  Result<RepoInfo> CreateRepo(const RepoSpec& spec, bool exist_ok) override {
    return store_->CreateRepo(spec, exist_ok);
  }
  Status DeleteRepo(std::string_view repo) override { return store_->DeleteRepo(repo); }
  Result<std::string> ResolveRevision(std::string_view repo, std::string_view rev) override {
    return store_->ResolveRevision(repo, rev);
  }
  Result<std::vector<RefInfo>> ListRefs(std::string_view repo) override {
    return store_->ListRefs(repo);
  }
  Result<RefInfo> CreateBranch(std::string_view repo, std::string_view name,
                               std::string_view revision) override {
    return store_->CreateRef(repo, name, revision, /*is_tag=*/false);
  }
  Result<std::vector<CommitInfo>> ListCommits(std::string_view repo, std::string_view rev,
                                              size_t limit) override {
    return store_->ListCommits(repo, rev, 0, limit);
  }
  Result<std::vector<FileEntry>> ListFiles(std::string_view repo, std::string_view commit,
                                           std::string_view prefix) override {
    return store_->ListFiles(repo, commit, prefix);
  }
  Result<FileEntry> GetFile(std::string_view repo, std::string_view commit,
                            std::string_view path) override {
    return store_->GetFile(repo, commit, path);
  }
  Result<CommitInfo> Commit(const CommitRequest& request) override {
    return store_->Commit(request);
  }
  Result<std::unique_ptr<ContentUpload>> BeginUpload(std::string name) override {
    return store_->BeginUpload(std::move(name));
  }
  Result<std::unique_ptr<RandomAccessFile>> OpenFile(const MegaUri& where,
                                                     const FileEntry& entry) override {
    return store_->OpenContent(entry, where.ToString());
  }
  Result<std::unique_ptr<RandomAccessFile>> OpenContent(const FileEntry& entry,
                                                        std::string name) override {
    return store_->OpenContent(entry, std::move(name));
  }
  Result<BucketInfo> GetBucket(std::string_view bucket) override {
    return store_->GetBucket(bucket);
  }
  Result<BucketInfo> CreateBucket(std::string_view ns, std::string_view name, bool is_private,
                                  bool exist_ok) override {
    return store_->CreateBucket(ns, name, is_private, exist_ok);
  }
  Status DeleteBucket(std::string_view bucket) override { return store_->DeleteBucket(bucket); }
  Status BucketBatch(std::string_view bucket, const std::vector<BucketOperation>& ops) override {
    return store_->BucketBatch(bucket, ops);
  }
  Result<std::vector<BucketEntry>> ListBucket(std::string_view bucket,
                                              std::string_view prefix) override {
    return store_->ListBucket(bucket, prefix, "", SIZE_MAX);
  }
  Result<BucketEntry> GetBucketEntry(std::string_view bucket, std::string_view path) override {
    return store_->GetBucketEntry(bucket, path);
  }

 private:
  std::unique_ptr<HubStore> store_;
};

// ---------------------------------------------------------------------------
// Remote
// ---------------------------------------------------------------------------

// "ns/name" with each part percent-encoded (the native routes' rule).
std::string RepoPath(std::string_view repo) {
  size_t slash = repo.find('/');
  if (slash == std::string_view::npos) return PercentEncode(repo);
  return PercentEncode(repo.substr(0, slash)) + "/" + PercentEncode(repo.substr(slash + 1));
}

std::string StrOr(const json& j, const char* key, std::string def = "") {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : def;
}

uint64_t U64Or(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

Result<json> ParseJson(const HttpResponse& r, std::string_view what) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return DataLossError(std::string(what) + ": answer is not JSON");
  return j;
}

RepoInfo RepoFromJson(const json& j) {
  RepoInfo r;
  auto parts = SplitRepoId(StrOr(j, "repo_id", StrOr(j, "id")));
  if (parts.ok()) {
    r.ns = parts->first;
    r.name = parts->second;
  }
  auto type = RepoTypeFromName(StrOr(j, "repo_type", "model"));
  r.type = type.ok() ? *type : RepoType::kModel;
  r.is_private = j.value("private", false);
  r.description = StrOr(j, "description");
  r.created_ms = ParseTimestamp(StrOr(j, "created_at"));
  r.updated_ms = ParseTimestamp(StrOr(j, "updated_at"));
  return r;
}

CommitInfo CommitFromJson(const json& j) {
  CommitInfo c;
  c.id = StrOr(j, "revision");
  if (j.contains("parent_revision") && j["parent_revision"].is_string()) {
    c.parent = j["parent_revision"].get<std::string>();
  }
  c.message = StrOr(j, "message");
  c.description = StrOr(j, "description");
  c.author = StrOr(j, "author");
  c.created_ms = ParseTimestamp(StrOr(j, "created_at"));
  c.no_change =
      j.contains("no_change") && j["no_change"].is_boolean() && j["no_change"].get<bool>();
  if (j.contains("files") && j["files"].is_array()) {
    for (const auto& f : j["files"]) {
      FileChange ch;
      ch.path = StrOr(f, "path");
      ch.change = StrOr(f, "change");
      ch.size = U64Or(f, "size");
      ch.sha256 = StrOr(f, "sha256");
      ch.previous_sha256 = StrOr(f, "previous_sha256");
      c.changes.push_back(std::move(ch));
    }
  }
  return c;
}

RefInfo RefFromJson(const json& j, bool is_tag) {
  RefInfo r;
  r.name = StrOr(j, "name");
  r.is_tag = is_tag;
  r.target = StrOr(j, "target_revision");
  if (j.contains("message") && j["message"].is_string())
    r.message = j["message"].get<std::string>();
  r.updated_ms = ParseTimestamp(StrOr(j, "updated_at"));
  return r;
}

BucketEntry BucketEntryFromJson(const json& j) {
  BucketEntry e;
  e.path = StrOr(j, "path");
  e.size = U64Or(j, "size");
  e.xet_hash = StrOr(j, "xetHash");
  e.sha256 = StrOr(j, "sha256");
  e.content_type = StrOr(j, "contentType");
  e.mtime_ms = ParseTimestamp(StrOr(j, "mtime"));
  e.uploaded_ms = ParseTimestamp(StrOr(j, "uploadedAt"));
  return e;
}

// Random access through HTTP Range requests on a resolve URL. Each ReadAt is
// one GET for exactly the bytes asked for, received straight into `dst`; the
// hub reads only the xorb ranges covering them. The answer's X-Xet-Hash must still be the opened
// content (buckets are mutable: a replaced file fails the read instead of mixing).
class RemoteRangeFile final : public RandomAccessFile {
 public:
  RemoteRangeFile(std::shared_ptr<HttpClient> http, std::string target, std::string name,
                  FileEntry entry)
      : http_(std::move(http)),
        target_(std::move(target)),
        name_(std::move(name)),
        entry_(std::move(entry)) {}

  const std::string& name() const override { return name_; }
  uint64_t size() const override { return entry_.size; }

  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset >= entry_.size || dst.empty()) return size_t{0};
    size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), entry_.size - offset));
    size_t pos = 0;
    auto res = http_->GetRange(target_, offset, dst.first(n), &pos);
    if (!res.ok()) return res.status().WithContext(name_);
    std::string xet = res->Header("X-Xet-Hash");
    if (!xet.empty() && ToLower(xet) != ToLower(entry_.xet_hash)) {
      return AbortedError(name_ + ": the file changed while it was being read (content " + xet +
                          ", opened " + entry_.xet_hash + ")");
    }
    if (pos != n || (res->status != 206 && !(res->status == 200 && n == entry_.size))) {
      return DataLossError(name_ + ": range [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + ") answered with " + std::to_string(pos) +
                           " bytes, HTTP " + std::to_string(res->status));
    }
    return n;
  }

 private:
  std::shared_ptr<HttpClient> http_;
  std::string target_, name_;
  FileEntry entry_;
};

class RemoteHub final : public HubConnection {
 public:
  RemoteHub(std::shared_ptr<HttpClient> http, std::unique_ptr<cas::CasStore> cas)
      : http_(std::move(http)), cas_(std::move(cas)) {}

  std::string Describe() const override { return "hub " + http_->endpoint(); }
  bool is_remote() const override { return true; }
  uint64_t bytes_received() const override { return http_->bytes_received(); }

  Result<RepoInfo> GetRepo(std::string_view repo) override {
    MEGA_ASSIGN_OR_RETURN(auto j, Get("/api/repos/" + RepoPath(repo)));
    return RepoFromJson(j);
  }

  Result<RepoInfo> CreateRepo(const RepoSpec& spec, bool exist_ok) override {
    json body = {{"repo_id", spec.ns + "/" + spec.name},
                 {"repo_type", std::string(RepoTypeName(spec.type))},
                 {"private", spec.is_private},
                 {"exist_ok", exist_ok},
                 {"description", spec.description}};
    MEGA_ASSIGN_OR_RETURN(auto j, PostJson("/api/repos", body, /*idempotent=*/exist_ok));
    return RepoFromJson(j);
  }

  Status DeleteRepo(std::string_view repo) override {
    return Delete("/api/repos/" + RepoPath(repo));
  }

  Result<std::string> ResolveRevision(std::string_view repo, std::string_view rev) override {
    MEGA_ASSIGN_OR_RETURN(auto j,
                          Get("/api/repos/" + RepoPath(repo) + "/commits/" + PercentEncode(rev)));
    std::string id = StrOr(j, "revision");
    if (!IsCommitId(id))
      return DataLossError("hub answered a bad commit id for " + std::string(rev));
    return id;
  }

  Result<std::vector<RefInfo>> ListRefs(std::string_view repo) override {
    MEGA_ASSIGN_OR_RETURN(auto j, Get("/api/repos/" + RepoPath(repo) + "/refs"));
    std::vector<RefInfo> out;
    for (const char* key : {"branches", "tags"}) {
      if (!j.contains(key) || !j[key].is_array()) continue;
      for (const auto& r : j[key]) out.push_back(RefFromJson(r, std::string(key) == "tags"));
    }
    return out;
  }

  Result<RefInfo> CreateBranch(std::string_view repo, std::string_view name,
                               std::string_view revision) override {
    json body = {
        {"name", std::string(name)}, {"revision", std::string(revision)}, {"exist_ok", false}};
    MEGA_ASSIGN_OR_RETURN(auto j,
                          PostJson("/api/repos/" + RepoPath(repo) + "/refs/branches", body, false));
    return RefFromJson(j, false);
  }

  Result<std::vector<CommitInfo>> ListCommits(std::string_view repo, std::string_view rev,
                                              size_t limit) override {
    std::vector<CommitInfo> out;
    if (limit == 0) return out;
    auto target = [&] {
      return "/api/repos/" + RepoPath(repo) +
             "/commits?limit=" + std::to_string(std::min<size_t>(100, limit - out.size())) +
             "&revision=" + PercentEncode(rev);
    };
    auto take = [&](const json& commits) {
      for (const auto& c : commits) out.push_back(CommitFromJson(c));
      return out.size() < limit;
    };
    MEGA_RETURN_IF_ERROR(GetPages(target, "commits", "bad commit list", take));
    return out;
  }

  Result<std::vector<FileEntry>> ListFiles(std::string_view repo, std::string_view commit,
                                           std::string_view prefix) override {
    std::string target =
        "/api/repos/" + RepoPath(repo) + "/files?revision=" + PercentEncode(commit) + "&limit=1000";
    if (!prefix.empty()) target += "&prefix=" + PercentEncode(prefix);
    std::vector<FileEntry> out;
    auto take = [&](const json& files) {
      for (const auto& f : files) {
        FileEntry e;
        e.path = StrOr(f, "path");
        e.size = U64Or(f, "size");
        e.sha256 = StrOr(f, "sha256");
        e.xet_hash = StrOr(f, "xet_hash");
        out.push_back(std::move(e));
      }
      return true;
    };
    MEGA_RETURN_IF_ERROR(GetPages([&] { return target; }, "files", "bad file list", take));
    return out;
  }

  Result<FileEntry> GetFile(std::string_view repo, std::string_view commit,
                            std::string_view path) override {
    HttpRequest req;
    req.method = "HEAD";
    req.target = ResolveTarget(repo, commit, path);
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    FileEntry e;
    e.path = std::string(path);
    std::string size = res.Header("X-Linked-Size");
    if (size.empty()) size = res.Header("Content-Length");
    e.size = std::strtoull(size.c_str(), nullptr, 10);
    std::string etag = res.Header("X-Linked-Etag");
    if (etag.empty()) etag = res.Header("ETag");
    if (etag.starts_with("W/")) etag = etag.substr(2);
    if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
      etag = etag.substr(1, etag.size() - 2);
    e.sha256 = etag;
    e.xet_hash = e.size == 0 ? std::string(kEmptyXetHash) : ToLower(res.Header("X-Xet-Hash"));
    return e;
  }

  Result<CommitInfo> Commit(const CommitRequest& r) override {
    json ops = json::array();
    for (const auto& op : r.ops) {
      switch (op.kind) {
        case CommitOperation::Kind::kAdd:
          ops.push_back({{"operation", "add"},
                         {"path", op.path},
                         {"size", op.entry.size},
                         {"sha256", op.entry.sha256},
                         {"xet_hash", op.entry.xet_hash}});
          break;
        case CommitOperation::Kind::kDelete:
          ops.push_back({{"operation", "delete"}, {"path", op.path}});
          break;
        case CommitOperation::Kind::kDeleteFolder:
          ops.push_back({{"operation", "delete_folder"}, {"path", op.path}});
          break;
        case CommitOperation::Kind::kCopy:
          ops.push_back({{"operation", "copy"},
                         {"path", op.path},
                         {"source_repo_id", op.source_repo.empty() ? r.repo : op.source_repo},
                         {"source_path", op.source_path},
                         {"source_revision",
                          op.source_revision.empty() ? json(nullptr) : json(op.source_revision)}});
          break;
      }
    }
    json body = {{"revision", r.branch},
                 {"commit_message", r.message},
                 {"commit_description", r.description},
                 {"operations", ops},
                 {"rebase", r.rebase},
                 {"create_branch", r.create_branch},
                 {"ignore_missing_deletes", r.ignore_missing_deletes}};
    if (r.parent) body["parent_revision"] = *r.parent;
    // Not idempotent: a retry after the commit landed would report a conflict.
    MEGA_ASSIGN_OR_RETURN(auto j,
                          PostJson("/api/repos/" + RepoPath(r.repo) + "/commits", body, false));
    return CommitFromJson(j);
  }

  Result<std::unique_ptr<ContentUpload>> BeginUpload(std::string name) override {
    cas::UploadOptions opts;
    opts.name = name;
    MEGA_ASSIGN_OR_RETURN(auto stream, cas_->BeginUpload(opts));
    return std::make_unique<ContentUpload>(std::move(name), std::move(stream));
  }

  Result<std::unique_ptr<RandomAccessFile>> OpenFile(const MegaUri& where,
                                                     const FileEntry& entry) override {
    std::string target;
    if (where.is_bucket) {
      target =
          "/buckets/" + RepoPath(where.repo_id()) + "/resolve/" + PercentEncodePath(where.path);
    } else {
      target = ResolveTarget(where.repo_id(), where.revision, where.path);
    }
    return std::unique_ptr<RandomAccessFile>(
        new RemoteRangeFile(http_, std::move(target), where.ToString(), entry));
  }

  Result<std::unique_ptr<RandomAccessFile>> OpenContent(const FileEntry& entry,
                                                        std::string name) override {
    return OpenCasContent(*cas_, entry, std::move(name));
  }

  Result<BucketInfo> GetBucket(std::string_view bucket) override {
    MEGA_ASSIGN_OR_RETURN(auto j, Get("/api/buckets/" + RepoPath(bucket)));
    BucketInfo b;
    auto parts = SplitRepoId(StrOr(j, "id", std::string(bucket)));
    if (parts.ok()) {
      b.ns = parts->first;
      b.name = parts->second;
    }
    b.is_private = j.value("private", false);
    b.created_ms = ParseTimestamp(StrOr(j, "createdAt"));
    b.size = U64Or(j, "size");
    b.total_files = U64Or(j, "totalFiles");
    return b;
  }

  Result<BucketInfo> CreateBucket(std::string_view ns, std::string_view name, bool is_private,
                                  bool exist_ok) override {
    std::string id = std::string(ns) + "/" + std::string(name);
    HttpRequest req;
    req.method = "POST";
    req.target = "/api/buckets/" + RepoPath(id);
    req.body = Dump(json{{"private", is_private}});
    req.content_type = "application/json";
    req.idempotent = false;
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Send(req));
    if (res.status == 409 && exist_ok) return GetBucket(id);
    if (res.status >= 400) return http_->ErrorFor(res, "create bucket " + id);
    return GetBucket(id);
  }

  Status DeleteBucket(std::string_view bucket) override {
    return Delete("/api/buckets/" + RepoPath(bucket));
  }

  Status BucketBatch(std::string_view bucket, const std::vector<BucketOperation>& ops) override {
    for (size_t start = 0; start < ops.size() || start == 0; start += 1000) {
      std::string body;
      for (size_t i = start; i < ops.size() && i < start + 1000; ++i) {
        const BucketOperation& op = ops[i];
        json line;
        if (op.kind == BucketOperation::Kind::kDelete) {
          line = {{"type", "deleteFile"}, {"path", op.entry.path}};
        } else {
          line = {{"type", "addFile"},
                  {"path", op.entry.path},
                  {"xetHash", op.entry.xet_hash},
                  {"mtime", op.entry.mtime_ms ? op.entry.mtime_ms : NowMs()},
                  {"size", op.entry.size}};
          if (!op.entry.sha256.empty()) line["sha256"] = op.entry.sha256;
          if (!op.entry.content_type.empty()) line["contentType"] = op.entry.content_type;
        }
        body += Dump(line) + "\n";
      }
      HttpRequest req;
      req.method = "POST";
      req.target = "/api/buckets/" + RepoPath(bucket) + "/batch";
      req.body = std::move(body);
      req.content_type = "application/x-ndjson";
      MEGA_RETURN_IF_ERROR(http_->Call(req).status());
      if (ops.empty()) break;
    }
    return Status::OK();
  }

  Result<std::vector<BucketEntry>> ListBucket(std::string_view bucket,
                                              std::string_view prefix) override {
    // The tree route lists a folder; list the folder holding `prefix` and
    // keep the entries that start with it.
    std::string folder(
        prefix.substr(0, prefix.rfind('/') == std::string_view::npos ? 0 : prefix.rfind('/')));
    std::string target = "/api/buckets/" + RepoPath(bucket) + "/tree" +
                         (folder.empty() ? "" : "/" + PercentEncode(folder)) + "?recursive=true";
    std::vector<BucketEntry> out;
    while (true) {
      HttpRequest req;
      req.target = target;
      MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
      MEGA_ASSIGN_OR_RETURN(auto j, ParseJson(res, "bucket tree"));
      if (!j.is_array()) return DataLossError("bucket tree: answer is not an array");
      for (const auto& e : j) {
        if (StrOr(e, "type") != "file") continue;
        BucketEntry be = BucketEntryFromJson(e);
        if (be.path.starts_with(prefix)) out.push_back(std::move(be));
      }
      std::string link = res.Header("Link");
      size_t lt = link.find('<'), gt = link.find('>');
      if (link.find("rel=\"next\"") == std::string::npos || lt == std::string::npos ||
          gt == std::string::npos)
        break;
      std::string next = link.substr(lt + 1, gt - lt - 1);
      if (next.starts_with(http_->endpoint())) next = next.substr(http_->endpoint().size());
      if (next == target) break;
      target = next;
    }
    std::sort(out.begin(), out.end(),
              [](const BucketEntry& a, const BucketEntry& b) { return a.path < b.path; });
    return out;
  }

  Result<BucketEntry> GetBucketEntry(std::string_view bucket, std::string_view path) override {
    json body = {{"paths", json::array({std::string(path)})}};
    HttpRequest req;
    req.method = "POST";
    req.target = "/api/buckets/" + RepoPath(bucket) + "/paths-info";
    req.body = Dump(body);
    req.content_type = "application/json";
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    MEGA_ASSIGN_OR_RETURN(auto j, ParseJson(res, "paths-info"));
    if (j.is_array()) {
      for (const auto& e : j) {
        if (StrOr(e, "path") == path) return BucketEntryFromJson(e);
      }
    }
    return NotFoundError("entry '" + std::string(path) + "' not found in bucket " +
                         std::string(bucket));
  }

 private:
  static std::string Dump(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }

  static std::string ResolveTarget(std::string_view repo, std::string_view revision,
                                   std::string_view path) {
    return "/api/repos/" + RepoPath(repo) + "/resolve?revision=" + PercentEncode(revision) +
           "&path=" + PercentEncode(path);
  }

  Result<json> Get(const std::string& target) {
    HttpRequest req;
    req.target = target;
    req.headers.push_back({"Accept", "application/json"});
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    return ParseJson(res, target);
  }

  // Reads a cursor-paged list: GETs `target()` (with "&cursor=..." after the
  // first page) and hands each answer's array `key` to `take`, until the
  // answer names no new next_cursor or `take` returns false. An answer
  // without the array is DataLoss(`bad_answer`).
  Status GetPages(const std::function<std::string()>& target, const char* key,
                  const char* bad_answer, const std::function<bool(const json&)>& take) {
    std::string cursor;
    while (true) {
      std::string page = target();
      if (!cursor.empty()) page += "&cursor=" + PercentEncode(cursor);
      MEGA_ASSIGN_OR_RETURN(auto j, Get(page));
      if (!j.contains(key) || !j[key].is_array()) return DataLossError(bad_answer);
      if (!take(j[key])) return Status::OK();
      if (!j.contains("next_cursor") || !j["next_cursor"].is_string()) return Status::OK();
      std::string next = j["next_cursor"].get<std::string>();
      if (next.empty() || next == cursor) return Status::OK();
      cursor = std::move(next);
    }
  }

  Status Delete(const std::string& target) {
    HttpRequest req;
    req.method = "DELETE";
    req.target = target;
    return http_->Call(req).status();
  }

  Result<json> PostJson(const std::string& target, const json& body, bool idempotent) {
    HttpRequest req;
    req.method = "POST";
    req.target = target;
    req.body = Dump(body);
    req.content_type = "application/json";
    req.idempotent = idempotent;
    MEGA_ASSIGN_OR_RETURN(auto res, http_->Call(req));
    return ParseJson(res, target);
  }

  std::shared_ptr<HttpClient> http_;
  std::unique_ptr<cas::CasStore> cas_;
};

}  // namespace

Result<std::shared_ptr<HubConnection>> OpenEmbeddedHub(const std::string& root) {
  HubStoreOptions options;
  MEGA_ASSIGN_OR_RETURN(auto store, HubStore::Open(root, options));
  return std::shared_ptr<HubConnection>(new EmbeddedHub(std::move(store)));
}

Result<std::shared_ptr<HubConnection>> OpenRemoteHub(const std::string& endpoint,
                                                     const std::string& token,
                                                     const RemoteOptions& options) {
  if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://")) {
    return InvalidArgumentError("remote hub endpoint '" + endpoint + "' is not http(s)://");
  }
  auto http = std::make_shared<HttpClient>(endpoint, token, options);
  cas::CasStoreOptions cas_options;
  MEGA_ASSIGN_OR_RETURN(auto cas, cas::CasStore::Open(NewRemoteCasBackend(http), cas_options));
  return std::shared_ptr<HubConnection>(new RemoteHub(std::move(http), std::move(cas)));
}

std::string DefaultEndpoint() {
  const char* ep = std::getenv("MEGA_ENDPOINT");
  if (ep && *ep) return ep;
  std::string home;
  if (const char* mh = std::getenv("MEGA_HOME"); mh && *mh) {
    home = mh;
  } else {
    const char* h = std::getenv("HOME");
    home = std::string(h && *h ? h : "/tmp") + "/.cache/mega";
  }
  return "file://" + home + "/hub";
}

Result<std::shared_ptr<HubConnection>> ConnectHub(std::string_view endpoint_in,
                                                  std::optional<std::string> token) {
  std::string endpoint = endpoint_in.empty() ? DefaultEndpoint() : std::string(endpoint_in);
  if (!token) {
    const char* t = std::getenv("MEGA_TOKEN");
    token = t ? std::string(t) : std::string();
  }
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<HubConnection>> cache;
  std::string key = endpoint + "\n" + *token;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) {
    if (auto live = it->second.lock()) return live;
  }
  std::shared_ptr<HubConnection> conn;
  if (endpoint.starts_with("file://")) {
    std::string root = endpoint.substr(7);
    if (root.empty() || root[0] != '/') {
      return InvalidArgumentError("hub endpoint '" + endpoint +
                                  "': file:// needs an absolute path (file:///DIR)");
    }
    MEGA_ASSIGN_OR_RETURN(conn, OpenEmbeddedHub(root));
  } else if (endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
    MEGA_ASSIGN_OR_RETURN(conn, OpenRemoteHub(endpoint, *token));
  } else {
    return InvalidArgumentError(
        "hub endpoint '" + endpoint +
        "' must be file:///DIR (embedded) or http(s)://HOST:PORT (megahub)");
  }
  cache[key] = conn;
  return conn;
}

Result<std::string> FetchServerStats(const std::string& endpoint) {
  HttpClient http(endpoint, "", RemoteOptions{});
  HttpRequest req;
  req.target = "/api/stats";
  MEGA_ASSIGN_OR_RETURN(auto res, http.Call(req));
  return res.body;
}

}  // namespace megackpt::hub
