// The megahub HTTP service. Routing is done here on the raw request target
// (httplib decodes %2F in req.path, which would merge encoded revisions and
// bucket paths into extra segments), so every route is registered as ".*" and
// dispatched by Router below. Route list and JSON shapes: docs/hub.md.
#include "megackpt/hub/server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "cas/bytes.h"
#include "hub/ndjson.h"
#include "hub/util.h"
#include "megackpt/cas/shard.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/core/checksum.h"
#include "megackpt/hub/mega_uri.h"

namespace megackpt::hub {
namespace {

using json = nlohmann::json;

// ---- large request bodies without cpp-httplib's 4 KiB reads ----
//
// cpp-httplib 0.11.4 (Debian's compiled library, so CPPHTTPLIB_RECV_BUFSIZ
// cannot be changed) hands a request body to a ContentReceiver in pieces of
// at most 4 KiB, each a poll() + recv() (+ a copy); a 64 MiB xorb upload is
// 16k of each. For a plain Content-Length body the server therefore finds the
// connection's socket and receives the rest of the body itself, straight into
// place, in large recv() calls (ReadBodyInto below).

std::string NumericPeer(const sockaddr_storage& a, socklen_t len, int* port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "";
  }
  *port = std::atoi(serv);
  return host;
}

// True when fd is the accepted socket of `req`'s connection: local port =
// the server's, peer = the request's remote address and port (as cpp-httplib
// itself reports it, getnameinfo NI_NUMERICHOST). A client socket in the same
// process has the server's port as its *peer* port, so it never matches.
bool IsConnectionSocket(int fd, const httplib::Request& req, int local_port) {
  sockaddr_storage a;
  socklen_t len = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  int port = -1;
  if (NumericPeer(a, len, &port).empty() || port != local_port) return false;
  len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  std::string host = NumericPeer(a, len, &port);
  return port == req.remote_port && !host.empty() && host == req.remote_addr;
}

// The socket of the connection the calling handler thread serves, or -1.
// cpp-httplib serves one connection per pool thread at a time, so the last
// answer is cached per thread and re-checked (two syscalls) before use.
int FindConnectionSocket(const httplib::Request& req, int server_port) {
  thread_local int cached = -1;
  const int local_port = req.local_port > 0 ? req.local_port : server_port;
  if (local_port <= 0 || req.remote_port <= 0) return -1;
  if (cached >= 0 && IsConnectionSocket(cached, req, local_port)) return cached;
  cached = -1;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0 || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (IsConnectionSocket(static_cast<int>(fd), req, local_port)) {
      cached = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return cached;
}

// Receives exactly dst.size() bytes (large recv calls, a poll timeout of
// `timeout_seconds` between progress).
Status RecvExactly(int fd, std::span<std::byte> dst, int timeout_seconds) {
  size_t got = 0;
  while (got < dst.size()) {
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, std::max(1, timeout_seconds) * 1000);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoToStatus("request body: poll", errno);
    if (r == 0) return DeadlineExceededError("request body: no data for " + std::to_string(timeout_seconds) + " s");
    ssize_t n = recv(fd, dst.data() + got, dst.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0) {
      return UnavailableError("request body: connection closed after " + std::to_string(got) + " of " +
                              std::to_string(dst.size()) + " bytes");
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoToStatus("request body: recv", errno);
    }
  }
  return Status::OK();
}

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json NullableString(const std::optional<std::string>& s) {
  return s ? json(*s) : json(nullptr);
}

uint64_t ReadPeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// An error answer: status, JSON {"error": message}, X-Error-Code when given.
struct HttpError {
  int status = 500;
  std::string message;
  std::string code;  // X-Error-Code
};

int HttpStatusFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kDataLoss:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kFailedPrecondition:
      return 412;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kResourceExhausted:
      return 413;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kUnimplemented:
      return 501;
    default:
      return 500;
  }
}

// "bytes=a-b" | "bytes=a-" | "bytes=-n" against a file of `size` bytes.
// Returns nullopt for "no range"; an error for unsatisfiable / multi ranges.
struct ByteRangeReq {
  uint64_t first = 0, last = 0;  // inclusive
};
Result<std::optional<ByteRangeReq>> ParseRange(std::string_view header, uint64_t size) {
  if (header.empty()) return std::optional<ByteRangeReq>();
  if (!header.starts_with("bytes=")) return InvalidArgumentError("unsupported Range unit");
  std::string_view spec = header.substr(6);
  if (spec.find(',') != std::string_view::npos) {
    return OutOfRangeError("multiple ranges are not supported");
  }
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return InvalidArgumentError("bad Range header");
  auto num = [](std::string_view s, uint64_t* out) {
    if (s.empty() || s.size() > 19) return false;
    uint64_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    *out = v;
    return true;
  };
  std::string_view a = spec.substr(0, dash), b = spec.substr(dash + 1);
  ByteRangeReq r;
  if (a.empty()) {
    uint64_t n;
    if (!num(b, &n)) return InvalidArgumentError("bad Range header");
    if (n == 0 || size == 0) return OutOfRangeError("unsatisfiable range");
    r.first = n >= size ? 0 : size - n;
    r.last = size - 1;
  } else {
    if (!num(a, &r.first)) return InvalidArgumentError("bad Range header");
    if (b.empty()) {
      r.last = size == 0 ? 0 : size - 1;
    } else if (!num(b, &r.last) || r.last < r.first) {
      return InvalidArgumentError("bad Range header");
    }
    if (r.first >= size) return OutOfRangeError("unsatisfiable range");
    if (r.last >= size) r.last = size - 1;
  }
  return std::optional<ByteRangeReq>(r);
}

std::string GuessContentType(std::string_view path) {
  if (path.ends_with(".json")) return "application/json";
  if (path.ends_with(".md")) return "text/markdown";
  if (path.ends_with(".txt")) return "text/plain";
  return "application/octet-stream";
}

// Who is calling.
struct Identity {
  bool presented = false;  // an Authorization header was sent
  bool valid = false;
  bool xet = false;  // a short-lived CAS token
  TokenScope scope = TokenScope::kRead;
  std::optional<std::string> ns;
  std::string name = "anonymous";
};

}  // namespace

struct HubServer::Impl {
  std::shared_ptr<HubStore> store;
  HubServerOptions options;
  httplib::Server http;
  int port = 0;
  std::string secret;

  std::atomic<uint64_t> requests{0}, request_body_bytes{0}, xorbs_received{0},
      xorb_bytes_received{0}, xorbs_inserted{0}, shards_received{0}, blob_bytes_received{0},
      commits{0}, responses_4xx{0}, responses_5xx{0};

  // ---- plumbing ----
  // Handle + a log line with the handler's duration when --log.
  void TimedHandle(const httplib::Request& req, httplib::Response& res,
                   const httplib::ContentReader* reader) {
    auto t0 = std::chrono::steady_clock::now();
    current_content_length = req.has_header("Content-Length")
                                 ? std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10)
                                 : 0;
    Handle(req, res, reader);
    if (options.log_requests) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "megahub: %s %s -> %d (%.1f ms)\n", req.method.c_str(), req.target.c_str(),
                   res.status, ms);
    }
  }
  void Handle(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader* reader);
  Identity Authenticate(const httplib::Request& req);
  std::string MakeXetToken(bool write, const std::string& resource);
  Result<Identity> VerifyXetToken(std::string_view token);

  // ---- route groups ----
  void RouteApiRepos(const std::vector<std::string>& seg, const httplib::Request& req,
                     httplib::Response& res, const httplib::ContentReader* reader,
                     const Identity& who);
  void RouteHfRepo(RepoType type, const std::vector<std::string>& seg, const httplib::Request& req,
                   httplib::Response& res, const httplib::ContentReader* reader,
                   const Identity& who);
  void RouteBuckets(const std::vector<std::string>& seg, const httplib::Request& req,
                    httplib::Response& res, const httplib::ContentReader* reader,
                    const Identity& who);
  void RouteUploads(const std::vector<std::string>& seg, const httplib::Request& req,
                    httplib::Response& res, const httplib::ContentReader* reader,
                    const Identity& who);
  void RouteCas(const std::vector<std::string>& seg, const httplib::Request& req,
                httplib::Response& res, const httplib::ContentReader* reader, const Identity& who);

  // ---- handlers ----
  void ServeResolve(const RepoInfo& repo, const std::string& revision, const std::string& path,
                    const httplib::Request& req, httplib::Response& res);
  void ServeContent(const FileEntry& entry, const httplib::Request& req, httplib::Response& res,
                    const std::string& name);
  // `extra` fields are merged into the 201 answer (single-file routes).
  void NativeCommit(const RepoInfo& repo, const json& body, const Identity& who,
                    httplib::Response& res, const json& extra = json::object());
  // PUT/DELETE /api/repos/{ns}/{name}/files/{path}, POST .../copy: one commit
  // each, through NativeCommit (same parent/conflict rules).
  void FileRoute(const RepoInfo& repo, const std::vector<std::string>& seg,
                 const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader* reader, const Identity& who);
  void CopyRoute(const RepoInfo& repo, const json& body, const Identity& who,
                 httplib::Response& res);
  // GET /v1|v2/reconstructions/{hash}, batch GET/POST /v1/reconstructions.
  void ReconstructionRoute(const std::vector<std::string>& seg, const httplib::Request& req,
                           httplib::Response& res, const httplib::ContentReader* reader);
  void NdjsonCommitRoute(const RepoInfo& repo, const std::string& revision, std::string_view body,
                         const Identity& who, const httplib::Request& req, httplib::Response& res);

  HubServerStats Snapshot() const {
    HubServerStats st;
    st.requests = requests;
    st.request_body_bytes = request_body_bytes;
    st.xorbs_received = xorbs_received;
    st.xorb_bytes_received = xorb_bytes_received;
    st.xorbs_inserted = xorbs_inserted;
    st.shards_received = shards_received;
    st.blob_bytes_received = blob_bytes_received;
    st.commits = commits;
    st.responses_4xx = responses_4xx;
    st.responses_5xx = responses_5xx;
    st.peak_rss_bytes = ReadPeakRss();
    return st;
  }

  // ---- helpers ----
  static void Error(httplib::Response& res, int status, const std::string& message,
                    const std::string& code = "");
  static void ErrorFrom(httplib::Response& res, const Status& s, const std::string& code = "");
  static void Json(httplib::Response& res, const json& body, int status = 200);
  Result<std::string> ReadBody(const httplib::ContentReader* reader, uint64_t limit);
  // Reads the body into `out` (a recycled buffer: no fresh pages per upload).
  // A plain Content-Length body is received from the socket directly after
  // cpp-httplib's first piece (see FindConnectionSocket); anything else
  // (chunked, encoded, no length, socket not found) goes through ReadBody.
  Status ReadBodyInto(const httplib::Request& req, const httplib::ContentReader* reader,
                      uint64_t limit, cas::internal::ByteBuffer* out);
  // Content-Length of the request being handled on this thread (0 = unknown).
  static thread_local uint64_t current_content_length;
  Status CheckRead(const Identity& who, bool is_private, const std::string& ns);
  Status CheckWrite(const Identity& who, const std::string& ns);
  std::string Endpoint(const httplib::Request& req) const;
  Result<RepoInfo> LoadRepoForRead(const std::string& ns, const std::string& name,
                                   const Identity& who, httplib::Response& res);
};

// ---------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------

thread_local uint64_t HubServer::Impl::current_content_length = 0;

void HubServer::Impl::Error(httplib::Response& res, int status, const std::string& message,
                            const std::string& code) {
  res.status = status;
  json body = {{"error", message}};
  res.set_content(Dump(body), "application/json");
  if (!code.empty()) res.set_header("X-Error-Code", code);
  std::string header_msg;
  for (char c : message.substr(0, 300)) header_msg += (c >= 0x20 && c < 0x7f) ? c : '?';
  res.set_header("X-Error-Message", header_msg);
}

void HubServer::Impl::ErrorFrom(httplib::Response& res, const Status& s, const std::string& code) {
  Error(res, HttpStatusFor(s), s.message(), code);
}

void HubServer::Impl::Json(httplib::Response& res, const json& body, int status) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

