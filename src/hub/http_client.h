// A small HTTP/1.1 client for the hub over libcurl: a pool of easy handles,
// each keeping its keep-alive connection; bearer auth; retries with
// exponential backoff on transient failures; HTTP status -> Status mapping.
// Response bodies arrive in large reads (1 MiB receive buffer) and go
// straight to the caller's sink; request bodies are sent from the caller's
// memory without a copy. (docs/hub.md, "HTTP stack".)
#ifndef MEGACKPT_HUB_HTTP_CLIENT_H_
#define MEGACKPT_HUB_HTTP_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/hub/client.h"

namespace megackpt::hub {

struct HttpResponse {
  int status = 0;
  std::string body;
  std::multimap<std::string, std::string> headers;  // keys as received
  // First value of a header (case-insensitive), "" when absent.
  std::string Header(std::string_view key) const;
};

struct HttpRequest {
  std::string method = "GET";
  std::string target;  // path + query, already encoded
  std::string body;
  // When non-empty, sent instead of `body` without a copy (e.g. a 64 MiB
  // xorb); must stay valid until Send returns.
  std::string_view body_ref;
  std::string content_type;
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, 2xx response bodies are streamed here instead of into
  // HttpResponse::body, in the pieces libcurl receives (returning false
  // aborts: Send returns Aborted).
  std::function<bool(const char*, size_t)> sink;
  // Called before every attempt (so a sink can restart after a retry).
  std::function<void()> reset;
  // Safe to send twice (GET/HEAD/PUT of content-addressed objects...). A
  // non-idempotent request is retried only when the server surely did not
  // process it (connection refused, 429, 503).
  bool idempotent = true;
};

class HttpClient {
 public:
  HttpClient(std::string endpoint, std::string token, RemoteOptions options);
  ~HttpClient();

  const std::string& endpoint() const { return endpoint_; }
  bool has_token() const { return !token_.empty(); }

  // Sends with retries. Returns the final response (any status) or
  // Unavailable after transport failures (a refused or failed connection:
  // "is megahub running at <endpoint>?"). Never fails for an HTTP status.
  Result<HttpResponse> Send(const HttpRequest& request);

  // Send + status check: statuses >= 400 become errors (see ErrorFor).
  Result<HttpResponse> Call(const HttpRequest& request);

  // A Range GET of bytes [offset, offset + dst.size()) of `target`, through
  // Call (retries; statuses >= 400 become errors). The body lands in dst as
  // it arrives, from its start again on every retry; *got = how many body
  // bytes arrived. A body longer than dst is DataLoss naming the URL and the
  // range (nothing is written past dst). The caller checks the status (206,
  // or 200 when the range is the whole resource) and *got.
  // REQUIRES: dst is not empty.
  Result<HttpResponse> GetRange(const std::string& target, uint64_t offset,
                                std::span<std::byte> dst, size_t* got);

  // ErrorFromHttp plus what to do about it: a 401 says whether a token was
  // sent and how to give one (MEGA_TOKEN / --token, `megahub token create`),
  // a 403 that the token lacks the right (write scope, namespace).
  Status ErrorFor(const HttpResponse& response, std::string_view what) const;

  // Body bytes sent and received by this client (headers excluded).
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  struct Handle;  // a libcurl easy handle (and its connection)
  std::unique_ptr<Handle> Acquire();
  void Release(std::unique_ptr<Handle> h);

  std::string endpoint_, token_;
  RemoteOptions options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_;
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
};

// Maps an HTTP error answer to a Status: 400 InvalidArgument, 401
// Unauthenticated, 403 PermissionDenied, 404 NotFound, 409 Aborted (message
// "conflict...") or AlreadyExists, 412 FailedPrecondition, 413
// ResourceExhausted, 416 OutOfRange, 429/5xx Unavailable. The message is
// "<what>: HTTP <status>: <server message>".
Status ErrorFromHttp(const HttpResponse& response, std::string_view what);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_HTTP_CLIENT_H_
