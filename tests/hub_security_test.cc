// megahub against hostile or careless clients (issue 11): content named by
// hash must be readable by the caller, no body is read before the caller is
// authorised, idle and slow connections cannot starve the server, path
// segments are bounded, Range headers follow RFC 7233, and a commit with
// nothing to change makes no commit. A real `megahub serve` child process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "hub/test_server.h"
#include "hub/util.h"
#include "hub_test_server.h"
#include "megackpt/core/checksum.h"

namespace megackpt {
namespace {

using json = nlohmann::json;
using ::megackpt::hub::testing::RawConnection;
using ::megackpt::test_util::RandomData;
using ::megackpt::testing::CreateToken;
using ::megackpt::testing::HttpHeaders;
using ::megackpt::testing::HttpResult;
using ::testing::HasSubstr;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// `message` with every 64-hex digest replaced by "<hash>".
std::string WithoutHashes(const std::string& message) {
  return std::regex_replace(message, std::regex("[0-9a-f]{64}"), "<hash>");
}

class HubSecurityTest : public ::megackpt::testing::MegahubTest {
 protected:
  HubSecurityTest() : MegahubTest({"hub-security-test", {}}) {}

  HttpResult PutFile(const std::string& repo, const std::string& path, const std::string& data,
                     const std::string& token) {
    return http_->Put("/api/repos/" + repo + "/files/" + path, Auth(token), data,
                      "application/octet-stream");
  }
  std::string Head(const std::string& repo) {
    return Body(http_->Get("/api/repos/" + repo + "/commits/main", Auth(write_)))["revision"];
  }
  size_t CommitCount(const std::string& repo) {
    return Body(http_->Get("/api/repos/" + repo + "/commits?limit=1000", Auth(write_)))["commits"]
        .size();
  }
  HttpResult NdjsonCommit(const std::string& repo, const std::vector<json>& lines,
                          const std::string& token) {
    std::string body = json{{"key", "header"}, {"value", {{"summary", "s"}}}}.dump() + "\n";
    for (const json& l : lines) body += l.dump() + "\n";
    return http_->Post("/api/models/" + repo + "/commit/main", Auth(token), body,
                       "application/x-ndjson");
  }
  static std::string Error(const HttpResult& r) {
    return WithoutHashes(Body(r).value("error", ""));
  }
};

TEST_F(HubSecurityTest, ContentNamedByHashMustBeReadable) {
  const std::string other = CreateToken(root_.path(), "write", "other");
  ASSERT_FALSE(other.empty());
  // org/secret is private and holds S; org/pub is public and holds P.
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/secret"}, {"private", true}}, write_)->status,
            201);
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/pub"}}, write_)->status, 201);
  const std::string secret = RandomData(70000, 1), pub = RandomData(50000, 2);
  ASSERT_EQ(PutFile("org/secret", "s.bin", secret, write_)->status, 201);
  ASSERT_EQ(PutFile("org/pub", "p.bin", pub, write_)->status, 201);
  std::string secret_xet = http_->Head("/api/repos/org/secret/resolve/s.bin", Auth(write_))
                               ->get_header_value("X-Xet-Hash");
  ASSERT_EQ(secret_xet.size(), 64u);
  const std::string secret_sha = hub::Sha256Hex(secret),
                    unknown_sha = hub::Sha256Hex("never uploaded");
  const std::string unknown_xet(64, '7');
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "other/m"}}, other)->status, 201);
  ASSERT_EQ(http_->Post("/api/buckets/other/b", Auth(other), "{}", "application/json")->status,
            200);
  const std::string head = Head("other/m");

  auto json_add = [&](const std::string& sha, const std::string& xet, uint64_t size) {
    json op = {{"operation", "add"}, {"path", "x.bin"}, {"size", size}, {"sha256", sha}};
    if (!xet.empty()) op["xet_hash"] = xet;
    return PostJson("/api/repos/other/m/commits", {{"operations", {op}}}, other);
  };
  // JSON add by sha256: refused exactly like an unknown object.
  auto stolen = json_add(secret_sha, "", secret.size());
  auto unknown = json_add(unknown_sha, "", secret.size());
  EXPECT_EQ(stolen->status, 400) << stolen->body;
  EXPECT_EQ(stolen->status, unknown->status);
  EXPECT_EQ(Error(stolen), Error(unknown));
  // JSON add by Xet hash (a wrong size must not tell the real one either).
  stolen = json_add(secret_sha, secret_xet, 1);
  unknown = json_add(secret_sha, unknown_xet, 1);
  EXPECT_EQ(stolen->status, 412) << stolen->body;
  EXPECT_EQ(stolen->status, unknown->status);
  EXPECT_EQ(Error(stolen), Error(unknown));
  // NDJSON lfsFile.
  auto lfs = [&](const std::string& sha) {
    return NdjsonCommit(
        "other/m",
        {{{"key", "lfsFile"},
          {"value",
           {{"path", "x.bin"}, {"algo", "sha256"}, {"oid", sha}, {"size", secret.size()}}}}},
        other);
  };
  stolen = lfs(secret_sha);
  unknown = lfs(unknown_sha);
  EXPECT_EQ(stolen->status, 400) << stolen->body;
  EXPECT_EQ(stolen->status, unknown->status);
  EXPECT_EQ(Error(stolen), Error(unknown));
  // Bucket batch (with and without a size).
  for (uint64_t size : {uint64_t{0}, uint64_t{secret.size()}}) {
    auto batch = [&](const std::string& xet) {
      json line = {{"type", "addFile"}, {"path", "x.bin"}, {"xetHash", xet}, {"mtime", 1}};
      if (size) line["size"] = size;
      return http_->Post("/api/buckets/other/b/batch", Auth(other), line.dump() + "\n",
                         "application/x-ndjson");
    };
    stolen = batch(secret_xet);
    unknown = batch(unknown_xet);
    EXPECT_EQ(stolen->status, 412) << stolen->body;
    EXPECT_EQ(stolen->status, unknown->status);
    EXPECT_EQ(Error(stolen), Error(unknown));
  }
  // Nothing was committed, and nothing can be downloaded.
  EXPECT_EQ(Head("other/m"), head);
  EXPECT_EQ(http_->Get("/api/repos/other/m/resolve/x.bin", Auth(other))->status, 404);
  EXPECT_EQ(http_->Get("/buckets/other/b/resolve/x.bin", Auth(other))->status, 404);

  // Public content may be named; content the caller uploaded itself too.
  auto p = json_add(hub::Sha256Hex(pub), "", pub.size());
  EXPECT_EQ(p->status, 201) << p->body;
  HttpHeaders h = Auth(other);
  h.emplace("X-Mega-Size", std::to_string(secret.size()));
  ASSERT_EQ(
      http_->Put("/api/repos/other/m/blobs/" + secret_sha, h, secret, "application/octet-stream")
          ->status,
      200);
  auto own = json_add(secret_sha, "", secret.size());
  EXPECT_EQ(own->status, 201) << own->body;
  EXPECT_TRUE(http_->Get("/api/repos/other/m/resolve/x.bin", Auth(other))->body == secret);
  // Unrestricted tokens may name anything stored.
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/copy"}}, write_)->status, 201);
  EXPECT_EQ(PostJson("/api/repos/org/copy/commits",
                     {{"operations",
                       {{{"operation", "add"},
                         {"path", "s.bin"},
                         {"size", secret.size()},
                         {"sha256", secret_sha}}}}},
                     write_)
                ->status,
            201);
}

