// The parts of megahub's HTTP service shared by its route files
// (routes_*.cc): the server context (store, options, counters), the caller's
// identity and the checks on it, the error/JSON/Range helpers, and the
// registration function of each route group. Layout: docs/hub.md §4.
#ifndef MEGACKPT_SRC_HUB_SERVER_INTERNAL_H_
#define MEGACKPT_SRC_HUB_SERVER_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/http_server.h"
#include "hub/router.h"
#include "megackpt/core/status.h"
#include "megackpt/hub/server.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using json = nlohmann::json;
using httpd::Action;
using httpd::Request;
using httpd::Response;

// ---- who is calling (server_auth.cc) ----
struct Identity {
  bool presented = false;  // an Authorization header was sent
  bool valid = false;
  bool xet = false;  // a short-lived CAS token
  TokenScope scope = TokenScope::kRead;
  std::optional<std::string> ns;  // hub tokens: namespace restriction
  std::string xet_resource;       // xet tokens: "repo:ns/name" or "bucket:ns/name"
  std::string name = "anonymous";
};

struct ServerCounters {
  std::atomic<uint64_t> requests{0}, request_body_bytes{0}, xorbs_received{0},
      xorb_bytes_received{0}, xorbs_inserted{0}, shards_received{0}, blob_bytes_received{0},
      commits{0}, responses_4xx{0}, responses_5xx{0};
};

struct ServerContext {
  std::shared_ptr<HubStore> store;
  HubServerOptions options;
  std::string secret;  // signs xet tokens
  int port = 0;
  ServerCounters counters;

  // "http://" + the request's Host (or host:port).
  std::string Endpoint(const Request& req) const;
};

Identity Authenticate(ServerContext& ctx, const Request& req);
std::string MakeXetToken(const ServerContext& ctx, bool write, const std::string& resource);
// The answer of the xet-{read,write}-token routes: {"accessToken", "exp",
// "casUrl"} (megatensors, hf_xet) and the same in X-Xet-Access-Token,
// X-Xet-Token-Expiration and X-Xet-Cas-Url (huggingface_hub reads headers).
Response XetTokenResponse(const ServerContext& ctx, const Request& req, bool write,
                          const std::string& resource);
// The URL of a xorb handed out in reconstruction answers: signed with the
// root's secret and valid for xet_token_seconds, so it is fetched without an
// Authorization header (hf_xet fetches `fetch_info` URLs as presigned URLs,
// as it does S3's on the Hugging Face Hub).
std::string SignedXorbUrl(const ServerContext& ctx, const std::string& endpoint,
                          const std::string& xorb_hex);
// Whether `req` carries a valid, unexpired signature for `xorb_hex`.
bool HasValidXorbSignature(const ServerContext& ctx, const Request& req, std::string_view xorb_hex);
// OK when `who` may read a repo/bucket of `ns` (private or not).
Status CheckRead(const Identity& who, bool is_private, const std::string& ns);
// OK when `who` holds a write token valid for `ns`.
Status CheckWrite(const Identity& who, const std::string& ns);
// OK when `who` holds a write token (any namespace): checked before reading
// a body that names the namespace (then CheckWrite).
Status CheckAnyWrite(const Identity& who);
// Which content `who` may name by hash in a write (store.h ContentAccess),
// and the namespace its uploads are granted to: a namespace-limited hub
// token is limited to its namespace, a xet token (which can only upload) to
// the namespace of the resource it was issued for. Not a read rule: the CAS
// read routes serve any content whose hash is known (docs/hub.md §4).
ContentAccess AccessOf(const Identity& who);

// ---- a matched request ----
struct Call {
  ServerContext& ctx;
  Request& req;
  const Identity& who;
  RouteMatch match;
  HubStore& store() const { return *ctx.store; }
  const std::string& p(size_t i) const { return match.params.at(i); }
  const std::string& tail() const { return match.tail; }
};
// What a route returns: an Action (an answer now, or a body reader), or an
// error Status (answered with its HTTP status). Converts from all of them so
// that MEGA_RETURN_IF_ERROR / MEGA_ASSIGN_OR_RETURN work in route functions.
class Routed {
 public:
  Routed(Response r) : action_(Action(std::move(r))) {}                            // NOLINT
  Routed(Action a) : action_(std::move(a)) {}                                      // NOLINT
  Routed(std::unique_ptr<httpd::BodyReader> b) : action_(Action(std::move(b))) {}  // NOLINT
  Routed(Status s) : action_(std::move(s)) {}                                      // NOLINT
  Routed(Result<Action> a) : action_(std::move(a)) {}                              // NOLINT
  Routed(Result<Response> r)                                                       // NOLINT
      : action_(r.ok() ? Result<Action>(Action(*std::move(r))) : Result<Action>(r.status())) {}
  Result<Action> Take() && { return std::move(action_); }

