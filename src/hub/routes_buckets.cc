// megahub routes on buckets (mutable path -> entry maps, no history):
// /api/buckets/{ns}/{name} (create, info, delete), .../tree[/{prefix}],
// .../paths-info, .../batch (NDJSON), .../xet-{read,write}-token, and
// downloads at /buckets/{ns}/{name}/resolve/{path}.
#include "hub/ndjson.h"
#include "hub/server_internal.h"
#include "hub/util.h"

namespace megackpt::hub {
namespace {

std::string BucketId(const Call& c) { return c.p(0) + "/" + c.p(1); }

// The route's bucket after the read (or write) check; errors in *error.
std::optional<BucketInfo> LoadBucket(const Call& c, bool write, Response* error) {
  auto bucket = c.store().GetBucket(BucketId(c));
  if (!bucket.ok()) {
    *error = ErrorFrom(bucket.status(), "RepoNotFound");
    return std::nullopt;
  }
  Status s = write ? CheckWrite(c.who, c.p(0)) : CheckRead(c.who, bucket->is_private, c.p(0));
  if (!s.ok()) {
    *error = ErrorFrom(s, s.code() == StatusCode::kUnauthenticated && !write ? "RepoNotFound" : "");
    return std::nullopt;
  }
  return *bucket;
}

// /buckets/{ns}/{name}/resolve/{path}: the path arrives either with "/"
// kept or fully encoded (%2F); both decode to the same segments here.
Routed ResolveRoute(Call& c) {
  Response error;
  auto bucket = c.store().GetBucket(BucketId(c));
  if (!bucket.ok()) return ErrorFrom(bucket.status(), "RepoNotFound");
  MEGA_RETURN_IF_ERROR(CheckRead(c.who, bucket->is_private, bucket->ns));
  const std::string& path = c.tail();
  MEGA_RETURN_IF_ERROR(ValidateRepoPath(path));
  auto entry = c.store().GetBucketEntry(BucketId(c), path);
  if (!entry.ok()) return ErrorFrom(entry.status(), "EntryNotFound");
  FileEntry fe;
  fe.path = entry->path;
  fe.size = entry->size;
  fe.sha256 = entry->sha256;
  fe.xet_hash = entry->xet_hash;
  Response res;
  res.SetHeader("X-Xet-Hash", entry->xet_hash);
  res.SetHeader("ETag", "\"" + (entry->sha256.empty() ? entry->xet_hash : entry->sha256) + "\"");
  res.SetHeader("X-Linked-Size", std::to_string(entry->size));
  res.SetHeader("Link", "<" + c.ctx.Endpoint(c.req) + "/api/buckets/" + BucketId(c) +
                            "/xet-read-token>; rel=\"xet-auth\"");
  return ServeContent(c, fe, "bucket " + BucketId(c) + "/" + path, std::move(res));
}

Routed CreateRoute(Call& c) {
  MEGA_RETURN_IF_ERROR(CheckWrite(c.who, c.p(0)));
  return WithBody(c, c.ctx.options.max_json_bytes, [&c](std::string body) -> Result<Response> {
    json j = body.empty() ? json::object() : json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return ErrorResponse(400, "body is not a JSON object");
    std::string id = BucketId(c);
    std::string url = c.ctx.Endpoint(c.req) + "/buckets/" + id;
    MEGA_ASSIGN_OR_RETURN(bool is_private, BoolField(j, "private"));
    auto b = c.store().CreateBucket(c.p(0), c.p(1), is_private, false);
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kAlreadyExists) {
        return JsonResponse({{"error", b.status().message()}, {"url", url}, {"id", id}}, 409);
      }
      return b.status();
    }
    return JsonResponse({{"url", url}, {"id", id}, {"name", c.p(1)}}, 200);
  });
}

Routed InfoRoute(Call& c) {
  Response error;
  auto bucket = LoadBucket(c, false, &error);
  if (!bucket) return error;
  return (JsonResponse({{"id", BucketId(c)},
                        {"private", bucket->is_private},
                        {"createdAt", FormatTimestamp(bucket->created_ms)},
                        {"size", bucket->size},
                        {"totalFiles", bucket->total_files}}));
}

Routed DeleteRoute(Call& c) {
  Response error;
  if (!LoadBucket(c, true, &error)) return error;
  Status s = c.store().DeleteBucket(BucketId(c));
  if (!s.ok()) return ErrorFrom(s, "RepoNotFound");
  return (JsonResponse(json::object()));
}