TEST_F(HubSecurityTest, NoBodyIsReadBeforeTheCallerIsAuthorised) {
  // Headers announcing 64 MiB, no body: the answer comes at once.
  for (const auto& [target, auth, want] : std::vector<std::tuple<std::string, std::string, int>>{
           {"/api/repos", "", 401},
           {"/api/repos", read_, 403},
           {"/v1/xorbs/default/" + std::string(64, 'a'), "", 401},
           {"/api/repos/org/m/commits", "mega_bogus", 401}}) {
    RawConnection c(server_.port());
    ASSERT_TRUE(c.ok());
    std::string head = "POST " + target +
                       " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                       (auth.empty() ? "" : "Authorization: Bearer " + auth + "\r\n") +
                       "Content-Length: " + std::to_string(64 << 20) + "\r\n\r\n";
    auto t0 = std::chrono::steady_clock::now();
    auto a = c.Exchange(head);
    ASSERT_TRUE(a.has_value()) << target;
    EXPECT_EQ(a->status, want) << target << ": " << a->body;
    EXPECT_LT(Seconds(t0), 5.0) << target;
  }
  // Several clients sending 48 MiB bodies at once: all refused, the bodies
  // are not read, the server's memory stays small.
  uint64_t before = Body(http_->Get("/api/stats"))["request_body_bytes"];
  constexpr int kClients = 6;
  const std::string junk(48 << 20, '{');
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      RawConnection c(server_.port());
      std::string target = i % 2 ? "/api/repos" : "/v1/xorbs/default/" + std::string(64, 'b');
      std::string head = "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " +
                         std::to_string(junk.size()) + "\r\n\r\n";
      std::thread sender([&] { (void)c.Send(head + junk); });  // fails once the server closes
      auto a = c.Read();
      if (a && a->status == 401) ++refused;
      sender.join();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused.load(), kClients);
  json st = Body(http_->Get("/api/stats"));
  uint64_t read = st["request_body_bytes"].get<uint64_t>() - before;
  std::printf("refused %d uploads of %zu bytes: %llu body bytes read, server peak RSS %.1f MiB\n",
              kClients, junk.size(), static_cast<unsigned long long>(read),
              st["peak_rss_bytes"].get<uint64_t>() / 1048576.0);
  EXPECT_LT(read, uint64_t{kClients} * (8u << 20));
  EXPECT_LT(st["peak_rss_bytes"].get<uint64_t>(), uint64_t{200} << 20);
  // The server still answers.
  EXPECT_EQ(http_->Get("/api/whoami", Auth(write_))->status, 200);
}

