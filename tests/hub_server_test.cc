// The megahub service over HTTP: a real `megahub serve` child process on a
// loopback port, exercised with raw requests (the routes and headers the MEGA
// client relies on, spec/mega-hub-protocol.md) and through megackpt's remote
// client (dedup, conflicts, pinned readers, auth, crash recovery, load).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <thread>

#include "hub/ndjson.h"
#include "hub/util.h"
#include "hub_test_server.h"
#include "megackpt/core/checksum.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/transaction.h"

namespace megackpt {
namespace {

using json = nlohmann::json;
using ::megackpt::test_util::RandomData;
using ::megackpt::testing::CreateToken;
using ::testing::HasSubstr;
using ::testing::StartsWith;

double NowSecondsForTest() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class HubServerTest : public ::megackpt::testing::MegahubTest {
 protected:
  HubServerTest()
      : MegahubTest({"hub-server-test",
                     {"--max-json-bytes", "1048576", "--max-object-bytes", "33554432",
                      "--part-size", "1024"}}) {}

  // One "add" operation of a native commit (POST /api/repos/{id}/commits).
  static json AddOp(const std::string& path, uint64_t size, const std::string& sha) {
    return {{"operation", "add"}, {"path", path}, {"size", size}, {"sha256", sha}};
  }

  // POST /api/repos/org/m/commits (write token) on branch main with
  // `operations`, and a parent_revision and commit_message unless empty.
  ::megackpt::testing::HttpResult PostCommit(const json& operations, const std::string& parent = "",
                                             const std::string& message = "") {
    json body = {{"revision", "main"}, {"operations", operations}};
    if (!parent.empty()) body["parent_revision"] = parent;
    if (!message.empty()) body["commit_message"] = message;
    return PostJson("/api/repos/org/m/commits", body, write_);
  }

  std::shared_ptr<hub::HubConnection> Remote(const std::string& token) {
    auto h = hub::OpenRemoteHub(server_.endpoint(), token);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return *h;
  }

  json Stats() {
    auto r = http_->Get("/api/stats");
    return r ? Body(r) : json();
  }

  // Creates org/m with one file "a.bin" through the native blob + commit routes.
  std::string SeedRepo(const std::string& data) {
    auto r = PostJson("/api/repos", {{"repo_id", "org/m"}, {"repo_type", "model"}}, write_);
    EXPECT_EQ(r->status, 201) << r->body;
    std::string sha = hub::Sha256Hex(data);
    ::megackpt::testing::HttpHeaders h = Auth(write_);
    h.emplace("X-Mega-Size", std::to_string(data.size()));
    auto put =
        http_->Put(("/api/repos/org/m/blobs/" + sha).c_str(), h, data, "application/octet-stream");
    EXPECT_EQ(put->status, 200) << put->body;
    auto refs = http_->Get("/api/repos/org/m/refs", Auth(write_));
    std::string head = Body(refs)["branches"][0]["target_revision"];
    auto c = PostCommit(json::array({AddOp("a.bin", data.size(), sha)}), head, "add a.bin");
    EXPECT_EQ(c->status, 201) << c->body;
    return Body(c)["revision"];
  }
};

TEST_F(HubServerTest, RepoLifecycleAndNativeCommit) {
  // Auth on creation: anonymous 401, read token 403, other-namespace 403.
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, "")->status, 401);
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, read_)->status, 403);
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "other/m"}}, org_only_)->status, 403);
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, "mega_bogus")->status, 401);

  std::string data = "hello hub";
  std::string commit = SeedRepo(data);
  EXPECT_TRUE(hub::IsCommitId(commit));
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, write_)->status, 409);
  EXPECT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}, {"exist_ok", true}}, write_)->status,
            201);

  auto info = http_->Get("/api/repos/org/m");
  ASSERT_EQ(info->status, 200);
  EXPECT_EQ(Body(info)["repo_id"], "org/m");
  std::regex ts(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  EXPECT_TRUE(std::regex_match(Body(info)["created_at"].get<std::string>(), ts));

  auto c = http_->Get("/api/repos/org/m/commits/main");
  ASSERT_EQ(c->status, 200);
  EXPECT_EQ(Body(c)["revision"], commit);
  EXPECT_EQ(Body(c)["files"][0]["path"], "a.bin");
  EXPECT_EQ(Body(c)["files"][0]["change"], "add");
  EXPECT_EQ(http_->Get("/api/repos/org/m/commits/nope")->status, 404);

  // History: newest first, last page has next_cursor null.
  auto list = http_->Get("/api/repos/org/m/commits?limit=1&revision=main");
  ASSERT_EQ(list->status, 200);
  EXPECT_EQ(Body(list)["commits"].size(), 1u);
  ASSERT_TRUE(Body(list)["next_cursor"].is_string());
  auto list2 = http_->Get(("/api/repos/org/m/commits?limit=1&revision=main&cursor=" +
                           Body(list)["next_cursor"].get<std::string>())
                              .c_str());
  EXPECT_TRUE(Body(list2)["next_cursor"].is_null());
  EXPECT_TRUE(Body(list2)["commits"][0]["parent_revision"].is_null());

  auto files = http_->Get("/api/repos/org/m/files?revision=main&limit=1000");
  ASSERT_EQ(files->status, 200);
  EXPECT_EQ(Body(files)["revision"], commit);
  EXPECT_EQ(Body(files)["files"][0]["sha256"], hub::Sha256Hex(data));
  EXPECT_TRUE(Body(files)["next_cursor"].is_null());

  // Stale parent -> 409; the branch does not move.
  std::string sha = hub::Sha256Hex(data);
  auto stale = PostCommit(json::array(), std::string(40, '0'), "stale");
  EXPECT_EQ(stale->status, 404);  // unknown parent commit
  std::string initial = Body(list2)["commits"][0]["revision"];
  stale = PostCommit(json::array({AddOp("b.bin", data.size(), sha)}), initial, "stale");
  EXPECT_EQ(stale->status, 409) << stale->body;
  EXPECT_EQ(Body(http_->Get("/api/repos/org/m/commits/main"))["revision"], commit);

  // Blob checks: wrong sha256 and unstaged objects are 400.
  ::megackpt::testing::HttpHeaders h = Auth(write_);
  h.emplace("X-Mega-Size", "3");
  EXPECT_EQ(http_
                ->Put(("/api/repos/org/m/blobs/" + std::string(64, 'a')).c_str(), h, "abc",
                      "application/octet-stream")
                ->status,
            400);
  auto unstaged = PostCommit(json::array({AddOp("x", 1, std::string(64, 'b'))}));
  EXPECT_EQ(unstaged->status, 400);

  // Refs: create a branch, then delete it.
  auto br =
      PostJson("/api/repos/org/m/refs/branches", {{"name", "dev"}, {"revision", "main"}}, write_);
  ASSERT_EQ(br->status, 201) << br->body;
  EXPECT_EQ(Body(br)["name"], "dev");
  EXPECT_EQ(Body(br)["target_revision"], commit);
  EXPECT_EQ(
      PostJson("/api/repos/org/m/refs/branches", {{"name", "dev"}, {"revision", "main"}}, write_)
          ->status,
      409);
  EXPECT_EQ(http_->Delete("/api/repos/org/m/refs/branches/dev", Auth(write_))->status, 200);
  EXPECT_EQ(http_->Delete("/api/repos/org/m", Auth(read_))->status, 403);
  EXPECT_EQ(http_->Delete("/api/repos/org/m", Auth(write_))->status, 200);
  EXPECT_EQ(http_->Get("/api/repos/org/m")->status, 404);
}

