// The HTTP layer under megahub (http_server.h) with a toy handler: the
// two-step request handling (answer before the body, or read it), keep-alive
// after drained bodies, exceptions as 500s, and raw targets.
#include "hub/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "hub/server_internal.h"
#include "hub/test_server.h"

namespace megackpt::hub::httpd {
namespace {

using ::megackpt::hub::ParseRange;
using ::megackpt::hub::RangeRequest;
using testing::RawConnection;

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions o;
    o.threads = 2;
    o.drain_limit = 64 << 10;
    server_ = std::make_unique<HttpServer>(
        o, [this](Request& r) { return Begin(r); },
        [](const Status& s) {
          Response r;
          r.status = s.code() == StatusCode::kResourceExhausted ? 413
                     : s.code() == StatusCode::kInternal        ? 500
                                                                : 400;
          r.body = s.message();
          return r;
        },
        [this](const Request&, int status, double) { last_status_ = status; },
        [this](size_t n) { body_bytes_ += n; });
    auto port = server_->Bind();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
    serving_ = std::thread([this] { (void)server_->Serve(); });
  }
  void TearDown() override {
    server_->Stop();
    serving_.join();
  }

  Result<Action> Begin(Request& r) {
    if (r.segments.size() == 1 && r.segments[0] == "throw") throw std::runtime_error("a bug");
    if (r.segments.size() == 1 && r.segments[0] == "deny") {
      Response no;
      no.status = 401;
      no.body = "denied";
      return Action(std::move(no));
    }
    if (r.segments.size() == 1 && r.segments[0] == "echo") {
      return Action(BufferedBody(1 << 20, r.content_length.value_or(0),
                                 [](std::string body) -> Result<Response> {
                                   Response res;
                                   res.body = "got " + std::to_string(body.size());
                                   return res;
                                 }));
    }
    Response res;
    res.body = "path";
    for (const auto& s : r.segments) res.body += "|" + s;
    res.body += " q=" + r.Param("q");
    return Action(std::move(res));
  }

  static std::string Post(const std::string& path, size_t length) {
    return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(length) +
           "\r\n\r\n";
  }

  std::unique_ptr<HttpServer> server_;
  std::thread serving_;
  int port_ = 0;
  std::atomic<int> last_status_{0};
  std::atomic<uint64_t> body_bytes_{0};
};

TEST_F(HttpServerTest, SegmentsAreDecodedOneByOneAndQueriesParsed) {
  RawConnection c(port_);
  auto a = c.Exchange("GET /a%2Fb/c?q=x%20y+z HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->body, "path|a/b|c q=x y z");
  a = c.Exchange("GET /bad%zz HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, 400);
}

TEST_F(HttpServerTest, ExceptionsAre500AndTheServerGoesOn) {
  RawConnection c(port_);
  auto a = c.Exchange("GET /throw HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, 500);
  EXPECT_NE(a->body.find("a bug"), std::string::npos);
  a = c.Exchange("GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, 200);
}

TEST_F(HttpServerTest, EarlyAnswersDrainSmallBodiesAndNeverReadLargeOnes) {
  // A small body behind an early answer is drained: the connection goes on.
  RawConnection c(port_);
  auto a = c.Exchange(Post("/deny", 1000) + std::string(1000, 'x') +
                      "GET /after HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, 401);
  a = c.Read();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->body, "path|after q=");
  // A large one is not read: the answer comes from the headers alone, then
  // the connection is closed.
  uint64_t before = body_bytes_;
  RawConnection big(port_);
  a = big.Exchange(Post("/deny", 512 << 20));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, 401);
  EXPECT_TRUE(big.ClosedWithin(2000));
  EXPECT_EQ(body_bytes_ - before, 0u);
  // A body reader gets the body; one over its limit is refused (413), and
  // a declared length is honoured exactly (the next request is intact).
  RawConnection e(port_);
  a = e.Exchange(Post("/echo", 300000) + std::string(300000, 'y') + Post("/echo", 3) + "abc");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->body, "got 300000");
  a = e.Read();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->body, "got 3");
  std::string chunked = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 3; ++i) chunked += "80000\r\n" + std::string(0x80000, 'z') + "\r\n";
  chunked += "0\r\n\r\n";
  a = e.Exchange(chunked);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status, 413);
}

