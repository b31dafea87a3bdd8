// Test helpers for the hub: a temp folder, a real `megahub serve` child
// process on a loopback port (started with --port 0; the printed port is
// read back), stopped by PID, and fixtures around it (MegahubTest: a fresh hub
// per test with tokens and an HTTP client; SharedHub: one per test binary),
// and a raw HTTP client for tests (TestHttpClient).
#ifndef MEGACKPT_TESTS_HUB_TEST_SERVER_H_
#define MEGACKPT_TESTS_HUB_TEST_SERVER_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/test_files.h"
#include "hub/http_client.h"
#include "test_util.h"

namespace megackpt::testing {

using ::megackpt::test_util::TempDir;

inline std::string MegahubBinary() { return std::string(MEGACKPT_BINARY_DIR) + "/tools/megahub"; }
using ::megackpt::test_util::MegackptBinary;

// Runs a command, returns its stdout (stderr passes through) and exit code.
inline std::string RunCommand(const std::string& cmd, int* exit_code = nullptr) {
  test_util::CommandResult r = test_util::RunCommand(cmd);
  if (exit_code) *exit_code = r.code;
  return r.out;
}

// `megahub token create` on a root; returns the token ("" on failure).
inline std::string CreateToken(const std::string& root, const std::string& scope,
                               const std::string& ns = "") {
  std::string cmd = MegahubBinary() + " token create --root '" + root + "' --scope " + scope;
  if (!ns.empty()) cmd += " --namespace " + ns;
  std::string out = RunCommand(cmd);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

class MegahubProcess {
 public:
  MegahubProcess() = default;
  MegahubProcess(const MegahubProcess&) = delete;
  ~MegahubProcess() { Stop(); }

  // Starts `megahub serve --root root --port port extra...` (port 0: any
  // free port); waits for the
  // "listening on 127.0.0.1:N" line (up to 20 s). False on failure.
  bool Start(const std::string& root, const std::vector<std::string>& extra = {}, int port = 0) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    std::vector<std::string> args = {MegahubBinary(),     "serve", "--root", root, "--port",
                                     std::to_string(port)};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char c;
      ssize_t n = read(out_fd_, &c, 1);
      if (n <= 0) break;
      if (c == '\n') {
        const std::string prefix = "listening on 127.0.0.1:";
        if (line.rfind(prefix, 0) == 0) {
          port_ = std::atoi(line.c_str() + prefix.size());
          return port_ > 0;
        }
        line.clear();
      } else {
        line += c;
      }
    }
    Kill();
    return false;
  }

  // SIGTERM (graceful), then SIGKILL after 10 s. Returns the exit status.
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        Reset();
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    Kill();
    return -1;
  }

  // SIGKILL (a crash).
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    Reset();
  }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void Reset() {
    pid_ = -1;
    if (out_fd_ >= 0) close(out_fd_);
    out_fd_ = -1;
  }
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
};

// One megahub with a write token shared by a whole test binary: started on the
// first call (its root a temp folder named after `prefix`), stopped at exit.
struct SharedHubServer {
  explicit SharedHubServer(const std::string& prefix) : root(prefix) {
    token = CreateToken(root.path(), "write");
    ok = !token.empty() && server.Start(root.path());
  }
  TempDir root;
  MegahubProcess server;
  std::string token;
  bool ok = false;  // false when the token or the server could not be made
};

inline SharedHubServer& SharedHub(const std::string& prefix = "shared-hub") {
  static SharedHubServer* s = [&] {
    auto* p = new SharedHubServer(prefix);
    std::atexit([] {
      // Stop the server, then remove its store (the object itself is never
      // destroyed, so its TempDir would not).
      SharedHubServer& h = SharedHub();
      h.server.Stop();
      std::error_code ec;
      std::filesystem::remove_all(h.root.path(), ec);
    });
    return p;
  }();
  return *s;
}

// Raw HTTP for tests, over the hub's own client (libcurl) with retries off:
// every answer is returned as the server sent it.
using HttpHeaders = std::multimap<std::string, std::string>;

struct HttpAnswer {
  int status = 0;
  std::string body;
  std::multimap<std::string, std::string> headers;
  // First value of a header (case-insensitive), "" when absent.
  std::string get_header_value(const std::string& key) const {
    hub::HttpResponse r;
    r.headers = headers;
    return r.Header(key);
  }
  bool has_header(const std::string& key) const { return !get_header_value(key).empty(); }
};

