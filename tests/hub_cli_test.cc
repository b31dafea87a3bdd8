// `megackpt push/pull/ls/rm/log` as separate processes against a real megahub
// on loopback and against an embedded hub (file://), including concurrent
// writer processes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "hub_test_server.h"

namespace megackpt {
namespace {

using json = nlohmann::json;
using ::megackpt::test_util::CommandResult;
using ::megackpt::test_util::RandomData;
using ::megackpt::test_util::ReadFileOrEmpty;
using ::megackpt::test_util::WriteFileCreatingDirs;
using ::megackpt::testing::TempDir;
using ::testing::HasSubstr;

class HubCliTest : public ::megackpt::testing::MegahubTest {
 protected:
  HubCliTest() : MegahubTest({"cli-hub", {}}) {}

  // Runs megackpt with the hub environment (MEGA_ENDPOINT: the fixture's
  // server unless `endpoint` is given; MEGA_TOKEN: the write token unless
  // `token` is given); stdout in `out`, stderr in `err`.
  CommandResult Cli(const std::string& args, const std::string& token = "use-default",
                    const std::string& endpoint = "") {
    return test_util::RunMegackpt(
        args, {.stderr_to = test_util::StderrTo::kErr,
               .env = {{"MEGA_ENDPOINT", endpoint.empty() ? server_.endpoint() : endpoint},
                       {"MEGA_TOKEN", token == "use-default" ? write_ : token}}});
  }

  uint64_t ServerBytes() {
    auto r = http_->Get("/api/stats");
    if (!r) return 0;
    json j = Body(r);
    return j.is_object() ? j["request_body_bytes"].get<uint64_t>() : 0;
  }

  // Two writer processes push to the same branch at once, several times.
  // Every push either lands or fails with a conflict; nothing lost or torn.
  void ConcurrentPushes(const std::string& endpoint, const std::string& token) {
    std::string a = work_.path() + "/a", b = work_.path() + "/b";
    WriteFileCreatingDirs(a + "/from-a.bin", RandomData(300000, 1));
    WriteFileCreatingDirs(b + "/from-b.bin", RandomData(300000, 2));
    int landed = 0, unchanged = 0, conflicts = 0;
    for (int round = 0; round < 3; ++round) {
      CommandResult ra, rb;
      std::thread ta(
          [&] { ra = Cli("push -q " + a + " mega://org/race --json", token, endpoint); });
      std::thread tb(
          [&] { rb = Cli("push -q " + b + " mega://org/race --json", token, endpoint); });
      ta.join();
      tb.join();
      for (const CommandResult* r : {&ra, &rb}) {
        if (r->code == 0) {
          // A push of content the branch already has makes no commit.
          json out = json::parse(r->out, nullptr, false);
          bool no_change = out.is_object() && out.value("no_change", false);
          ++(no_change ? unchanged : landed);
        } else {
          ++conflicts;
          EXPECT_EQ(r->code, 1);
          EXPECT_THAT(r->err, HasSubstr("conflict"));
        }
      }
    }
    EXPECT_GE(landed + unchanged, 3);
    EXPECT_GE(landed, 2);  // each folder landed at least once
    CommandResult r = Cli("log mega://org/race --json -n 100", token, endpoint);
    json log = json::parse(r.out, nullptr, false);
    ASSERT_EQ(r.code, 0);
    EXPECT_EQ(static_cast<int>(log.size()), landed + 1);  // + initial commit
    // The last landed content of both files is readable.
    EXPECT_EQ(Cli("pull -q mega://org/race " + work_.path() + "/race-out", token, endpoint).code,
              0);
    std::printf("concurrent pushes: %d landed, %d with nothing to change, %d conflicts\n", landed,
                unchanged, conflicts);
  }

