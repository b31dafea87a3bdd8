// Routes of megahub that the MEGA client knows but its main flows do not use
// (spec/mega-hub-protocol.md section 3, "Also known to the native client"),
// and the remaining Xet CAS routes (section 5.4): single-file PUT/DELETE
// /api/repos/{id}/files/{path}, POST /api/repos/{id}/copy, the repo listing's
// filters, GET /v2/reconstructions/{file} and the batch reconstruction query.
// Each against a real `megahub serve` child process on loopback: success,
// auth (401/403), bad input (400/404/413/416) and, for writes, exactly one
// commit per request and the parent (compare-and-swap) conflict.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "hub/ndjson.h"
#include "hub/util.h"
#include "hub_test_server.h"
#include "megackpt/cas/shard.h"
#include "megackpt/cas/xorb.h"

namespace megackpt {
namespace {

using json = nlohmann::json;
using ::megackpt::test_util::RandomData;

class HubRoutesTest : public ::megackpt::testing::MegahubTest {
 protected:
  HubRoutesTest() : MegahubTest({"hub-routes-test", {"--max-object-bytes", "1048576"}}) {}

  // The fixture's hub, with the repo org/m.
  void SetUp() override {
    MegahubTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "org/m"}}, write_)->status, 201);
  }

  // PUT /api/repos/{repo}/files/{path}{query} with X-Mega-Sha256/X-Mega-Size
  // of `data` (unless overridden).
  ::megackpt::testing::HttpResult PutFile(const std::string& repo,
                                          const std::string& path_and_query,
                                          const std::string& data, const std::string& token,
                                          std::string sha = "", std::string size = "") {
    ::megackpt::testing::HttpHeaders h = Auth(token);
    h.emplace("X-Mega-Sha256", sha.empty() ? hub::Sha256Hex(data) : sha);
    h.emplace("X-Mega-Size", size.empty() ? std::to_string(data.size()) : size);
    return http_->Put(("/api/repos/" + repo + "/files/" + path_and_query).c_str(), h, data,
                      "application/octet-stream");
  }
  std::string Head(const std::string& repo = "org/m", const std::string& branch = "main") {
    auto r = http_->Get(("/api/repos/" + repo + "/refs").c_str(), Auth(write_));
    json refs = Body(r);
    for (const auto& b : refs["branches"]) {
      if (b["name"] == branch) return b["target_revision"];
    }
    return "";
  }
  size_t CommitCount(const std::string& repo = "org/m", const std::string& rev = "main") {
    auto r = http_->Get(("/api/repos/" + repo + "/commits?limit=1000&revision=" + rev).c_str(),
                        Auth(write_));
    return Body(r)["commits"].size();
  }
  // GET resolve of path at revision: (status, body).
  std::pair<int, std::string> Resolve(const std::string& path, const std::string& rev = "main",
                                      const std::string& repo = "org/m") {
    auto r = http_->Get(("/api/repos/" + repo + "/resolve/" + path + "?revision=" + rev).c_str(),
                        Auth(write_));
    return {r->status, r->body};
  }
};

// ---------------------------------------------------------------------------
// PUT /api/repos/{id}/files/{path}
// ---------------------------------------------------------------------------

TEST_F(HubRoutesTest, PutFileMakesOneCommit) {
  std::string before = Head();
  std::string data = "hello single file";
  auto r = PutFile("org/m", "dir/a.txt?revision=main&commit_message=put%20a", data, write_);
  ASSERT_EQ(r->status, 201) << r->body;
  json j = Body(r);
  EXPECT_TRUE(hub::IsCommitId(j["revision"].get<std::string>()));
  EXPECT_EQ(j["repo_id"], "org/m");
  EXPECT_EQ(j["path"], "dir/a.txt");
  EXPECT_EQ(j["size"], data.size());
  EXPECT_EQ(j["sha256"], hub::Sha256Hex(data));
  EXPECT_EQ(j["parent_revision"], before);
  EXPECT_EQ(Head(), j["revision"]);
  EXPECT_EQ(CommitCount(), 2u);  // initial + this one
  auto c = http_->Get(("/api/repos/org/m/commits/" + j["revision"].get<std::string>()).c_str());
  EXPECT_EQ(Body(c)["message"], "put a");
  ASSERT_EQ(Body(c)["files"].size(), 1u);
  EXPECT_EQ(Body(c)["files"][0]["change"], "add");
  EXPECT_EQ(Resolve("dir/a.txt"), std::make_pair(200, data));

  // Replace it (default message), then an empty file; each one commit.
  std::string v2 = RandomData(200'000, 1);
  r = PutFile("org/m", "dir/a.txt", v2, write_);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["message"], "Upload dir/a.txt");
  EXPECT_EQ(Body(r)["files"][0]["change"], "modify");
  EXPECT_EQ(Resolve("dir/a.txt").second, v2);
  EXPECT_EQ(Resolve("dir/a.txt", j["revision"]).second, data);  // old revision unchanged
  r = PutFile("org/m", "empty.bin", "", write_);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Resolve("empty.bin"), std::make_pair(200, std::string()));
  EXPECT_EQ(CommitCount(), 4u);

  // Without the optional headers the body is taken as is.
  ::megackpt::testing::HttpHeaders h = Auth(write_);
  r = http_->Put("/api/repos/org/m/files/plain.txt", h, "abc", "text/plain");
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Resolve("plain.txt").second, "abc");
}