TEST_F(HubServerTest, ResolveHeadersAndExactRanges) {
  std::string data = RandomData(200000, 3);
  std::string commit = SeedRepo(data);
  auto head = http_->Head("/api/repos/org/m/resolve/a.bin?revision=main");
  ASSERT_EQ(head->status, 200);
  EXPECT_EQ(head->get_header_value("X-Repo-Commit"), commit);
  EXPECT_EQ(head->get_header_value("ETag"), "\"" + hub::Sha256Hex(data) + "\"");
  EXPECT_EQ(head->get_header_value("Content-Length"), std::to_string(data.size()));
  EXPECT_EQ(head->get_header_value("X-Linked-Size"), std::to_string(data.size()));
  EXPECT_FALSE(head->get_header_value("X-Xet-Hash").empty());
  EXPECT_TRUE(head->body.empty());

  auto full = http_->Get("/api/repos/org/m/resolve/a.bin?revision=main");
  ASSERT_EQ(full->status, 200);
  EXPECT_EQ(full->body, data);
  auto range =
      http_->Get("/api/repos/org/m/resolve/a.bin?revision=main", {{"Range", "bytes=70000-70009"}});
  ASSERT_EQ(range->status, 206);
  EXPECT_EQ(range->body, data.substr(70000, 10));
  EXPECT_EQ(range->get_header_value("Content-Range"), "bytes 70000-70009/200000");
  auto tail = http_->Get(("/api/repos/org/m/resolve?revision=" + commit + "&path=a.bin").c_str(),
                         {{"Range", "bytes=199990-"}});
  ASSERT_EQ(tail->status, 206);
  EXPECT_EQ(tail->body, data.substr(199990));
  EXPECT_EQ(http_->Get("/api/repos/org/m/resolve/a.bin", {{"Range", "bytes=300000-"}})->status,
            416);
  // HF-style URL too.
  auto hf = http_->Get("/org/m/resolve/main/a.bin", {{"Range", "bytes=0-3"}});
  ASSERT_EQ(hf->status, 206);
  EXPECT_EQ(hf->body, data.substr(0, 4));

  auto missing = http_->Head("/api/repos/org/m/resolve/nope.bin?revision=main");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->get_header_value("X-Error-Code"), "EntryNotFound");
  EXPECT_EQ(
      http_->Head("/api/repos/org/m/resolve/a.bin?revision=nope")->get_header_value("X-Error-Code"),
      "RevisionNotFound");
  EXPECT_EQ(http_->Head("/api/repos/org/zz/resolve/a.bin")->get_header_value("X-Error-Code"),
            "RepoNotFound");
  // Traversal is rejected.
  EXPECT_EQ(http_->Get("/api/repos/org/m/resolve/x/%2E%2E/a.bin?revision=main")->status, 400);
  EXPECT_EQ(http_->Get("/api/repos/org/m/resolve?revision=main&path=../a.bin")->status, 400);

  // model_info.
  auto mi = http_->Get("/api/models/org/m");
  ASSERT_EQ(mi->status, 200);
  EXPECT_EQ(Body(mi)["id"], "org/m");
  EXPECT_EQ(Body(mi)["sha"], commit);
  EXPECT_EQ(Body(mi)["siblings"][0]["rfilename"], "a.bin");
  EXPECT_EQ(http_->Get(("/api/models/org/m/revision/" + commit).c_str())->status, 200);
  EXPECT_EQ(http_->Get("/api/datasets/org/m")->status, 404);
}