  TempDir work_{"cli-work"};
};

TEST_F(HubCliTest, PushPullLsLogRm) {
  std::string src = work_.path() + "/src";
  constexpr int kFiles = 20;
  constexpr size_t kSize = 200 * 1024;
  for (int i = 0; i < kFiles; ++i) {
    WriteFileCreatingDirs(src + "/t/" + std::to_string(i) + ".bin", RandomData(kSize, i));
  }
  WriteFileCreatingDirs(src + "/index.json", "{\"files\": 20}");
  CommandResult r = Cli("push " + src + " mega://org/model@main/ckpt/step-1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  std::string c1 = j["commit"];
  EXPECT_EQ(c1.size(), 40u);
  uint64_t total = j["total_bytes"];
  EXPECT_EQ(total, kFiles * kSize + 13);
  EXPECT_GE(j["uploaded_bytes"].get<uint64_t>(), kFiles * kSize);

  // Second version: 10% of the files changed uploads <= 15% of the bytes,
  // measured at the server.
  WriteFileCreatingDirs(src + "/t/4.bin", RandomData(kSize, 1004));
  WriteFileCreatingDirs(src + "/t/15.bin", RandomData(kSize, 1015));
  uint64_t before = ServerBytes();
  r = Cli("push " + src + " mega://org/model@main/ckpt/step-1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  uint64_t sent = ServerBytes() - before;
  json j2 = json::parse(r.out, nullptr, false);
  std::printf(
      "second push: client reports %llu uploaded, server received %llu of %llu bytes (%.1f%%)\n",
      (unsigned long long)j2["uploaded_bytes"].get<uint64_t>(), (unsigned long long)sent,
      (unsigned long long)total, 100.0 * sent / total);
  EXPECT_LE(sent, total * 15 / 100);
  EXPECT_LE(j2["uploaded_bytes"].get<uint64_t>(), total * 15 / 100);
  std::string c2 = j2["commit"];

  // pull the new head, and the old commit.
  r = Cli("pull mega://org/model@main/ckpt/step-1 " + work_.path() + "/out -q");
  ASSERT_EQ(r.code, 0) << r.err;
  for (int i = 0; i < kFiles; ++i) {
    std::string name = "/t/" + std::to_string(i) + ".bin";
    EXPECT_EQ(ReadFileOrEmpty(work_.path() + "/out" + name), ReadFileOrEmpty(src + name)) << name;
  }
  r = Cli("pull mega://org/model@" + c1 + "/ckpt/step-1/t/4.bin " + work_.path() + "/old -q");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ReadFileOrEmpty(work_.path() + "/old/4.bin"), RandomData(kSize, 4));

  r = Cli("ls mega://org/model/ckpt/step-1");
  ASSERT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("mega://org/model/ckpt/step-1/index.json"));
  EXPECT_THAT(r.out, HasSubstr("mega://org/model/ckpt/step-1/t/"));
  r = Cli("log mega://org/model --json");
  ASSERT_EQ(r.code, 0);
  json log = json::parse(r.out, nullptr, false);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0]["commit"], c2);
  EXPECT_EQ(log[1]["commit"], c1);
  r = Cli("rm -r mega://org/model/ckpt/step-1/t");
  ASSERT_EQ(r.code, 0) << r.err;
  r = Cli("ls -r mega://org/model --json");
  EXPECT_EQ(json::parse(r.out, nullptr, false).size(), 1u);

  // Errors: bad URI = usage (2); read-only token = failure (1), nothing committed.
  EXPECT_EQ(Cli("ls mega://org//x").code, 2);
  EXPECT_EQ(Cli("push " + src + " mega://org/model --json", read_).code, 1);
  r = Cli("push " + src + " mega://org/model --json", "");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("Unauthenticated"));
  r = Cli("log mega://org/model --json");
  EXPECT_EQ(json::parse(r.out, nullptr, false).size(), 4u);  // + the rm commit only
}

// Pushing the same folder again changes nothing: no commit, and the CLI says so.
TEST_F(HubCliTest, PushWithNothingToChangeMakesNoCommit) {
  std::string src = work_.path() + "/same";
  WriteFileCreatingDirs(src + "/a.bin", RandomData(100000, 7));
  WriteFileCreatingDirs(src + "/b/c.txt", "hello");
  for (const std::string& endpoint : {std::string(), "file://" + work_.path() + "/embedded-same"}) {
    const std::string token = endpoint.empty() ? write_ : "";
    CommandResult first = Cli("push -q " + src + " mega://org/same --json", token, endpoint);
    ASSERT_EQ(first.code, 0) << first.err;
    json j1 = json::parse(first.out, nullptr, false);
    EXPECT_FALSE(j1.value("no_change", false));
    CommandResult again = Cli("push -q " + src + " mega://org/same --json", token, endpoint);
    ASSERT_EQ(again.code, 0) << again.err;
    json j2 = json::parse(again.out, nullptr, false);
    EXPECT_TRUE(j2.value("no_change", false)) << again.out;
    EXPECT_EQ(j2["commit"], j1["commit"]);
    CommandResult text = Cli("push -q " + src + " mega://org/same", token, endpoint);
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_THAT(text.out, HasSubstr("nothing to change"));
    CommandResult log = Cli("log mega://org/same --json", token, endpoint);
    EXPECT_EQ(json::parse(log.out, nullptr, false).size(), 2u)
        << endpoint;  // initial + the first push
  }
}

