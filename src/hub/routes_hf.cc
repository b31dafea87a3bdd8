// megahub's Hugging Face style routes (spec/mega-hub-protocol.md §5):
// /api/{models,datasets,spaces}/{ns}/{name}[/revision/{rev}] (info),
// .../xet-{read,write}-token/{rev}, .../preupload/{rev}, .../commit/{rev}
// (NDJSON), the "mcp" type (none here), and /api/whoami[-v2].
#include "hub/ndjson.h"
#include "hub/server_internal.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {
namespace {

// The route's repo ({type}/{ns}/{name}) for any HF route: it must exist, be
// readable and be of the URL's type. Errors in *error.
std::optional<RepoInfo> LoadHfRepo(const Call& c, Response* error) {
  auto repo = LoadRepoForRead(c, c.p(1), c.p(2));
  if (!repo.ok()) {
    *error = RepoError(repo.status());
    return std::nullopt;
  }
  RepoType type = *RepoTypeFromName(c.p(0));
  if (repo->type != type) {
    *error = ErrorResponse(404, "repo '" + repo->id() + "' is a " + std::string(RepoTypeName(repo->type)) +
                                    ", not a " + std::string(RepoTypeName(type)),
                           "RepoNotFound");
    return std::nullopt;
  }
  return *repo;
}

Routed InfoRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  std::string rev = c.tail().empty() ? "main" : c.tail();
  auto commit = c.store().GetCommit(repo->id(), rev, false);
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  MEGA_ASSIGN_OR_RETURN(auto files, c.store().ListFiles(repo->id(), commit->id));
  json siblings = json::array();
  for (const auto& f : files) {
    siblings.push_back({{"rfilename", f.path},
                        {"size", f.size},
                        {"blobId", f.sha256},
                        {"lfs", {{"size", f.size}, {"sha256", f.sha256}, {"pointerSize", 0}}}});
  }
  return (JsonResponse({{"id", repo->id()},
                                {"_id", repo->id()},
                                {"sha", commit->id},
                                {"author", repo->ns},
                                {"private", repo->is_private},
                                {"createdAt", FormatTimestamp(repo->created_ms)},
                                {"lastModified", FormatTimestamp(commit->created_ms)},
                                {"tags", json::array()},
                                {"siblings", siblings},
                                {"gated", false},
                                {"disabled", false},
                                {"downloads", 0},
                                {"likes", 0}}));
}

Routed XetTokenRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  bool write = c.p(3) == "xet-write-token";
  if (write) MEGA_RETURN_IF_ERROR(CheckWrite(c.who, repo->ns));
  return (JsonResponse({{"accessToken", MakeXetToken(c.ctx, write, "repo:" + repo->id())},
                                {"exp", NowMs() / 1000 + c.ctx.options.xet_token_seconds},
                                {"casUrl", c.ctx.Endpoint(c.req)}}));
}

Routed PreuploadRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, repo->ns));
  auto commit = c.store().ResolveRevision(repo->id(), c.tail());
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [commit = *commit](json j) -> Result<Response> {
    if (!j.contains("files") || !j["files"].is_array()) return ErrorResponse(400, "body must be {\"files\": [...]}");
    json out = json::array();
    for (const auto& f : j["files"]) {
      if (!f.is_object()) return ErrorResponse(400, "files[] entries must be objects");
      MEGA_ASSIGN_OR_RETURN(std::string path, StringField(f, "path"));
      MEGA_RETURN_IF_ERROR(ValidateRepoPath(path));
      MEGA_ASSIGN_OR_RETURN(uint64_t size, U64Field(f, "size"));
      MEGA_ASSIGN_OR_RETURN(std::string sample, StringField(f, "sample"));
      auto decoded = Base64Decode(sample);
      bool binary = !decoded.ok() || decoded->find('\0') != std::string::npos;
      // Small text goes inline in the NDJSON commit; everything else through Xet.
      bool regular = size == 0 || (size < (1u << 20) && !binary);
      out.push_back({{"path", path},
                     {"uploadMode", regular ? "regular" : "lfs"},
                     {"shouldIgnore", false},
                     {"oid", nullptr}});
    }
    return JsonResponse({{"files", out}, {"commitOid", commit}});
  });
}