 private:
  Result<Action> action_;
};
using RouteFn = std::function<Routed(Call&)>;
using HubRouter = Router<RouteFn>;

// Route groups, registered in this order (first match wins).
void AddRepoRoutes(HubRouter& r);    // routes_repos.cc: /api/repos..., HF download URLs
void AddUploadRoutes(HubRouter& r);  // routes_uploads.cc: /api/uploads...
void AddBucketRoutes(HubRouter& r);  // routes_buckets.cc: /api/buckets..., /buckets/.../resolve
void AddHfRoutes(HubRouter& r);      // routes_hf.cc: /api/{models,datasets,spaces}/..., whoami
void AddCasRoutes(HubRouter& r);     // routes_cas.cc: /v1/..., /v2/reconstructions/...
void AddDownloadRoutes(
    HubRouter& r);  // routes_repos.cc: /{ns}/{name}/resolve/... (last: catch-all shape)
// The CAS routes' token rule, applied before routing to any /v1 or
// /v2/reconstructions path (so unknown CAS paths answer 401 too).
std::optional<Status> CheckCasAccess(const ServerContext& ctx, const Request& req,
                                     const Identity& who);

// ---- answers (server_status.cc) ----
int HttpStatusFor(const Status& s);
// {"error": message} with X-Error-Message (and X-Error-Code when given).
Response ErrorResponse(int status, const std::string& message, const std::string& code = "");
Response ErrorFrom(const Status& s, const std::string& code = "");
Response JsonResponse(const json& body, int status = 200);
Response BytesResponse(std::string body, const std::string& type = "application/octet-stream");

// ---- request bodies ----
// Reads a JSON object body (at most `limit` bytes; 413 beyond, checked
// against Content-Length before reading), then calls `then`.
Result<Action> WithJsonBody(const Call& call, uint64_t limit,
                            std::function<Result<Response>(json body)> then);
// The same for a raw body.
Result<Action> WithBody(const Call& call, uint64_t limit,
                        std::function<Result<Response>(std::string body)> then);
// 413 when the request declares more than `limit` body bytes.
Status CheckDeclaredLength(const Request& req, uint64_t limit);

// ---- client JSON fields (server_json.cc): InvalidArgument naming the field
// when present with the wrong type; `def` when absent (or null).
Result<std::string> StringField(const json& j, const char* key, std::string def = "");
Result<uint64_t> U64Field(const json& j, const char* key, uint64_t def = 0);
Result<bool> BoolField(const json& j, const char* key, bool def = false);
// A query parameter as a number within [lo, hi]; `def` when absent.
Result<size_t> SizeParam(const Request& req, const char* name, size_t def, size_t lo, size_t hi);

// ---- JSON views of the data model (server_json.cc) ----
std::string Dump(const json& j);
json RepoJson(const RepoInfo& r, const std::optional<std::string>& sha = std::nullopt);
json CommitJson(const CommitInfo& c, bool with_files);
json RefJson(const RefInfo& r);
json BucketEntryJson(const BucketEntry& e);
std::string GuessContentType(std::string_view path);

// ---- byte ranges (server_range.cc, RFC 7233) ----
struct ByteRange {
  uint64_t first = 0, last = 0;  // inclusive
};
struct RangeRequest {
  enum class Kind { kWhole, kRange, kUnsatisfiable };
  Kind kind = Kind::kWhole;
  ByteRange range;
};
// `header` against a representation of `size` bytes. No header, another
// unit, invalid syntax or several ranges: kWhole (the header is ignored).
// A valid single range starting at or past the end (or a zero suffix):
// kUnsatisfiable (answer 416 with "Content-Range: bytes */size"). Ends past
// the end are clipped.
RangeRequest ParseRange(std::string_view header, uint64_t size);
// The 416 answer for a representation of `size` bytes.
Response RangeNotSatisfiable(uint64_t size);

// ---- shared handlers (routes_repos.cc) ----
// Serves content (200 or 206 per Range; HEAD: headers only) with `res`'s
// headers kept. `name` is for messages.
Result<Response> ServeContent(const Call& call, const FileEntry& entry, const std::string& name,
                              Response res);
// The repo for a read route (exists, and `who` may read it); answer an
// error with RepoError.
Result<RepoInfo> LoadRepoForRead(const Call& call, const std::string& ns, const std::string& name);
// An error of LoadRepoForRead / GetRepo: X-Error-Code RepoNotFound (except 403).
Response RepoError(const Status& s);
// One commit from a native JSON commit body (routes_repos.cc); `extra` fields
// are merged into the 201 answer.
Result<Response> NativeCommit(const Call& call, const RepoInfo& repo, const json& body,
                              const json& extra = json::object());

}  // namespace megackpt::hub

#endif  // MEGACKPT_SRC_HUB_SERVER_INTERNAL_H_
