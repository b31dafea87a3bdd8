// libmicrohttpd glue: request state per HTTP request, the two-step handling
// of http_server.h, responses from strings (handed over without a copy) or
// from a stream callback.
#include "hub/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "megackpt/core/path_components.h"
#include "megackpt/hub/mega_uri.h"

namespace megackpt::hub::httpd {
namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::string Find(const HeaderList& list, std::string_view name, bool ignore_case) {
  for (const auto& [k, v] : list) {
    if (ignore_case ? EqualsIgnoreCase(k, name) : k == name) return v;
  }
  return "";
}

bool Has(const HeaderList& list, std::string_view name, bool ignore_case) {
  for (const auto& [k, v] : list) {
    if (ignore_case ? EqualsIgnoreCase(k, name) : k == name) return true;
  }
  return false;
}

// Query component decoding: '+' is a space, then percent-decoding.
std::string DecodeQueryPart(std::string_view s) {
  std::string plus(s);
  std::replace(plus.begin(), plus.end(), '+', ' ');
  auto decoded = PercentDecode(plus);
  return decoded.ok() ? *decoded : plus;
}

// Discards a body, then answers with a prepared response (an early answer
// that keeps the connection usable).
class DrainBody final : public BodyReader {
 public:
  explicit DrainBody(Response r) : response_(std::move(r)) {}
  Status Append(std::span<const std::byte>) override { return Status::OK(); }
  Result<Response> Finish(const Status&) override { return std::move(response_); }

 private:
  Response response_;
};

class Buffered final : public BodyReader {
 public:
  Buffered(uint64_t limit, uint64_t reserve, std::function<Result<Response>(std::string)> then)
      : limit_(limit), then_(std::move(then)) {
    if (reserve > 0 && reserve <= limit) body_.reserve(static_cast<size_t>(reserve));
  }
  Status Append(std::span<const std::byte> data) override {
    if (body_.size() + data.size() > limit_) {
      body_.clear();
      body_.shrink_to_fit();
      return ResourceExhaustedError("request body exceeds " + std::to_string(limit_) + " bytes");
    }
    body_.append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::OK();
  }
  Result<Response> Finish(const Status& status) override {
    if (!status.ok()) return status;
    return then_(std::move(body_));
  }

 private:
  uint64_t limit_;
  std::string body_;
  std::function<Result<Response>(std::string)> then_;
};

}  // namespace

std::string Request::Header(std::string_view name) const { return Find(headers, name, true); }
bool Request::HasHeader(std::string_view name) const { return Has(headers, name, true); }
std::string Request::Param(std::string_view name, std::string def) const {
  return Has(query, name, false) ? Find(query, name, false) : def;
}
bool Request::HasParam(std::string_view name) const { return Has(query, name, false); }
std::vector<std::string> Request::Params(std::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [k, v] : query) {
    if (k == name) out.push_back(v);
  }
  return out;
}

void Response::SetHeader(std::string name, std::string value) {
  for (auto& [k, v] : headers) {
    if (EqualsIgnoreCase(k, name)) {
      v = std::move(value);
      return;
    }
  }
  headers.emplace_back(std::move(name), std::move(value));
}

std::string Response::Header(std::string_view name) const { return Find(headers, name, true); }

Status ParseTarget(Request* r) {
  size_t q = r->target.find('?');
  r->path = q == std::string::npos ? r->target : r->target.substr(0, q);
  if (r->path.empty() || r->path[0] != '/') {
    return InvalidArgumentError("bad request target '" + r->target.substr(0, 200) + "'");
  }
  r->segments.clear();
  for (std::string_view part : PathComponents(std::string_view(r->path).substr(1))) {
    auto decoded = PercentDecode(part);
    if (!decoded.ok()) return decoded.status();
    r->segments.push_back(*std::move(decoded));
  }
  while (!r->segments.empty() && r->segments.back().empty()) r->segments.pop_back();
  r->query.clear();
  if (q != std::string::npos) {
    std::string_view qs = std::string_view(r->target).substr(q + 1);
    while (!qs.empty()) {
      size_t amp = qs.find('&');
      std::string_view item = qs.substr(0, amp);
      if (!item.empty()) {
        size_t eq = item.find('=');
        r->query.emplace_back(
            DecodeQueryPart(item.substr(0, eq)),
            eq == std::string_view::npos ? "" : DecodeQueryPart(item.substr(eq + 1)));
      }
      if (amp == std::string_view::npos) break;
      qs.remove_prefix(amp + 1);
    }
  }
  return Status::OK();
}

std::unique_ptr<BodyReader> BufferedBody(uint64_t limit, uint64_t reserve,
                                         std::function<Result<Response>(std::string body)> then) {
  return std::make_unique<Buffered>(limit, reserve, std::move(then));
}

// ---------------------------------------------------------------------------