TEST_F(HubServerTest, PreuploadAndNdjsonCommit) {
  SeedRepo("seed");
  auto pre =
      PostJson("/api/models/org/m/preupload/main",
               {{"files",
                 {{{"path", "README.md"}, {"sample", hub::Base64Encode("# hi")}, {"size", 4}},
                  {{"path", "w.bin"},
                   {"sample", hub::Base64Encode(std::string("\0\1", 2))},
                   {"size", 50000000}}}}},
               write_);
  ASSERT_EQ(pre->status, 200) << pre->body;
  EXPECT_EQ(Body(pre)["files"][0]["uploadMode"], "regular");
  EXPECT_EQ(Body(pre)["files"][0]["shouldIgnore"], false);
  EXPECT_EQ(Body(pre)["files"][1]["uploadMode"], "lfs");

  std::string head = Body(http_->Get("/api/repos/org/m/commits/main"))["revision"];
  std::string body =
      json{{"key", "header"},
           {"value", {{"summary", "ndjson"}, {"description", ""}, {"parentCommit", head}}}}
          .dump() +
      "\n" + json{{"key", "deletedFile"}, {"value", {{"path", "a.bin"}}}}.dump() + "\n" +
      json{
          {"key", "file"},
          {"value",
           {{"content", hub::Base64Encode("# hi")}, {"path", "README.md"}, {"encoding", "base64"}}}}
          .dump() +
      "\n";
  ::megackpt::testing::HttpHeaders h = Auth(write_);
  auto c = http_->Post("/api/models/org/m/commit/main", h, body, "application/x-ndjson");
  ASSERT_EQ(c->status, 200) << c->body;
  std::string oid = Body(c)["commitOid"];
  EXPECT_TRUE(hub::IsCommitId(oid));
  EXPECT_EQ(Body(c)["commitUrl"], server_.endpoint() + "/org/m/commit/" + oid);
  EXPECT_EQ(http_->Get("/api/repos/org/m/resolve/README.md?revision=main")->body, "# hi");

  // The same body again: its parent is stale now.
  EXPECT_EQ(http_->Post("/api/models/org/m/commit/main", h, body, "application/x-ndjson")->status,
            409);
  // Malformed NDJSON, unknown keys and traversal are 400.
  EXPECT_EQ(http_
                ->Post("/api/models/org/m/commit/main", h, "{\"key\":\"header\",\"value\":{",
                       "application/x-ndjson")
                ->status,
            400);
  EXPECT_EQ(http_
                ->Post("/api/models/org/m/commit/main", h,
                       "{\"key\":\"header\",\"value\":{}}\n{\"key\":\"bogus\",\"value\":{}}\n",
                       "application/x-ndjson")
                ->status,
            400);
  std::string evil =
      json{{"key", "header"}, {"value", {{"summary", "x"}}}}.dump() + "\n" +
      json{{"key", "file"}, {"value", {{"content", "AA=="}, {"path", "../../etc/passwd"}}}}.dump() +
      "\n";
  auto ev = http_->Post("/api/models/org/m/commit/main", h, evil, "application/x-ndjson");
  EXPECT_EQ(ev->status, 400);
  EXPECT_THAT(ev->body, HasSubstr("traversal"));
  EXPECT_EQ(http_->Post("/api/models/org/m/commit/main", Auth(read_), body, "application/x-ndjson")
                ->status,
            403);

  // Xet token routes.
  auto rt = http_->Get(("/api/models/org/m/xet-read-token/" + oid).c_str());
  ASSERT_EQ(rt->status, 200);
  EXPECT_TRUE(Body(rt)["accessToken"].is_string());
  EXPECT_TRUE(Body(rt)["exp"].is_number());
  EXPECT_EQ(Body(rt)["casUrl"], server_.endpoint());
  EXPECT_EQ(http_->Get("/api/models/org/m/xet-write-token/main")->status, 401);
  auto wt = http_->Get("/api/models/org/m/xet-write-token/main", Auth(write_));
  ASSERT_EQ(wt->status, 200);
  // The CAS token opens the /v1 routes; anonymous CAS access is refused.
  std::string xet =
      Body(http_->Get("/api/repos/org/m/files?revision=main"))["files"][0]["xet_hash"];
  EXPECT_EQ(http_->Head(("/v1/files/" + xet).c_str())->status, 401);
  EXPECT_EQ(http_->Head(("/v1/files/" + xet).c_str(), Auth(Body(rt)["accessToken"]))->status, 200);
  auto recon = http_->Get(("/v1/reconstructions/" + xet).c_str(), Auth(Body(rt)["accessToken"]));
  ASSERT_EQ(recon->status, 200);
  EXPECT_TRUE(Body(recon)["terms"].is_array());
  EXPECT_TRUE(Body(recon)["fetch_info"].is_object());
  // A read CAS token cannot upload.
  EXPECT_EQ(
      http_->Post("/v1/shards", Auth(Body(rt)["accessToken"]), "x", "application/octet-stream")
          ->status,
      403);
}