// Empty (false) when the request failed below HTTP (no answer).
class HttpResult {
 public:
  HttpResult() = default;
  explicit HttpResult(HttpAnswer a) : a_(std::move(a)) {}
  explicit operator bool() const { return a_.has_value(); }
  const HttpAnswer* operator->() const { return &*a_; }
  const HttpAnswer& operator*() const { return *a_; }

 private:
  std::optional<HttpAnswer> a_;
};

class TestHttpClient {
 public:
  explicit TestHttpClient(std::string endpoint) : http_(std::move(endpoint), "", NoRetries()) {}
  HttpResult Get(const std::string& path, const HttpHeaders& h = {}) {
    return Send("GET", path, h, "", "");
  }
  HttpResult Head(const std::string& path, const HttpHeaders& h = {}) {
    return Send("HEAD", path, h, "", "");
  }
  HttpResult Delete(const std::string& path, const HttpHeaders& h = {}) {
    return Send("DELETE", path, h, "", "");
  }
  HttpResult Post(const std::string& path, const HttpHeaders& h, const std::string& body,
                  const std::string& type) {
    return Send("POST", path, h, body, type);
  }
  HttpResult Post(const std::string& path, const std::string& body, const std::string& type) {
    return Send("POST", path, {}, body, type);
  }
  HttpResult Put(const std::string& path, const HttpHeaders& h, const std::string& body,
                 const std::string& type) {
    return Send("PUT", path, h, body, type);
  }
  HttpResult Put(const std::string& path, const std::string& body, const std::string& type) {
    return Send("PUT", path, {}, body, type);
  }

 private:
  static hub::RemoteOptions NoRetries() {
    hub::RemoteOptions o;
    o.max_retries = 0;
    o.io_timeout_seconds = 60;
    return o;
  }
  HttpResult Send(const std::string& method, const std::string& path, const HttpHeaders& h,
                  const std::string& body, const std::string& type) {
    hub::HttpRequest req;
    req.method = method;
    req.target = path;
    req.body = body;
    req.content_type = type;
    for (const auto& [k, v] : h) req.headers.emplace_back(k, v);
    auto r = http_.Send(req);
    if (!r.ok()) return HttpResult();
    return HttpResult(HttpAnswer{r->status, std::move(r->body), std::move(r->headers)});
  }
  hub::HttpClient http_;
};

// Options of a MegahubTest fixture.
struct MegahubTestOptions {
  std::string root_prefix = "megahub-test";  // the hub root: a temp folder "<prefix>-XXXXXX"
  std::vector<std::string> server_flags;     // extra `megahub serve` flags
};

// A fresh megahub per test: a temp root with three tokens (write_, read_, and
// org_only_: write limited to namespace "org"), `megahub serve` with the
// options' flags, and an HTTP client on it (60 s read timeout). TearDown
// expects a clean shutdown (exit status 0). Derive and pass the options:
//   class MyTest : public MegahubTest {
//    protected:
//     MyTest() : MegahubTest({"my-test", {"--part-size", "1024"}}) {}
//   };
class MegahubTest : public ::testing::Test {
 protected:
  explicit MegahubTest(MegahubTestOptions options = {})
      : options_(std::move(options)), root_(options_.root_prefix) {}

  void SetUp() override {
    write_ = CreateToken(root_.path(), "write");
    read_ = CreateToken(root_.path(), "read");
    org_only_ = CreateToken(root_.path(), "write", "org");
    ASSERT_FALSE(write_.empty());
    ASSERT_TRUE(server_.Start(root_.path(), options_.server_flags));
    http_ = std::make_unique<TestHttpClient>(server_.endpoint());
  }
  void TearDown() override { EXPECT_EQ(server_.Stop(), 0) << "megahub did not shut down cleanly"; }

  // "Authorization: Bearer <token>" (no header for "").
  static HttpHeaders Auth(const std::string& token) {
    return token.empty() ? HttpHeaders{} : HttpHeaders{{"Authorization", "Bearer " + token}};
  }
  HttpResult PostJson(const std::string& path, const nlohmann::json& body,
                      const std::string& token) {
    return http_->Post(path.c_str(), Auth(token), body.dump(), "application/json");
  }
  // The response body as JSON (discarded when it is not JSON).
  static nlohmann::json Body(const HttpResult& r) {
    return nlohmann::json::parse(r->body, nullptr, false);
  }

  MegahubTestOptions options_;
  TempDir root_;
  MegahubProcess server_;
  std::string write_, read_, org_only_;
  std::unique_ptr<TestHttpClient> http_;
};

}  // namespace megackpt::testing

#endif  // MEGACKPT_TESTS_HUB_TEST_SERVER_H_