class HubConnectionLimitsTest : public ::megackpt::testing::MegahubTest {
 protected:
  HubConnectionLimitsTest()
      : MegahubTest(
            {"hub-limits-test",
             {"--threads", "16", "--header-timeout", "2", "--max-connections-per-client", "24"}}) {}
};

TEST_F(HubConnectionLimitsTest, IdleSocketsHeaderDeadlineAndPerClientCap) {
  // 20 idle connections (more than --threads) do not stop the server.
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 20; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server_.port()));
    ASSERT_TRUE(idle.back()->ok());
  }
  auto t0 = std::chrono::steady_clock::now();
  auto r = http_->Get("/api/whoami", Auth(write_));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(Seconds(t0), 2.0);
  // Past the cap of 24 per client (20 idle + this client's own): refused.
  std::vector<std::unique_ptr<RawConnection>> more;
  int closed = 0;
  for (int i = 0; i < 6; ++i) {
    more.push_back(std::make_unique<RawConnection>(server_.port()));
    if (more.back()->ClosedWithin(500)) ++closed;
  }
  EXPECT_GE(closed, 2);
  more.clear();
  // A connection that never completes its headers is closed after the
  // header timeout (2 s), and so are the idle ones.
  RawConnection slow(server_.port());
  ASSERT_TRUE(slow.Send("GET /api/whoami HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(slow.ClosedWithin(8000));
  EXPECT_LT(Seconds(t0), 7.0);
  for (auto& c : idle) EXPECT_TRUE(c->ClosedWithin(3000));
  idle.clear();
  EXPECT_EQ(http_->Get("/api/whoami", Auth(write_))->status, 200);
}

TEST_F(HubConnectionLimitsTest, ListenBacklogIsLarge) {
  // `ss` shows a listening socket's backlog in its Send-Q column.
  int rc = 0;
  std::string out = ::megackpt::testing::RunCommand(
      "ss -Hltn 'sport = :" + std::to_string(server_.port()) + "' 2>/dev/null", &rc);
  if (rc != 0 || out.empty()) GTEST_SKIP() << "ss (iproute2) is not available";
  std::istringstream line(out);
  std::string state;
  long recv_q = 0, send_q = 0;
  line >> state >> recv_q >> send_q;
  EXPECT_EQ(state, "LISTEN");
  EXPECT_GE(send_q, 128) << out;
}

TEST_F(HubSecurityTest, PathSegmentsAreAtMost255Bytes) {
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, write_)->status, 201);
  EXPECT_EQ(PutFile("org/m", std::string(1000, 'a'), "x", write_)->status, 400);
  EXPECT_EQ(PutFile("org/m", "d/" + std::string(256, 'b') + "/f", "x", write_)->status, 400);
  EXPECT_EQ(PutFile("org/m", "d/" + std::string(255, 'c'), "x", write_)->status, 201);
  auto r = NdjsonCommit(
      "org/m",
      {{{"key", "file"},
        {"value", {{"path", std::string(300, 'n')}, {"content", "eA=="}, {"encoding", "base64"}}}}},
      write_);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(CommitCount("org/m"), 2u);  // initial + the 255-byte one
}