TEST_F(HubServerTest, ResumableMultipartUpload) {
  SeedRepo("seed");
  std::string data = RandomData(2500, 4);  // 3 parts of 1024 (server --part-size 1024)
  std::string sha = hub::Sha256Hex(data);
  auto up = PostJson("/api/uploads",
                     {{"repo_id", "org/m"},
                      {"path", "big.bin"},
                      {"revision", "main"},
                      {"size", data.size()},
                      {"sha256", sha},
                      {"stage_only", true}},
                     write_);
  ASSERT_EQ(up->status, 200) << up->body;
  std::string id = Body(up)["upload_id"];
  EXPECT_EQ(Body(up)["part_size"], 1024);
  EXPECT_TRUE(Body(http_->Get(("/api/uploads/" + id).c_str(), Auth(write_)))["parts"].empty());
  json parts = json::array();
  for (int n = 1; n <= 3; ++n) {
    auto p =
        http_->Put(("/api/uploads/" + id + "/parts/" + std::to_string(n)).c_str(), Auth(write_),
                   data.substr((n - 1) * 1024, 1024), "application/octet-stream");
    ASSERT_EQ(p->status, 200) << p->body;
    parts.push_back({{"part_number", n}, {"etag", Body(p)["etag"]}});
  }
  EXPECT_EQ(Body(http_->Get(("/api/uploads/" + id).c_str(), Auth(write_)))["parts"].size(), 3u);
  auto done = PostJson("/api/uploads/" + id + "/complete", {{"parts", parts}}, write_);
  ASSERT_EQ(done->status, 200) << done->body;
  std::string head = Body(http_->Get("/api/repos/org/m/commits/main"))["revision"];
  auto c = PostCommit(json::array({AddOp("big.bin", data.size(), sha)}), head);
  ASSERT_EQ(c->status, 201) << c->body;
  EXPECT_EQ(http_->Get("/api/repos/org/m/resolve/big.bin?revision=main")->body, data);
}