struct HttpServer::Impl {
  HttpServerOptions options;
  BeginFn begin;
  ErrorFn error;
  DoneFn done;
  BodyBytesFn body_bytes;
  int listen_fd = -1;
  int port = 0;
  MHD_Daemon* daemon = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  bool stop_requested = false;
  int in_flight = 0;  // requests between their first callback and completion
  // When a request last made progress (a callback ran: headers, body bytes,
  // a response block). At shutdown, requests that made none for a while are
  // not waited for: a client that died mid-body is not always noticed by
  // libmicrohttpd before its connection's timeout (seen after SIGKILLed
  // pushes: the request's completion never came until the 60 s timeout).
  std::atomic<int64_t> last_progress_ms{0};
  std::atomic<int> in_handler{0};  // threads running a route callback now
  void Progressed() { last_progress_ms = NowMs(); }
  static int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Per HTTP request (MHD's req_cls).
  struct State {
    Request request;
    bool begun = false;
    std::unique_ptr<BodyReader> reader;
    Status failure;          // Append's first error
    uint64_t discarded = 0;  // body bytes dropped after a failure
    int status = 0;          // answered status (0: none yet)
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };

  static void* UriLog(void* cls, const char* uri, MHD_Connection*) {
    auto* self = static_cast<Impl*>(cls);
    auto* st = new State();
    (void)self;
    st->request.target = uri ? uri : "";
    return st;
  }

  static void Completed(void* cls, MHD_Connection* connection, void** req_cls,
                        MHD_RequestTerminationCode) {
    auto* self = static_cast<Impl*>(cls);
    auto* st = static_cast<State*>(*req_cls);
    *req_cls = nullptr;
    if (!st) return;
    if (st->begun && self->done) {
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - st->start)
              .count();
      self->done(st->request, st->status, ms);
    }
    bool counted = st->begun;
    delete st;
    // Back to the idle/header timeout for the next request on this connection.
    if (connection) {
      MHD_set_connection_option(
          connection, MHD_CONNECTION_OPTION_TIMEOUT,
          static_cast<unsigned int>(std::max(1, self->options.header_timeout_seconds)));
    }
    if (counted) {
      std::lock_guard<std::mutex> lock(self->mu);
      --self->in_flight;
    }
    self->cv.notify_all();
  }

  static MHD_Result CollectHeader(void* cls, MHD_ValueKind, const char* key, const char* value) {
    static_cast<Request*>(cls)->headers.emplace_back(key ? key : "", value ? value : "");
    return MHD_YES;
  }

