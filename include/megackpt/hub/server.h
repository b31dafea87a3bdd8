// HubServer: the `megahub` HTTP/1.1 service over a HubStore. Serves the routes
// the existing MEGA client uses (spec/mega-hub-protocol.md) plus the Xet CAS
// `/v1/...` routes; the full list, the server's layout and its HTTP stack
// (libmicrohttpd) are in docs/hub.md.
//
// Requests are authenticated and authorised from their headers before any
// body byte is read. Handler errors map to 4xx; an unexpected exception is a
// 500 and is logged on stderr.
//
// Threading: `threads` event threads (poll) serve all connections; an idle
// or slow connection holds no thread, a request being handled holds its
// connection's thread. Stop() stops accepting, lets in-flight requests
// finish, then Serve() returns.
#ifndef MEGACKPT_HUB_SERVER_H_
#define MEGACKPT_HUB_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "megackpt/core/status.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

struct HubServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = any free port (see HubServer::port())
  int threads = 64;
  // The listening socket's backlog (clamped by net.core.somaxconn).
  int listen_backlog = 1024;
  // Connections open at once, in all and per client IP address; beyond, a
  // new connection is closed at once.
  int max_connections = 1024;
  int max_connections_per_client = 256;
  // Bodies of objects (xorbs, blobs, upload parts, shards): 413 beyond this.
  uint64_t max_object_bytes = 80ull << 20;
  // Bodies of JSON / NDJSON requests: 413 beyond this.
  uint64_t max_json_bytes = 48ull << 20;
  // A connection that sends nothing for this long while its request headers
  // are incomplete, or while idle between requests, is closed.
  int header_timeout_seconds = 30;
  // The same while a request body is received or a request is handled.
  int read_timeout_seconds = 60;
  // Part size handed out by POST /api/uploads.
  uint64_t upload_part_size = 8ull << 20;
  // Lifetime of the Xet CAS access tokens from the xet-*-token routes.
  int xet_token_seconds = 3600;
  // One line per request on stderr.
  bool log_requests = false;
};

// Counters since start, served as JSON by GET /api/stats.
struct HubServerStats {
  uint64_t requests = 0;
  uint64_t request_body_bytes = 0;  // every request body byte received
  uint64_t xorbs_received = 0;
  uint64_t xorb_bytes_received = 0;  // bodies of POST /v1/xorbs
  uint64_t xorbs_inserted = 0;       // of those, new to the store
  uint64_t shards_received = 0;
  uint64_t blob_bytes_received = 0;  // blob PUTs, upload parts, inline NDJSON files
  uint64_t commits = 0;
  uint64_t responses_4xx = 0;
  uint64_t responses_5xx = 0;
  uint64_t peak_rss_bytes = 0;  // VmHWM of the server process
};

class HubServer {
 public:
  static Result<std::unique_ptr<HubServer>> Create(std::shared_ptr<HubStore> store,
                                                   const HubServerOptions& options = {});
  ~HubServer();

  // Binds the listening socket; returns the port. Unavailable when the
  // address is taken.
  Result<int> Bind();
  // Serves until Stop() (REQUIRES: Bind() succeeded). Returns after the
  // in-flight requests finished.
  Status Serve();
  // Thread-safe and async-signal-unsafe: call from a normal thread.
  void Stop();

  int port() const;
  HubServerStats stats() const;

 private:
  HubServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_SERVER_H_