// A second pull into the same folder downloads nothing: files whose local
// copy has the same size and SHA-256 are skipped; a local file that differs
// (same size, other bytes) is downloaded again.
TEST_F(HubCliTest, PullSkipsFilesThatAlreadyMatch) {
  std::string src = work_.path() + "/skip-src", dst = work_.path() + "/skip-dst";
  for (int i = 0; i < 4; ++i)
    WriteFileCreatingDirs(src + "/f" + std::to_string(i) + ".bin", RandomData(150000, 40 + i));
  ASSERT_EQ(Cli("push -q " + src + " mega://org/skip").code, 0);
  CommandResult first = Cli("pull -q mega://org/skip " + dst + " --json");
  ASSERT_EQ(first.code, 0) << first.err;
  json j1 = json::parse(first.out, nullptr, false);
  EXPECT_EQ(j1["skipped_files"], 0);
  EXPECT_EQ(j1["downloaded_bytes"], 4 * 150000);
  CommandResult again = Cli("pull -q mega://org/skip " + dst + " --json");
  ASSERT_EQ(again.code, 0) << again.err;
  json j2 = json::parse(again.out, nullptr, false);
  EXPECT_EQ(j2["skipped_files"], 4);
  EXPECT_EQ(j2["downloaded_bytes"], 0);
  std::string changed = RandomData(150000, 99);
  WriteFileCreatingDirs(dst + "/f2.bin", changed);
  CommandResult third = Cli("pull mega://org/skip " + dst + " --json");
  ASSERT_EQ(third.code, 0) << third.err;
  json j3 = json::parse(third.out, nullptr, false);
  EXPECT_EQ(j3["skipped_files"], 3);
  EXPECT_EQ(j3["downloaded_bytes"], 150000);
  EXPECT_EQ(ReadFileOrEmpty(dst + "/f2.bin"), RandomData(150000, 42));
  // --json progress: NDJSON events on stderr (start, file, done), stdout the result.
  std::vector<std::string> events;
  std::istringstream lines(third.err);
  for (std::string line; std::getline(lines, line);) {
    json ev = json::parse(line, nullptr, false);
    ASSERT_TRUE(ev.is_object()) << line;
    events.push_back(ev["event"]);
    if (ev["event"] == "start") {
      EXPECT_EQ(ev["endpoint"], server_.endpoint());
      EXPECT_EQ(ev["endpoint_source"], "MEGA_ENDPOINT");
      EXPECT_EQ(ev["files_total"], 4);
    }
    if (ev["event"] == "done") {
      EXPECT_EQ(ev["bytes_done"], 4 * 150000);
      EXPECT_EQ(ev["files_skipped"], 3);
    }
  }
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front(), "start");
  EXPECT_EQ(events.back(), "done");
  EXPECT_EQ(std::count(events.begin(), events.end(), "file"), 4);
}

// push/pull/ls say which hub they talk to, and errors say what to do.
TEST_F(HubCliTest, CommandsNameTheEndpointAndErrorsSayWhatToDo) {
  std::string src = work_.path() + "/named";
  WriteFileCreatingDirs(src + "/a.bin", RandomData(5000, 5));
  CommandResult r = Cli("push " + src + " mega://org/named");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("megahub at " + server_.endpoint() + " (MEGA_ENDPOINT)"));
  r = Cli("ls mega://org/named");
  EXPECT_THAT(r.err, HasSubstr("megahub at " + server_.endpoint()));
  r = Cli("pull mega://org/named " + work_.path() + "/named-out --endpoint " + server_.endpoint());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(--endpoint)"));
  // No MEGA_ENDPOINT: the default embedded hub under MEGA_HOME, and it says so.
  const std::string home = work_.path() + "/mega-home";
  r = test_util::RunMegackpt(
      "push " + src + " mega://org/named",
      {.stderr_to = test_util::StderrTo::kErr,
       .env = {{"MEGA_ENDPOINT", ""}, {"MEGA_TOKEN", ""}, {"MEGA_HOME", home}}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr("the embedded hub at " + home + "/hub (default: MEGA_ENDPOINT is not set"));
  // No token: how to give one. A refused connection: is megahub running there?
  r = Cli("push " + src + " mega://org/named2", "");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("set MEGA_TOKEN="));
  EXPECT_THAT(r.err, HasSubstr("megahub token create"));
  r = Cli("push " + src + " mega://org/named2", "mega_0000000000000000000000000000000000000000");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("did not accept the token"));
  r = Cli("ls mega://org/named", "use-default", "http://127.0.0.1:1");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("is megahub running at http://127.0.0.1:1?"));
}

TEST_F(HubCliTest, ConcurrentPushProcessesRemote) { ConcurrentPushes("", write_); }

TEST_F(HubCliTest, ConcurrentPushProcessesEmbedded) {
  ConcurrentPushes("file://" + work_.path() + "/embedded-hub", "");
}

}  // namespace
}  // namespace megackpt