Result<Response> NdjsonCommit(const Call& c, const RepoInfo& repo, const std::string& revision,
                              std::string_view body) {
  HubStore& store = c.store();
  MEGA_ASSIGN_OR_RETURN(auto parsed, ParseNdjsonCommit(body));
  CommitRequest cr;
  cr.repo = repo.id();
  cr.branch = revision;
  cr.message = parsed.summary;
  cr.description = parsed.description;
  cr.author = c.who.name;
  cr.parent = parsed.parent_commit;
  cr.ignore_missing_deletes = false;
  cr.access = AccessOf(c.who);
  for (auto& op : parsed.ops) {
    CommitOperation co;
    co.path = op.path;
    switch (op.kind) {
      case NdjsonCommit::Op::Kind::kDeletedFile:
        co.kind = CommitOperation::Kind::kDelete;
        break;
      case NdjsonCommit::Op::Kind::kDeletedFolder:
        co.kind = CommitOperation::Kind::kDeleteFolder;
        break;
      case NdjsonCommit::Op::Kind::kFile: {
        // Inline content: uploaded by the caller in this request.
        co.kind = CommitOperation::Kind::kAdd;
        c.ctx.counters.blob_bytes_received += op.content.size();
        MEGA_ASSIGN_OR_RETURN(auto up, store.BeginUpload(op.path, cr.access.ns));
        MEGA_RETURN_IF_ERROR(up->Append(AsBytes(op.content)));
        MEGA_RETURN_IF_ERROR(up->Close());
        co.entry = up->entry();
        break;
      }
      case NdjsonCommit::Op::Kind::kLfsFile: {
        co.kind = CommitOperation::Kind::kAdd;
        // Unknown and unreadable content answer alike (no existence oracle).
        MEGA_ASSIGN_OR_RETURN(auto found, store.FindBySha256(op.oid, cr.access));
        if (!found) return ErrorResponse(400, "lfsFile '" + op.path + "': no uploaded content has sha256 " + op.oid);
        if (op.size != 0 && found->size != op.size) {
          return ErrorResponse(400, "lfsFile '" + op.path + "': size " + std::to_string(op.size) +
                                        " does not match the uploaded content");
        }
        co.entry = *found;
        break;
      }
    }
    cr.ops.push_back(std::move(co));
  }
  std::string prefix = repo.type == RepoType::kModel ? "" : "/" + std::string(RepoTypePlural(repo.type));
  // ?create_pr=1: the commit goes to a new branch refs/pr/N (N = next free
  // number) based on `revision` (or the header's parentCommit); the
  // revision itself does not move.
  std::string create_pr = c.req.Param("create_pr");
  std::optional<int> pr_number;
  if (create_pr == "1" || create_pr == "true" || create_pr == "True") {
    auto base = store.ResolveRevision(cr.repo, revision);
    if (!base.ok()) return ErrorFrom(base.status(), "RevisionNotFound");
    if (!cr.parent) cr.parent = *base;
    cr.create_branch = true;
  }
  Result<CommitInfo> commit = InternalError("no commit attempted");
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (cr.create_branch) {
      MEGA_ASSIGN_OR_RETURN(auto refs, store.ListRefs(cr.repo));
      int next = 1;
      for (const auto& r : refs) {
        if (r.is_tag || r.name.rfind("refs/pr/", 0) != 0) continue;
        next = std::max(next, std::atoi(r.name.c_str() + 8) + 1);
      }
      pr_number = next;
      cr.branch = "refs/pr/" + std::to_string(next);
    }
    commit = store.Commit(cr);
    // A concurrent PR took the same number: try the next one.
    if (!cr.create_branch || commit.ok() || commit.status().code() != StatusCode::kAborted) break;
  }
  if (!commit.ok()) {
    return ErrorFrom(commit.status(), commit.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
  }
  if (!commit->no_change) ++c.ctx.counters.commits;
  std::string endpoint = c.ctx.Endpoint(c.req);
  json out = {{"commitOid", commit->id},
              {"commitUrl", endpoint + prefix + "/" + repo.id() + "/commit/" + commit->id},
              {"commitMessage", commit->message}};
  // Nothing changed: the unchanged head, and "noChange": true.
  if (commit->no_change) out["noChange"] = true;
  if (pr_number) {
    out["pullRequestUrl"] = endpoint + prefix + "/" + repo.id() + "/discussions/" + std::to_string(*pr_number);
    out["pullRequestRevision"] = cr.branch;
  }
  return JsonResponse(out);
}

Routed CommitRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, repo->ns));
  return WithBody(c, c.ctx.options.max_json_bytes, [&c, repo = *repo](std::string body) -> Result<Response> {
    return NdjsonCommit(c, repo, c.tail(), body);
  });
}

// Any other route under an existing repo: 404 (after the repo checks).
Routed UnknownRoute(Call& c) {
  Response error;
  if (!LoadHfRepo(c, &error)) return error;
  return (ErrorResponse(404, "no route for " + c.req.method + " " + c.req.path));
}

}  // namespace

void AddHfRoutes(HubRouter& r) {
  constexpr const char* kRepo = "/api/(models|datasets|spaces)/{ns}/{name}";
  r.Add("GET", kRepo, InfoRoute);
  r.Add("GET", std::string(kRepo) + "/revision/*", InfoRoute);
  r.Add("GET", std::string(kRepo) + "/(xet-read-token|xet-write-token)/*", XetTokenRoute);
  r.Add("POST", std::string(kRepo) + "/preupload/*", PreuploadRoute);
  r.Add("POST", std::string(kRepo) + "/commit/*", CommitRoute);
  r.Add("*", std::string(kRepo) + "/*?", UnknownRoute);
  // The client also knows an "mcps" repository type (preupload/commit/
  // xet tokens); this hub has none, so every such repository is missing.
  r.Add("*", "/api/mcps/{ns}/{name}/*?", [](Call& c) -> Routed {
    return (ErrorResponse(404, "repository type 'mcp' is not served by this hub (repo " + c.p(0) + "/" +
                                           c.p(1) + ")",
                                  "RepoNotFound"));
  });
  auto whoami = [](Call& c) -> Routed {
    if (!c.who.valid) return (ErrorResponse(401, "invalid or missing token"));
    return (JsonResponse(
        {{"name", c.who.name},
         {"type", "user"},
         {"auth", {{"accessToken", {{"role", c.who.scope == TokenScope::kWrite ? "write" : "read"}}}}}}));
  };
  r.Add("*", "/api/whoami/*?", whoami);
  r.Add("*", "/api/whoami-v2/*?", whoami);
}

}  // namespace megackpt::hub