// Stop() while clients connect, ask and hang up must never bring the process
// down or hang. With a thread pool and epoll, libmicrohttpd 0.9.75 (Debian 12)
// aborted about once in 450 stops of the hub tests ("Failed to remove listen
// FD from epoll set": MHD_quiesce_daemon raced a worker dropping the listening
// socket from its own epoll set); the server now runs its pool on poll().
// Every fifth round stops before Serve() starts: Serve() must then close the
// listening socket so that queued clients are refused, not left waiting.
TEST(HttpServerStopTest, StopDuringConnectionChurnNeverAbortsNorHangs) {
  for (int round = 0; round < 200; ++round) {
    SCOPED_TRACE(round);
    HttpServerOptions o;
    o.threads = 64;  // megahub's default pool: one listening socket in 64 workers
    HttpServer server(
        o,
        [](Request&) -> Result<Action> {
          Response res;
          res.body = "ok";
          return Action(std::move(res));
        },
        [](const Status& s) {
          Response r;
          r.status = 500;
          r.body = s.message();
          return r;
        },
        [](const Request&, int, double) {}, [](size_t) {});
    auto port = server.Bind();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    const bool stop_first = round % 5 == 0;
    if (stop_first) server.Stop();
    std::thread serving([&server] { EXPECT_TRUE(server.Serve().ok()); });
    std::atomic<bool> done{false};
    std::atomic<int> answered{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 3; ++t) {
      clients.emplace_back([&done, &answered, p = *port] {
        while (!done.load()) {
          RawConnection c(p);
          if (c.ok() && c.Exchange("GET /x HTTP/1.1\r\nHost: x\r\n\r\n").has_value()) ++answered;
        }
      });
    }
    if (!stop_first) {
      // Stop once the server answers, right after a connection closes.
      while (answered.load() < 1 + round % 4) std::this_thread::yield();
      {
        RawConnection last(*port);
        // EXPECT, not ASSERT: threads are still joinable here.
        EXPECT_TRUE(last.ok());
        if (last.ok()) {
          EXPECT_TRUE(last.Exchange("GET /x HTTP/1.1\r\nHost: x\r\n\r\n").has_value());
        }
      }
      server.Stop();
    }
    const auto t0 = std::chrono::steady_clock::now();
    serving.join();
    done = true;
    for (auto& c : clients) c.join();
    // A client queued in the backlog is refused at once, not after its 20 s
    // receive timeout.
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    if (stop_first) {
      EXPECT_EQ(answered.load(), 0);
    }
  }
}

// RFC 7233 §2.1/§3.1/§4.4 cases of megahub's Range parser.
TEST(RangeParseTest, Rfc7233) {
  using K = RangeRequest::Kind;
  struct Case {
    const char* header;
    uint64_t size;
    K kind;
    uint64_t first, last;
  };
  for (const Case& c : std::initializer_list<Case>{
           {"", 100, K::kWhole, 0, 0},
           {"bytes=0-9", 100, K::kRange, 0, 9},
           {"bytes=90-", 100, K::kRange, 90, 99},
           {"bytes=90-1000", 100, K::kRange, 90, 99},
           {"bytes=-10", 100, K::kRange, 90, 99},
           {"bytes=-1000", 100, K::kRange, 0, 99},
           {"bytes= 5-6 ", 100, K::kRange, 5, 6},
           {"bytes=100-", 100, K::kUnsatisfiable, 0, 0},
           {"bytes=-0", 100, K::kUnsatisfiable, 0, 0},
           {"bytes=0-", 0, K::kUnsatisfiable, 0, 0},
           {"bytes=-5", 0, K::kUnsatisfiable, 0, 0},
           {"bytes=5-1", 100, K::kWhole, 0, 0},
           {"bytes=abc", 100, K::kWhole, 0, 0},
           {"bytes=1-2-3", 100, K::kWhole, 0, 0},
           {"bytes=0-1,5-6", 100, K::kWhole, 0, 0},
           {"items=0-1", 100, K::kWhole, 0, 0},
           {"bytes=", 100, K::kWhole, 0, 0},
           {"bytes=99999999999999999999-", 100, K::kWhole, 0, 0},
       }) {
    RangeRequest r = ParseRange(c.header, c.size);
    EXPECT_EQ(r.kind, c.kind) << c.header;
    if (c.kind == K::kRange) {
      EXPECT_EQ(r.range.first, c.first) << c.header;
      EXPECT_EQ(r.range.last, c.last) << c.header;
    }
  }
}

}  // namespace
}  // namespace megackpt::hub::httpd
