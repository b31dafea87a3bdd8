// HubServer: megahub's HTTP service. This file wires the HTTP layer
// (http_server.{h,cc}: libmicrohttpd) to the router and the route groups
// (routes_*.cc), authenticates every request before routing, and keeps the
// counters of GET /api/stats. Layout: docs/hub.md §4.
#include "megackpt/hub/server.h"

#include <cstdio>
#include <fstream>

#include "hub/server_internal.h"

namespace megackpt::hub {
namespace {

uint64_t ReadPeakRss() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

HubServerStats Snapshot(const ServerCounters& c) {
  HubServerStats st;
  st.requests = c.requests;
  st.request_body_bytes = c.request_body_bytes;
  st.xorbs_received = c.xorbs_received;
  st.xorb_bytes_received = c.xorb_bytes_received;
  st.xorbs_inserted = c.xorbs_inserted;
  st.shards_received = c.shards_received;
  st.blob_bytes_received = c.blob_bytes_received;
  st.commits = c.commits;
  st.responses_4xx = c.responses_4xx;
  st.responses_5xx = c.responses_5xx;
  st.peak_rss_bytes = ReadPeakRss();
  return st;
}

// A request's identity and route match, alive until its body is read.
struct HeldCall {
  Identity who;
  std::unique_ptr<Call> call;
};

// Keeps the HeldCall alive while a route's BodyReader runs.
class HoldingBody final : public httpd::BodyReader {
 public:
  HoldingBody(std::shared_ptr<HeldCall> held, std::unique_ptr<httpd::BodyReader> inner)
      : held_(std::move(held)), inner_(std::move(inner)) {}
  Status Append(std::span<const std::byte> data) override { return inner_->Append(data); }
  Result<Response> Finish(const Status& status) override { return inner_->Finish(status); }

 private:
  std::shared_ptr<HeldCall> held_;
  std::unique_ptr<httpd::BodyReader> inner_;
};

}  // namespace

struct HubServer::Impl {
  ServerContext ctx;
  HubRouter router;
  std::unique_ptr<httpd::HttpServer> http;

  Result<Action> Begin(Request& req) {
    ++ctx.counters.requests;
    auto held = std::make_shared<HeldCall>();
    held->who = Authenticate(ctx, req);
    if (auto cas = CheckCasAccess(ctx, req, held->who); cas && !cas->ok()) return *cas;
    RouteMatch match;
    const RouteFn* route = router.Find(req.method, req.segments, &match);
    if (!route) return Action(ErrorResponse(404, "no route for " + req.method + " " + req.path));
    held->call = std::make_unique<Call>(Call{ctx, req, held->who, std::move(match)});
    MEGA_ASSIGN_OR_RETURN(Action action, (*route)(*held->call).Take());
    if (action.body) action.body = std::make_unique<HoldingBody>(held, std::move(action.body));
    return action;
  }

  void Done(const Request& req, int status, double ms) {
    if (status >= 500) {
      ++ctx.counters.responses_5xx;
    } else if (status >= 400) {
      ++ctx.counters.responses_4xx;
    }
    if (ctx.options.log_requests) {
      std::fprintf(stderr, "megahub: %s %s -> %d (%.1f ms)\n", req.method.c_str(),
                   req.target.c_str(), status, ms);
    }
  }
};

HubServer::~HubServer() = default;

Result<std::unique_ptr<HubServer>> HubServer::Create(std::shared_ptr<HubStore> store,
                                                     const HubServerOptions& options) {
  std::unique_ptr<HubServer> server(new HubServer());
  server->impl_ = std::make_unique<Impl>();
  Impl* impl = server->impl_.get();
  impl->ctx.store = std::move(store);
  impl->ctx.options = options;
  MEGA_ASSIGN_OR_RETURN(impl->ctx.secret, impl->ctx.store->ServerSecret());

  HubRouter& r = impl->router;
  AddRepoRoutes(r);
  AddUploadRoutes(r);
  AddBucketRoutes(r);
  AddHfRoutes(r);
  AddCasRoutes(r);
  r.Add("*", "/api/stats/*?", [impl](Call&) -> Routed {
    HubServerStats st = Snapshot(impl->ctx.counters);
    return (JsonResponse({{"requests", st.requests},
                          {"request_body_bytes", st.request_body_bytes},
                          {"xorbs_received", st.xorbs_received},
                          {"xorb_bytes_received", st.xorb_bytes_received},
                          {"xorbs_inserted", st.xorbs_inserted},
                          {"shards_received", st.shards_received},
                          {"blob_bytes_received", st.blob_bytes_received},
                          {"commits", st.commits},
                          {"responses_4xx", st.responses_4xx},
                          {"responses_5xx", st.responses_5xx},
                          {"peak_rss_bytes", st.peak_rss_bytes}}));
  });
  AddDownloadRoutes(r);

  httpd::HttpServerOptions ho;
  ho.host = options.host;
  ho.port = options.port;
  ho.threads = std::max(1, options.threads);
  ho.listen_backlog = options.listen_backlog;
  ho.max_connections = options.max_connections;
  ho.max_connections_per_client = options.max_connections_per_client;
  ho.header_timeout_seconds = options.header_timeout_seconds;
  ho.read_timeout_seconds = options.read_timeout_seconds;
  impl->http = std::make_unique<httpd::HttpServer>(
      ho, [impl](Request& req) { return impl->Begin(req); },
      [](const Status& s) { return ErrorFrom(s); },
      [impl](const Request& req, int status, double ms) { impl->Done(req, status, ms); },
      [impl](size_t n) { impl->ctx.counters.request_body_bytes += n; });
  return server;
}

Result<int> HubServer::Bind() {
  MEGA_ASSIGN_OR_RETURN(impl_->ctx.port, impl_->http->Bind());
  return impl_->ctx.port;
}

Status HubServer::Serve() { return impl_->http->Serve(); }

void HubServer::Stop() { impl_->http->Stop(); }

int HubServer::port() const { return impl_->ctx.port; }

HubServerStats HubServer::stats() const { return Snapshot(impl_->ctx.counters); }

}  // namespace megackpt::hub