  static ssize_t ReadStream(void* cls, uint64_t pos, char* buf, size_t max) {
    auto* r = static_cast<Response*>(cls);
    if (pos >= r->stream_length) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = static_cast<size_t>(std::min<uint64_t>(max, r->stream_length - pos));
    Result<size_t> got = InternalError("stream threw");
    try {
      got = r->stream(pos, std::as_writable_bytes(std::span<char>(buf, n)));
    } catch (const std::exception& e) {
      got = InternalError(e.what());
    }
    if (!got.ok() || *got == 0 || *got > n) {
      if (!got.ok() && got.status().code() != StatusCode::kUnavailable) {
        std::fprintf(stderr, "megahub: streaming a response failed at byte %llu: %s\n",
                     static_cast<unsigned long long>(pos),
                     got.ok() ? "no bytes" : got.status().ToString().c_str());
      }
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return static_cast<ssize_t>(*got);
  }

  static void FreeResponse(void* cls) { delete static_cast<Response*>(cls); }
  static void FreeString(void* cls) { delete static_cast<std::string*>(cls); }

  MHD_Result Queue(MHD_Connection* connection, State* st, Response r) {
    st->status = r.status;
    MHD_Response* resp = nullptr;
    HeaderList headers = std::move(r.headers);
    int status = r.status;
    if (r.head_length) {
      // HEAD: libmicrohttpd sends the size as Content-Length and no body.
      auto* owned = new Response();
      owned->stream_length = *r.head_length;
      owned->stream = [](uint64_t, std::span<std::byte>) -> Result<size_t> {
        return InternalError("HEAD answers have no body");
      };
      resp = MHD_create_response_from_callback(*r.head_length, 4096, &ReadStream, owned,
                                               &FreeResponse);
    } else if (r.stream) {
      uint64_t len = r.stream_length;
      auto* owned = new Response(std::move(r));
      owned->stream = [this, inner = std::move(owned->stream)](uint64_t pos,
                                                               std::span<std::byte> dst) {
        Progressed();
        return inner(pos, dst);
      };
      resp = MHD_create_response_from_callback(len, 1u << 20, &ReadStream, owned, &FreeResponse);
    } else {
      auto* owned = new std::string(std::move(r.body));
      resp = MHD_create_response_from_buffer_with_free_callback_cls(owned->size(), owned->data(),
                                                                    &FreeString, owned);
    }
    if (!resp) return MHD_NO;
    for (const auto& [k, v] : headers) MHD_add_response_header(resp, k.c_str(), v.c_str());
    MHD_Result ok = MHD_queue_response(connection, static_cast<unsigned int>(status), resp);
    MHD_destroy_response(resp);
    return ok;
  }

  Response ErrorAnswer(const Status& s) { return error(s); }

  MHD_Result Begin(MHD_Connection* connection, const char* method, State* st) {
    st->begun = true;
    {
      std::lock_guard<std::mutex> lock(mu);
      ++in_flight;
    }
    Request& req = st->request;
    req.method = method ? method : "";
    MHD_get_connection_values(connection, MHD_HEADER_KIND, &CollectHeader, &req);
    std::string cl = req.Header("Content-Length");
    if (!cl.empty()) {
      char* end = nullptr;
      unsigned long long v = std::strtoull(cl.c_str(), &end, 10);
      if (end && *end == '\0') req.content_length = v;
    }
    req.has_body =
        (req.content_length && *req.content_length > 0) || req.HasHeader("Transfer-Encoding");
    // Bodies are read under the (longer) read timeout.
    MHD_set_connection_option(connection, MHD_CONNECTION_OPTION_TIMEOUT,
                              static_cast<unsigned int>(std::max(1, options.read_timeout_seconds)));
    Result<Action> action = InternalError("no action");
    Status parsed = ParseTarget(&req);
    if (!parsed.ok()) {
      action = parsed;
    } else {
      try {
        action = begin(req);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "megahub: internal error in %s %s: %s\n", req.method.c_str(),
                     req.target.substr(0, 300).c_str(), e.what());
        action = InternalError(std::string("internal error: ") + e.what());
      }
    }
    // libmicrohttpd calls again once the request is complete (at once when
    // there is no body); answers are queued then, so the connection stays
    // alive. Queueing now means "do not read the body, close after".
    if (action.ok() && action->body) {
      st->reader = std::move(action->body);
      return MHD_YES;
    }
    Response r = action.ok() ? std::move(action->response) : ErrorAnswer(action.status());
    if (!req.has_body || (req.content_length && *req.content_length <= options.drain_limit)) {
      st->reader = std::make_unique<DrainBody>(std::move(r));
      return MHD_YES;
    }
    // A body too large to drain (or of unknown length): answer now.
    return Queue(connection, st, std::move(r));
  }

  MHD_Result Finish(MHD_Connection* connection, State* st, BodyReader* reader) {
    Result<Response> r = InternalError("no response");
    try {
      r = reader->Finish(st->failure);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megahub: internal error in %s %s: %s\n", st->request.method.c_str(),
                   st->request.target.substr(0, 300).c_str(), e.what());
      r = InternalError(std::string("internal error: ") + e.what());
    }
    return Queue(connection, st, r.ok() ? *std::move(r) : ErrorAnswer(r.status()));
  }

  static MHD_Result Access(void* cls, MHD_Connection* connection, const char*, const char* method,
                           const char*, const char* upload_data, size_t* upload_data_size,
                           void** req_cls) {
    auto* self = static_cast<Impl*>(cls);
    auto* st = static_cast<State*>(*req_cls);
    if (!st) return MHD_NO;
    self->Progressed();
    ++self->in_handler;
    struct Leave {
      Impl* self;
      ~Leave() {
        self->Progressed();
        --self->in_handler;
      }
    } leave{self};
    if (!st->begun) return self->Begin(connection, method, st);
    if (!st->reader) return MHD_NO;  // answered already
    if (*upload_data_size > 0) {
      size_t n = *upload_data_size;
      *upload_data_size = 0;
      if (self->body_bytes) self->body_bytes(n);
      if (st->failure.ok()) {
        try {
          st->failure = st->reader->Append(std::as_bytes(std::span<const char>(upload_data, n)));
        } catch (const std::exception& e) {
          std::fprintf(stderr, "megahub: internal error in %s %s: %s\n", st->request.method.c_str(),
                       st->request.target.substr(0, 300).c_str(), e.what());
          st->failure = InternalError(std::string("internal error: ") + e.what());
        }
      } else {
        st->discarded += n;
        // A body without end (chunked) after a failure: cut the connection.
        if (st->discarded > (256ull << 20)) return MHD_NO;
      }
      return MHD_YES;
    }
    auto reader = std::move(st->reader);
    return self->Finish(connection, st, reader.get());
  }

  static void Log(void*, const char* fmt, va_list ap) {
    std::fprintf(stderr, "megahub: http: ");
    std::vfprintf(stderr, fmt, ap);
  }
};