TEST_F(HubServerTest, BucketsRoutes) {
  auto created = http_->Post("/api/buckets/org/scratch", Auth(write_), "{}", "application/json");
  ASSERT_EQ(created->status, 200) << created->body;
  EXPECT_EQ(Body(created)["url"], server_.endpoint() + "/buckets/org/scratch");
  auto again = http_->Post("/api/buckets/org/scratch", Auth(write_), "{}", "application/json");
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(Body(again)["url"], server_.endpoint() + "/buckets/org/scratch");
  auto missing = http_->Get("/api/buckets/org/nope");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->get_header_value("X-Error-Code"), "RepoNotFound");

  // Stage content through the CAS (remote client), then add it by xetHash.
  auto hubc = Remote(write_);
  std::string data = RandomData(100000, 5);
  auto up = hubc->BeginUpload("b");
  ASSERT_TRUE(up.ok());
  ASSERT_TRUE((*up)->Append(AsBytes(data)).ok());
  ASSERT_TRUE((*up)->Close().ok());
  std::string xet = (*up)->entry().xet_hash;
  std::string batch =
      json{{"type", "addFile"}, {"path", "run/a.bin"}, {"xetHash", xet}, {"mtime", 1700000000000LL}}
          .dump() +
      "\n" +
      json{{"type", "addFile"},
           {"path", "run/sub/b.bin"},
           {"xetHash", xet},
           {"mtime", 1700000000000LL}}
          .dump() +
      "\n";
  auto b =
      http_->Post("/api/buckets/org/scratch/batch", Auth(write_), batch, "application/x-ndjson");
  ASSERT_EQ(b->status, 200) << b->body;
  EXPECT_EQ(http_
                ->Post("/api/buckets/org/scratch/batch", Auth(write_), "not json\n",
                       "application/x-ndjson")
                ->status,
            400);

  auto info = http_->Get("/api/buckets/org/scratch");
  EXPECT_EQ(Body(info)["totalFiles"], 2);
  EXPECT_EQ(Body(info)["size"], 200000);
  auto tree = http_->Get("/api/buckets/org/scratch/tree/run");
  ASSERT_EQ(tree->status, 200);
  json t = Body(tree);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0]["type"], "file");
  EXPECT_EQ(t[0]["path"], "run/a.bin");
  EXPECT_EQ(t[0]["xetHash"], xet);
  EXPECT_EQ(t[0]["mtime"], "2023-11-14T22:13:20.000Z");
  EXPECT_EQ(t[1]["type"], "directory");
  // Pagination with Link rel="next".
  auto page = http_->Get("/api/buckets/org/scratch/tree?recursive=true&limit=1");
  ASSERT_EQ(Body(page).size(), 1u);
  std::string link = page->get_header_value("Link");
  ASSERT_THAT(link, HasSubstr("rel=\"next\""));
  std::string next = link.substr(link.find('<') + 1, link.find('>') - link.find('<') - 1);
  ASSERT_THAT(next, StartsWith(server_.endpoint()));
  auto page2 = http_->Get(next.substr(server_.endpoint().size()).c_str());
  ASSERT_EQ(Body(page2).size(), 1u);
  EXPECT_EQ(Body(page2)[0]["path"], "run/sub/b.bin");
  EXPECT_TRUE(page2->get_header_value("Link").empty());

  auto pi = http_->Post("/api/buckets/org/scratch/paths-info",
                        json{{"paths", {"run/a.bin", "nope"}}}.dump(), "application/json");
  ASSERT_EQ(pi->status, 200);
  EXPECT_EQ(Body(pi).size(), 1u);

  // Resolve, both spellings of the path.
  auto head = http_->Head("/buckets/org/scratch/resolve/run%2Fsub%2Fb.bin");
  ASSERT_EQ(head->status, 200);
  EXPECT_EQ(head->get_header_value("X-Xet-Hash"), xet);
  EXPECT_EQ(head->get_header_value("Content-Length"), "100000");
  EXPECT_THAT(head->get_header_value("Link"), HasSubstr("rel=\"xet-auth\""));
  auto get = http_->Get("/buckets/org/scratch/resolve/run/sub/b.bin", {{"Range", "bytes=10-19"}});
  ASSERT_EQ(get->status, 206);
  EXPECT_EQ(get->body, data.substr(10, 10));
  auto tok = http_->Get("/api/buckets/org/scratch/xet-write-token", Auth(write_));
  ASSERT_EQ(tok->status, 200);
  EXPECT_TRUE(Body(tok)["accessToken"].is_string());
  EXPECT_EQ(http_->Delete("/api/buckets/org/scratch", Auth(write_))->status, 200);
  EXPECT_EQ(http_->Get("/api/buckets/org/scratch")->status, 404);
}

