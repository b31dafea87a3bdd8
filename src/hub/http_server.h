// The HTTP/1.1 server under megahub: a thin layer over libmicrohttpd
// (docs/hub.md §"HTTP stack"). It knows nothing of the hub's routes.
//
// A request is handled in two steps, so that nothing of a body is read before
// the handler has looked at the headers (authentication, size limits):
//  1. `begin` sees the request line and headers and returns an Action: either
//     a Response at once (the body, if any, is then not stored: a small one is
//     drained to keep the connection alive, a large one is never read and the
//     connection is closed after the answer), or a BodyReader;
//  2. the BodyReader receives the body in the pieces libmicrohttpd reads
//     (large reads: the per-connection buffer is `connection_buffer_bytes`),
//     then returns the Response.
// Exceptions escaping a handler become 500 answers and are logged on stderr.
//
// Threading: libmicrohttpd's internal thread pool (`threads` threads, poll);
// idle and slow connections cost no thread. A handler runs on the thread of
// its connection. All handler callbacks may run concurrently.
#ifndef MEGACKPT_SRC_HUB_HTTP_SERVER_H_
#define MEGACKPT_SRC_HUB_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::hub::httpd {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "HEAD", "POST", ...
  std::string target;  // as sent: path + "?" + query, still percent-encoded
  std::string path;    // target before '?', still encoded
  std::vector<std::string>
      segments;        // path split at '/', each percent-decoded; trailing empties dropped
  HeaderList query;    // decoded name/value pairs in order ('+' is a space)
  HeaderList headers;  // as received
  std::optional<uint64_t> content_length;  // nullopt: no Content-Length header
  bool has_body = false;                   // Content-Length > 0 or a Transfer-Encoding

  // First value of a header (case-insensitive name), "" when absent.
  std::string Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
  // First value of a query parameter, `def` when absent.
  std::string Param(std::string_view name, std::string def = "") const;
  bool HasParam(std::string_view name) const;
  std::vector<std::string> Params(std::string_view name) const;
};

// Fills method/target-derived fields: path, segments, query. InvalidArgument
// for a target that is not absolute or has bad percent-encoding.
Status ParseTarget(Request* request);

struct Response {
  int status = 200;
  HeaderList headers;
  // The body (moved to libmicrohttpd without a copy), unless `stream` is set.
  std::string body;
  // A streamed body of `stream_length` bytes: stream(offset, dst) writes the
  // bytes at `offset` into dst and returns how many (> 0), or an error (the
  // connection is then cut: the client sees a short body).
  uint64_t stream_length = 0;
  std::function<Result<size_t>(uint64_t offset, std::span<std::byte> dst)> stream;
  // Answers to HEAD: the Content-Length a GET would have (no body is sent).
  std::optional<uint64_t> head_length;

  void SetHeader(std::string name, std::string value);
  std::string Header(std::string_view name) const;  // "" when absent
};

// Receives a request body (see the file comment).
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // The next piece of the body. An error stops the delivery: the rest of the
  // body is discarded and Finish gets that error.
  virtual Status Append(std::span<const std::byte> data) = 0;
  // The body ended; `status` is OK or Append's first error. An error result
  // is answered by the server's error mapping.
  virtual Result<Response> Finish(const Status& status) = 0;
};

struct Action {
  Action(Response r) : response(std::move(r)) {}                 // NOLINT: implicit on purpose
  Action(std::unique_ptr<BodyReader> b) : body(std::move(b)) {}  // NOLINT
  Response response;                                             // used when body is null
  std::unique_ptr<BodyReader> body;                              // reads the body, then answers
};

// A BodyReader keeping the whole body (at most `limit` bytes, else
// ResourceExhausted naming the limit), then calling `then`.
std::unique_ptr<BodyReader> BufferedBody(uint64_t limit, uint64_t reserve,
                                         std::function<Result<Response>(std::string body)> then);

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int threads = 16;
  int listen_backlog = 1024;             // clamped by the kernel (net.core.somaxconn)
  int max_connections = 1024;            // beyond: new connections are closed at once
  int max_connections_per_client = 256;  // per client IP address
  // A connection that sends nothing for this long while no request is being
  // handled (idle keep-alive, or headers not complete yet) is closed.
  int header_timeout_seconds = 30;
  // The same while a request body is being received or a request handled.
  int read_timeout_seconds = 60;
  // Per-connection buffer (headers + body reads). Large enough that big
  // bodies arrive in few, large reads.
  size_t connection_buffer_bytes = 1u << 20;
  // A request answered before its body was read (auth failure, 404, 413):
  // bodies up to this many bytes are read and discarded so the connection
  // stays usable; larger ones are not read and the connection is closed.
  uint64_t drain_limit = 1u << 20;
};

class HttpServer {
 public:
  using BeginFn = std::function<Result<Action>(Request& request)>;
  // Called once per answered request (status sent, wall time of handling).
  using DoneFn = std::function<void(const Request& request, int status, double ms)>;
  // Called with the size of every request body piece received (also discarded ones).
  using BodyBytesFn = std::function<void(size_t n)>;
  // Maps a handler error to its answer.
  using ErrorFn = std::function<Response(const Status& status)>;

  HttpServer(HttpServerOptions options, BeginFn begin, ErrorFn error, DoneFn done,
             BodyBytesFn body_bytes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Creates the listening socket (connections queue in its backlog until
  // Serve). Returns the port. Unavailable naming the address when taken.
  Result<int> Bind();
  // Serves until Stop(), then waits (up to read_timeout_seconds) for the
  // requests being handled, closes the listening socket and returns.
  // REQUIRES: Bind() returned OK; called once.
  Status Serve();
  // Thread-safe; may be called before Serve (which then returns at once).
  void Stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megackpt::hub::httpd

#endif  // MEGACKPT_SRC_HUB_HTTP_SERVER_H_