HttpServer::HttpServer(HttpServerOptions options, BeginFn begin, ErrorFn error, DoneFn done,
                       BodyBytesFn body_bytes)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->begin = std::move(begin);
  impl_->error = std::move(error);
  impl_->done = std::move(done);
  impl_->body_bytes = std::move(body_bytes);
}

HttpServer::~HttpServer() {
  if (impl_->daemon) MHD_stop_daemon(impl_->daemon);
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
}

Result<int> HttpServer::Bind() {
  const HttpServerOptions& o = impl_->options;
  std::string where = o.host + ":" + std::to_string(o.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(o.host.empty() ? nullptr : o.host.c_str(), std::to_string(o.port).c_str(),
                         &hints, &found);
  if (rc != 0) return UnavailableError("cannot resolve " + where + ": " + gai_strerror(rc));
  int fd = -1;
  int err = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::listen(fd, std::max(16, o.listen_backlog)) == 0)
      break;
    err = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  if (fd < 0) return UnavailableError("cannot bind " + where + " (in use?): " + std::strerror(err));
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, nullptr, 0, serv, sizeof serv,
                    NI_NUMERICSERV) != 0) {
    ::close(fd);
    return UnavailableError("cannot read the port of " + where);
  }
  impl_->listen_fd = fd;
  impl_->port = std::atoi(serv);
  return impl_->port;
}

Status HttpServer::Serve() {
  Impl* impl = impl_.get();
  const HttpServerOptions& o = impl->options;
  if (impl->listen_fd < 0) return FailedPreconditionError("HttpServer::Serve before Bind");
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    if (impl->stop_requested) {
      // Stopped before serving: connections queued in the backlog are
      // refused now rather than left waiting for the destructor.
      ::close(impl->listen_fd);
      impl->listen_fd = -1;
      return Status::OK();
    }
  }
  // poll(), not epoll: libmicrohttpd 0.9.75 (Debian 12) with a thread pool and
  // epoll aborts the process ("Failed to remove listen FD from epoll set") when
  // MHD_quiesce_daemon races a worker that drops the listening socket from its
  // own epoll set; with poll() quiescing is a message to each worker instead.
  // Each worker polls only its own connections, so the cost is the same here.
  unsigned int flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
  MHD_OptionItem opts[] = {
      {MHD_OPTION_EXTERNAL_LOGGER, reinterpret_cast<intptr_t>(&Impl::Log), impl},
      {MHD_OPTION_LISTEN_SOCKET, impl->listen_fd, nullptr},
      {MHD_OPTION_THREAD_POOL_SIZE, std::max(1, o.threads), nullptr},
      {MHD_OPTION_CONNECTION_LIMIT, std::max(1, o.max_connections), nullptr},
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, std::max(1, o.max_connections_per_client), nullptr},
      {MHD_OPTION_CONNECTION_TIMEOUT, std::max(1, o.header_timeout_seconds), nullptr},
      {MHD_OPTION_CONNECTION_MEMORY_LIMIT,
       static_cast<intptr_t>(std::max<size_t>(64u << 10, o.connection_buffer_bytes)), nullptr},
      {MHD_OPTION_URI_LOG_CALLBACK, reinterpret_cast<intptr_t>(&Impl::UriLog), impl},
      {MHD_OPTION_NOTIFY_COMPLETED, reinterpret_cast<intptr_t>(&Impl::Completed), impl},
      {MHD_OPTION_END, 0, nullptr},
  };
  impl->daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &Impl::Access, impl, MHD_OPTION_ARRAY,
                                  opts, MHD_OPTION_END);
  if (!impl->daemon)
    return UnavailableError("cannot start the HTTP server on port " + std::to_string(impl->port));
  std::unique_lock<std::mutex> lock(impl->mu);
  impl->cv.wait(lock, [impl] { return impl->stop_requested; });
  lock.unlock();
  // Stop accepting (the listening socket stays ours), let the requests being
  // handled finish, then close every connection.
  MHD_quiesce_daemon(impl->daemon);
  // Wait while requests are in flight and a route runs or some request made
  // progress in the last second (bounded by the read timeout); a request
  // stalled that long (its client gone or silent) is cut by MHD_stop_daemon.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(std::max(1, o.read_timeout_seconds));
  lock.lock();
  while (impl->in_flight > 0 && std::chrono::steady_clock::now() < deadline &&
         (impl->in_handler > 0 || Impl::NowMs() - impl->last_progress_ms < 1000)) {
    impl->cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  lock.unlock();
  MHD_stop_daemon(impl->daemon);
  impl->daemon = nullptr;
  ::close(impl->listen_fd);
  impl->listen_fd = -1;
  return Status::OK();
}

void HttpServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop_requested = true;
  }
  impl_->cv.notify_all();
}

int HttpServer::port() const { return impl_->port; }

}  // namespace megackpt::hub::httpd