TEST_F(HubServerTest, SizeLimitsAndTraversal) {
  SeedRepo("x");
  // JSON bodies above --max-json-bytes (1 MiB) -> 413; the connection stays usable.
  std::string big(2 << 20, ' ');
  auto r =
      http_->Post("/api/repos/org/m/commits", Auth(write_), "{" + big + "}", "application/json");
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(http_->Get("/api/repos/org/m")->status, 200);
  // Objects above --max-object-bytes (32 MiB) -> 413.
  std::string huge((32 << 20) + 10, 'x');
  ::megackpt::testing::HttpHeaders h = Auth(write_);
  auto b = http_->Put(("/api/repos/org/m/blobs/" + hub::Sha256Hex(huge)).c_str(), h, huge,
                      "application/octet-stream");
  EXPECT_EQ(b->status, 413);
  // Paths with '..', absolute paths and empty segments are refused.
  for (std::string p : {"../x", "/etc/passwd", "a//b", "a/./b"}) {
    auto c = PostCommit(json::array({json{{"operation", "delete"}, {"path", p}}}));
    EXPECT_EQ(c->status, 400) << p;
  }
  EXPECT_EQ(
      PostJson(
          "/api/uploads",
          {{"repo_id", "org/m"}, {"path", "../x"}, {"size", 1}, {"sha256", std::string(64, 'a')}},
          write_)
          ->status,
      400);
  EXPECT_EQ(http_->Get("/api/repos/org/m/resolve/%2Fetc%2Fpasswd")->status, 400);
}

// ---- through megackpt's remote client ----

TEST_F(HubServerTest, SecondVersionUploadsOnlyChangedBytes) {
  auto hubc = Remote(write_);
  auto root = *hub::ParseMegaUri("mega://org/ckpt@main/step");
  constexpr int kFiles = 20;
  constexpr size_t kSize = 256 * 1024;
  std::vector<std::string> files;
  for (int i = 0; i < kFiles; ++i) files.push_back(RandomData(kSize, 100 + i));
  auto save = [&]() -> std::string {
    auto txn = hub::HubTransaction::Begin(hubc, root);
    EXPECT_TRUE(txn.ok()) << txn.status().ToString();
    for (int i = 0; i < kFiles; ++i)
      EXPECT_TRUE((*txn)->Put("t" + std::to_string(i) + ".bin", files[i]).ok());
    auto c = (*txn)->Commit();
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? c->id : "";
  };
  uint64_t before = Stats()["request_body_bytes"];
  std::string first = save();
  uint64_t after_first = Stats()["request_body_bytes"];
  files[3] = RandomData(kSize, 999);
  files[11] = RandomData(kSize, 998);
  std::string second = save();
  uint64_t after_second = Stats()["request_body_bytes"];
  uint64_t total = kFiles * kSize;
  uint64_t sent_first = after_first - before, sent_second = after_second - after_first;
  std::printf("first save sent %llu bytes, second %llu bytes (%.1f%% of %llu)\n",
              (unsigned long long)sent_first, (unsigned long long)sent_second,
              100.0 * sent_second / total, (unsigned long long)total);
  EXPECT_GE(sent_first, total);  // random data: everything travels once
  EXPECT_LE(sent_second, total * 15 / 100);
  EXPECT_NE(first, second);
  // Both versions read back exactly.
  auto fs = hub::NewMegaFileSystem(hubc);
  EXPECT_EQ(*fs->ReadWhole("mega://org/ckpt@main/step/t11.bin"), files[11]);
  EXPECT_EQ(*fs->ReadWhole("mega://org/ckpt@" + first + "/step/t11.bin"), RandomData(kSize, 111));
}

