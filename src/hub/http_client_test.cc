// HttpClient (libcurl) against an in-process megahub: Range GETs received
// straight into the caller's buffer (RemoteRangeFile), body byte counters,
// and how HTTP and transport failures map to Status.
#include "hub/http_client.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "cas/test_util.h"
#include "hub/http_server.h"
#include "hub/test_server.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::hub {
namespace {

using cas::testing::RandomBytes;

class HttpClientTest : public testing::InProcessHubTest {
 protected:
  HttpClientTest() : InProcessHubTest("megackpt-http-client") {}

  // HttpClient::GetRange into `dst`, every byte of it expected.
  Result<HttpResponse> RangeInto(HttpClient& http, const std::string& target, uint64_t offset,
                                 std::span<char> dst) {
    size_t got = 0;
    auto r = http.GetRange(target, offset, std::as_writable_bytes(dst), &got);
    if (r.ok() && got != dst.size()) return DataLossError("short body");
    return r;
  }
};

TEST_F(HttpClientTest, RangeReadsGoStraightIntoTheBuffer) {
  auto hub = OpenRemoteHub(endpoint_, token_);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  const std::string data = RandomBytes(11, 3'300'000);
  {
    auto txn = HubTransaction::Begin(*hub, *ParseMegaUri("mega://fr/repo@main"));
    ASSERT_TRUE(txn.ok()) << txn.status().ToString();
    ASSERT_TRUE((*txn)->Put("w.bin", data).ok());
    ASSERT_TRUE((*txn)->Commit().ok());
  }
  // Through the remote hub's file: whole file, a large middle range, and a small range.
  auto where = ParseMegaUri("mega://fr/repo@main/w.bin");
  ASSERT_TRUE(where.ok());
  auto entry = (*hub)->GetFile("fr/repo", "main", "w.bin");
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  ASSERT_EQ(entry->size, data.size());
  auto f = (*hub)->OpenFile(*where, *entry);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::string whole(data.size(), '\0');
  ASSERT_TRUE((*f)->ReadExactlyAt(0, std::as_writable_bytes(std::span(whole))).ok());
  EXPECT_TRUE(whole == data);
  std::string mid(1'500'001, '\0');
  ASSERT_TRUE((*f)->ReadExactlyAt(777'777, std::as_writable_bytes(std::span(mid))).ok());
  EXPECT_TRUE(mid == data.substr(777'777, mid.size()));
  std::string small(1000, '\0');
  ASSERT_TRUE((*f)->ReadExactlyAt(5, std::as_writable_bytes(std::span(small))).ok());
  EXPECT_TRUE(small == data.substr(5, 1000));

  // Directly: a good range (exactly the body bytes counted), then failures.
  const std::string target = "/api/repos/fr/repo/resolve?revision=main&path=w.bin";
  HttpClient http(endpoint_, token_, RemoteOptions{});
  std::string buf(2'000'000, '\0');
  auto r = RangeInto(http, target, 1000, std::span(buf));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status, 206);
  EXPECT_TRUE(buf == data.substr(1000, buf.size()));
  EXPECT_FALSE(r->Header("X-Xet-Hash").empty());
  EXPECT_EQ(r->Header("Content-Range"), "bytes 1000-2000999/3300000");
  EXPECT_EQ(http.bytes_received(), buf.size());
  // Past the end: 416.
  EXPECT_EQ(RangeInto(http, target, data.size() + 10, std::span(buf)).status().code(),
            StatusCode::kOutOfRange);
  // Unknown path: 404.
  EXPECT_EQ(
      RangeInto(http, "/api/repos/fr/repo/resolve?revision=main&path=nope.bin", 0, std::span(buf))
          .status()
          .code(),
      StatusCode::kNotFound);
  // Bad token: 401.
  HttpClient bad(endpoint_, "mega_" + std::string(40, '0'), RemoteOptions{});
  EXPECT_EQ(RangeInto(bad, target, 0, std::span(buf)).status().code(),
            StatusCode::kUnauthenticated);
  // A sink that refuses: Aborted, no retry.
  HttpRequest refuse;
  refuse.target = target;
  refuse.sink = [](const char*, size_t) { return false; };
  EXPECT_EQ(http.Send(refuse).status().code(), StatusCode::kAborted);
  // Nothing listening (plain or TLS): Unavailable after the retries, no hang.
  RemoteOptions quick;
  quick.max_retries = 1;
  quick.initial_backoff_ms = 1;
  for (const char* ep : {"https://127.0.0.1:1", "http://127.0.0.1:1"}) {
    HttpClient closed(ep, token_, quick);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(RangeInto(closed, target, 0, std::span(buf)).status().code(),
              StatusCode::kUnavailable)
        << ep;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << ep;
  }
}

// A server that answers a Range GET with more bytes than asked for: the
// extra bytes never land past the buffer and the read is DataLoss naming the
// range; a short answer is reported as it arrived (*got).
TEST(HttpClientRangeTest, AnswersLongerThanTheRangeAreDataLoss) {
  std::string answer = "0123456789abcdefghij";  // 20 bytes, whatever was asked
  httpd::HttpServerOptions o;
  o.threads = 2;
  httpd::HttpServer server(
      o,
      [&answer](httpd::Request&) -> Result<httpd::Action> {
        httpd::Response res;
        res.status = 206;
        res.body = answer;
        return httpd::Action(std::move(res));
      },
      [](const Status& s) {
        httpd::Response r;
        r.status = 500;
        r.body = s.message();
        return r;
      },
      [](const httpd::Request&, int, double) {}, [](size_t) {});
  auto port = server.Bind();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  std::thread serving([&server] { EXPECT_TRUE(server.Serve().ok()); });
  HttpClient http("http://127.0.0.1:" + std::to_string(*port), "", RemoteOptions{});
  std::string buf(15, '.');  // 10 asked for, 5 guard bytes after them
  size_t got = 0;
  auto r = http.GetRange("/f", 100, std::as_writable_bytes(std::span(buf).first(10)), &got);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  EXPECT_NE(r.status().message().find("bytes 100-109"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(buf.substr(10), ".....");  // nothing written past the range
  // Exactly as long: OK, every byte in place.
  std::string exact(20, '.');
  r = http.GetRange("/f", 0, std::as_writable_bytes(std::span(exact)), &got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(got, 20u);
  EXPECT_EQ(exact, answer);
  // Shorter than asked: OK at this layer, *got says how much arrived.
  std::string more(32, '.');
  r = http.GetRange("/f", 0, std::as_writable_bytes(std::span(more)), &got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(got, 20u);
  EXPECT_EQ(r->status, 206);
  server.Stop();
  serving.join();
}

// A body sent from the caller's memory (body_ref) arrives intact, and a
// keep-alive connection is reused for the next request.
TEST_F(HttpClientTest, BodiesAndKeepAlive) {
  HttpClient http(endpoint_, token_, RemoteOptions{});
  HttpRequest create;
  create.method = "POST";
  create.target = "/api/repos";
  create.body = R"({"repo_id": "kc/m"})";
  create.content_type = "application/json";
  auto c = http.Call(create);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->status, 201);
  const std::string data = RandomBytes(3, 5'000'000);
  HttpRequest put;
  put.method = "PUT";
  put.target = "/api/repos/kc/m/files/big.bin";
  put.body_ref = data;
  auto p = http.Call(put);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->status, 201);
  EXPECT_EQ(http.bytes_sent(), create.body.size() + data.size());
  HttpRequest get;
  get.target = "/api/repos/kc/m/resolve/big.bin";
  auto g = http.Call(get);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->body == data);
  HttpRequest head;
  head.method = "HEAD";
  head.target = get.target;
  auto h = http.Call(head);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->Header("Content-Length"), std::to_string(data.size()));
  EXPECT_TRUE(h->body.empty());
}

}  // namespace
}  // namespace megackpt::hub