TEST_F(HubRoutesTest, PutFileOnOtherBranchAndParentConflict) {
  ASSERT_EQ(
      PostJson("/api/repos/org/m/refs/branches", {{"name", "dev"}, {"revision", "main"}}, write_)
          ->status,
      201);
  std::string main_head = Head();
  auto r = PutFile("org/m", "x.txt?revision=dev", "on dev", write_);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Head(), main_head);
  EXPECT_EQ(Head("org/m", "dev"), Body(r)["revision"]);
  EXPECT_EQ(Resolve("x.txt", "main").first, 404);
  EXPECT_EQ(Resolve("x.txt", "dev").second, "on dev");

  // Compare-and-swap on the branch head: a stale parent is 409, nothing moves.
  std::string dev_head = Head("org/m", "dev");
  r = PutFile("org/m", "y.txt?revision=dev&parent_revision=" + main_head, "stale", write_);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_NE(r->body.find("conflict"), std::string::npos);
  EXPECT_EQ(Head("org/m", "dev"), dev_head);
  r = PutFile("org/m", "y.txt?revision=dev&parent_revision=" + dev_head, "fresh", write_);
  EXPECT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["parent_revision"], dev_head);

  // Tags and commit ids are not writable branches.
  ASSERT_EQ(PostJson("/api/repos/org/m/refs/tags", {{"name", "v1"}, {"revision", "main"}}, write_)
                ->status,
            201);
  r = PutFile("org/m", "z.txt?revision=v1", "z", write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RevisionNotFound");
  r = PutFile("org/m", "z.txt?revision=nope", "z", write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RevisionNotFound");
}

TEST_F(HubRoutesTest, PutFileAuthAndBadInput) {
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "other/m"}}, write_)->status, 201);
  std::string head = Head();
  EXPECT_EQ(PutFile("org/m", "a.txt", "x", "")->status, 401);
  EXPECT_EQ(PutFile("org/m", "a.txt", "x", "mega_bogus")->status, 401);
  EXPECT_EQ(PutFile("org/m", "a.txt", "x", read_)->status, 403);
  EXPECT_EQ(PutFile("other/m", "a.txt", "x", org_only_)->status, 403);
  EXPECT_EQ(PutFile("org/m", "a.txt", "x", org_only_)->status, 201);
  head = Head();

  auto r = PutFile("org/m", "a.txt", "body", write_, hub::Sha256Hex("other"));
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("sha256 mismatch"), std::string::npos) << r->body;
  r = PutFile("org/m", "a.txt", "body", write_, "", "5");
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("size mismatch"), std::string::npos) << r->body;
  EXPECT_EQ(PutFile("org/m", "a.txt", "body", write_, "xyz")->status, 400);
  EXPECT_EQ(PutFile("org/m", "a.txt", "body", write_, "", "12abc")->status, 400);
  EXPECT_EQ(PutFile("org/m", "a/%2E%2E/b.txt", "body", write_)->status, 400);
  EXPECT_EQ(PutFile("org/m", "a//b.txt", "body", write_)->status, 400);
  r = PutFile("org/nope", "a.txt", "body", write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RepoNotFound");
  // Over --max-object-bytes (1 MiB): 413, and the connection stays usable.
  r = PutFile("org/m", "big.bin", RandomData(1'500'000, 2), write_);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(Head(), head) << "a rejected PUT made a commit";
  EXPECT_EQ(http_->Get("/api/repos/org/m")->status, 200);
}

// ---------------------------------------------------------------------------
// DELETE /api/repos/{id}/files/{path}
// ---------------------------------------------------------------------------