TEST_F(HubServerTest, ConcurrentWritersOneWinsNothingLost) {
  auto a = Remote(write_);
  auto b = Remote(write_);
  auto root = *hub::ParseMegaUri("mega://org/race@main");
  auto ta = hub::HubTransaction::Begin(a, root);
  ASSERT_TRUE(ta.ok());
  auto tb = hub::HubTransaction::Begin(b, root, {}, (*ta)->base_commit());
  ASSERT_TRUE(tb.ok());
  ASSERT_TRUE((*ta)->Put("from-a.txt", "A").ok());
  ASSERT_TRUE((*tb)->Put("from-b.txt", "B").ok());
  Result<hub::CommitInfo> ra = InternalError("unset"), rb = InternalError("unset");
  std::thread t1([&] { ra = (*ta)->Commit(); });
  std::thread t2([&] { rb = (*tb)->Commit(); });
  t1.join();
  t2.join();
  ASSERT_NE(ra.ok(), rb.ok()) << ra.status().ToString() << " / " << rb.status().ToString();
  const Status& lost = ra.ok() ? rb.status() : ra.status();
  EXPECT_EQ(lost.code(), StatusCode::kAborted);
  EXPECT_THAT(lost.message(), HasSubstr("conflict"));
  // The loser retries on the new head: both files are there.
  auto& loser = ra.ok() ? b : a;
  auto retry = hub::HubTransaction::Begin(loser, root);
  ASSERT_TRUE(retry.ok());
  ASSERT_TRUE((*retry)->Put(ra.ok() ? "from-b.txt" : "from-a.txt", ra.ok() ? "B" : "A").ok());
  ASSERT_TRUE((*retry)->Commit().ok());
  auto fs = hub::NewMegaFileSystem(a);
  EXPECT_EQ(*fs->ReadWhole("mega://org/race/from-a.txt"), "A");
  EXPECT_EQ(*fs->ReadWhole("mega://org/race/from-b.txt"), "B");
  auto log = a->ListCommits("org/race", "main", 10);
  EXPECT_EQ(log->size(), 3u);  // initial + winner + retried loser
}

TEST_F(HubServerTest, PinnedReaderKeepsItsRevision) {
  auto hubc = Remote(write_);
  auto fs = hub::NewMegaFileSystem(hubc);
  std::string v1 = RandomData(300000, 7), v2 = RandomData(300000, 8);
  ASSERT_TRUE(fs->WriteAtomically("mega://org/pin/w.bin", v1).ok());
  auto reader = fs->OpenForRead("mega://org/pin/w.bin");  // pinned at open
  ASSERT_TRUE(reader.ok());
  std::string buf(1000, '\0');
  auto dst = std::as_writable_bytes(std::span<char>(buf.data(), buf.size()));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(fs->WriteAtomically("mega://org/pin/w.bin", i % 2 ? v1 : v2).ok());
    ASSERT_TRUE(fs->WriteAtomically("mega://org/pin/other" + std::to_string(i), "x").ok());
    ASSERT_TRUE((*reader)->ReadExactlyAt(1000 * i, dst).ok());
    EXPECT_EQ(buf, v1.substr(1000 * i, 1000));
  }
  EXPECT_EQ(*fs->ReadWhole("mega://org/pin/w.bin"), v2);  // i == 2 wrote v2
}

TEST_F(HubServerTest, UnauthorizedWritesRejected) {
  SeedRepo("seed");
  auto anon = Remote("");
  auto reader = Remote(read_);
  auto wrong_ns = Remote(CreateToken(root_.path(), "write", "elsewhere"));
  auto root = *hub::ParseMegaUri("mega://org/m@main");
  for (auto* h : {&anon, &reader, &wrong_ns}) {
    auto txn = hub::HubTransaction::Begin(*h, root);
    ASSERT_TRUE(txn.ok()) << txn.status().ToString();  // reading refs is public
    Status put = (*txn)->Put("x.txt", "x");
    Status s = put.ok() ? (*txn)->Commit().status() : put;
    EXPECT_TRUE(s.code() == StatusCode::kUnauthenticated ||
                s.code() == StatusCode::kPermissionDenied)
        << s.ToString();
  }
  // Anonymous reads of a public repo work; private repos need a token.
  auto fs = hub::NewMegaFileSystem(anon);
  EXPECT_EQ(*fs->ReadWhole("mega://org/m/a.bin"), "seed");
  auto w = Remote(write_);
  ASSERT_TRUE(hub::HubTransaction::Begin(w, *hub::ParseMegaUri("mega://org/secret"),
                                         {.create_private = true})
                  .ok());
  EXPECT_EQ(anon->GetRepo("org/secret").status().code(), StatusCode::kUnauthenticated);
  EXPECT_TRUE(reader->GetRepo("org/secret").ok());
}