Result<std::string> HubServer::Impl::ReadBody(const httplib::ContentReader* reader,
                                              uint64_t limit) {
  std::string body;
  if (!reader) return body;
  if (current_content_length > 0 && current_content_length <= limit) {
    body.reserve(static_cast<size_t>(current_content_length));
  }
  bool too_big = false;
  bool ok = (*reader)([&](const char* data, size_t len) {
    request_body_bytes += len;
    if (too_big) return true;  // drain, keeping the connection in sync
    if (body.size() + len > limit) {
      too_big = true;
      body.clear();
      body.shrink_to_fit();
      return true;
    }
    body.append(data, len);
    return true;
  });
  if (too_big) {
    return ResourceExhaustedError("request body exceeds " + std::to_string(limit) + " bytes");
  }
  if (!ok) return UnavailableError("request body could not be read");
  return body;
}

Status HubServer::Impl::ReadBodyInto(const httplib::Request& req, const httplib::ContentReader* reader,
                                     uint64_t limit, cas::internal::ByteBuffer* out) {
  out->Clear();
  if (!reader) return Status::OK();
  const uint64_t len = current_content_length;
  const bool plain = len > 0 && len <= limit && !req.has_header("Transfer-Encoding") &&
                     !req.has_header("Content-Encoding") && !req.is_multipart_form_data();
  if (!plain) {
    MEGA_ASSIGN_OR_RETURN(std::string body, ReadBody(reader, limit));
    out->Append(body.data(), body.size());
    return Status::OK();
  }
  out->Resize(static_cast<size_t>(len));
  const int fd = FindConnectionSocket(req, port);
  uint64_t got = 0;
  bool direct = false;
  Status failure;
  bool ok = (*reader)([&](const char* data, size_t n) {
    request_body_bytes += n;
    if (n > len - got) {
      failure = InvalidArgumentError("request body longer than its Content-Length");
      return false;
    }
    std::memcpy(out->data() + got, data, n);
    got += n;
    if (fd >= 0 && !direct && got < len) {
      // cpp-httplib's first piece is the rest of its 4 KiB stream buffer
      // (or one recv of 4 KiB), so its buffer is empty now and the rest of
      // the body is still in the socket: receive exactly that, then stop
      // cpp-httplib's loop. Exactly the body is consumed, so the keep-alive
      // connection stays in sync; the handler's answer is sent as usual.
      direct = true;
      Status s = RecvExactly(fd, std::span<std::byte>(out->data() + got, len - got),
                             options.read_timeout_seconds);
      if (!s.ok()) {
        // The connection is out of sync now: make sure it is not reused.
        ::shutdown(fd, SHUT_RDWR);
        failure = s;
        return false;
      }
      request_body_bytes += len - got;
      got = len;
      return false;
    }
    return true;
  });
  if (!failure.ok()) return failure;
  if (got == len && (ok || direct)) return Status::OK();
  return UnavailableError("request body could not be read (" + std::to_string(got) + " of " +
                          std::to_string(len) + " bytes)");
}

std::string HubServer::Impl::Endpoint(const httplib::Request& req) const {
  std::string host = req.get_header_value("Host");
  if (host.empty()) host = options.host + ":" + std::to_string(port);
  return "http://" + host;
}

Identity HubServer::Impl::Authenticate(const httplib::Request& req) {
  Identity who;
  std::string auth = req.get_header_value("Authorization");
  if (auth.empty()) return who;
  who.presented = true;
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() <= kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) return who;
  std::string token = auth.substr(kBearer.size());
  if (token.rfind("xet_", 0) == 0) {
    auto x = VerifyXetToken(token);
    if (x.ok()) return *x;
    return who;
  }
  auto info = store->Authenticate(token);
  if (!info.ok()) return who;
  who.valid = true;
  who.scope = info->scope;
  who.ns = info->ns;
  who.name = info->ns ? *info->ns : "token-" + info->id;
  return who;
}