TEST_F(HubRoutesTest, DeleteFileMakesOneCommit) {
  ASSERT_EQ(PutFile("org/m", "d/a.txt", "A", write_)->status, 201);
  ASSERT_EQ(PutFile("org/m", "d/b.txt", "B", write_)->status, 201);
  std::string before = Head();
  size_t n = CommitCount();

  EXPECT_EQ(http_->Delete("/api/repos/org/m/files/d/a.txt")->status, 401);
  EXPECT_EQ(http_->Delete("/api/repos/org/m/files/d/a.txt", Auth(read_))->status, 403);
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "other/m"}}, write_)->status, 201);
  ASSERT_EQ(PutFile("other/m", "a.txt", "A", write_)->status, 201);
  EXPECT_EQ(http_->Delete("/api/repos/other/m/files/a.txt", Auth(org_only_))->status, 403);

  auto r = http_->Delete("/api/repos/org/m/files/d/a.txt?commit_message=rm%20a", Auth(write_));
  ASSERT_EQ(r->status, 201) << r->body;
  json j = Body(r);
  EXPECT_EQ(j["parent_revision"], before);
  EXPECT_EQ(j["message"], "rm a");
  EXPECT_EQ(j["path"], "d/a.txt");
  ASSERT_EQ(j["files"].size(), 1u);
  EXPECT_EQ(j["files"][0]["change"], "delete");
  EXPECT_EQ(Head(), j["revision"]);
  EXPECT_EQ(CommitCount(), n + 1);
  EXPECT_EQ(Resolve("d/a.txt").first, 404);
  EXPECT_EQ(Resolve("d/b.txt").second, "B");
  EXPECT_EQ(Resolve("d/a.txt", before).second, "A");  // history keeps it

  r = http_->Delete("/api/repos/org/m/files/d/a.txt", Auth(write_));
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "EntryNotFound");
  r = http_->Delete("/api/repos/org/m/files/d/b.txt?revision=nope", Auth(write_));
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RevisionNotFound");
  EXPECT_EQ(http_->Delete("/api/repos/org/m/files/d/%2E%2E/x", Auth(write_))->status, 400);
  r = http_->Delete(("/api/repos/org/m/files/d/b.txt?parent_revision=" + before).c_str(),
                    Auth(write_));
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_EQ(Resolve("d/b.txt").second, "B");
  EXPECT_EQ(CommitCount(), n + 1);
}

// ---------------------------------------------------------------------------
// POST /api/repos/{id}/copy
// ---------------------------------------------------------------------------

TEST_F(HubRoutesTest, CopyMakesOneCommit) {
  std::string data = RandomData(100'000, 3);
  ASSERT_EQ(PutFile("org/m", "src.bin", data, write_)->status, 201);
  std::string v1 = Head();
  size_t n = CommitCount();
  auto r = PostJson("/api/repos/org/m/copy", {{"source_path", "src.bin"}, {"path", "dst/copy.bin"}},
                    write_);
  ASSERT_EQ(r->status, 201) << r->body;
  json j = Body(r);
  EXPECT_EQ(j["parent_revision"], v1);
  EXPECT_EQ(j["source_revision"], v1);
  EXPECT_EQ(j["size"], data.size());
  EXPECT_EQ(j["sha256"], hub::Sha256Hex(data));
  EXPECT_EQ(j["message"], "Copy src.bin to dst/copy.bin");
  EXPECT_EQ(CommitCount(), n + 1);
  EXPECT_EQ(Resolve("dst/copy.bin").second, data);

  // From an older revision (the source changed since), with a message and
  // the head as parent.
  ASSERT_EQ(PutFile("org/m", "src.bin", "v2", write_)->status, 201);
  std::string head = Head();
  r = PostJson("/api/repos/org/m/copy",
               {{"source_path", "src.bin"},
                {"path", "old.bin"},
                {"source_revision", v1},
                {"commit_message", "restore"},
                {"parent_revision", head}},
               write_);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Resolve("old.bin").second, data);
  EXPECT_EQ(Resolve("src.bin").second, "v2");
  // A stale parent: 409, nothing changes.
  std::string now = Head();
  r = PostJson("/api/repos/org/m/copy",
               {{"source_path", "src.bin"}, {"path", "late.bin"}, {"parent_revision", head}},
               write_);
  EXPECT_EQ(r->status, 409) << r->body;
  EXPECT_EQ(Head(), now);
  EXPECT_EQ(Resolve("late.bin").first, 404);
}

