#include "hub/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

namespace megackpt::hub {
namespace {

bool RetryableStatus(int status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 ||
         status == 504;
}

// The HTTP error statuses with one meaning each (409 depends on the message).
struct HttpErrorCode {
  int http_status;
  StatusCode code;
};
constexpr HttpErrorCode kHttpErrorCodes[] = {
    {400, StatusCode::kInvalidArgument},    {401, StatusCode::kUnauthenticated},
    {403, StatusCode::kPermissionDenied},   {404, StatusCode::kNotFound},
    {412, StatusCode::kFailedPrecondition}, {413, StatusCode::kResourceExhausted},
    {416, StatusCode::kOutOfRange},         {501, StatusCode::kUnimplemented},
};

}  // namespace

std::string HttpResponse::Header(std::string_view key) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == key.size() && std::equal(k.begin(), k.end(), key.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      return v;
    }
  }
  return "";
}

Status ErrorFromHttp(const HttpResponse& r, std::string_view what) {
  std::string msg;
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (j.contains("error") && j["error"].is_string())
      msg = j["error"].get<std::string>();
    else if (j.contains("message") && j["message"].is_string())
      msg = j["message"].get<std::string>();
  }
  if (msg.empty()) msg = r.Header("X-Error-Message");
  if (msg.empty()) msg = r.body.substr(0, 200);
  std::string text =
      std::string(what) + ": HTTP " + std::to_string(r.status) + (msg.empty() ? "" : ": " + msg);
  if (r.status == 409) {
    return msg.find("conflict") != std::string::npos ? AbortedError(text)
                                                     : AlreadyExistsError(text);
  }
  for (const HttpErrorCode& e : kHttpErrorCodes) {
    if (e.http_status == r.status) return Status(e.code, text);
  }
  if (RetryableStatus(r.status)) return UnavailableError(text);
  return InternalError(text);
}

namespace {

// libcurl's global state, set up once per process before the first handle.
void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

bool NotSent(CURLcode c) {
  return c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST ||
         c == CURLE_COULDNT_RESOLVE_PROXY;
}

// Per-attempt state shared with libcurl's callbacks.
struct Exchange {
  CURL* curl = nullptr;
  const HttpRequest* request = nullptr;
  HttpResponse* out = nullptr;
  std::atomic<uint64_t>* received = nullptr;
  bool sink_refused = false;
};

size_t OnBody(char* data, size_t size, size_t nmemb, void* cls) {
  auto* x = static_cast<Exchange*>(cls);
  size_t n = size * nmemb;
  *x->received += n;
  long code = 0;
  curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &code);
  if (x->request->sink && code >= 200 && code < 300) {
    if (!x->request->sink(data, n)) {
      x->sink_refused = true;
      return 0;  // CURLE_WRITE_ERROR
    }
    return n;
  }
  if (!x->request->sink || x->out->body.size() < (1u << 16)) x->out->body.append(data, n);
  return n;
}

size_t OnHeader(char* data, size_t size, size_t nmemb, void* cls) {
  auto* x = static_cast<Exchange*>(cls);
  size_t n = size * nmemb;
  std::string_view line(data, n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {
    x->out->headers.clear();  // a new status line (after 100 Continue, a redirect)
    return n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  std::string_view value = line.substr(colon + 1);
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  x->out->headers.emplace(std::string(line.substr(0, colon)), std::string(value));
  return n;
}

}  // namespace

struct HttpClient::Handle {
  CURL* curl = nullptr;
  Handle() : curl(curl_easy_init()) {}
  ~Handle() {
    if (curl) curl_easy_cleanup(curl);
  }
};

HttpClient::HttpClient(std::string endpoint, std::string token, RemoteOptions options)
    : endpoint_(std::move(endpoint)), token_(std::move(token)), options_(options) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  InitCurlOnce();
}

HttpClient::~HttpClient() = default;

std::unique_ptr<HttpClient::Handle> HttpClient::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  return std::make_unique<Handle>();
}

void HttpClient::Release(std::unique_ptr<Handle> h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < static_cast<size_t>(std::max(1, options_.max_connections))) {
    idle_.push_back(std::move(h));
  }
}