TEST_F(HubServerTest, KilledMidUploadRestartsCleanAndRetrySucceeds) {
  auto hubc = Remote(write_);
  auto root = *hub::ParseMegaUri("mega://org/crash@main");
  ASSERT_TRUE(hub::HubTransaction::Begin(hubc, root).ok());  // creates the repo
  std::string base = *hubc->ResolveRevision("org/crash", "main");
  std::string data = RandomData(24 << 20, 11);
  int port = server_.port();
  std::atomic<bool> upload_done{false};
  Status upload_status;
  std::thread uploader([&] {
    hub::RemoteOptions fast;
    fast.max_retries = 1;
    fast.initial_backoff_ms = 10;
    auto h = hub::OpenRemoteHub(server_.endpoint(), write_, fast);
    auto txn = hub::HubTransaction::Begin(*h, root);
    if (!txn.ok()) {
      upload_status = txn.status();
    } else {
      auto f = (*txn)->OpenForWrite("big.bin");
      Status s = f.ok() ? Status::OK() : f.status();
      for (size_t off = 0; s.ok() && off < data.size(); off += 1 << 20) {
        s = (*f)->Append(AsBytes(std::string_view(data).substr(off, 1 << 20)));
      }
      if (s.ok()) s = (*f)->Close();
      if (s.ok()) s = (*txn)->Commit().status();
      upload_status = s;
    }
    upload_done = true;
  });
  // Kill the server once it has received a first xorb of this upload.
  for (int i = 0; i < 400 && !upload_done; ++i) {
    json st = Stats();
    if (st.is_object() && st["xorbs_received"].get<uint64_t>() >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server_.Kill();
  uploader.join();
  EXPECT_FALSE(upload_status.ok()) << "upload finished before the kill";
  // Restart on the same port and root: the branch is where it was.
  // Same port (a client would retry against the same endpoint).
  bool restarted = false;
  for (int i = 0; i < 50 && !restarted; ++i) {
    restarted = server_.Start(root_.path(), {}, port);
    if (!restarted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(restarted);
  EXPECT_EQ(server_.port(), port);
  auto again = Remote(write_);
  EXPECT_EQ(*again->ResolveRevision("org/crash", "main"), base);
  EXPECT_EQ(again->GetFile("org/crash", base, "big.bin").status().code(), StatusCode::kNotFound);
  // A retry succeeds and the file reads back intact.
  auto txn = hub::HubTransaction::Begin(again, root);
  ASSERT_TRUE(txn.ok());
  ASSERT_TRUE((*txn)->Put("big.bin", data).ok());
  auto c = (*txn)->Commit();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto fs = hub::NewMegaFileSystem(again);
  EXPECT_EQ(*fs->ReadWhole("mega://org/crash/big.bin"), data);
}

// A short, bounded version of the load test: 16 clients push and pull for
// ~3 s; zero errors; reports throughput and the server's peak RSS.
TEST_F(HubServerTest, LoadSixteenClientsNoErrors) {
  constexpr int kClients = 16;
  std::atomic<uint64_t> ops{0}, bytes{0}, errors{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  double t0 = NowSecondsForTest();
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto h = hub::OpenRemoteHub(server_.endpoint(), write_);
      if (!h.ok()) {
        ++errors;
        return;
      }
      auto fs = hub::NewMegaFileSystem(*h);
      std::string uri = "mega://load/client" + std::to_string(c) + "@main";
      for (int round = 0; !stop; ++round) {
        std::string data = RandomData(64 * 1024 + round, c * 1000 + round);
        auto txn = hub::HubTransaction::Begin(*h, *hub::ParseMegaUri(uri));
        Status s = txn.status();
        if (s.ok()) s = (*txn)->Put("f" + std::to_string(round % 4), data);
        if (s.ok()) s = (*txn)->Commit().status();
        if (s.ok()) {
          auto back = fs->ReadWhole(uri + "/f" + std::to_string(round % 4));
          if (!back.ok() || *back != data) s = DataLossError("mismatch");
        }
        if (!s.ok()) {
          ++errors;
          std::fprintf(stderr, "client %d: %s\n", c, s.ToString().c_str());
        } else {
          ops += 2;
          bytes += 2 * data.size();
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  stop = true;
  for (auto& t : threads) t.join();
  double dt = NowSecondsForTest() - t0;
  json st = Stats();
  std::printf(
      "load: %d clients, %.1f s, %llu ops (%.0f ops/s), %.1f MB/s, errors %llu, server peak RSS "
      "%.1f MiB\n",
      kClients, dt, (unsigned long long)ops.load(), ops / dt, bytes / dt / 1e6,
      (unsigned long long)errors.load(), st["peak_rss_bytes"].get<uint64_t>() / 1048576.0);
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_GT(ops.load(), 0u);
  EXPECT_EQ(st["responses_5xx"].get<uint64_t>(), 0u);
}

}  // namespace
}  // namespace megackpt