TEST_F(HubRoutesTest, CopyAcrossReposAuthAndBadInput) {
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "other/priv"}, {"private", true}}, write_)->status,
            201);
  ASSERT_EQ(PutFile("other/priv", "secret.bin", "secret", write_)->status, 201);
  ASSERT_EQ(PutFile("org/m", "a.txt", "A", write_)->status, 201);
  std::string head = Head();
  json cross = {{"source_repo_id", "other/priv"}, {"source_path", "secret.bin"}, {"path", "s.bin"}};
  // The org-only token may write org/m but may not read other/priv.
  EXPECT_EQ(PostJson("/api/repos/org/m/copy", cross, org_only_)->status, 403);
  auto r = PostJson("/api/repos/org/m/copy", cross, write_);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Resolve("s.bin").second, "secret");
  head = Head();

  json ok = {{"source_path", "a.txt"}, {"path", "b.txt"}};
  EXPECT_EQ(PostJson("/api/repos/org/m/copy", ok, "")->status, 401);
  EXPECT_EQ(PostJson("/api/repos/org/m/copy", ok, read_)->status, 403);
  EXPECT_EQ(PostJson("/api/repos/other/priv/copy", {{"source_path", "secret.bin"}, {"path", "c"}},
                     org_only_)
                ->status,
            403);
  EXPECT_EQ(PostJson("/api/repos/org/m/copy", {{"path", "b.txt"}}, write_)->status, 400);
  EXPECT_EQ(PostJson("/api/repos/org/m/copy", {{"source_path", "a.txt"}}, write_)->status, 400);
  EXPECT_EQ(PostJson("/api/repos/org/m/copy", {{"source_path", "a.txt"}, {"path", "../x"}}, write_)
                ->status,
            400);
  EXPECT_EQ(
      http_->Post("/api/repos/org/m/copy", Auth(write_), "{not json", "application/json")->status,
      400);
  r = PostJson("/api/repos/org/m/copy", {{"source_path", "missing.txt"}, {"path", "b.txt"}},
               write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "EntryNotFound");
  r = PostJson("/api/repos/org/m/copy",
               {{"source_path", "a.txt"}, {"path", "b.txt"}, {"source_revision", "nope"}}, write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RevisionNotFound");
  r = PostJson("/api/repos/org/m/copy",
               {{"source_repo_id", "org/none"}, {"source_path", "a"}, {"path", "b"}}, write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RepoNotFound");
  EXPECT_EQ(PostJson("/api/repos/org/none/copy", ok, write_)->status, 404);
  EXPECT_EQ(Head(), head) << "a rejected copy made a commit";
}

// ---------------------------------------------------------------------------
// GET /api/repos?type&q&owner&cursor&limit
// ---------------------------------------------------------------------------

TEST_F(HubRoutesTest, RepoListingFilters) {
  ASSERT_EQ(
      PostJson("/api/repos", {{"repo_id", "org/data"}, {"repo_type", "dataset"}}, write_)->status,
      201);
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "zed/model-two"}}, write_)->status, 201);
  ASSERT_EQ(PostJson("/api/repos", {{"repo_id", "zed/hidden"}, {"private", true}}, write_)->status,
            201);
  auto ids = [&](const std::string& q, const std::string& token = "") {
    auto r = http_->Get(("/api/repos" + q).c_str(), Auth(token));
    std::vector<std::string> out;
    json j = Body(r);
    for (const auto& x : j["repos"]) out.push_back(x["repo_id"]);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(ids(""), (V{"org/data", "org/m", "zed/model-two"}));
  EXPECT_EQ(ids("", write_), (V{"org/data", "org/m", "zed/hidden", "zed/model-two"}));
  EXPECT_EQ(ids("?type=dataset"), (V{"org/data"}));
  EXPECT_EQ(ids("?type=models"), (V{"org/m", "zed/model-two"}));
  EXPECT_EQ(ids("?q=MODEL"), (V{"zed/model-two"}));
  EXPECT_EQ(ids("?owner=zed", write_), (V{"zed/hidden", "zed/model-two"}));
  EXPECT_EQ(http_->Get("/api/repos?type=bogus")->status, 400);
  // Paging over the filtered list: limit 1, follow next_cursor to the end.
  std::vector<std::string> all;
  std::string cursor;
  for (int page = 0; page < 10; ++page) {
    auto r = http_->Get(
        ("/api/repos?type=model&limit=1" + (cursor.empty() ? "" : "&cursor=" + cursor)).c_str());
    json j = Body(r);
    for (const auto& x : j["repos"]) all.push_back(x["repo_id"]);
    if (j["next_cursor"].is_null()) break;
    cursor = j["next_cursor"];
  }
  EXPECT_EQ(all, (V{"org/m", "zed/model-two"}));
}

// ---------------------------------------------------------------------------
// POST /api/{type}s/{id}/commit/{rev}?create_pr=1 (NDJSON): a refs/pr/N branch
// ---------------------------------------------------------------------------

TEST_F(HubRoutesTest, NdjsonCommitCreatePr) {
  ASSERT_EQ(PutFile("org/m", "base.txt", "base", write_)->status, 201);
  std::string main_head = Head();
  auto ndjson = [](const std::string& path, const std::string& content) {
    return json({{"key", "header"}, {"value", {{"summary", "pr " + path}, {"description", ""}}}})
               .dump() +
           "\n" +
           json({{"key", "file"},
                 {"value",
                  {{"path", path},
                   {"content", hub::Base64Encode(content)},
                   {"encoding", "base64"}}}})
               .dump() +
           "\n";
  };
  auto post = [&](const std::string& target, const std::string& body, const std::string& token) {
    return http_->Post(target.c_str(), Auth(token), body, "application/x-ndjson");
  };
  EXPECT_EQ(post("/api/models/org/m/commit/main?create_pr=1", ndjson("p.txt", "x"), "")->status,
            401);
  EXPECT_EQ(post("/api/models/org/m/commit/main?create_pr=1", ndjson("p.txt", "x"), read_)->status,
            403);
  auto r = post("/api/models/org/m/commit/nope?create_pr=1", ndjson("p.txt", "x"), write_);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RevisionNotFound");

  r = post("/api/models/org/m/commit/main?create_pr=1", ndjson("p.txt", "first pr"), write_);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = Body(r);
  EXPECT_EQ(j["pullRequestUrl"], server_.endpoint() + "/org/m/discussions/1");
  EXPECT_EQ(j["commitUrl"],
            server_.endpoint() + "/org/m/commit/" + j["commitOid"].get<std::string>());
  EXPECT_EQ(Head(), main_head) << "create_pr moved main";
  EXPECT_EQ(Head("org/m", "refs/pr/1"), j["commitOid"]);
  EXPECT_EQ(Resolve("p.txt", "refs%2Fpr%2F1").second, "first pr");
  EXPECT_EQ(Resolve("base.txt", "refs%2Fpr%2F1").second, "base");
  EXPECT_EQ(Resolve("p.txt").first, 404);
  auto c = http_->Get(("/api/repos/org/m/commits/" + j["commitOid"].get<std::string>()).c_str());
  EXPECT_EQ(Body(c)["parent_revision"], main_head);

  r = post("/api/models/org/m/commit/main?create_pr=1", ndjson("q.txt", "second"), write_);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Body(r)["pullRequestUrl"], server_.endpoint() + "/org/m/discussions/2");
  EXPECT_EQ(Resolve("p.txt", "refs%2Fpr%2F2").first, 404);  // based on main, not on PR 1
  // Without create_pr the branch itself moves and there is no PR url.
  r = post("/api/models/org/m/commit/main", ndjson("m.txt", "main"), write_);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FALSE(Body(r).contains("pullRequestUrl"));
  EXPECT_EQ(Head(), Body(r)["commitOid"]);
}

