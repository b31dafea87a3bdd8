// megahub's Hugging Face style routes (spec/mega-hub-protocol.md §5):
// /api/{models,datasets,spaces}/{ns}/{name}[/revision/{rev}] (info),
// .../xet-{read,write}-token/{rev}, .../preupload/{rev}, .../commit/{rev}
// (NDJSON), .../tree/{rev}, huggingface_hub's /api/repos/{create,delete},
// the "mcp" type (none here), and /api/whoami[-v2].
#include "hub/ndjson.h"
#include "hub/server_internal.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/text.h"

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
    *error =
        ErrorResponse(404,
                      "repo '" + repo->id() + "' is a " + std::string(RepoTypeName(repo->type)) +
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
  return XetTokenResponse(c.ctx, c.req, write, "repo:" + repo->id());
}

Routed PreuploadRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, repo->ns));
  auto commit = c.store().ResolveRevision(repo->id(), c.tail());
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  return WithJsonBody(c, c.ctx.options.max_json_bytes,
                      [commit = *commit](json j) -> Result<Response> {
                        if (!j.contains("files") || !j["files"].is_array())
                          return ErrorResponse(400, "body must be {\"files\": [...]}");
                        json out = json::array();
                        for (const auto& f : j["files"]) {
                          if (!f.is_object())
                            return ErrorResponse(400, "files[] entries must be objects");
                          MEGA_ASSIGN_OR_RETURN(std::string path, StringField(f, "path"));
                          MEGA_RETURN_IF_ERROR(ValidateRepoPath(path));
                          MEGA_ASSIGN_OR_RETURN(uint64_t size, U64Field(f, "size"));
                          MEGA_ASSIGN_OR_RETURN(std::string sample, StringField(f, "sample"));
                          auto decoded = Base64Decode(sample);
                          bool binary = !decoded.ok() || decoded->find('\0') != std::string::npos;
                          // Small text goes inline in the NDJSON commit; everything else through
                          // Xet.
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
        // hf_xet's shards claim the SHA-256 (not verified by the hub); the
        // claim counts for the repository's namespace, whose writers made it.
        MEGA_ASSIGN_OR_RETURN(auto found, store.FindBySha256(op.oid, cr.access, repo.ns));
        if (!found)
          return ErrorResponse(
              400, "lfsFile '" + op.path + "': no uploaded content has sha256 " + op.oid);
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
  std::string prefix =
      repo.type == RepoType::kModel ? "" : "/" + std::string(RepoTypePlural(repo.type));
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
    return ErrorFrom(commit.status(),
                     commit.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
  }
  if (!commit->no_change) ++c.ctx.counters.commits;
  std::string endpoint = c.ctx.Endpoint(c.req);
  json out = {{"commitOid", commit->id},
              {"commitUrl", endpoint + prefix + "/" + repo.id() + "/commit/" + commit->id},
              {"commitMessage", commit->message}};
  // Nothing changed: the unchanged head, and "noChange": true.
  if (commit->no_change) out["noChange"] = true;
  if (pr_number) {
    out["pullRequestUrl"] =
        endpoint + prefix + "/" + repo.id() + "/discussions/" + std::to_string(*pr_number);
    out["pullRequestRevision"] = cr.branch;
  }
  return JsonResponse(out);
}

Routed CommitRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, repo->ns));
  return WithBody(c, c.ctx.options.max_json_bytes,
                  [&c, repo = *repo](std::string body) -> Result<Response> {
                    return NdjsonCommit(c, repo, c.tail(), body);
                  });
}