std::string HubServer::Impl::MakeXetToken(bool write, const std::string& resource) {
  int64_t exp = NowMs() / 1000 + options.xet_token_seconds;
  std::string payload = std::string(write ? "w" : "r") + "|" + std::to_string(exp) + "|" + resource;
  std::string hex_payload = ToHex(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  return "xet_" + hex_payload + "." + HmacSha256Hex(secret, payload);
}

Result<Identity> HubServer::Impl::VerifyXetToken(std::string_view token) {
  token.remove_prefix(4);
  size_t dot = token.find('.');
  if (dot == std::string_view::npos || dot % 2 != 0 || dot > 2048) {
    return UnauthenticatedError("malformed xet token");
  }
  std::string payload(dot / 2, '\0');
  if (!FromHex(token.substr(0, dot),
               std::span<uint8_t>(reinterpret_cast<uint8_t*>(payload.data()), payload.size()))
           .ok()) {
    return UnauthenticatedError("malformed xet token");
  }
  if (!ConstantTimeEquals(token.substr(dot + 1), HmacSha256Hex(secret, payload))) {
    return UnauthenticatedError("bad xet token signature");
  }
  size_t p1 = payload.find('|');
  size_t p2 = payload.find('|', p1 == std::string::npos ? 0 : p1 + 1);
  if (p1 == std::string::npos || p2 == std::string::npos) return UnauthenticatedError("malformed xet token");
  int64_t exp = std::atoll(payload.substr(p1 + 1, p2 - p1 - 1).c_str());
  if (exp < NowMs() / 1000) return UnauthenticatedError("xet token expired");
  Identity who;
  who.presented = who.valid = who.xet = true;
  who.scope = payload[0] == 'w' ? TokenScope::kWrite : TokenScope::kRead;
  who.name = "xet:" + payload.substr(p2 + 1);
  return who;
}

Status HubServer::Impl::CheckRead(const Identity& who, bool is_private, const std::string& ns) {
  if (who.presented && !who.valid) return UnauthenticatedError("invalid token");
  if (!is_private) return Status::OK();
  if (!who.valid || who.xet) return UnauthenticatedError("a token is required for this private repository");
  if (who.ns && *who.ns != ns) {
    return PermissionDeniedError("token is limited to namespace '" + *who.ns + "'");
  }
  return Status::OK();
}

Status HubServer::Impl::CheckWrite(const Identity& who, const std::string& ns) {
  if (!who.presented) return UnauthenticatedError("a write token is required");
  if (!who.valid || who.xet) return UnauthenticatedError("invalid token");
  if (who.scope != TokenScope::kWrite) return PermissionDeniedError("token is read-only");
  if (who.ns && *who.ns != ns) {
    return PermissionDeniedError("token may not write to namespace '" + ns + "' (limited to '" +
                                 *who.ns + "')");
  }
  return Status::OK();
}

Result<RepoInfo> HubServer::Impl::LoadRepoForRead(const std::string& ns, const std::string& name,
                                                  const Identity& who, httplib::Response& res) {
  auto repo = store->GetRepo(ns + "/" + name);
  if (!repo.ok()) {
    ErrorFrom(res, repo.status(), "RepoNotFound");
    return repo.status();
  }
  Status s = CheckRead(who, repo->is_private, ns);
  if (!s.ok()) {
    ErrorFrom(res, s, s.code() == StatusCode::kUnauthenticated ? "RepoNotFound" : "");
    return s;
  }
  return repo;
}

json RepoJson(const RepoInfo& r, const std::optional<std::string>& sha = std::nullopt) {
  json j = {{"repo_id", r.id()},
            {"id", r.id()},
            {"repo_type", std::string(RepoTypeName(r.type))},
            {"private", r.is_private},
            {"owner", r.ns},
            {"created_at", FormatTimestamp(r.created_ms)},
            {"updated_at", FormatTimestamp(r.updated_ms)},
            {"description", r.description},
            {"tags", json::array()},
            {"license", ""},
            {"likes", 0},
            {"downloads", 0}};
  if (sha) j["sha"] = *sha;
  return j;
}

json CommitJson(const CommitInfo& c, bool with_files) {
  json j = {{"revision", c.id},
            {"id", c.id},
            {"parent_revision", NullableString(c.parent)},
            {"message", c.message},
            {"title", c.message},
            {"author", c.author},
            {"authors", json::array({c.author})},
            {"created_at", FormatTimestamp(c.created_ms)},
            {"description", c.description}};
  if (with_files) {
    json files = json::array();
    for (const auto& f : c.changes) {
      files.push_back({{"path", f.path},
                       {"change", f.change},
                       {"size", f.size},
                       {"sha256", f.sha256.empty() ? json(nullptr) : json(f.sha256)},
                       {"previous_sha256",
                        f.previous_sha256.empty() ? json(nullptr) : json(f.previous_sha256)}});
    }
    j["files"] = std::move(files);
  }
  return j;
}

json RefJson(const RefInfo& r) {
  return {{"name", r.name},
          {"ref", (r.is_tag ? "refs/tags/" : "refs/heads/") + r.name},
          {"target_revision", r.target},
          {"targetCommit", r.target},
          {"message", NullableString(r.message)},
          {"updated_at", FormatTimestamp(r.updated_ms)}};
}

json BucketEntryJson(const BucketEntry& e) {
  json j = {{"type", "file"},
            {"path", e.path},
            {"size", e.size},
            {"xetHash", e.xet_hash},
            {"mtime", e.mtime_ms ? json(FormatTimestamp(e.mtime_ms)) : json(nullptr)},
            {"uploadedAt", FormatTimestamp(e.uploaded_ms)}};
  if (!e.sha256.empty()) j["sha256"] = e.sha256;
  if (!e.content_type.empty()) j["contentType"] = e.content_type;
  return j;
}

// ---------------------------------------------------------------------------
// dispatch
// ---------------------------------------------------------------------------

void HubServer::Impl::Handle(const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader* reader) {
  // httplib would slice the response body again by the request's Range;
  // this server answers ranges itself (exact 206s, fetching only what is
  // needed), so the parsed ranges are dropped. The Request object itself is
  // not const inside httplib.
  const_cast<httplib::Request&>(req).ranges.clear();
  ++requests;
  std::string target = req.target;
  size_t q = target.find('?');
  std::string raw_path = q == std::string::npos ? target : target.substr(0, q);
  std::vector<std::string> seg;
  {
    size_t start = 1;
    if (raw_path.empty() || raw_path[0] != '/') {
      Error(res, 400, "bad request target");
      return;
    }
    while (start <= raw_path.size()) {
      size_t slash = raw_path.find('/', start);
      std::string part = raw_path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      auto decoded = PercentDecode(part);
      if (!decoded.ok()) {
        Error(res, 400, decoded.status().message());
        return;
      }
      seg.push_back(*std::move(decoded));
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    while (!seg.empty() && seg.back().empty()) seg.pop_back();
  }
  Identity who = Authenticate(req);
  auto starts = [&](std::initializer_list<const char*> parts) {
    if (seg.size() < parts.size()) return false;
    size_t i = 0;
    for (const char* p : parts) {
      if (seg[i++] != p) return false;
    }
    return true;
  };
  try {
    if (starts({"api", "repos"})) {
      if (seg.size() == 2) {
        if (req.method == "POST") {
          auto body = ReadBody(reader, options.max_json_bytes);
          if (!body.ok()) return ErrorFrom(res, body.status());
          json j = json::parse(*body, nullptr, false);
          if (j.is_discarded() || !j.is_object()) return Error(res, 400, "body is not a JSON object");
          std::string repo_id = j.value("repo_id", "");
          auto parts = SplitRepoId(repo_id);
          if (!parts.ok()) return ErrorFrom(res, parts.status());
          Status s = CheckWrite(who, parts->first);
          if (!s.ok()) return ErrorFrom(res, s);
          RepoSpec spec;
          spec.ns = parts->first;
          spec.name = parts->second;
          auto type = RepoTypeFromName(j.value("repo_type", "model"));
          if (!type.ok()) return ErrorFrom(res, type.status());
          spec.type = *type;
          spec.is_private = j.value("private", false);
          spec.description = j.contains("description") && j["description"].is_string()
                                 ? j["description"].get<std::string>() : "";
          auto repo = store->CreateRepo(spec, j.value("exist_ok", false));
          if (!repo.ok()) return ErrorFrom(res, repo.status());
          return Json(res, RepoJson(*repo), 201);
        }
        if (req.method == "GET") {
          std::string owner = req.has_param("owner") ? req.get_param_value("owner") : "";
          std::string after = req.has_param("cursor") ? req.get_param_value("cursor") : "";
          size_t limit = req.has_param("limit") ? std::stoul(req.get_param_value("limit")) : 100;
          limit = std::clamp<size_t>(limit, 1, 1000);
          // Optional filters: type (model|dataset|space, also plural) and q
          // (case-insensitive substring of the repo id).
          std::optional<RepoType> type;
          if (req.has_param("type") && !req.get_param_value("type").empty()) {
            std::string t = req.get_param_value("type");
            if (t.size() > 1 && t.back() == 's') t.pop_back();
            auto parsed = RepoTypeFromName(t);
            if (!parsed.ok()) return ErrorFrom(res, parsed.status());
            type = *parsed;
          }
          std::string q = ToLower(req.get_param_value("q"));
          json arr = json::array();
          std::optional<std::string> next;
          std::string cursor = after;
          bool exhausted = false;
          // Page through the store until `limit` visible matches (+1 to know
          // whether there is more) or the end.
          while (!exhausted && !next) {
            auto repos = store->ListRepos(owner, cursor, 256);
            if (!repos.ok()) return ErrorFrom(res, repos.status());
            exhausted = repos->size() < 256;
            for (const RepoInfo& r : *repos) {
              cursor = r.id();
              if (r.is_private && !CheckRead(who, true, r.ns).ok()) continue;
              if (type && r.type != *type) continue;
              if (!q.empty() && ToLower(r.id()).find(q) == std::string::npos) continue;
              if (arr.size() == limit) {
                next = arr.back()["repo_id"].get<std::string>();
                break;
              }
              arr.push_back(RepoJson(r));
            }
          }
          return Json(res, {{"repos", arr}, {"next_cursor", NullableString(next)}});
        }
        return Error(res, 405, "method not allowed");
      }
      return RouteApiRepos(seg, req, res, reader, who);
    }
    if (starts({"api", "uploads"})) return RouteUploads(seg, req, res, reader, who);
    if (starts({"api", "buckets"}) || (seg.size() >= 4 && seg[0] == "buckets" && seg[3] == "resolve")) {
      return RouteBuckets(seg, req, res, reader, who);
    }
    if (seg.size() >= 4 && seg[0] == "api" &&
        (seg[1] == "models" || seg[1] == "datasets" || seg[1] == "spaces")) {
      return RouteHfRepo(*RepoTypeFromName(seg[1]), seg, req, res, reader, who);
    }
    if (starts({"v1"}) || starts({"v2", "reconstructions"})) return RouteCas(seg, req, res, reader, who);
    // The client also knows an "mcps" repository type (preupload/commit/
    // xet tokens); this hub has none, so every such repository is missing.
    if (seg.size() >= 4 && seg[0] == "api" && seg[1] == "mcps") {
      return Error(res, 404, "repository type 'mcp' is not served by this hub (repo " + seg[2] + "/" +
                                 seg[3] + ")",
                   "RepoNotFound");
    }
    if (starts({"api", "whoami"}) || starts({"api", "whoami-v2"})) {
      if (!who.valid) return Error(res, 401, "invalid or missing token");
      return Json(res, {{"name", who.name},
                        {"type", "user"},
                        {"auth", {{"accessToken", {{"role", who.scope == TokenScope::kWrite ? "write" : "read"}}}}}});
    }
    if (starts({"api", "stats"})) {
      HubServerStats st = Snapshot();
      return Json(res, {{"requests", st.requests},
                        {"request_body_bytes", st.request_body_bytes},
                        {"xorbs_received", st.xorbs_received},
                        {"xorb_bytes_received", st.xorb_bytes_received},
                        {"xorbs_inserted", st.xorbs_inserted},
                        {"shards_received", st.shards_received},
                        {"blob_bytes_received", st.blob_bytes_received},
                        {"commits", st.commits},
                        {"responses_4xx", st.responses_4xx},
                        {"responses_5xx", st.responses_5xx},
                        {"peak_rss_bytes", st.peak_rss_bytes}});
    }
    // HF-style download URL: /{ns}/{name}/resolve/{rev}/{path} (also
    // /datasets/... and /spaces/...).
    {
      size_t base = (!seg.empty() && (seg[0] == "datasets" || seg[0] == "spaces")) ? 1 : 0;
      if (seg.size() >= base + 5 && seg[base + 2] == "resolve" &&
          (req.method == "GET" || req.method == "HEAD")) {
        auto repo = LoadRepoForRead(seg[base], seg[base + 1], who, res);
        if (!repo.ok()) return;
        std::string path;
        for (size_t i = base + 4; i < seg.size(); ++i) path += (path.empty() ? "" : "/") + seg[i];
        return ServeResolve(*repo, seg[base + 3], path, req, res);
      }
    }
    Error(res, 404, "no route for " + req.method + " " + raw_path);
  } catch (const std::exception& e) {
    // nlohmann::json accessors throw on type mismatches in client JSON.
    Error(res, 400, std::string("malformed request: ") + e.what());
  }
}

// /api/repos/{ns}/{name}[/...]
void HubServer::Impl::RouteApiRepos(const std::vector<std::string>& seg,
                                    const httplib::Request& req, httplib::Response& res,
                                    const httplib::ContentReader* reader, const Identity& who) {
  if (seg.size() < 4) return Error(res, 404, "no route");
  const std::string& ns = seg[2];
  const std::string& name = seg[3];
  std::string repo_id = ns + "/" + name;
  const std::string& m = req.method;
  if (seg.size() == 4) {
    if (m == "GET") {
      auto repo = LoadRepoForRead(ns, name, who, res);
      if (!repo.ok()) return;
      auto head = store->ResolveRevision(repo_id, "main");
      return Json(res, RepoJson(*repo, head.ok() ? std::optional<std::string>(*head) : std::nullopt));
    }
    if (m == "DELETE") {
      Status s = CheckWrite(who, ns);
      if (!s.ok()) return ErrorFrom(res, s);
      s = store->DeleteRepo(repo_id);
      if (!s.ok()) return ErrorFrom(res, s, "RepoNotFound");
      return Json(res, json::object());
    }
    return Error(res, 405, "method not allowed");
  }
  const std::string& what = seg[4];

  // Resolve: /resolve/{path...}?revision=R or /resolve?revision=R&path=P.
  if (what == "resolve" && (m == "GET" || m == "HEAD")) {
    auto repo = LoadRepoForRead(ns, name, who, res);
    if (!repo.ok()) return;
    std::string path;
    if (seg.size() > 5) {
      for (size_t i = 5; i < seg.size(); ++i) path += (i > 5 ? "/" : "") + seg[i];
    } else {
      path = req.get_param_value("path");
    }
    std::string rev = req.has_param("revision") ? req.get_param_value("revision") : "main";
    return ServeResolve(*repo, rev, path, req, res);
  }

  bool write = m == "POST" || m == "PUT" || m == "DELETE";
  RepoInfo repo;
  if (write) {
    Status s = CheckWrite(who, ns);
    if (!s.ok()) return ErrorFrom(res, s);
    auto r = store->GetRepo(repo_id);
    if (!r.ok()) return ErrorFrom(res, r.status(), "RepoNotFound");
    repo = *r;
  } else {
    auto r = LoadRepoForRead(ns, name, who, res);
    if (!r.ok()) return;
    repo = *r;
  }

  if (what == "commits") {
    if (seg.size() == 6 && m == "GET") {
      auto c = store->GetCommit(repo_id, seg[5], true);
      if (!c.ok()) return ErrorFrom(res, c.status(), "RevisionNotFound");
      return Json(res, CommitJson(*c, true));
    }
    if (seg.size() == 5 && m == "GET") {
      std::string rev = req.has_param("revision") ? req.get_param_value("revision") : "main";
      size_t limit = req.has_param("limit") ? std::stoul(req.get_param_value("limit")) : 100;
      limit = std::clamp<size_t>(limit, 1, 1000);
      size_t offset = req.has_param("cursor") && !req.get_param_value("cursor").empty()
                          ? std::stoul(req.get_param_value("cursor")) : 0;
      auto list = store->ListCommits(repo_id, rev, offset, limit + 1);
      if (!list.ok()) return ErrorFrom(res, list.status(), "RevisionNotFound");
      json arr = json::array();
      for (size_t i = 0; i < list->size() && i < limit; ++i) arr.push_back(CommitJson((*list)[i], false));
      json next = list->size() > limit ? json(std::to_string(offset + limit)) : json(nullptr);
      return Json(res, {{"commits", arr}, {"next_cursor", next}});
    }
    if (seg.size() == 5 && m == "POST") {
      auto body = ReadBody(reader, options.max_json_bytes);
      if (!body.ok()) return ErrorFrom(res, body.status());
      json j = json::parse(*body, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return Error(res, 400, "body is not a JSON object");
      return NativeCommit(repo, j, who, res);
    }
  }
  if (what == "files" && seg.size() == 5 && m == "GET") {
    std::string rev = req.has_param("revision") ? req.get_param_value("revision") : "main";
    auto commit = store->ResolveRevision(repo_id, rev);
    if (!commit.ok()) return ErrorFrom(res, commit.status(), "RevisionNotFound");
    size_t limit = req.has_param("limit") ? std::stoul(req.get_param_value("limit")) : 1000;
    limit = std::clamp<size_t>(limit, 1, 10000);
    std::string cursor = req.get_param_value("cursor");
    std::string prefix = req.get_param_value("prefix");
    auto files = store->ListFiles(repo_id, *commit, prefix, cursor, limit + 1);
    if (!files.ok()) return ErrorFrom(res, files.status());
    json arr = json::array();
    for (size_t i = 0; i < files->size() && i < limit; ++i) {
      const auto& f = (*files)[i];
      arr.push_back({{"path", f.path},
                     {"size", f.size},
                     {"sha256", f.sha256},
                     {"xet_hash", f.xet_hash},
                     {"content_type", GuessContentType(f.path)}});
    }
    json next = files->size() > limit ? json((*files)[limit - 1].path) : json(nullptr);
    return Json(res, {{"revision", *commit}, {"files", arr}, {"next_cursor", next}});
  }
  if (what == "refs") {
    if (seg.size() == 5 && m == "GET") {
      auto refs = store->ListRefs(repo_id);
      if (!refs.ok()) return ErrorFrom(res, refs.status());
      json branches = json::array(), tags = json::array();
      for (const auto& r : *refs) (r.is_tag ? tags : branches).push_back(RefJson(r));
      return Json(res, {{"branches", branches}, {"tags", tags}, {"converts", json::array()},
                        {"pullRequests", json::array()}});
    }
    if (seg.size() == 6 && (seg[5] == "branches" || seg[5] == "tags") && m == "POST") {
      auto body = ReadBody(reader, options.max_json_bytes);
      if (!body.ok()) return ErrorFrom(res, body.status());
      json j = json::parse(*body, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return Error(res, 400, "body is not a JSON object");
      std::string rname = j.value("name", j.value("tag", ""));
      std::string rev = j.value("revision", "main");
      std::optional<std::string> msg;
      if (j.contains("message") && j["message"].is_string()) msg = j["message"].get<std::string>();
      auto ref = store->CreateRef(repo_id, rname, rev, seg[5] == "tags", j.value("exist_ok", false), msg);
      if (!ref.ok()) return ErrorFrom(res, ref.status(), ref.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
      return Json(res, RefJson(*ref), 201);
    }
    if (seg.size() >= 7 && (seg[5] == "branches" || seg[5] == "tags") && m == "DELETE") {
      std::string rname;
      for (size_t i = 6; i < seg.size(); ++i) rname += (i > 6 ? "/" : "") + seg[i];
      Status s = store->DeleteRef(repo_id, rname, seg[5] == "tags");
      if (!s.ok()) return ErrorFrom(res, s, "RevisionNotFound");
      return Json(res, json::object());
    }
  }
  if (what == "blobs" && seg.size() == 6 && m == "PUT") {
    std::string want = ToLower(seg[5]);
    if (!IsSha256Hex(want)) return Error(res, 400, "blob id '" + seg[5] + "' is not a sha256 hex digest");
    uint64_t declared = req.has_header("X-Mega-Size")
                            ? std::strtoull(req.get_header_value("X-Mega-Size").c_str(), nullptr, 10)
                            : req.get_header_value<uint64_t>("Content-Length");
    if (declared > options.max_object_bytes) {
      return Error(res, 413, "blob of " + std::to_string(declared) + " bytes exceeds " +
                                 std::to_string(options.max_object_bytes));
    }
    auto upload = store->BeginUpload("blob " + want);
    if (!upload.ok()) return ErrorFrom(res, upload.status());
    (*upload)->set_on_close(nullptr);
    Status write_status;
    bool ok = (*reader)([&](const char* data, size_t len) {
      request_body_bytes += len;
      blob_bytes_received += len;
      if (!write_status.ok()) return true;
      write_status = (*upload)->Append(std::as_bytes(std::span<const char>(data, len)));
      return true;
    });
    if (!ok) return Error(res, 400, "blob body could not be read");
    if (!write_status.ok()) return ErrorFrom(res, write_status);
    Status s = (*upload)->Close();
    if (!s.ok()) return ErrorFrom(res, s);
    const FileEntry& e = (*upload)->entry();
    if (e.sha256 != want) {
      return Error(res, 400, "blob sha256 mismatch: body hashes to " + e.sha256 + ", URL says " + want);
    }
    if (e.size != declared) {
      return Error(res, 400, "blob size mismatch: received " + std::to_string(e.size) +
                                 " bytes, X-Mega-Size says " + std::to_string(declared));
    }
    s = store->RecordContent(e, /*sha256_verified=*/true);
    if (!s.ok()) return ErrorFrom(res, s);
    return Json(res, {{"sha256", e.sha256}, {"size", e.size}, {"xet_hash", e.xet_hash}});
  }
  if (what == "files" && seg.size() >= 6 && (m == "PUT" || m == "DELETE")) {
    return FileRoute(repo, seg, req, res, reader, who);
  }
  if (what == "copy" && seg.size() == 5 && m == "POST") {
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    json j = json::parse(*body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Error(res, 400, "body is not a JSON object");
    return CopyRoute(repo, j, who, res);
  }
  Error(res, 404, "no route for " + m + " " + req.path);
}

// PUT /api/repos/{ns}/{name}/files/{path}?revision=R&commit_message=M
//   body = the file; X-Mega-Sha256 / X-Mega-Size checked when sent.
// DELETE /api/repos/{ns}/{name}/files/{path}?revision=R&commit_message=M
// Both make exactly one commit on branch R (default main) via NativeCommit;
// an optional parent_revision query parameter is a compare-and-swap (409).
void HubServer::Impl::FileRoute(const RepoInfo& repo, const std::vector<std::string>& seg,
                                const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader* reader, const Identity& who) {
  std::string path;
  for (size_t i = 5; i < seg.size(); ++i) path += (i > 5 ? "/" : "") + seg[i];
  Status ps = ValidateRepoPath(path);
  if (!ps.ok()) return Error(res, 400, ps.message());
  std::string branch = req.has_param("revision") ? req.get_param_value("revision") : "main";
  if (branch.empty()) return Error(res, 400, "empty revision");
  bool put = req.method == "PUT";
  // The target must be an existing branch (tags and commit ids are not writable).
  auto refs = store->ListRefs(repo.id());
  if (!refs.ok()) return ErrorFrom(res, refs.status());
  std::optional<std::string> head;
  for (const auto& r : *refs) {
    if (!r.is_tag && r.name == branch) head = r.target;
  }
  if (!head) {
    return Error(res, 404, "branch '" + branch + "' not found in " + repo.id(), "RevisionNotFound");
  }
  json body = {{"revision", branch},
               {"commit_message", req.has_param("commit_message")
                                      ? req.get_param_value("commit_message")
                                      : std::string(put ? "Upload " : "Delete ") + path}};
  if (req.has_param("commit_description")) {
    body["commit_description"] = req.get_param_value("commit_description");
  }
  if (req.has_param("parent_revision")) body["parent_revision"] = req.get_param_value("parent_revision");
  json extra = {{"repo_id", repo.id()}, {"path", path}};
  if (!put) {
    auto entry = store->GetFile(repo.id(), *head, path);
    if (!entry.ok()) return ErrorFrom(res, entry.status(), "EntryNotFound");
    body["operations"] = json::array({{{"operation", "delete"}, {"path", path}}});
    return NativeCommit(repo, body, who, res, extra);
  }
  std::string want_sha;
  if (req.has_header("X-Mega-Sha256")) {
    want_sha = ToLower(req.get_header_value("X-Mega-Sha256"));
    if (!IsSha256Hex(want_sha)) return Error(res, 400, "X-Mega-Sha256 is not a sha256 hex digest");
  }
  std::optional<uint64_t> want_size;
  if (req.has_header("X-Mega-Size")) {
    std::string v = req.get_header_value("X-Mega-Size");
    char* end = nullptr;
    uint64_t n = std::strtoull(v.c_str(), &end, 10);
    if (v.empty() || !end || *end) return Error(res, 400, "X-Mega-Size '" + v + "' is not a number");
    want_size = n;
  }
  uint64_t declared = want_size ? *want_size : current_content_length;
  if (declared > options.max_object_bytes || current_content_length > options.max_object_bytes) {
    return Error(res, 413, "file of " + std::to_string(std::max(declared, current_content_length)) +
                               " bytes exceeds " + std::to_string(options.max_object_bytes) +
                               " (use /api/uploads for large files)");
  }
  auto upload = store->BeginUpload("file " + repo.id() + "/" + path);
  if (!upload.ok()) return ErrorFrom(res, upload.status());
  (*upload)->set_on_close(nullptr);
  Status write_status;
  uint64_t got = 0;
  bool ok = !reader || (*reader)([&](const char* data, size_t len) {
    request_body_bytes += len;
    blob_bytes_received += len;
    got += len;
    if (!write_status.ok()) return true;
    if (got > options.max_object_bytes) {
      write_status = ResourceExhaustedError("file body exceeds " + std::to_string(options.max_object_bytes) + " bytes");
      return true;
    }
    write_status = (*upload)->Append(std::as_bytes(std::span<const char>(data, len)));
    return true;
  });
  if (!ok) return Error(res, 400, "file body could not be read");
  if (!write_status.ok()) return ErrorFrom(res, write_status);
  Status s = (*upload)->Close();
  if (!s.ok()) return ErrorFrom(res, s);
  const FileEntry& e = (*upload)->entry();
  if (!want_sha.empty() && e.sha256 != want_sha) {
    return Error(res, 400, "sha256 mismatch: body hashes to " + e.sha256 + ", X-Mega-Sha256 says " + want_sha);
  }
  if (want_size && e.size != *want_size) {
    return Error(res, 400, "size mismatch: received " + std::to_string(e.size) +
                               " bytes, X-Mega-Size says " + std::to_string(*want_size));
  }
  s = store->RecordContent(e, /*sha256_verified=*/true);
  if (!s.ok()) return ErrorFrom(res, s);
  body["operations"] = json::array({{{"operation", "add"},
                                     {"path", path},
                                     {"size", e.size},
                                     {"sha256", e.sha256},
                                     {"xet_hash", e.xet_hash}}});
  extra["size"] = e.size;
  extra["sha256"] = e.sha256;
  NativeCommit(repo, body, who, res, extra);
}

// POST /api/repos/{ns}/{name}/copy
//   {"source_path", "path", "revision"?, "source_revision"?, "source_repo_id"?,
//    "commit_message"?, "commit_description"?, "parent_revision"?}
// One commit on `revision` (default main) adding `path` with the content of
// `source_path` (same repo at the branch head unless source_repo_id /
// source_revision say otherwise); no bytes are copied (content-addressed).
void HubServer::Impl::CopyRoute(const RepoInfo& repo, const json& body, const Identity& who,
                                httplib::Response& res) {
  auto str = [&](const char* key) -> std::string {
    return body.contains(key) && body[key].is_string() ? body[key].get<std::string>() : "";
  };
  std::string path = str("path"), source_path = str("source_path");
  if (path.empty() || source_path.empty()) {
    return Error(res, 400, "copy needs \"source_path\" and \"path\"");
  }
  for (const std::string* p : {&path, &source_path}) {
    Status ps = ValidateRepoPath(*p);
    if (!ps.ok()) return Error(res, 400, ps.message());
  }
  std::string branch = body.contains("revision") ? str("revision") : "main";
  if (branch.empty()) return Error(res, 400, "revision must be a non-empty string");
  std::string source_repo = str("source_repo_id");
  if (source_repo.empty()) source_repo = repo.id();
  auto src = store->GetRepo(source_repo);
  if (!src.ok()) return ErrorFrom(res, src.status(), "RepoNotFound");
  Status rs = CheckRead(who, src->is_private, src->ns);
  if (!rs.ok()) return ErrorFrom(res, rs);
  std::string source_rev = str("source_revision");
  auto src_commit = store->ResolveRevision(source_repo, source_rev.empty() ? branch : source_rev);
  if (!src_commit.ok()) return ErrorFrom(res, src_commit.status(), "RevisionNotFound");
  auto entry = store->GetFile(source_repo, *src_commit, source_path);
  if (!entry.ok()) return ErrorFrom(res, entry.status(), "EntryNotFound");
  json commit = {{"revision", branch},
                 {"commit_message", body.contains("commit_message") && body["commit_message"].is_string()
                                        ? body["commit_message"].get<std::string>()
                                        : "Copy " + source_path + " to " + path}};
  if (body.contains("commit_description")) commit["commit_description"] = body["commit_description"];
  if (body.contains("parent_revision")) commit["parent_revision"] = body["parent_revision"];
  // Pin the source to the commit resolved above, so a concurrent commit
  // cannot change what is copied.
  commit["operations"] = json::array({{{"operation", "copy"},
                                       {"path", path},
                                       {"source_repo_id", source_repo},
                                       {"source_path", source_path},
                                       {"source_revision", *src_commit}}});
  NativeCommit(repo, commit, who, res,
               {{"repo_id", repo.id()}, {"path", path}, {"source_path", source_path},
                {"source_revision", *src_commit}, {"size", entry->size}, {"sha256", entry->sha256}});
}

void HubServer::Impl::NativeCommit(const RepoInfo& repo, const json& body, const Identity& who,
                                   httplib::Response& res, const json& extra) {
  CommitRequest cr;
  cr.repo = repo.id();
  cr.branch = body.value("revision", "main");
  cr.message = body.value("commit_message", "");
  cr.description = body.contains("commit_description") && body["commit_description"].is_string()
                       ? body["commit_description"].get<std::string>() : "";
  cr.author = who.name;
  cr.rebase = body.value("rebase", false);
  // megahub extensions used by megackpt's own client.
  cr.create_branch = body.value("create_branch", false);
  cr.ignore_missing_deletes = body.value("ignore_missing_deletes", false);
  if (body.contains("parent_revision")) {
    const json& p = body["parent_revision"];
    if (p.is_null()) {
      // "The branch must not exist yet."
      auto head = store->ResolveRevision(cr.repo, cr.branch);
      if (head.ok()) {
        return Error(res, 409, "conflict: branch '" + cr.branch + "' already exists (parent_revision is null)");
      }
      cr.create_branch = true;
    } else if (p.is_string()) {
      cr.parent = ToLower(p.get<std::string>());
      if (!IsCommitId(*cr.parent)) {
        // Accept a branch/tag name by resolving it.
        auto resolved = store->ResolveRevision(cr.repo, p.get<std::string>());
        if (!resolved.ok()) return ErrorFrom(res, resolved.status(), "RevisionNotFound");
        cr.parent = *resolved;
      }
    } else {
      return Error(res, 400, "parent_revision must be a string or null");
    }
  }
  if (body.contains("operations") && !body["operations"].is_array()) {
    return Error(res, 400, "operations must be an array");
  }
  const json ops = body.value("operations", json::array());
  for (size_t i = 0; i < ops.size(); ++i) {
    const json& o = ops[i];
    if (!o.is_object()) return Error(res, 400, "operations[" + std::to_string(i) + "] is not an object");
    std::string kind = o.value("operation", "");
    CommitOperation op;
    op.path = o.value("path", "");
    Status ps = ValidateRepoPath(op.path);
    if (!ps.ok()) return Error(res, 400, "operations[" + std::to_string(i) + "]: " + ps.message());
    if (kind == "add") {
      op.kind = CommitOperation::Kind::kAdd;
      std::string sha = ToLower(o.value("sha256", ""));
      uint64_t size = o.value("size", uint64_t{0});
      std::string xet = o.contains("xet_hash") && o["xet_hash"].is_string() ? o["xet_hash"].get<std::string>() : "";
      if (!xet.empty()) {
        op.entry.xet_hash = ToLower(xet);
        op.entry.size = size;
        op.entry.sha256 = sha;
      } else {
        if (!IsSha256Hex(sha)) {
          return Error(res, 400, "operations[" + std::to_string(i) + "]: sha256 missing or malformed");
        }
        auto found = store->FindBySha256(sha);
        if (!found.ok()) return ErrorFrom(res, found.status());
        if (!*found) {
          return Error(res, 400, "operations[" + std::to_string(i) + "]: object " + sha +
                                     " for '" + op.path + "' was not staged (PUT blobs/{sha256} first)");
        }
        if ((*found)->size != size) {
          return Error(res, 400, "operations[" + std::to_string(i) + "]: size " + std::to_string(size) +
                                     " does not match the staged object (" +
                                     std::to_string((*found)->size) + " bytes)");
        }
        op.entry = **found;
      }
    } else if (kind == "delete") {
      op.kind = CommitOperation::Kind::kDelete;
    } else if (kind == "delete_folder" || kind == "deleteFolder") {
      op.kind = CommitOperation::Kind::kDeleteFolder;
    } else if (kind == "copy") {
      op.kind = CommitOperation::Kind::kCopy;
      op.source_repo = o.value("source_repo_id", "");
      op.source_path = o.value("source_path", "");
      op.source_revision = o.contains("source_revision") && o["source_revision"].is_string()
                               ? o["source_revision"].get<std::string>() : "";
      if (!op.source_repo.empty() && op.source_repo != cr.repo) {
        auto src = store->GetRepo(op.source_repo);
        if (!src.ok()) return ErrorFrom(res, src.status(), "RepoNotFound");
        Status s = CheckRead(who, src->is_private, src->ns);
        if (!s.ok()) return ErrorFrom(res, s);
      }
    } else {
      return Error(res, 400, "operations[" + std::to_string(i) + "]: unknown operation '" + kind + "'");
    }
    cr.ops.push_back(std::move(op));
  }
  auto c = store->Commit(cr);
  if (!c.ok()) {
    return ErrorFrom(res, c.status(), c.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
  }
  ++commits;
  json j = CommitJson(*c, true);
  j["commit_url"] = "/" + cr.repo + "/commit/" + c->id;
  for (const auto& [k, v] : extra.items()) j[k] = v;
  Json(res, j, 201);
}

// ---------------------------------------------------------------------------
// resolve (downloads)
// ---------------------------------------------------------------------------

void HubServer::Impl::ServeResolve(const RepoInfo& repo, const std::string& revision,
                                   const std::string& path, const httplib::Request& req,
                                   httplib::Response& res) {
  Status ps = ValidateRepoPath(path);
  if (!ps.ok()) return Error(res, 400, ps.message());
  auto commit = store->ResolveRevision(repo.id(), revision);
  if (!commit.ok()) return ErrorFrom(res, commit.status(), "RevisionNotFound");
  auto entry = store->GetFile(repo.id(), *commit, path);
  if (!entry.ok()) return ErrorFrom(res, entry.status(), "EntryNotFound");
  res.set_header("X-Repo-Commit", *commit);
  res.set_header("ETag", "\"" + entry->sha256 + "\"");
  res.set_header("X-Linked-Etag", "\"" + entry->sha256 + "\"");
  res.set_header("X-Linked-Size", std::to_string(entry->size));
  if (entry->size > 0) {
    res.set_header("X-Xet-Hash", entry->xet_hash);
    res.set_header("Link", "<" + Endpoint(req) + "/api/" + std::string(RepoTypePlural(repo.type)) +
                               "/" + repo.id() + "/xet-read-token/" + *commit + ">; rel=\"xet-auth\"");
  }
  ServeContent(*entry, req, res, repo.id() + "@" + *commit + "/" + path);
}

void HubServer::Impl::ServeContent(const FileEntry& entry, const httplib::Request& req,
                                   httplib::Response& res, const std::string& name) {
  res.set_header("Accept-Ranges", "bytes");
  auto range = ParseRange(req.get_header_value("Range"), entry.size);
  if (!range.ok()) {
    if (range.status().code() == StatusCode::kOutOfRange) {
      res.set_header("Content-Range", "bytes */" + std::to_string(entry.size));
      return Error(res, 416, range.status().message());
    }
    return ErrorFrom(res, range.status());
  }
  uint64_t first = 0, length = entry.size;
  res.status = 200;
  if (*range) {
    first = (*range)->first;
    length = (*range)->last - first + 1;
    res.status = 206;
    res.set_header("Content-Range", "bytes " + std::to_string(first) + "-" +
                                        std::to_string((*range)->last) + "/" +
                                        std::to_string(entry.size));
  }
  std::string type = GuessContentType(entry.path.empty() ? name : entry.path);
  if (req.method == "HEAD") {
    res.set_header("Content-Length", std::to_string(length));
    res.set_header("Content-Type", type);
    return;
  }
  if (length == 0) {
    res.set_content("", type);
    return;
  }
  auto hash = cas::MerkleHash::FromHex(entry.xet_hash);
  if (!hash.ok()) return ErrorFrom(res, hash.status());
  cas::MerkleHash h = *hash;
  HubStore* st = store.get();
  res.set_content_provider(
      length, type,
      [st, h, first, length, name](size_t offset, size_t, httplib::DataSink& sink) {
        // One call streams the whole requested range; `offset` is where a
        // previous call stopped (never, unless a write failed).
        Status s = st->cas().Download(
            h, cas::ByteRange{first + offset, length - offset},
            [&sink](std::span<const std::byte> data) -> Status {
              if (!sink.write(reinterpret_cast<const char*>(data.data()), data.size())) {
                return UnavailableError("client went away");
              }
              return Status::OK();
            });
        if (!s.ok() && s.code() != StatusCode::kUnavailable) {
          std::fprintf(stderr, "megahub: download of %s failed: %s\n", name.c_str(),
                       s.ToString().c_str());
        }
        return s.ok();
      });
}

// ---------------------------------------------------------------------------
// Hugging Face style routes: /api/{type}s/{ns}/{name}[/revision/{rev}|/preupload/{rev}|
// /commit/{rev}|/xet-{read,write}-token/{rev}]
// ---------------------------------------------------------------------------

void HubServer::Impl::RouteHfRepo(RepoType type, const std::vector<std::string>& seg,
                                  const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader* reader, const Identity& who) {
  const std::string& ns = seg[2];
  const std::string& name = seg[3];
  std::string repo_id = ns + "/" + name;
  auto repo_r = LoadRepoForRead(ns, name, who, res);
  if (!repo_r.ok()) return;
  RepoInfo repo = *repo_r;
  if (repo.type != type) {
    return Error(res, 404, "repo '" + repo_id + "' is a " + std::string(RepoTypeName(repo.type)) +
                               ", not a " + std::string(RepoTypeName(type)),
                 "RepoNotFound");
  }
  auto tail = [&](size_t from) {
    std::string s;
    for (size_t i = from; i < seg.size(); ++i) s += (i > from ? "/" : "") + seg[i];
    return s;
  };
  if (req.method == "GET" && (seg.size() == 4 || (seg.size() >= 6 && seg[4] == "revision"))) {
    std::string rev = seg.size() >= 6 ? tail(5) : "main";
    auto commit = store->GetCommit(repo_id, rev, false);
    if (!commit.ok()) return ErrorFrom(res, commit.status(), "RevisionNotFound");
    auto files = store->ListFiles(repo_id, commit->id);
    if (!files.ok()) return ErrorFrom(res, files.status());
    json siblings = json::array();
    for (const auto& f : *files) {
      siblings.push_back({{"rfilename", f.path},
                          {"size", f.size},
                          {"blobId", f.sha256},
                          {"lfs", {{"size", f.size}, {"sha256", f.sha256}, {"pointerSize", 0}}}});
    }
    json j = {{"id", repo_id},
              {"_id", repo_id},
              {"sha", commit->id},
              {"author", ns},
              {"private", repo.is_private},
              {"createdAt", FormatTimestamp(repo.created_ms)},
              {"lastModified", FormatTimestamp(commit->created_ms)},
              {"tags", json::array()},
              {"siblings", siblings},
              {"gated", false},
              {"disabled", false},
              {"downloads", 0},
              {"likes", 0}};
    return Json(res, j);
  }
  if (seg.size() >= 6 && (seg[4] == "xet-read-token" || seg[4] == "xet-write-token") &&
      req.method == "GET") {
    bool write = seg[4] == "xet-write-token";
    if (write) {
      Status s = CheckWrite(who, ns);
      if (!s.ok()) return ErrorFrom(res, s);
    }
    return Json(res, {{"accessToken", MakeXetToken(write, "repo:" + repo_id)},
                      {"exp", NowMs() / 1000 + options.xet_token_seconds},
                      {"casUrl", Endpoint(req)}});
  }
  if (seg.size() >= 6 && seg[4] == "preupload" && req.method == "POST") {
    Status s = CheckWrite(who, ns);
    if (!s.ok()) return ErrorFrom(res, s);
    std::string rev = tail(5);
    auto commit = store->ResolveRevision(repo_id, rev);
    if (!commit.ok()) return ErrorFrom(res, commit.status(), "RevisionNotFound");
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    json j = json::parse(*body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_array()) {
      return Error(res, 400, "body must be {\"files\": [...]}");
    }
    json out = json::array();
    for (const auto& f : j["files"]) {
      if (!f.is_object()) return Error(res, 400, "files[] entries must be objects");
      std::string path = f.value("path", "");
      Status ps = ValidateRepoPath(path);
      if (!ps.ok()) return Error(res, 400, ps.message());
      uint64_t size = f.value("size", uint64_t{0});
      std::string sample = f.value("sample", "");
      auto decoded = Base64Decode(sample);
      bool binary = !decoded.ok() || decoded->find('\0') != std::string::npos;
      // Small text goes inline in the NDJSON commit; everything else through Xet.
      bool regular = size == 0 || (size < (1u << 20) && !binary);
      out.push_back({{"path", path},
                     {"uploadMode", regular ? "regular" : "lfs"},
                     {"shouldIgnore", false},
                     {"oid", nullptr}});
    }
    return Json(res, {{"files", out}, {"commitOid", *commit}});
  }
  if (seg.size() >= 6 && seg[4] == "commit" && req.method == "POST") {
    Status s = CheckWrite(who, ns);
    if (!s.ok()) return ErrorFrom(res, s);
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    return NdjsonCommitRoute(repo, tail(5), *body, who, req, res);
  }
  Error(res, 404, "no route for " + req.method + " " + req.path);
}

void HubServer::Impl::NdjsonCommitRoute(const RepoInfo& repo, const std::string& revision,
                                        std::string_view body, const Identity& who,
                                        const httplib::Request& req, httplib::Response& res) {
  auto parsed = ParseNdjsonCommit(body);
  if (!parsed.ok()) return ErrorFrom(res, parsed.status());
  CommitRequest cr;
  cr.repo = repo.id();
  cr.branch = revision;
  cr.message = parsed->summary;
  cr.description = parsed->description;
  cr.author = who.name;
  cr.parent = parsed->parent_commit;
  cr.ignore_missing_deletes = false;
  for (auto& op : parsed->ops) {
    CommitOperation c;
    c.path = op.path;
    switch (op.kind) {
      case NdjsonCommit::Op::Kind::kDeletedFile:
        c.kind = CommitOperation::Kind::kDelete;
        break;
      case NdjsonCommit::Op::Kind::kDeletedFolder:
        c.kind = CommitOperation::Kind::kDeleteFolder;
        break;
      case NdjsonCommit::Op::Kind::kFile: {
        c.kind = CommitOperation::Kind::kAdd;
        blob_bytes_received += op.content.size();
        auto up = store->BeginUpload(op.path);
        if (!up.ok()) return ErrorFrom(res, up.status());
        Status s = (*up)->Append(AsBytes(op.content));
        if (s.ok()) s = (*up)->Close();
        if (!s.ok()) return ErrorFrom(res, s);
        c.entry = (*up)->entry();
        break;
      }
      case NdjsonCommit::Op::Kind::kLfsFile: {
        c.kind = CommitOperation::Kind::kAdd;
        auto found = store->FindBySha256(op.oid);
        if (!found.ok()) return ErrorFrom(res, found.status());
        if (!*found) {
          return Error(res, 400, "lfsFile '" + op.path + "': no uploaded content has sha256 " + op.oid);
        }
        if (op.size != 0 && (*found)->size != op.size) {
          return Error(res, 400, "lfsFile '" + op.path + "': size " + std::to_string(op.size) +
                                     " does not match the uploaded content");
        }
        c.entry = **found;
        break;
      }
    }
    cr.ops.push_back(std::move(c));
  }
  std::string prefix = repo.type == RepoType::kModel ? "" : "/" + std::string(RepoTypePlural(repo.type));
  // ?create_pr=1: the commit goes to a new branch refs/pr/N (N = next free
  // number) based on `revision` (or the header's parentCommit); the
  // revision itself does not move.
  std::string create_pr = req.get_param_value("create_pr");
  std::optional<int> pr_number;
  if (create_pr == "1" || create_pr == "true" || create_pr == "True") {
    auto base = store->ResolveRevision(cr.repo, revision);
    if (!base.ok()) return ErrorFrom(res, base.status(), "RevisionNotFound");
    if (!cr.parent) cr.parent = *base;
    cr.create_branch = true;
  }
  Result<CommitInfo> commit = InternalError("no commit attempted");
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (cr.create_branch) {
      auto refs = store->ListRefs(cr.repo);
      if (!refs.ok()) return ErrorFrom(res, refs.status());
      int next = 1;
      for (const auto& r : *refs) {
        if (r.is_tag || r.name.rfind("refs/pr/", 0) != 0) continue;
        next = std::max(next, std::atoi(r.name.c_str() + 8) + 1);
      }
      pr_number = next;
      cr.branch = "refs/pr/" + std::to_string(next);
    }
    commit = store->Commit(cr);
    // A concurrent PR took the same number: try the next one.
    if (!cr.create_branch || commit.ok() || commit.status().code() != StatusCode::kAborted) break;
  }
  if (!commit.ok()) {
    return ErrorFrom(res, commit.status(),
                     commit.status().code() == StatusCode::kNotFound ? "RevisionNotFound" : "");
  }
  ++commits;
  json out = {{"commitOid", commit->id},
              {"commitUrl", Endpoint(req) + prefix + "/" + repo.id() + "/commit/" + commit->id},
              {"commitMessage", commit->message}};
  if (pr_number) {
    out["pullRequestUrl"] = Endpoint(req) + prefix + "/" + repo.id() + "/discussions/" +
                            std::to_string(*pr_number);
    out["pullRequestRevision"] = cr.branch;
  }
  Json(res, out);
}

// ---------------------------------------------------------------------------
// /api/uploads (resumable multipart staging)
// ---------------------------------------------------------------------------

void HubServer::Impl::RouteUploads(const std::vector<std::string>& seg,
                                   const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader* reader, const Identity& who) {
  const std::string& m = req.method;
  if (seg.size() == 2 && m == "POST") {
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    json j = json::parse(*body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Error(res, 400, "body is not a JSON object");
    HubStore::MultipartUpload u;
    u.repo = j.value("repo_id", "");
    auto parts = SplitRepoId(u.repo);
    if (!parts.ok()) return ErrorFrom(res, parts.status());
    Status s = CheckWrite(who, parts->first);
    if (!s.ok()) return ErrorFrom(res, s);
    auto repo = store->GetRepo(u.repo);
    if (!repo.ok()) return ErrorFrom(res, repo.status(), "RepoNotFound");
    u.path = j.value("path", "");
    Status ps = ValidateRepoPath(u.path);
    if (!ps.ok()) return Error(res, 400, ps.message());
    u.revision = j.value("revision", "main");
    u.size = j.value("size", uint64_t{0});
    u.sha256 = j.value("sha256", "");
    u.stage_only = j.value("stage_only", true);
    u.part_size = options.upload_part_size;
    auto created = store->CreateMultipartUpload(u);
    if (!created.ok()) return ErrorFrom(res, created.status());
    return Json(res, {{"upload_id", created->id}, {"part_size", created->part_size}});
  }
  if (seg.size() < 3) return Error(res, 404, "no route");
  auto upload = store->GetMultipartUpload(seg[2]);
  if (!upload.ok()) return ErrorFrom(res, upload.status());
  auto parts = SplitRepoId(upload->repo);
  if (!parts.ok()) return ErrorFrom(res, parts.status());
  Status s = CheckWrite(who, parts->first);
  if (!s.ok()) return ErrorFrom(res, s);
  if (seg.size() == 3 && m == "GET") {
    auto stored = store->ListUploadParts(upload->id);
    if (!stored.ok()) return ErrorFrom(res, stored.status());
    json arr = json::array();
    for (const auto& [n, etag] : *stored) arr.push_back({{"part_number", n}, {"etag", etag}});
    return Json(res, {{"upload_id", upload->id}, {"part_size", upload->part_size}, {"parts", arr}});
  }
  if (seg.size() == 3 && m == "DELETE") {
    s = store->DeleteMultipartUpload(upload->id);
    if (!s.ok()) return ErrorFrom(res, s);
    return Json(res, json::object());
  }
  if (seg.size() == 5 && seg[3] == "parts" && m == "PUT") {
    char* end = nullptr;
    long n = std::strtol(seg[4].c_str(), &end, 10);
    uint64_t nparts = (upload->size + upload->part_size - 1) / upload->part_size;
    if (!end || *end || n < 1 || static_cast<uint64_t>(n) > std::max<uint64_t>(nparts, 1)) {
      return Error(res, 400, "bad part number '" + seg[4] + "'");
    }
    uint64_t expect = static_cast<uint64_t>(n) < nparts
                          ? upload->part_size
                          : upload->size - (static_cast<uint64_t>(n) - 1) * upload->part_size;
    std::string path = store->UploadPartPath(upload->id, static_cast<int>(n));
    std::string tmp = path + ".tmp-" + RandomHex(4);
    auto file = CreateLocalFile(tmp);
    if (!file.ok()) return ErrorFrom(res, file.status());
    Sha256 sha;
    uint64_t got = 0;
    Status ws;
    bool ok = (*reader)([&](const char* data, size_t len) {
      request_body_bytes += len;
      blob_bytes_received += len;
      got += len;
      if (!ws.ok() || got > expect) return true;
      auto bytes = std::as_bytes(std::span<const char>(data, len));
      sha.Update(bytes);
      ws = (*file)->Append(bytes);
      return true;
    });
    if (ws.ok()) ws = (*file)->Close();
    if (!ok || !ws.ok() || got != expect) {
      std::filesystem::remove(tmp);
      if (!ws.ok()) return ErrorFrom(res, ws);
      return Error(res, 400, "part " + std::to_string(n) + " has " + std::to_string(got) +
                                 " bytes, expected " + std::to_string(expect));
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) return Error(res, 500, "storing part: " + ec.message());
    std::string etag = ToHex(sha.Finish()).substr(0, 32);
    s = store->RecordUploadPart(upload->id, static_cast<int>(n), etag, got);
    if (!s.ok()) return ErrorFrom(res, s);
    return Json(res, {{"etag", etag}, {"part_number", n}});
  }
  if (seg.size() == 4 && seg[3] == "complete" && m == "POST") {
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    json j = json::parse(*body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("parts") || !j["parts"].is_array()) {
      return Error(res, 400, "body must be {\"parts\": [...]}");
    }
    std::vector<std::pair<int, std::string>> list;
    for (const auto& p : j["parts"]) {
      if (!p.is_object()) return Error(res, 400, "parts[] entries must be objects");
      list.emplace_back(p.value("part_number", 0), p.value("etag", ""));
    }
    auto entry = store->CompleteMultipartUpload(upload->id, list);
    if (!entry.ok()) return ErrorFrom(res, entry.status());
    if (upload->stage_only) {
      return Json(res, {{"staged", true}, {"path", upload->path}, {"size", entry->size},
                        {"sha256", entry->sha256}});
    }
    CommitRequest cr;
    cr.repo = upload->repo;
    cr.branch = upload->revision;
    cr.message = j.value("commit_message", "Upload " + upload->path);
    cr.author = who.name;
    CommitOperation op;
    op.kind = CommitOperation::Kind::kAdd;
    op.path = upload->path;
    op.entry = *entry;
    cr.ops.push_back(op);
    auto c = store->Commit(cr);
    if (!c.ok()) return ErrorFrom(res, c.status());
    ++commits;
    return Json(res, {{"repo_id", upload->repo}, {"path", upload->path}, {"revision", c->id},
                      {"size", entry->size}, {"sha256", entry->sha256}});
  }
  Error(res, 404, "no route for " + m + " " + req.path);
}

// ---------------------------------------------------------------------------
// buckets
// ---------------------------------------------------------------------------

void HubServer::Impl::RouteBuckets(const std::vector<std::string>& seg,
                                   const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader* reader, const Identity& who) {
  const std::string& m = req.method;
  // /buckets/{ns}/{name}/resolve/{path}: the path arrives either with "/"
  // kept or fully encoded (%2F); both decode to the same segments here.
  if (seg[0] == "buckets") {
    if (m != "GET" && m != "HEAD") return Error(res, 405, "method not allowed");
    std::string bucket_id = seg[1] + "/" + seg[2];
    auto bucket = store->GetBucket(bucket_id);
    if (!bucket.ok()) return ErrorFrom(res, bucket.status(), "RepoNotFound");
    Status s = CheckRead(who, bucket->is_private, bucket->ns);
    if (!s.ok()) return ErrorFrom(res, s);
    std::string path;
    for (size_t i = 4; i < seg.size(); ++i) path += (i > 4 ? "/" : "") + seg[i];
    Status ps = ValidateRepoPath(path);
    if (!ps.ok()) return Error(res, 400, ps.message());
    auto entry = store->GetBucketEntry(bucket_id, path);
    if (!entry.ok()) return ErrorFrom(res, entry.status(), "EntryNotFound");
    FileEntry fe;
    fe.path = entry->path;
    fe.size = entry->size;
    fe.sha256 = entry->sha256;
    fe.xet_hash = entry->xet_hash;
    res.set_header("X-Xet-Hash", entry->xet_hash);
    res.set_header("ETag", "\"" + (entry->sha256.empty() ? entry->xet_hash : entry->sha256) + "\"");
    res.set_header("X-Linked-Size", std::to_string(entry->size));
    res.set_header("Link", "<" + Endpoint(req) + "/api/buckets/" + bucket_id +
                               "/xet-read-token>; rel=\"xet-auth\"");
    return ServeContent(fe, req, res, "bucket " + bucket_id + "/" + path);
  }
  if (seg.size() < 4) return Error(res, 404, "no route");
  const std::string& ns = seg[2];
  const std::string& name = seg[3];
  std::string bucket_id = ns + "/" + name;
  std::string url = Endpoint(req) + "/buckets/" + bucket_id;
  if (seg.size() == 4 && m == "POST") {
    Status s = CheckWrite(who, ns);
    if (!s.ok()) return ErrorFrom(res, s);
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    json j = body->empty() ? json::object() : json::parse(*body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Error(res, 400, "body is not a JSON object");
    auto b = store->CreateBucket(ns, name, j.value("private", false), false);
    if (!b.ok()) {
      if (b.status().code() == StatusCode::kAlreadyExists) {
        return Json(res, {{"error", b.status().message()}, {"url", url}, {"id", bucket_id}}, 409);
      }
      return ErrorFrom(res, b.status());
    }
    return Json(res, {{"url", url}, {"id", bucket_id}, {"name", name}}, 200);
  }
  auto bucket = store->GetBucket(bucket_id);
  if (!bucket.ok()) return ErrorFrom(res, bucket.status(), "RepoNotFound");
  bool write = m == "POST" || m == "PUT" || m == "DELETE";
  // paths-info is a read even though it is a POST.
  if (seg.size() == 5 && seg[4] == "paths-info") write = false;
  Status s = write ? CheckWrite(who, ns) : CheckRead(who, bucket->is_private, ns);
  if (!s.ok()) return ErrorFrom(res, s, s.code() == StatusCode::kUnauthenticated && !write ? "RepoNotFound" : "");
  if (seg.size() == 4 && m == "GET") {
    return Json(res, {{"id", bucket_id},
                      {"private", bucket->is_private},
                      {"createdAt", FormatTimestamp(bucket->created_ms)},
                      {"size", bucket->size},
                      {"totalFiles", bucket->total_files}});
  }
  if (seg.size() == 4 && m == "DELETE") {
    s = store->DeleteBucket(bucket_id);
    if (!s.ok()) return ErrorFrom(res, s, "RepoNotFound");
    return Json(res, json::object());
  }
  if (seg.size() >= 5 && seg[4] == "tree" && m == "GET") {
    std::string prefix;
    for (size_t i = 5; i < seg.size(); ++i) prefix += (i > 5 ? "/" : "") + seg[i];
    while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    bool recursive = req.get_param_value("recursive") == "true" || req.get_param_value("recursive") == "1";
    size_t limit = req.has_param("limit") ? std::clamp<size_t>(std::stoul(req.get_param_value("limit")), 1, 10000) : 1000;
    std::string cursor = req.get_param_value("cursor");
    std::string list_prefix = prefix.empty() ? "" : prefix + "/";
    json arr = json::array();
    std::string last;
    bool more = false;
    if (recursive) {
      auto entries = store->ListBucket(bucket_id, list_prefix, cursor, limit + 1);
      if (!entries.ok()) return ErrorFrom(res, entries.status());
      for (size_t i = 0; i < entries->size() && i < limit; ++i) {
        arr.push_back(BucketEntryJson((*entries)[i]));
        last = (*entries)[i].path;
      }
      more = entries->size() > limit;
    } else {
      // Direct children: files, and one entry per sub-folder (skipping past
      // each folder's contents with a range jump).
      std::string after = cursor;
      while (arr.size() < limit) {
        auto entries = store->ListBucket(bucket_id, list_prefix, after, 1);
        if (!entries.ok()) return ErrorFrom(res, entries.status());
        if (entries->empty()) break;
        const BucketEntry& e = entries->front();
        std::string rest = e.path.substr(list_prefix.size());
        size_t slash = rest.find('/');
        if (slash == std::string::npos) {
          arr.push_back(BucketEntryJson(e));
          after = e.path;
        } else {
          std::string dir = list_prefix + rest.substr(0, slash);
          arr.push_back({{"type", "directory"}, {"path", dir}, {"uploadedAt", FormatTimestamp(e.uploaded_ms)}});
          after = dir + "/\xff";  // past every path under dir/
        }
        last = after;
      }
      if (arr.size() == limit) {
        auto peek = store->ListBucket(bucket_id, list_prefix, after, 1);
        more = peek.ok() && !peek->empty();
      }
    }
    if (arr.empty() && !prefix.empty() && cursor.empty()) {
      auto exact = store->GetBucketEntry(bucket_id, prefix);
      if (exact.ok()) arr.push_back(BucketEntryJson(*exact));
    }
    if (more) {
      std::string next = Endpoint(req) + "/api/buckets/" + bucket_id + "/tree" +
                         (prefix.empty() ? "" : "/" + PercentEncode(prefix)) + "?recursive=" +
                         (recursive ? "true" : "false") + "&limit=" + std::to_string(limit) +
                         "&cursor=" + PercentEncode(last);
      res.set_header("Link", "<" + next + ">; rel=\"next\"");
    }
    return Json(res, arr);
  }
  if (seg.size() == 5 && seg[4] == "paths-info" && m == "POST") {
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    json j = json::parse(*body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("paths") || !j["paths"].is_array()) {
      return Error(res, 400, "body must be {\"paths\": [...]}");
    }
    if (j["paths"].size() > 1000) return Error(res, 400, "at most 1000 paths per request");
    json arr = json::array();
    for (const auto& p : j["paths"]) {
      if (!p.is_string()) return Error(res, 400, "paths[] must be strings");
      auto e = store->GetBucketEntry(bucket_id, p.get<std::string>());
      if (e.ok()) arr.push_back(BucketEntryJson(*e));
    }
    return Json(res, arr);
  }
  if (seg.size() == 5 && seg[4] == "batch" && m == "POST") {
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    auto ops = ParseBucketBatch(*body);
    if (!ops.ok()) return ErrorFrom(res, ops.status());
    std::vector<BucketOperation> bops;
    for (const auto& op : *ops) {
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
    s = store->BucketBatch(bucket_id, bops);
    if (!s.ok()) return ErrorFrom(res, s);
    return Json(res, {{"success", true}, {"operations", bops.size()}});
  }
  if (seg.size() == 5 && (seg[4] == "xet-read-token" || seg[4] == "xet-write-token") && m == "GET") {
    bool w = seg[4] == "xet-write-token";
    if (w) {
      s = CheckWrite(who, ns);
      if (!s.ok()) return ErrorFrom(res, s);
    }
    return Json(res, {{"accessToken", MakeXetToken(w, "bucket:" + bucket_id)},
                      {"exp", NowMs() / 1000 + options.xet_token_seconds},
                      {"casUrl", Endpoint(req)}});
  }
  Error(res, 404, "no route for " + m + " " + req.path);
}

// ---------------------------------------------------------------------------
// Xet CAS routes
// ---------------------------------------------------------------------------

void HubServer::Impl::RouteCas(const std::vector<std::string>& seg, const httplib::Request& req,
                               httplib::Response& res, const httplib::ContentReader* reader,
                               const Identity& who) {
  const std::string& m = req.method;
  bool write = m == "POST" || m == "PUT";
  // Batch dedup lookups are reads even though they are POSTs.
  if (seg.size() == 3 && seg[1] == "chunks" && seg[2] == "lookup") write = false;
  // So is the batch reconstruction query.
  if (seg.size() == 2 && seg[1] == "reconstructions") write = false;
  if (!who.valid) return Error(res, 401, who.presented ? "invalid token" : "a CAS token is required");
  if (write && who.scope != TokenScope::kWrite) return Error(res, 403, "token is read-only");
  cas::CasBackend& backend = store->cas().backend();

  // POST /v1/xorbs/{prefix}/{hash}
  if (seg.size() == 4 && seg[1] == "xorbs" && m == "POST") {
    auto hash = cas::MerkleHash::FromHex(seg[3]);
    if (!hash.ok()) return ErrorFrom(res, hash.status());
    cas::internal::CachedBuffer body(current_content_length);
    Status read = ReadBodyInto(req, reader, options.max_object_bytes, &*body);
    if (!read.ok()) return ErrorFrom(res, read);
    ++xorbs_received;
    xorb_bytes_received += body->size();
    // Every record decoded and hashed without keeping the decoded bytes.
    auto verified = cas::VerifyXorb(body->span());
    if (!verified.ok()) return ErrorFrom(res, verified.status());
    const cas::XorbLayout& layout = *verified;
    if (layout.xorb_hash != *hash) {
      return Error(res, 400, "xorb content hashes to " + layout.xorb_hash.ToHex() +
                                 ", not to " + hash->ToHex());
    }
    auto inserted = backend.PutXorb(
        std::string_view(reinterpret_cast<const char*>(body->data()), body->size()), layout);
    if (!inserted.ok()) return ErrorFrom(res, inserted.status());
    if (*inserted) ++xorbs_inserted;
    return Json(res, {{"was_inserted", *inserted}});
  }
  // HEAD/GET /v1/xorbs/{prefix}/{hash}[/layout]
  if ((seg.size() == 4 || (seg.size() == 5 && seg[4] == "layout")) && seg[1] == "xorbs" &&
      (m == "GET" || m == "HEAD")) {
    auto hash = cas::MerkleHash::FromHex(seg[3]);
    if (!hash.ok()) return ErrorFrom(res, hash.status());
    if (seg.size() == 5) {
      auto layout = backend.GetXorbLayout(*hash);
      if (!layout.ok()) return ErrorFrom(res, layout.status());
      res.status = 200;
      res.set_content(cas::EncodeXorbFooter(*layout), "application/octet-stream");
      return;
    }
    auto size = backend.XorbSize(*hash);
    if (!size.ok()) return ErrorFrom(res, size.status());
    res.set_header("Accept-Ranges", "bytes");
    auto range = ParseRange(req.get_header_value("Range"), *size);
    if (!range.ok()) {
      res.set_header("Content-Range", "bytes */" + std::to_string(*size));
      return Error(res, range.status().code() == StatusCode::kOutOfRange ? 416 : 400,
                   range.status().message());
    }
    uint64_t first = 0, len = *size;
    res.status = 200;
    if (*range) {
      first = (*range)->first;
      len = (*range)->last - first + 1;
      res.status = 206;
      res.set_header("Content-Range", "bytes " + std::to_string(first) + "-" +
                                          std::to_string((*range)->last) + "/" + std::to_string(*size));
    }
    if (m == "HEAD") {
      res.set_header("Content-Length", std::to_string(len));
      return;
    }
    auto bytes = backend.GetXorbRange(*hash, first, len);
    if (!bytes.ok()) return ErrorFrom(res, bytes.status());
    int status = res.status;
    res.set_content(*std::move(bytes), "application/octet-stream");
    res.status = status;
    return;
  }
  // POST /v1/shards
  if (seg.size() == 2 && seg[1] == "shards" && m == "POST") {
    auto body = ReadBody(reader, options.max_object_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    ++shards_received;
    auto shard = cas::ParseShard(AsBytes(*body));
    if (!shard.ok()) return ErrorFrom(res, shard.status());
    auto imported = cas::ImportShard(backend, AsBytes(*body));
    if (!imported.ok()) return ErrorFrom(res, imported.status());
    for (const auto& f : shard->files) {
      FileEntry e;
      e.size = f.reconstruction.size;
      e.xet_hash = f.reconstruction.file_hash.ToHex();
      if (f.sha256) e.sha256 = ToHex(*f.sha256);
      if (e.size == 0) continue;
      Status s = store->RecordContent(e, /*sha256_verified=*/false);
      if (!s.ok()) return ErrorFrom(res, s);
    }
    return Json(res, {{"result", imported->files_imported > 0 ? 1 : 0}});
  }
  // GET /v1/chunks/{prefix}/{hash}: global dedup, answered with a shard.
  if (seg.size() == 4 && seg[1] == "chunks" && m == "GET") {
    auto hash = cas::MerkleHash::FromHex(seg[3]);
    if (!hash.ok()) return ErrorFrom(res, hash.status());
    auto loc = backend.LookupChunks(std::span<const cas::MerkleHash>(&*hash, 1));
    if (!loc.ok()) return ErrorFrom(res, loc.status());
    if (loc->empty() || !(*loc)[0]) return Error(res, 404, "chunk not found");
    auto layout = backend.GetXorbLayout((*loc)[0]->xorb_hash);
    if (!layout.ok()) return ErrorFrom(res, layout.status());
    cas::Shard shard;
    shard.xorbs.push_back(cas::ShardXorbInfoFromLayout(*layout));
    res.status = 200;
    res.set_content(cas::SerializeShard(shard), "application/octet-stream");
    return;
  }
  // POST /v1/chunks/lookup (megahub extension): body = N raw 32-byte chunk
  // hashes; answer = N records of {u8 found, 32-byte xorb hash, u32 LE index}.
  if (seg.size() == 3 && seg[1] == "chunks" && seg[2] == "lookup" && m == "POST") {
    auto body = ReadBody(reader, options.max_json_bytes);
    if (!body.ok()) return ErrorFrom(res, body.status());
    if (body->size() % 32 != 0) return Error(res, 400, "body must be a multiple of 32 bytes");
    std::vector<cas::MerkleHash> hashes(body->size() / 32);
    for (size_t i = 0; i < hashes.size(); ++i) std::memcpy(hashes[i].bytes.data(), body->data() + 32 * i, 32);
    auto locs = backend.LookupChunks(hashes);
    if (!locs.ok()) return ErrorFrom(res, locs.status());
    std::string out;
    out.reserve(locs->size() * 37);
    for (const auto& l : *locs) {
      out += static_cast<char>(l ? 1 : 0);
      cas::MerkleHash h = l ? l->xorb_hash : cas::MerkleHash{};
      out.append(reinterpret_cast<const char*>(h.bytes.data()), 32);
      uint32_t idx = l ? l->chunk_index : 0;
      char le[4] = {static_cast<char>(idx), static_cast<char>(idx >> 8), static_cast<char>(idx >> 16),
                    static_cast<char>(idx >> 24)};
      out.append(le, 4);
    }
    res.status = 200;
    res.set_content(out, "application/octet-stream");
    return;
  }
  // HEAD /v1/files/{hash}
  if (seg.size() == 3 && seg[1] == "files" && (m == "HEAD" || m == "GET")) {
    auto hash = cas::MerkleHash::FromHex(seg[2]);
    if (!hash.ok()) return ErrorFrom(res, hash.status());
    auto recon = backend.GetFile(*hash);
    if (!recon.ok()) return ErrorFrom(res, recon.status());
    res.status = 200;
    res.set_header("X-File-Size", std::to_string(recon->size));
    if (m == "HEAD") {
      res.set_header("Content-Length", "0");
      return;
    }
    return Json(res, {{"file_hash", hash->ToHex()}, {"size", recon->size}});
  }
  // GET /v1|v2/reconstructions/{file_hash} [Range], batch GET/POST /v1/reconstructions.
  if (seg.size() >= 2 && seg[1] == "reconstructions") {
    return ReconstructionRoute(seg, req, res, reader);
  }
  Error(res, 404, "no route for " + m + " " + req.path);
}

namespace {

// The chunk ranges of a file (or of a byte range of it) grouped by xorb, as
// Xet's reconstruction answers need them.
struct ReconPlan {
  uint64_t offset_into_first_range = 0;
  json terms = json::array();
  // xorb -> merged [start, end) chunk ranges, ascending.
  std::map<cas::MerkleHash, std::vector<std::pair<uint32_t, uint32_t>>> ranges;
  std::map<cas::MerkleHash, cas::XorbLayout> layouts;
};

// Terms covering bytes [first, last] of `recon` (whole chunks; the first
// term's leading bytes before `first` are offset_into_first_range). Terms
// that are not narrowed carry their verification hash (megahub extension
// "verification_hash", omitted when unknown).
Status PlanReconstruction(cas::CasBackend& backend, const cas::FileReconstruction& recon,
                          uint64_t want_first, uint64_t want_last, ReconPlan* plan) {
  uint64_t term_start = 0;
  bool first_term = true;
  for (const auto& t : recon.terms) {
    uint64_t term_end = term_start + t.unpacked_bytes;  // exclusive
    if (recon.size == 0 || term_end <= want_first || term_start > want_last) {
      term_start = term_end;
      continue;
    }
    auto it = plan->layouts.find(t.xorb_hash);
    if (it == plan->layouts.end()) {
      MEGA_ASSIGN_OR_RETURN(auto layout, backend.GetXorbLayout(t.xorb_hash));
      it = plan->layouts.emplace(t.xorb_hash, std::move(layout)).first;
    }
    const cas::XorbLayout& layout = it->second;
    if (t.chunk_end > layout.chunks.size() || t.chunk_start >= t.chunk_end) {
      return DataLossError("file " + recon.file_hash.ToHex() + ": term past the chunks of xorb " +
                           t.xorb_hash.ToHex());
    }
    // Narrow the chunk range to the chunks overlapping the wanted bytes.
    uint32_t cs = t.chunk_start, ce = t.chunk_end;
    uint64_t pos = term_start;
    uint64_t narrowed_start = term_start;
    for (uint32_t c = t.chunk_start; c < t.chunk_end; ++c) {
      uint64_t cend = pos + layout.chunks[c].unpacked_bytes;
      if (cend <= want_first) {
        cs = c + 1;
        narrowed_start = cend;
      }
      if (pos > want_last) {
        ce = c;
        break;
      }
      pos = cend;
    }
    uint64_t unpacked = 0;
    for (uint32_t c = cs; c < ce; ++c) unpacked += layout.chunks[c].unpacked_bytes;
    if (first_term) {
      plan->offset_into_first_range = want_first - narrowed_start;
      first_term = false;
    }
    json term = {{"hash", t.xorb_hash.ToHex()},
                 {"unpacked_length", unpacked},
                 {"range", {{"start", cs}, {"end", ce}}}};
    if (cs == t.chunk_start && ce == t.chunk_end && t.verification_hash != cas::MerkleHash{}) {
      term["verification_hash"] = t.verification_hash.ToHex();
    }
    plan->terms.push_back(std::move(term));
    plan->ranges[t.xorb_hash].emplace_back(cs, ce);
    term_start = term_end;
  }
  // Merge overlapping / adjacent chunk ranges per xorb (as Xet does).
  for (auto& [xorb, list] : plan->ranges) {
    std::sort(list.begin(), list.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : list) {
      if (!merged.empty() && r.first <= merged.back().second) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    list = std::move(merged);
  }
  return Status::OK();
}

// V1 fetch_info: xorb -> [{range, url, url_range (inclusive)}].
json FetchInfoV1(const ReconPlan& plan, const std::string& endpoint) {
  json fetch = json::object();
  for (const auto& [xorb, list] : plan.ranges) {
    const cas::XorbLayout& layout = plan.layouts.at(xorb);
    std::string xh = xorb.ToHex();
    json arr = json::array();
    for (const auto& [cs, ce] : list) {
      arr.push_back({{"range", {{"start", cs}, {"end", ce}}},
                     {"url", endpoint + "/v1/xorbs/default/" + xh},
                     {"url_range", {{"start", layout.chunks[cs].byte_offset},
                                    {"end", layout.RecordEnd(ce - 1) - 1}}}});
    }
    fetch[xh] = std::move(arr);
  }
  return fetch;
}

// V2 xorbs: xorb -> [{url, ranges: [{chunks, bytes (inclusive)}]}], one
// single-range entry per merged range (so every fetch is a plain 206).
json XorbsV2(const ReconPlan& plan, const std::string& endpoint) {
  json xorbs = json::object();
  for (const auto& [xorb, list] : plan.ranges) {
    const cas::XorbLayout& layout = plan.layouts.at(xorb);
    std::string xh = xorb.ToHex();
    json arr = json::array();
    for (const auto& [cs, ce] : list) {
      arr.push_back({{"url", endpoint + "/v1/xorbs/default/" + xh},
                     {"ranges", json::array({{{"chunks", {{"start", cs}, {"end", ce}}},
                                              {"bytes", {{"start", layout.chunks[cs].byte_offset},
                                                         {"end", layout.RecordEnd(ce - 1) - 1}}}}})}});
    }
    xorbs[xh] = std::move(arr);
  }
  return xorbs;
}

}  // namespace

void HubServer::Impl::ReconstructionRoute(const std::vector<std::string>& seg,
                                          const httplib::Request& req, httplib::Response& res,
                                          const httplib::ContentReader* reader) {
  const std::string& m = req.method;
  cas::CasBackend& backend = store->cas().backend();
  bool v2 = seg[0] == "v2";
  // Single file: GET /v{1,2}/reconstructions/{file_hash} [Range: bytes=a-b].
  if (seg.size() == 3 && m == "GET") {
    auto hash = cas::MerkleHash::FromHex(seg[2]);
    if (!hash.ok()) return ErrorFrom(res, hash.status());
    auto recon = backend.GetFile(*hash);
    if (!recon.ok()) return ErrorFrom(res, recon.status());
    auto range = ParseRange(req.get_header_value("Range"), recon->size);
    if (!range.ok()) {
      return Error(res, range.status().code() == StatusCode::kOutOfRange ? 416 : 400,
                   range.status().message());
    }
    uint64_t want_first = *range ? (*range)->first : 0;
    uint64_t want_last = *range ? (*range)->last : (recon->size ? recon->size - 1 : 0);
    ReconPlan plan;
    Status s = PlanReconstruction(backend, *recon, want_first, want_last, &plan);
    if (!s.ok()) return ErrorFrom(res, s);
    json out = {{"offset_into_first_range", plan.offset_into_first_range}, {"terms", plan.terms}};
    if (v2) {
      out["xorbs"] = XorbsV2(plan, Endpoint(req));
    } else {
      out["fetch_info"] = FetchInfoV1(plan, Endpoint(req));
    }
    return Json(res, out);
  }
  // Batch (V1 only): POST /v1/reconstructions {"file_ids": [...]} or
  // GET /v1/reconstructions?file_id=A&file_id=B.
  if (!v2 && seg.size() == 2 && (m == "GET" || m == "POST")) {
    std::vector<std::string> ids;
    if (m == "POST") {
      auto body = ReadBody(reader, options.max_json_bytes);
      if (!body.ok()) return ErrorFrom(res, body.status());
      json j = json::parse(*body, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("file_ids") || !j["file_ids"].is_array()) {
        return Error(res, 400, "body must be {\"file_ids\": [...]}");
      }
      for (const auto& id : j["file_ids"]) {
        if (!id.is_string()) return Error(res, 400, "file_ids[] must be strings");
        ids.push_back(id.get<std::string>());
      }
    } else {
      size_t n = req.get_param_value_count("file_id");
      for (size_t i = 0; i < n; ++i) ids.push_back(req.get_param_value("file_id", i));
    }
    if (ids.empty()) return Error(res, 400, "no file ids given");
    if (ids.size() > 1000) return Error(res, 400, "at most 1000 file ids per request");
    ReconPlan plan;
    json files = json::object();
    for (const auto& id : ids) {
      auto hash = cas::MerkleHash::FromHex(id);
      if (!hash.ok()) return ErrorFrom(res, hash.status());
      std::string key = hash->ToHex();
      if (files.contains(key)) continue;
      auto recon = backend.GetFile(*hash);
      if (!recon.ok()) return ErrorFrom(res, recon.status());
      plan.terms = json::array();
      Status s = PlanReconstruction(backend, *recon, 0, recon->size ? recon->size - 1 : 0, &plan);
      if (!s.ok()) return ErrorFrom(res, s);
      files[key] = plan.terms;
    }
    return Json(res, {{"files", files}, {"fetch_info", FetchInfoV1(plan, Endpoint(req))}});
  }
  Error(res, 404, "no route for " + m + " " + req.path);
}

// ---------------------------------------------------------------------------
// HubServer
// ---------------------------------------------------------------------------

HubServer::~HubServer() = default;

Result<std::unique_ptr<HubServer>> HubServer::Create(std::shared_ptr<HubStore> store,
                                                     const HubServerOptions& options) {
  std::unique_ptr<HubServer> server(new HubServer());
  server->impl_ = std::make_unique<Impl>();
  Impl* impl = server->impl_.get();
  impl->store = std::move(store);
  impl->options = options;
  MEGA_ASSIGN_OR_RETURN(impl->secret, impl->store->ServerSecret());
  auto& http = impl->http;
  int threads = std::max(4, options.threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_keep_alive_max_count(100000);
  http.set_keep_alive_timeout(options.keep_alive_seconds);
  http.set_read_timeout(options.read_timeout_seconds, 0);
  http.set_write_timeout(options.write_timeout_seconds, 0);
  http.set_payload_max_length(std::max(options.max_object_bytes, options.max_json_bytes));
  http.set_tcp_nodelay(true);
  auto plain = [impl](const httplib::Request& req, httplib::Response& res) {
    impl->TimedHandle(req, res, nullptr);
  };
  auto with_body = [impl](const httplib::Request& req, httplib::Response& res,
                          const httplib::ContentReader& reader) {
    // Handlers that answer early (auth, 404) leave the body unread; drain it
    // afterwards or the next request on this keep-alive connection would be
    // parsed from the middle of this body.
    bool consumed = false;
    httplib::ContentReader tracked(
        [&](httplib::ContentReceiver receiver) {
          consumed = true;
          return reader(std::move(receiver));
        },
        [&](httplib::MultipartContentHeader header, httplib::ContentReceiver receiver) {
          consumed = true;
          return reader(std::move(header), std::move(receiver));
        });
    impl->TimedHandle(req, res, &tracked);
    if (!consumed) {
      reader([impl](const char*, size_t len) {
        impl->request_body_bytes += len;
        return true;
      });
    }
  };
  http.Get(".*", plain);
  http.Delete(".*", plain);
  http.Post(".*", httplib::Server::HandlerWithContentReader(with_body));
  http.Put(".*", httplib::Server::HandlerWithContentReader(with_body));
  http.set_logger([impl](const httplib::Request&, const httplib::Response& res) {
    if (res.status >= 500) {
      ++impl->responses_5xx;
    } else if (res.status >= 400) {
      ++impl->responses_4xx;
    }
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    Impl::Error(res, 500, what);
  });
  return server;
}

Result<int> HubServer::Bind() {
  if (impl_->options.port == 0) {
    int port = impl_->http.bind_to_any_port(impl_->options.host);
    if (port <= 0) return UnavailableError("cannot bind " + impl_->options.host + " to any port");
    impl_->port = port;
  } else {
    if (!impl_->http.bind_to_port(impl_->options.host, impl_->options.port)) {
      return UnavailableError("cannot bind " + impl_->options.host + ":" +
                              std::to_string(impl_->options.port) + " (in use?)");
    }
    impl_->port = impl_->options.port;
  }
  return impl_->port;
}

Status HubServer::Serve() {
  if (!impl_->http.listen_after_bind() && impl_->http.is_running()) {
    return UnavailableError("megahub: listen failed");
  }
  return Status::OK();
}

void HubServer::Stop() { impl_->http.stop(); }

int HubServer::port() const { return impl_->port; }

HubServerStats HubServer::stats() const { return impl_->Snapshot(); }

}  // namespace megackpt::hub