TEST_F(HubRoutesTest, McpRepositoriesAreNotServed) {
  auto r = http_->Post("/api/mcps/org/m/preupload/main", Auth(write_), "{\"files\":[]}",
                       "application/json");
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->get_header_value("X-Error-Code"), "RepoNotFound");
  EXPECT_EQ(http_->Get("/api/mcps/org/m/xet-read-token/main")->status, 404);
  // Agent-harness telemetry: a 404 is what the client expects to tolerate.
  EXPECT_EQ(http_->Get("/api/agent-harnesses")->status, 404);
}

// ---------------------------------------------------------------------------
// Routes no other test exercises over raw HTTP: whoami, tags, upload
// cancellation, bucket read tokens, the global dedup query.
// ---------------------------------------------------------------------------

TEST_F(HubRoutesTest, WhoamiTagsUploadsAndBucketTokens) {
  EXPECT_EQ(http_->Get("/api/whoami")->status, 401);
  auto r = http_->Get("/api/whoami", Auth(read_));
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(Body(r)["auth"]["accessToken"]["role"], "read");
  EXPECT_EQ(Body(http_->Get("/api/whoami", Auth(org_only_)))["name"], "org");

  // Tags: create (409 twice), resolve, delete (404 twice); writes need a write token.
  EXPECT_EQ(PostJson("/api/repos/org/m/refs/tags", {{"name", "v1"}}, read_)->status, 403);
  r = PostJson("/api/repos/org/m/refs/tags", {{"name", "v1"}, {"revision", "main"}}, write_);
  ASSERT_EQ(r->status, 201) << r->body;
  EXPECT_EQ(Body(r)["ref"], "refs/tags/v1");
  EXPECT_EQ(Body(r)["target_revision"], Head());
  EXPECT_EQ(PostJson("/api/repos/org/m/refs/tags", {{"name", "v1"}}, write_)->status, 409);
  EXPECT_EQ(PostJson("/api/repos/org/m/refs/tags", {{"name", "v2"}, {"revision", "nope"}}, write_)
                ->status,
            404);
  json refs = Body(http_->Get("/api/repos/org/m/refs"));
  ASSERT_EQ(refs["tags"].size(), 1u);
  EXPECT_EQ(http_->Get("/api/repos/org/m/commits/v1")->status, 200);
  EXPECT_EQ(http_->Delete("/api/repos/org/m/refs/tags/v1", Auth(read_))->status, 403);
  EXPECT_EQ(http_->Delete("/api/repos/org/m/refs/tags/v1", Auth(write_))->status, 200);
  EXPECT_EQ(http_->Delete("/api/repos/org/m/refs/tags/v1", Auth(write_))->status, 404);
  EXPECT_EQ(http_->Get("/api/repos/org/m/commits/v1")->status, 404);

  // DELETE /api/uploads/{id} (megahub extension): cancels a multipart upload.
  std::string data = RandomData(5000, 4);
  r = PostJson("/api/uploads",
               {{"repo_id", "org/m"},
                {"path", "big.bin"},
                {"revision", "main"},
                {"size", data.size()},
                {"sha256", hub::Sha256Hex(data)},
                {"stage_only", true}},
               write_);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string id = Body(r)["upload_id"];
  EXPECT_EQ(http_->Delete(("/api/uploads/" + id).c_str())->status, 401);
  EXPECT_EQ(http_->Delete(("/api/uploads/" + id).c_str(), Auth(read_))->status, 403);
  EXPECT_EQ(http_->Delete(("/api/uploads/" + id).c_str(), Auth(write_))->status, 200);
  EXPECT_EQ(http_->Get(("/api/uploads/" + id).c_str(), Auth(write_))->status, 404);

  // Bucket read tokens: anonymous on a public bucket, 401 on a private one.
  ASSERT_EQ(PostJson("/api/buckets/org/pub", json::object(), write_)->status, 200);
  ASSERT_EQ(PostJson("/api/buckets/org/priv", {{"private", true}}, write_)->status, 200);
  r = http_->Get("/api/buckets/org/pub/xet-read-token");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(Body(r)["casUrl"], server_.endpoint());
  EXPECT_EQ(http_->Get("/api/buckets/org/priv/xet-read-token")->status, 401);
  EXPECT_EQ(http_->Get("/api/buckets/org/priv/xet-read-token", Auth(read_))->status, 200);
  EXPECT_EQ(http_->Get("/api/buckets/org/pub/xet-write-token", Auth(read_))->status, 403);
  EXPECT_EQ(http_->Get("/api/buckets/org/none/xet-read-token")->status, 404);
}