Routed TreeRoute(Call& c) {
  Response error;
  if (!LoadBucket(c, false, &error)) return error;
  const Request& req = c.req;
  HubStore& store = c.store();
  const std::string id = BucketId(c);
  std::string prefix = c.tail();
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  bool recursive = req.Param("recursive") == "true" || req.Param("recursive") == "1";
  MEGA_ASSIGN_OR_RETURN(size_t limit, SizeParam(req, "limit", 1000, 1, 10000));
  std::string cursor = req.Param("cursor");
  std::string list_prefix = prefix.empty() ? "" : prefix + "/";
  json arr = json::array();
  std::string last;
  bool more = false;
  if (recursive) {
    MEGA_ASSIGN_OR_RETURN(auto entries, store.ListBucket(id, list_prefix, cursor, limit + 1));
    for (size_t i = 0; i < entries.size() && i < limit; ++i) {
      arr.push_back(BucketEntryJson(entries[i]));
      last = entries[i].path;
    }
    more = entries.size() > limit;
  } else {
    // Direct children: files, and one entry per sub-folder (skipping past
    // each folder's contents with a range jump).
    std::string after = cursor;
    while (arr.size() < limit) {
      MEGA_ASSIGN_OR_RETURN(auto entries, store.ListBucket(id, list_prefix, after, 1));
      if (entries.empty()) break;
      const BucketEntry& e = entries.front();
      std::string rest = e.path.substr(list_prefix.size());
      size_t slash = rest.find('/');
      if (slash == std::string::npos) {
        arr.push_back(BucketEntryJson(e));
        after = e.path;
      } else {
        std::string dir = list_prefix + rest.substr(0, slash);
        arr.push_back(
            {{"type", "directory"}, {"path", dir}, {"uploadedAt", FormatTimestamp(e.uploaded_ms)}});
        after = dir + "/\xff";  // past every path under dir/
      }
      last = after;
    }
    if (arr.size() == limit) {
      auto peek = store.ListBucket(id, list_prefix, after, 1);
      more = peek.ok() && !peek->empty();
    }
  }
  if (arr.empty() && !prefix.empty() && cursor.empty()) {
    auto exact = store.GetBucketEntry(id, prefix);
    if (exact.ok()) arr.push_back(BucketEntryJson(*exact));
  }
  Response res = JsonResponse(arr);
  if (more) {
    std::string next = c.ctx.Endpoint(req) + "/api/buckets/" + id + "/tree" +
                       (prefix.empty() ? "" : "/" + PercentEncode(prefix)) +
                       "?recursive=" + (recursive ? "true" : "false") +
                       "&limit=" + std::to_string(limit) + "&cursor=" + PercentEncode(last);
    res.SetHeader("Link", "<" + next + ">; rel=\"next\"");
  }
  return res;
}

// paths-info is a read even though it is a POST.
Routed PathsInfoRoute(Call& c) {
  Response error;
  if (!LoadBucket(c, false, &error)) return error;
  return WithJsonBody(c, c.ctx.options.max_json_bytes, [&c](json j) -> Result<Response> {
    if (!j.contains("paths") || !j["paths"].is_array())
      return ErrorResponse(400, "body must be {\"paths\": [...]}");
    if (j["paths"].size() > 1000) return ErrorResponse(400, "at most 1000 paths per request");
    json arr = json::array();
    for (const auto& p : j["paths"]) {
      if (!p.is_string()) return ErrorResponse(400, "paths[] must be strings");
      auto e = c.store().GetBucketEntry(BucketId(c), p.get<std::string>());
      if (e.ok()) arr.push_back(BucketEntryJson(*e));
    }
    return JsonResponse(arr);
  });
}

Routed BatchRoute(Call& c) {
  Response error;
  if (!LoadBucket(c, true, &error)) return error;
  return WithBody(c, c.ctx.options.max_json_bytes, [&c](std::string body) -> Result<Response> {
    MEGA_ASSIGN_OR_RETURN(auto ops, ParseBucketBatch(body));
    std::vector<BucketOperation> bops;
    for (const auto& op : ops) {
      BucketOperation b;
      b.entry.path = op.path;
      if (op.kind == BucketBatchOp::Kind::kDeleteFile) {
        b.kind = BucketOperation::Kind::kDelete;
      } else {
        b.kind = BucketOperation::Kind::kAdd;
        b.entry.xet_hash = op.xet_hash;
        b.entry.size = op.size;
        b.entry.sha256 = op.sha256;
        b.entry.mtime_ms = op.mtime_ms;
        b.entry.content_type = op.content_type;
      }
      bops.push_back(std::move(b));
    }
    MEGA_RETURN_IF_ERROR(c.store().BucketBatch(BucketId(c), bops, AccessOf(c.who)));
    return JsonResponse({{"success", true}, {"operations", bops.size()}});
  });
}

Routed XetTokenRoute(Call& c) {
  Response error;
  bool write = c.p(2) == "xet-write-token";
  if (!LoadBucket(c, write, &error)) return error;
  return XetTokenResponse(c.ctx, c.req, write, "bucket:" + BucketId(c));
}

}  // namespace

void AddBucketRoutes(HubRouter& r) {
  r.Add("GET", "/buckets/{ns}/{name}/resolve/*?", ResolveRoute);
  r.Add("*", "/buckets/{ns}/{name}/resolve/*?",
        [](Call&) -> Routed { return (ErrorResponse(405, "method not allowed")); });
  r.Add("POST", "/api/buckets/{ns}/{name}", CreateRoute);
  r.Add("GET", "/api/buckets/{ns}/{name}", InfoRoute);
  r.Add("DELETE", "/api/buckets/{ns}/{name}", DeleteRoute);
  r.Add("GET", "/api/buckets/{ns}/{name}/tree/*?", TreeRoute);
  r.Add("POST", "/api/buckets/{ns}/{name}/paths-info", PathsInfoRoute);
  r.Add("POST", "/api/buckets/{ns}/{name}/batch", BatchRoute);
  r.Add("GET", "/api/buckets/{ns}/{name}/(xet-read-token|xet-write-token)", XetTokenRoute);
}

}  // namespace megackpt::hub
