// megahub's resumable multipart uploads (spec/mega-hub-protocol.md §4.7):
// POST /api/uploads, GET/DELETE /api/uploads/{id}, PUT .../parts/{n},
// POST .../complete. Parts are stored by the hub store (store_uploads.cc).
#include "hub/server_internal.h"
#include "hub/util.h"

namespace megackpt::hub {
namespace {

Routed CreateUploadRoute(Call& c) {
  // The repo is in the body: a write token is required before reading it.
  MEGA_RETURN_IF_ERROR(CheckAnyWrite(c.who));
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    HubStore::MultipartUpload u;
    MEGA_ASSIGN_OR_RETURN(u.repo, StringField(j, "repo_id"));
    MEGA_ASSIGN_OR_RETURN(auto parts, SplitRepoId(u.repo));
    MEGA_RETURN_IF_ERROR(CheckWrite(c.who, parts.first));
    auto repo = c.store().GetRepo(u.repo);
    if (!repo.ok()) return ErrorFrom(repo.status(), "RepoNotFound");
    MEGA_ASSIGN_OR_RETURN(u.path, StringField(j, "path"));
    MEGA_RETURN_IF_ERROR(ValidateRepoPath(u.path));
    MEGA_ASSIGN_OR_RETURN(u.revision, StringField(j, "revision", "main"));
    MEGA_ASSIGN_OR_RETURN(u.size, U64Field(j, "size"));
    MEGA_ASSIGN_OR_RETURN(u.sha256, StringField(j, "sha256"));
    MEGA_ASSIGN_OR_RETURN(u.stage_only, BoolField(j, "stage_only", true));
    u.part_size = c.ctx.options.upload_part_size;
    MEGA_ASSIGN_OR_RETURN(auto created, c.store().CreateMultipartUpload(u));
    return JsonResponse({{"upload_id", created.id}, {"part_size", created.part_size}});
  });
}

// The upload of the route ({id}) after checking the caller may write to its repo.
Result<HubStore::MultipartUpload> LoadUpload(const Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto upload, c.store().GetMultipartUpload(c.p(0)));
  MEGA_ASSIGN_OR_RETURN(auto parts, SplitRepoId(upload.repo));
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, parts.first));
  return upload;
}

Routed GetUploadRoute(Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto upload, LoadUpload(c));
  MEGA_ASSIGN_OR_RETURN(auto stored, c.store().ListUploadParts(upload.id));
  json arr = json::array();
  for (const auto& [n, etag] : stored) arr.push_back({{"part_number", n}, {"etag", etag}});
  return (
      JsonResponse({{"upload_id", upload.id}, {"part_size", upload.part_size}, {"parts", arr}}));
}

Routed DeleteUploadRoute(Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto upload, LoadUpload(c));
  MEGA_RETURN_IF_ERROR(c.store().DeleteMultipartUpload(upload.id));
  return (JsonResponse(json::object()));
}

class PartBody final : public httpd::BodyReader {
 public:
  PartBody(ServerContext& ctx, std::unique_ptr<HubStore::PartWriter> part, int n)
      : ctx_(ctx), part_(std::move(part)), n_(n) {}
  Status Append(std::span<const std::byte> data) override {
    ctx_.counters.blob_bytes_received += data.size();
    return part_->Append(data);
  }
  Result<Response> Finish(const Status& status) override {
    MEGA_RETURN_IF_ERROR(status);
    MEGA_ASSIGN_OR_RETURN(std::string etag, part_->Finish());
    return JsonResponse({{"etag", etag}, {"part_number", n_}});
  }

 private:
  ServerContext& ctx_;
  std::unique_ptr<HubStore::PartWriter> part_;
  int n_;
};

Routed PutPartRoute(Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto upload, LoadUpload(c));
  char* end = nullptr;
  long n = std::strtol(c.p(1).c_str(), &end, 10);
  uint64_t nparts = (upload.size + upload.part_size - 1) / upload.part_size;
  if (!end || *end || n < 1 || static_cast<uint64_t>(n) > std::max<uint64_t>(nparts, 1)) {
    return (ErrorResponse(400, "bad part number '" + c.p(1) + "'"));
  }
  uint64_t expect = static_cast<uint64_t>(n) < nparts
                        ? upload.part_size
                        : upload.size - (static_cast<uint64_t>(n) - 1) * upload.part_size;
  if (c.req.content_length && *c.req.content_length != expect) {
    return (ErrorResponse(400, "part " + std::to_string(n) + " has " +
                                   std::to_string(*c.req.content_length) + " bytes, expected " +
                                   std::to_string(expect)));
  }
  MEGA_ASSIGN_OR_RETURN(auto part,
                        c.store().BeginUploadPart(upload.id, static_cast<int>(n), expect));
  return Action(std::make_unique<PartBody>(c.ctx, std::move(part), static_cast<int>(n)));
}

Routed CompleteUploadRoute(Call& c) {
  MEGA_ASSIGN_OR_RETURN(auto upload, LoadUpload(c));
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c, upload](json j) -> Result<Response> {
    if (!j.contains("parts") || !j["parts"].is_array())
      return ErrorResponse(400, "body must be {\"parts\": [...]}");
    std::vector<std::pair<int, std::string>> list;
    for (const auto& p : j["parts"]) {
      if (!p.is_object()) return ErrorResponse(400, "parts[] entries must be objects");
      MEGA_ASSIGN_OR_RETURN(uint64_t n, U64Field(p, "part_number"));
      MEGA_ASSIGN_OR_RETURN(std::string etag, StringField(p, "etag"));
      list.emplace_back(static_cast<int>(std::min<uint64_t>(n, INT32_MAX)), etag);
    }
    ContentAccess access = AccessOf(c.who);
    MEGA_ASSIGN_OR_RETURN(auto entry,
                          c.store().CompleteMultipartUpload(upload.id, list, access.ns));
    if (upload.stage_only) {
      return JsonResponse({{"staged", true},
                           {"path", upload.path},
                           {"size", entry.size},
                           {"sha256", entry.sha256}});
    }
    CommitRequest cr;
    cr.repo = upload.repo;
    cr.branch = upload.revision;
    MEGA_ASSIGN_OR_RETURN(cr.message, StringField(j, "commit_message", "Upload " + upload.path));
    cr.author = c.who.name;
    cr.access = access;
    CommitOperation op;
    op.kind = CommitOperation::Kind::kAdd;
    op.path = upload.path;
    op.entry = entry;
    cr.ops.push_back(op);
    MEGA_ASSIGN_OR_RETURN(auto commit, c.store().Commit(cr));
    if (!commit.no_change) ++c.ctx.counters.commits;
    json out = {{"repo_id", upload.repo},
                {"path", upload.path},
                {"revision", commit.id},
                {"size", entry.size},
                {"sha256", entry.sha256}};
    if (commit.no_change) out["no_change"] = true;
    return JsonResponse(out);
  });
}

}  // namespace

void AddUploadRoutes(HubRouter& r) {
  r.Add("POST", "/api/uploads", CreateUploadRoute);
  r.Add("GET", "/api/uploads/{id}", GetUploadRoute);
  r.Add("DELETE", "/api/uploads/{id}", DeleteUploadRoute);
  r.Add("PUT", "/api/uploads/{id}/parts/{n}", PutPartRoute);
  r.Add("POST", "/api/uploads/{id}/complete", CompleteUploadRoute);
}

}  // namespace megackpt::hub
