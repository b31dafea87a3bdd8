// Test helpers: a megahub HubServer served in-process on a loopback port, over
// a fresh store in a temp folder, with one write token; a raw HTTP connection. For the hub layer's
// unit tests (the integration tests run the megahub binary: tests/hub_test_server.h).
#ifndef MEGACKPT_SRC_HUB_TEST_SERVER_H_
#define MEGACKPT_SRC_HUB_TEST_SERVER_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "core/test_files.h"
#include "megackpt/hub/server.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub::testing {

struct Answer {
  int status = 0;
  std::string body;
};

// One client TCP connection to 127.0.0.1:port speaking raw HTTP/1.1 (for
// tests of pipelining, early answers and connection limits).
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    timeval tv{20, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawConnection() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }
  bool Send(std::string_view s) {
    while (!s.empty()) {
      ssize_t n = send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      s.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // True when the server closed the connection (or reset it) within
  // `timeout_ms` without sending anything more.
  bool ClosedWithin(int timeout_ms) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char tmp[4096];
    ssize_t n = recv(fd_, tmp, sizeof tmp, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }
  // Sends `request` and reads one response (nullopt when the send fails or no
  // complete response comes).
  std::optional<Answer> Exchange(std::string_view request) {
    if (!Send(request)) return std::nullopt;
    return Read();
  }
  // Reads one response with a Content-Length body.
  std::optional<Answer> Read() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    std::string head = buf_.substr(0, end);
    Answer a;
    if (head.size() < 12) return std::nullopt;
    a.status = std::atoi(head.c_str() + 9);
    size_t len = 0;
    for (const char* key : {"Content-Length: ", "content-length: "}) {
      size_t p = head.find(key);
      if (p != std::string::npos) len = std::strtoull(head.c_str() + p + 16, nullptr, 10);
    }
    buf_.erase(0, end + 4);
    while (buf_.size() < len) {
      if (!Fill()) return std::nullopt;
    }
    a.body = buf_.substr(0, len);
    buf_.erase(0, len);
    return a;
  }

 private:
  bool Fill() {
    char tmp[65536];
    ssize_t n = recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool ok_ = false;
  std::string buf_;
};

// `a` (an answer read from a RawConnection) came, with HTTP status `status`
// (its body in the message when not). No answer is a fatal failure: call as
// ASSERT_NO_FATAL_FAILURE(ExpectAnswer(a, 200)).
inline void ExpectAnswer(const std::optional<Answer>& a, int status) {
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, status) << a->body;
}

// A fixture base: SetUp opens a store under $TMPDIR/<prefix>-XXXXXX/hub (no
// fsync), creates a write token and serves it on 127.0.0.1; TearDown stops the
// server and removes the folder.
class InProcessHubTest : public ::testing::Test {
 protected:
  explicit InProcessHubTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    tmp_.emplace(prefix_);
    root_ = tmp_->path();
    HubStoreOptions so;
    so.sync = false;
    auto store = HubStore::Open(root_ + "/hub", so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto token = (*store)->CreateToken(TokenScope::kWrite, std::nullopt);
    ASSERT_TRUE(token.ok()) << token.status().ToString();
    token_ = *token;
    auto server = HubServer::Create(std::shared_ptr<HubStore>(std::move(*store)));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    auto port = server_->Bind();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
    endpoint_ = "http://127.0.0.1:" + std::to_string(port_);
    serving_ = std::thread([this] { (void)server_->Serve(); });
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (serving_.joinable()) serving_.join();
    server_.reset();
    tmp_.reset();
  }

  std::optional<test_util::TempDir> tmp_;
  std::string prefix_, root_, token_, endpoint_;
  int port_ = 0;
  std::unique_ptr<HubServer> server_;
  std::thread serving_;
};

}  // namespace megackpt::hub::testing

#endif  // MEGACKPT_SRC_HUB_TEST_SERVER_H_