Result<HttpResponse> HttpClient::Send(const HttpRequest& request) {
  std::string what = request.method + " " + endpoint_ + request.target;
  thread_local std::mt19937 rng(std::random_device{}());
  const std::string_view body =
      request.body_ref.empty() ? std::string_view(request.body) : request.body_ref;
  const bool sends_body = !body.empty() || request.method == "POST" || request.method == "PUT";
  std::string url = endpoint_ + request.target;
  for (int attempt = 0;; ++attempt) {
    auto handle = Acquire();
    if (!handle->curl) return InternalError(what + ": curl_easy_init failed");
    CURL* c = handle->curl;
    // Options are set afresh for every request; the handle keeps its connection.
    curl_easy_reset(c);
    HttpResponse out;
    Exchange x{c, &request, &out, &bytes_received_};
    curl_slist* headers = nullptr;
    for (const auto& [k, v] : request.headers)
      headers = curl_slist_append(headers, (k + ": " + v).c_str());
    if (!token_.empty())
      headers = curl_slist_append(headers, ("Authorization: Bearer " + token_).c_str());
    if (sends_body) {
      std::string type =
          request.content_type.empty() ? "application/octet-stream" : request.content_type;
      headers = curl_slist_append(headers, ("Content-Type: " + type).c_str());
    }
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 1L << 20);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT,
                     static_cast<long>(std::max(1, options_.connect_timeout_seconds)));
    // An I/O timeout: less than 1 byte/s for io_timeout_seconds aborts.
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max(1, options_.io_timeout_seconds)));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
    if (request.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (request.method != "GET") {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    if (sends_body) {
      // Sent from the caller's memory (no copy).
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    if (request.reset) request.reset();
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    Release(std::move(handle));
    if (rc == CURLE_OK) bytes_sent_ += sends_body ? body.size() : 0;
    if (rc != CURLE_OK) {
      if (x.sink_refused) return AbortedError(what + ": canceled by the receiver");
      if ((request.idempotent || NotSent(rc)) && attempt < options_.max_retries) {
        int ms = std::min(8000, options_.initial_backoff_ms << attempt);
        std::this_thread::sleep_for(std::chrono::milliseconds(ms / 2 + rng() % (ms / 2 + 1)));
        continue;
      }
      if (NotSent(rc) || rc == CURLE_OPERATION_TIMEDOUT) {
        return UnavailableError("cannot reach the hub at " + endpoint_ + " (" + what + ": " +
                                curl_easy_strerror(rc) + ", " + std::to_string(attempt + 1) +
                                " attempts): is megahub running at " + endpoint_ +
                                "? Start one with `megahub serve --root DIR --port N`, or point "
                                "MEGA_ENDPOINT (or --endpoint) at a running hub");
      }
      return UnavailableError(what + ": " + curl_easy_strerror(rc) + " after " +
                              std::to_string(attempt + 1) + " attempt(s) (the connection to " +
                              endpoint_ +
                              " failed; retry, or check that megahub is still running)");
    }
    out.status = static_cast<int>(code);
    bool server_refused = out.status == 429 || out.status == 503;
    if (RetryableStatus(out.status) && (request.idempotent || server_refused) &&
        attempt < options_.max_retries) {
      int ms = std::min(8000, options_.initial_backoff_ms << attempt);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms / 2 + rng() % (ms / 2 + 1)));
      continue;
    }
    return out;
  }
}

Status HttpClient::ErrorFor(const HttpResponse& r, std::string_view what) const {
  Status s = ErrorFromHttp(r, what);
  if (r.status == 401) {
    std::string hint = token_.empty() ? "; no token was sent: set MEGA_TOKEN=<token> (or pass "
                                        "--token); `megahub token create --root "
                                        "DIR --scope write` prints one"
                                      : "; the hub did not accept the token in MEGA_TOKEN / "
                                        "--token (a token of another hub root, "
                                        "or an expired CAS token): create one with `megahub token "
                                        "create --root DIR --scope write`";
    return UnauthenticatedError(std::string(s.message()) + hint);
  }
  if (r.status == 403) {
    return PermissionDeniedError(std::string(s.message()) +
                                 "; the token may not do this: writes need a write token "
                                 "(`megahub token create --scope write`, with --namespace NS for "
                                 "a namespace-limited one)");
  }
  return s;
}

Result<HttpResponse> HttpClient::Call(const HttpRequest& request) {
  MEGA_ASSIGN_OR_RETURN(HttpResponse r, Send(request));
  if (r.status >= 400) return ErrorFor(r, request.method + " " + endpoint_ + request.target);
  return r;
}

Result<HttpResponse> HttpClient::GetRange(const std::string& target, uint64_t offset,
                                          std::span<std::byte> dst, size_t* got) {
  const std::string range = std::to_string(offset) + "-" + std::to_string(offset + dst.size() - 1);
  HttpRequest req;
  req.target = target;
  req.headers.push_back({"Range", "bytes=" + range});
  size_t pos = 0;
  bool overflow = false;
  req.reset = [&] {
    pos = 0;
    overflow = false;
  };
  req.sink = [&](const char* data, size_t len) {
    if (len > dst.size() - pos) {
      overflow = true;
      return false;
    }
    std::memcpy(dst.data() + pos, data, len);
    pos += len;
    return true;
  };
  auto r = Call(req);
  *got = pos;
  if (overflow) {
    return DataLossError("GET " + endpoint_ + target + " (bytes " + range +
                         "): the answer is longer than the " + std::to_string(dst.size()) +
                         " bytes asked for");
  }
  return r;
}

}  // namespace megackpt::hub