// POST /api/repos/create (huggingface_hub's create_repo): {"name",
// "organization", "type"?, "visibility"? | "private"?}. A missing
// organization is the token's namespace. 200 {"url", "name", "id"}; 409 (with
// "url") when the repository exists, which the client takes as exist_ok.
Routed HfCreateRepoRoute(Call& c) {
  MEGA_RETURN_IF_ERROR(CheckAnyWrite(c.who));
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    MEGA_ASSIGN_OR_RETURN(std::string name, StringField(j, "name"));
    MEGA_ASSIGN_OR_RETURN(std::string org, StringField(j, "organization"));
    if (org.empty()) {
      if (!c.who.ns) {
        return ErrorResponse(
            400,
            "\"organization\" is required (this token is not limited to a namespace; "
            "create the repository as \"<namespace>/" +
                name + "\")");
      }
      org = *c.who.ns;
    }
    MEGA_RETURN_IF_ERROR(CheckWrite(c.who, org));
    RepoSpec spec;
    spec.ns = org;
    spec.name = name;
    MEGA_ASSIGN_OR_RETURN(std::string type_name, StringField(j, "type", "model"));
    MEGA_ASSIGN_OR_RETURN(spec.type, RepoTypeFromName(type_name));
    MEGA_ASSIGN_OR_RETURN(std::string visibility, StringField(j, "visibility"));
    MEGA_ASSIGN_OR_RETURN(bool is_private, BoolField(j, "private"));
    if (!visibility.empty() && visibility != "public" && visibility != "private") {
      return ErrorResponse(
          400, "visibility must be \"public\" or \"private\", not " + Quote(visibility));
    }
    spec.is_private = visibility.empty() ? is_private : visibility == "private";
    std::string prefix =
        spec.type == RepoType::kModel ? "" : "/" + std::string(RepoTypePlural(spec.type));
    std::string url = c.ctx.Endpoint(c.req) + prefix + "/" + spec.ns + "/" + spec.name;
    auto repo = c.store().CreateRepo(spec, /*exist_ok=*/false);
    if (!repo.ok()) {
      if (repo.status().code() != StatusCode::kAlreadyExists) return repo.status();
      Response res = JsonResponse(
          {{"error", "You already created this " + type_name + " repo"}, {"url", url}}, 409);
      res.SetHeader("X-Error-Message", "You already created this " + type_name + " repo");
      return res;
    }
    return JsonResponse({{"url", url}, {"name", repo->id()}, {"id", repo->id()}});
  });
}

// DELETE /api/repos/delete (huggingface_hub's delete_repo): {"name",
// "organization", "type"?} -> 200 {}; 404 RepoNotFound.
Routed HfDeleteRepoRoute(Call& c) {
  MEGA_RETURN_IF_ERROR(CheckAnyWrite(c.who));
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    MEGA_ASSIGN_OR_RETURN(std::string name, StringField(j, "name"));
    MEGA_ASSIGN_OR_RETURN(std::string org, StringField(j, "organization"));
    if (org.empty() && c.who.ns) org = *c.who.ns;
    MEGA_RETURN_IF_ERROR(CheckWrite(c.who, org));
    Status s = c.store().DeleteRepo(org + "/" + name);
    if (!s.ok()) return ErrorFrom(s, "RepoNotFound");
    return JsonResponse(json::object());
  });
}

json TreeFileJson(const FileEntry& f) {
  json j = {{"type", "file"}, {"oid", f.sha256}, {"size", f.size}, {"path", f.path}};
  if (f.size > 0) {
    j["lfs"] = {{"oid", f.sha256}, {"size", f.size}, {"pointerSize", 134}};
    j["xetHash"] = f.xet_hash;
  }
  return j;
}