TEST_F(HubRoutesTest, GlobalDedupChunkQuery) {
  ASSERT_EQ(PutFile("org/m", "a.bin", RandomData(300'000, 5), write_)->status, 201);
  std::string xet = http_->Head("/api/repos/org/m/resolve/a.bin")->get_header_value("X-Xet-Hash");
  json recon = Body(http_->Get(("/v1/reconstructions/" + xet).c_str(), Auth(read_)));
  std::string xorb = recon["terms"][0]["hash"];
  auto layout_r = http_->Get(("/v1/xorbs/default/" + xorb + "/layout").c_str(), Auth(read_));
  ASSERT_EQ(layout_r->status, 200);
  auto layout = cas::ParseXorbFooter(std::as_bytes(std::span(layout_r->body)),
                                     *cas::MerkleHash::FromHex(xorb));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  std::string chunk = layout->chunks[1].hash.ToHex();

  auto r = http_->Get(("/v1/chunks/default/" + chunk).c_str(), Auth(read_));
  ASSERT_EQ(r->status, 200);
  auto shard = cas::ParseShard(std::as_bytes(std::span(r->body)));
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  ASSERT_EQ(shard->xorbs.size(), 1u);
  EXPECT_EQ(shard->xorbs[0].xorb_hash.ToHex(), xorb);
  EXPECT_EQ(shard->xorbs[0].chunks.size(), layout->chunks.size());
  EXPECT_EQ(http_->Get(("/v1/chunks/default/" + chunk).c_str())->status, 401);
  EXPECT_EQ(http_->Get(("/v1/chunks/default/" + std::string(64, '1')).c_str(), Auth(read_))->status,
            404);
  EXPECT_EQ(http_->Get("/v1/chunks/default/zz", Auth(read_))->status, 400);
}

// ---------------------------------------------------------------------------
// GET /v2/reconstructions/{file}, GET/POST /v1/reconstructions (batch)
// ---------------------------------------------------------------------------

class HubReconstructionTest : public HubRoutesTest {
 protected:
  void SetUp() override {
    HubRoutesTest::SetUp();
    a_ = RandomData(600'000, 11);
    b_ = a_.substr(0, 300'000) + RandomData(300'000, 12);  // shares A's first half
    ASSERT_EQ(PutFile("org/m", "a.bin", a_, write_)->status, 201);
    ASSERT_EQ(PutFile("org/m", "b.bin", b_, write_)->status, 201);
    xa_ = XetHash("a.bin");
    xb_ = XetHash("b.bin");
    ASSERT_EQ(xa_.size(), 64u);
  }
  std::string XetHash(const std::string& path) {
    auto r = http_->Head(("/api/repos/org/m/resolve/" + path).c_str());
    return r->get_header_value("X-Xet-Hash");
  }
  ::megackpt::testing::HttpResult Get(const std::string& path, const std::string& token,
                                      const std::string& range = "") {
    ::megackpt::testing::HttpHeaders h = Auth(token);
    if (!range.empty()) h.emplace("Range", range);
    return http_->Get(path.c_str(), h);
  }
  // Fetches xorb bytes [first, last] from an absolute fetch URL and decodes
  // the chunk records in them.
  std::string FetchChunks(const std::string& url, uint64_t first, uint64_t last) {
    std::string path = url.substr(server_.endpoint().size());
    auto r = Get(path, read_, "bytes=" + std::to_string(first) + "-" + std::to_string(last));
    EXPECT_EQ(r->status, 206);
    EXPECT_EQ(r->body.size(), last - first + 1);
    auto d = cas::DecodeXorb(std::as_bytes(std::span(r->body)));
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? d->data : "";
  }
  // Rebuilds bytes from a V2 answer: every term's chunk range must lie in one
  // of its xorb's entries.
  std::string Rebuild(const json& ans) {
    std::string out;
    for (const auto& t : ans["terms"]) {
      uint32_t cs = t["range"]["start"], ce = t["range"]["end"];
      bool found = false;
      for (const auto& e : ans["xorbs"][t["hash"].get<std::string>()]) {
        for (const auto& rg : e["ranges"]) {
          uint32_t es = rg["chunks"]["start"], ee = rg["chunks"]["end"];
          if (es > cs || ee < ce) continue;
          std::string chunks = FetchChunks(e["url"], rg["bytes"]["start"], rg["bytes"]["end"]);
          // Skip the entry's chunks before the term (sizes from the layout).
          uint64_t skip = 0;
          {
            auto path = e["url"].get<std::string>().substr(server_.endpoint().size());
            path = path.substr(0, path.find('?'));  // the URL is presigned
            auto layout = Get(path + "/layout", read_);
            auto parsed =
                cas::ParseXorbFooter(std::as_bytes(std::span(layout->body)),
                                     *cas::MerkleHash::FromHex(t["hash"].get<std::string>()));
            EXPECT_TRUE(parsed.ok());
            for (uint32_t c = es; c < cs; ++c) skip += parsed->chunks[c].unpacked_bytes;
          }
          out += chunks.substr(skip, t["unpacked_length"].get<uint64_t>());
          found = true;
          break;
        }
        if (found) break;
      }
      EXPECT_TRUE(found) << "no fetch entry covers term " << t.dump();
    }
    return out.substr(ans["offset_into_first_range"].get<uint64_t>());
  }

  std::string a_, b_, xa_, xb_;
};

TEST_F(HubReconstructionTest, V2WholeFileAndRanges) {
  auto r = Get("/v2/reconstructions/" + xb_, read_);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = Body(r);
  ASSERT_TRUE(j["xorbs"].is_object());
  EXPECT_FALSE(j.contains("fetch_info"));
  EXPECT_EQ(Rebuild(j), b_);
  // Same terms as V1; V1's url_range equals V2's single range per entry.
  json v1 = Body(Get("/v1/reconstructions/" + xb_, read_));
  json terms1 = v1["terms"], terms2 = j["terms"];
  EXPECT_EQ(terms1, terms2);
  for (const auto& [xorb, entries] : v1["fetch_info"].items()) {
    ASSERT_EQ(entries.size(), j["xorbs"][xorb].size());
    for (size_t i = 0; i < entries.size(); ++i) {
      EXPECT_EQ(entries[i]["url_range"], j["xorbs"][xorb][i]["ranges"][0]["bytes"]);
      EXPECT_EQ(entries[i]["range"], j["xorbs"][xorb][i]["ranges"][0]["chunks"]);
    }
  }
  // A byte range: only the chunks covering it, exact bytes after the offset.
  for (auto [first, last] :
       {std::pair<uint64_t, uint64_t>{1000, 2000}, {299'000, 301'000}, {599'000, 599'999}}) {
    r = Get("/v2/reconstructions/" + xb_, read_,
            "bytes=" + std::to_string(first) + "-" + std::to_string(last));
    ASSERT_EQ(r->status, 200) << r->body;
    std::string got = Rebuild(Body(r));
    ASSERT_GE(got.size(), last - first + 1);
    EXPECT_TRUE(got.substr(0, last - first + 1) == b_.substr(first, last - first + 1)) << first;
    uint64_t covered = 0;
    json ans = Body(r);
    for (const auto& t : ans["terms"]) covered += t["unpacked_length"].get<uint64_t>();
    EXPECT_LT(covered, b_.size()) << "range answer was not narrowed";
  }
}

TEST_F(HubReconstructionTest, V2AuthAndErrors) {
  EXPECT_EQ(Get("/v2/reconstructions/" + xa_, "")->status, 401);
  EXPECT_EQ(Get("/v2/reconstructions/" + xa_, "mega_bogus")->status, 401);
  // A CAS read token from the hub works as well as a hub token.
  auto tok = Get("/api/models/org/m/xet-read-token/main", "");
  ASSERT_EQ(tok->status, 200);
  EXPECT_EQ(Get("/v2/reconstructions/" + xa_, Body(tok)["accessToken"])->status, 200);
  EXPECT_EQ(Get("/v2/reconstructions/" + std::string(64, '0'), read_)->status, 404);
  EXPECT_EQ(Get("/v2/reconstructions/xyz", read_)->status, 400);
  EXPECT_EQ(Get("/v2/reconstructions/" + xa_, read_, "bytes=600000-600001")->status, 416);
  // A malformed Range (last < first) is ignored (RFC 7233 §3.1): the whole file.
  auto malformed = Get("/v2/reconstructions/" + xa_, read_, "bytes=5-1");
  EXPECT_EQ(malformed->status, 200);
  EXPECT_EQ(Body(malformed)["terms"], Body(Get("/v2/reconstructions/" + xa_, read_))["terms"]);
  EXPECT_EQ(
      http_->Post(("/v2/reconstructions/" + xa_).c_str(), Auth(write_), "", "text/plain")->status,
      404);
}

// hf_xet fetches `fetch_info` / V2 xorb URLs without an Authorization header
// (as presigned object-store URLs): the URLs carry a signature and an expiry.
// A tampered or missing signature, or another xorb's, is a 401 without a token.
TEST_F(HubReconstructionTest, XorbUrlsArePresigned) {
  json v1 = Body(Get("/v1/reconstructions/" + xa_, read_));
  ASSERT_FALSE(v1["fetch_info"].empty());
  auto [xorb, entries] = *v1["fetch_info"].items().begin();
  std::string url = entries[0]["url"];
  ASSERT_NE(url.find("X-Xet-Signature="), std::string::npos) << url;
  std::string path = url.substr(server_.endpoint().size());
  std::string range = "bytes=" + std::to_string(entries[0]["url_range"]["start"].get<uint64_t>()) +
                      "-" + std::to_string(entries[0]["url_range"]["end"].get<uint64_t>());
  auto r = Get(path, "", range);
  EXPECT_EQ(r->status, 206) << r->body;
  // No signature, a wrong one, an invalid token next to it: 401.
  std::string bare = path.substr(0, path.find('?'));
  EXPECT_EQ(Get(bare, "", range)->status, 401);
  std::string tampered = path;
  tampered.back() = tampered.back() == '0' ? '1' : '0';
  EXPECT_EQ(Get(tampered, "", range)->status, 401);
  EXPECT_EQ(Get(path, "mega_bogus", range)->status, 401);
  // The signature names the xorb: it does not open another one.
  json vb = Body(Get("/v1/reconstructions/" + xb_, read_));
  for (const auto& [other, e] : vb["fetch_info"].items()) {
    if (other == xorb) continue;
    EXPECT_EQ(Get("/v1/xorbs/default/" + other + path.substr(path.find('?')), "")->status, 401);
  }
  // An expired signature (the expiry is part of what is signed).
  std::string expired = path;
  size_t at = expired.find("X-Xet-Expires=") + 14;
  expired.replace(at, expired.find('&', at) - at, "1000");
  EXPECT_EQ(Get(expired, "", range)->status, 401);
  // Presigned URLs are for reads only.
  EXPECT_EQ(http_->Post(path.c_str(), {}, "x", "application/octet-stream")->status, 401);
}

TEST_F(HubReconstructionTest, BatchReconstructions) {
  json single_a = Body(Get("/v1/reconstructions/" + xa_, read_));
  json single_b = Body(Get("/v1/reconstructions/" + xb_, read_));
  // POST {"file_ids": [...]} (a read: a read token suffices) and GET ?file_id=...
  auto post = PostJson("/v1/reconstructions", {{"file_ids", {xa_, xb_, xa_}}}, read_);
  ASSERT_EQ(post->status, 200) << post->body;
  auto get = Get("/v1/reconstructions?file_id=" + xa_ + "&file_id=" + xb_, read_);
  ASSERT_EQ(get->status, 200) << get->body;
  for (const json& j : {Body(post), Body(get)}) {
    ASSERT_EQ(j["files"].size(), 2u);
    EXPECT_EQ(j["files"][xa_], single_a["terms"]);
    EXPECT_EQ(j["files"][xb_], single_b["terms"]);
    // Every term of both files is covered by a fetch_info entry.
    for (const auto& [id, terms] : j["files"].items()) {
      for (const auto& t : terms) {
        bool covered = false;
        for (const auto& e : j["fetch_info"][t["hash"].get<std::string>()]) {
          covered |=
              e["range"]["start"] <= t["range"]["start"] && e["range"]["end"] >= t["range"]["end"];
        }
        EXPECT_TRUE(covered) << id << " " << t.dump();
      }
    }
  }
  // B shares A's first xorb: the batch lists it once.
  size_t xorbs_a = single_a["fetch_info"].size(), xorbs_b = single_b["fetch_info"].size();
  EXPECT_LT(Body(post)["fetch_info"].size(), xorbs_a + xorbs_b);

  EXPECT_EQ(PostJson("/v1/reconstructions", {{"file_ids", {xa_}}}, "")->status, 401);
  EXPECT_EQ(Get("/v1/reconstructions?file_id=" + xa_, "")->status, 401);
  EXPECT_EQ(
      PostJson("/v1/reconstructions", {{"file_ids", {xa_, std::string(64, '0')}}}, read_)->status,
      404);
  EXPECT_EQ(PostJson("/v1/reconstructions", {{"file_ids", {"xyz"}}}, read_)->status, 400);
  EXPECT_EQ(PostJson("/v1/reconstructions", {{"file_ids", {1, 2}}}, read_)->status, 400);
  EXPECT_EQ(PostJson("/v1/reconstructions", {{"ids", {xa_}}}, read_)->status, 400);
  EXPECT_EQ(PostJson("/v1/reconstructions", {{"file_ids", json::array()}}, read_)->status, 400);
  EXPECT_EQ(Get("/v1/reconstructions", read_)->status, 400);
  json many = json::array();
  for (int i = 0; i < 1001; ++i) many.push_back(xa_);
  EXPECT_EQ(PostJson("/v1/reconstructions", {{"file_ids", many}}, read_)->status, 400);
}

}  // namespace
}  // namespace megackpt