TEST_F(HubSecurityTest, RangeHeadersFollowRfc7233) {
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, write_)->status, 201);
  const std::string data = RandomData(200000, 5);
  ASSERT_EQ(PutFile("org/m", "a.bin", data, write_)->status, 201);
  const std::string url = "/api/repos/org/m/resolve/a.bin";
  // Invalid, other units and several ranges: ignored, the whole file.
  for (const char* range :
       {"bytes=abc", "bytes=5-1", "items=0-5", "bytes=0-1,5-6", "bytes=", "bytes=-"}) {
    auto r = http_->Get(url, {{"Range", range}});
    EXPECT_EQ(r->status, 200) << range;
    EXPECT_TRUE(r->body == data) << range;
  }
  // Valid but unsatisfiable: 416 with the size.
  for (const char* range : {"bytes=200000-", "bytes=300000-300010", "bytes=-0"}) {
    auto r = http_->Get(url, {{"Range", range}});
    EXPECT_EQ(r->status, 416) << range;
    EXPECT_EQ(r->get_header_value("Content-Range"), "bytes */200000") << range;
  }
  // Satisfiable: exact 206s, ends clipped.
  auto r = http_->Get(url, {{"Range", "bytes=199990-300000"}});
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(r->body, data.substr(199990));
  EXPECT_EQ(r->get_header_value("Content-Range"), "bytes 199990-199999/200000");
  r = http_->Get(url, {{"Range", "bytes=-5"}});
  EXPECT_EQ(r->status, 206);
  EXPECT_EQ(r->body, data.substr(199995));
  // The same on a xorb.
  std::string xet = http_->Head(url)->get_header_value("X-Xet-Hash");
  json recon = Body(http_->Get("/v1/reconstructions/" + xet, Auth(read_)));
  std::string xorb = recon["terms"][0]["hash"];
  auto whole = http_->Get("/v1/xorbs/default/" + xorb, Auth(read_));
  ASSERT_EQ(whole->status, 200);
  auto ignored = http_->Get("/v1/xorbs/default/" + xorb,
                            {{"Range", "bytes=zz"}, {"Authorization", "Bearer " + read_}});
  EXPECT_EQ(ignored->status, 200);
  EXPECT_EQ(ignored->body.size(), whole->body.size());
  auto past = http_->Get("/v1/xorbs/default/" + xorb,
                         {{"Range", "bytes=" + std::to_string(whole->body.size()) + "-"},
                          {"Authorization", "Bearer " + read_}});
  EXPECT_EQ(past->status, 416);
  EXPECT_EQ(past->get_header_value("Content-Range"),
            "bytes */" + std::to_string(whole->body.size()));
}

TEST_F(HubSecurityTest, CommitWithNothingToChangeMakesNoCommit) {
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, write_)->status, 201);
  const std::string data = RandomData(1000, 9);
  ASSERT_EQ(PutFile("org/m", "a.bin", data, write_)->status, 201);
  const std::string head = Head("org/m");
  // The same file again (single-file PUT and JSON commit): 200, no commit.
  auto again = PutFile("org/m", "a.bin", data, write_);
  EXPECT_EQ(again->status, 200) << again->body;
  EXPECT_EQ(Body(again)["revision"], head);
  EXPECT_EQ(Body(again)["no_change"], true);
  auto json_again = PostJson("/api/repos/org/m/commits",
                             {{"parent_revision", head},
                              {"operations",
                               {{{"operation", "add"},
                                 {"path", "a.bin"},
                                 {"size", data.size()},
                                 {"sha256", hub::Sha256Hex(data)}}}}},
                             write_);
  EXPECT_EQ(json_again->status, 200) << json_again->body;
  EXPECT_EQ(Body(json_again)["no_change"], true);
  // NDJSON: an inline file equal to what is there.
  ASSERT_EQ(
      NdjsonCommit("org/m",
                   {{{"key", "file"},
                     {"value", {{"path", "r.txt"}, {"content", "aGk="}, {"encoding", "base64"}}}}},
                   write_)
          ->status,
      200);
  const std::string head2 = Head("org/m");
  EXPECT_NE(head2, head);
  auto nd =
      NdjsonCommit("org/m",
                   {{{"key", "file"},
                     {"value", {{"path", "r.txt"}, {"content", "aGk="}, {"encoding", "base64"}}}}},
                   write_);
  EXPECT_EQ(nd->status, 200);
  EXPECT_EQ(Body(nd)["commitOid"], head2);
  EXPECT_EQ(Body(nd)["noChange"], true);
  EXPECT_EQ(Head("org/m"), head2);
  EXPECT_EQ(CommitCount("org/m"), 3u);  // initial, a.bin, r.txt
  // A real change still commits.
  EXPECT_EQ(PutFile("org/m", "a.bin", data + "!", write_)->status, 201);
  EXPECT_EQ(CommitCount("org/m"), 4u);
}

TEST_F(HubSecurityTest, MalformedClientJsonIsAClientError) {
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}, {"private", "yes"}}, write_)->status,
            400);
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, write_)->status, 201);
  auto r =
      PostJson("/api/repos/org/m/commits",
               {{"operations", {{{"operation", "add"}, {"path", "a"}, {"size", "big"}}}}}, write_);
  EXPECT_EQ(r->status, 400);
  EXPECT_THAT(r->body, HasSubstr("size"));
  EXPECT_EQ(http_->Get("/api/repos?limit=lots")->status, 400);
  EXPECT_EQ(Body(http_->Get("/api/stats"))["responses_5xx"], 0);
}

TEST(MegahubCli, Version) {
  int rc = -1;
  std::string out =
      ::megackpt::testing::RunCommand(::megackpt::testing::MegahubBinary() + " --version", &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, ::testing::StartsWith("megahub "));
  EXPECT_THAT(out, HasSubstr("libmicrohttpd"));
}

}  // namespace
}  // namespace megackpt