// GET /api/{type}s/{ns}/{name}/tree/{rev}[/{path}]?recursive&limit&cursor
// (huggingface_hub's list_repo_tree / list_repo_files): a JSON array of
// {"type":"file","oid","size","path","lfs"?,"xetHash"?} and (non-recursive)
// {"type":"directory","oid","size":0,"path"}; more pages through
// `Link: <url>; rel="next"`. `oid` is the SHA-256 (git blob ids are not kept).
// 404 EntryNotFound when `path` names nothing.
Routed TreeRoute(Call& c) {
  Response error;
  auto repo = LoadHfRepo(c, &error);
  if (!repo) return error;
  HubStore& store = c.store();
  auto commit = store.ResolveRevision(repo->id(), c.p(3));
  if (!commit.ok()) return ErrorFrom(commit.status(), "RevisionNotFound");
  std::string prefix = c.tail();
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (!prefix.empty()) MEGA_RETURN_IF_ERROR(ValidateRepoPath(prefix));
  std::string recursive_param = ToLower(c.req.Param("recursive"));
  bool recursive = recursive_param == "true" || recursive_param == "1";
  MEGA_ASSIGN_OR_RETURN(size_t limit, SizeParam(c.req, "limit", 1000, 1, 10000));
  std::string cursor = c.req.Param("cursor");
  std::string list_prefix = prefix.empty() ? "" : prefix + "/";
  json arr = json::array();
  std::string after = cursor;
  bool more = false;
  if (recursive) {
    // Files, and every folder they are in (once, before its first file).
    MEGA_ASSIGN_OR_RETURN(auto files,
                          store.ListFiles(repo->id(), *commit, list_prefix, cursor, limit + 1));
    std::string prev = cursor;
    for (size_t i = 0; i < files.size() && i < limit; ++i) {
      const std::string& path = files[i].path;
      for (size_t slash = path.find('/', list_prefix.size()); slash != std::string::npos;
           slash = path.find('/', slash + 1)) {
        std::string dir = path.substr(0, slash + 1);
        if (prev.compare(0, dir.size(), dir) != 0) {
          arr.push_back(
              {{"type", "directory"}, {"oid", ""}, {"size", 0}, {"path", dir.substr(0, slash)}});
        }
      }
      arr.push_back(TreeFileJson(files[i]));
      prev = after = path;
    }
    more = files.size() > limit;
  } else {
    // Direct children; a folder is one entry, then the listing jumps past it.
    while (arr.size() < limit) {
      MEGA_ASSIGN_OR_RETURN(auto files,
                            store.ListFiles(repo->id(), *commit, list_prefix, after, 1));
      if (files.empty()) break;
      std::string rest = files[0].path.substr(list_prefix.size());
      size_t slash = rest.find('/');
      if (slash == std::string::npos) {
        arr.push_back(TreeFileJson(files[0]));
        after = files[0].path;
      } else {
        std::string dir = list_prefix + rest.substr(0, slash);
        arr.push_back({{"type", "directory"}, {"oid", ""}, {"size", 0}, {"path", dir}});
        after = dir + "/\xff";
      }
    }
    if (arr.size() == limit) {
      MEGA_ASSIGN_OR_RETURN(auto peek, store.ListFiles(repo->id(), *commit, list_prefix, after, 1));
      more = !peek.empty();
    }
  }
  if (arr.empty() && !prefix.empty() && cursor.empty()) {
    return ErrorResponse(
        404, "entry " + Quote(prefix) + " not found in " + repo->id() + " at " + *commit,
        "EntryNotFound");
  }
  Response res = JsonResponse(arr);
  if (more) {
    std::string next = c.ctx.Endpoint(c.req) + "/api/" + c.p(0) + "/" + repo->id() + "/tree/" +
                       PercentEncode(c.p(3)) + (prefix.empty() ? "" : "/" + PercentEncode(prefix)) +
                       "?recursive=" + (recursive ? "true" : "false") +
                       "&limit=" + std::to_string(limit) + "&cursor=" + PercentEncode(after);
    res.SetHeader("Link", "<" + next + ">; rel=\"next\"");
  }
  return res;
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
  r.Add("GET", std::string(kRepo) + "/tree/{rev}/*?", TreeRoute);
  r.Add("*", std::string(kRepo) + "/*?", UnknownRoute);
  // The client also knows an "mcps" repository type (preupload/commit/
  // xet tokens); this hub has none, so every such repository is missing.
  r.Add("*", "/api/mcps/{ns}/{name}/*?", [](Call& c) -> Routed {
    return (ErrorResponse(
        404, "repository type 'mcp' is not served by this hub (repo " + c.p(0) + "/" + c.p(1) + ")",
        "RepoNotFound"));
  });
  r.Add("POST", "/api/repos/create", HfCreateRepoRoute);
  r.Add("DELETE", "/api/repos/delete", HfDeleteRepoRoute);
  // upload_folder checks a README.md's YAML front matter here first; this hub
  // keeps model cards as plain files and validates nothing: no errors.
  r.Add("POST", "/api/validate-yaml", [](Call& c) -> Routed {
    return WithJsonBody(c, c.ctx.options.max_json_bytes, [](json) -> Result<Response> {
      return JsonResponse({{"errors", json::array()}, {"warnings", json::array()}});
    });
  });
  auto whoami = [](Call& c) -> Routed {
    if (!c.who.valid) return (ErrorResponse(401, "invalid or missing token"));
    return (JsonResponse(
        {{"name", c.who.name},
         {"type", "user"},
         {"auth",
          {{"accessToken", {{"role", c.who.scope == TokenScope::kWrite ? "write" : "read"}}}}}}));
  };
  r.Add("*", "/api/whoami/*?", whoami);
  r.Add("*", "/api/whoami-v2/*?", whoami);
}

}  // namespace megackpt::hub
