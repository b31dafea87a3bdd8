// `megackpt push/pull/ls/rm/log` as separate processes against a real megahub
// on loopback and against an embedded hub (file://), including concurrent
// writer processes.
#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "hub_test_server.h"

namespace megackpt {
namespace {

using json = nlohmann::json;
using ::megackpt::testing::CreateToken;
using ::megackpt::testing::MegackptBinary;
using ::megackpt::testing::MegahubProcess;
using ::megackpt::testing::RunCommand;
using ::megackpt::testing::TempDir;
using ::testing::HasSubstr;

void WriteFile(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string RandomData(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(s.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return s;
}

class HubCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_ = CreateToken(hub_root_.path(), "write");
    read_token_ = CreateToken(hub_root_.path(), "read");
    ASSERT_TRUE(server_.Start(hub_root_.path()));
  }

  // Runs megackpt with the hub environment; returns stdout. stderr goes to
  // work/<err> (read back with Stderr(err)).
  std::string Cli(const std::string& args, int* rc, const std::string& token = "use-default",
                  const std::string& endpoint = "", const std::string& err = "stderr.txt") {
    std::string env = "MEGA_ENDPOINT='" + (endpoint.empty() ? server_.endpoint() : endpoint) + "' MEGA_TOKEN='" +
                      (token == "use-default" ? token_ : token) + "' ";
    return RunCommand(env + MegackptBinary() + " " + args + " 2>" + work_.path() + "/" + err, rc);
  }
  std::string Stderr(const std::string& err = "stderr.txt") { return ReadFile(work_.path() + "/" + err); }

  uint64_t ServerBytes() {
    httplib::Client c(server_.endpoint());
    auto r = c.Get("/api/stats");
    if (!r) return 0;
    json j = json::parse(r->body, nullptr, false);
    return j.is_object() ? j["request_body_bytes"].get<uint64_t>() : 0;
  }

  // Two writer processes push to the same branch at once, several times.
  // Every push either lands or fails with a conflict; nothing lost or torn.
  void ConcurrentPushes(const std::string& endpoint, const std::string& token) {
    std::string a = work_.path() + "/a", b = work_.path() + "/b";
    WriteFile(a + "/from-a.bin", RandomData(300000, 1));
    WriteFile(b + "/from-b.bin", RandomData(300000, 2));
    int landed = 0, conflicts = 0;
    for (int round = 0; round < 3; ++round) {
      int rca = -1, rcb = -1;
      std::thread ta([&] { Cli("push -q " + a + " mega://org/race --json", &rca, token, endpoint, "a.err"); });
      std::thread tb([&] { Cli("push -q " + b + " mega://org/race --json", &rcb, token, endpoint, "b.err"); });
      ta.join();
      tb.join();
      for (auto [rc, err] : {std::pair{rca, "a.err"}, std::pair{rcb, "b.err"}}) {
        if (rc == 0) {
          ++landed;
        } else {
          ++conflicts;
          EXPECT_EQ(rc, 1);
          EXPECT_THAT(Stderr(err), HasSubstr("conflict"));
        }
      }
    }
    EXPECT_GE(landed, 3);
    int rc = -1;
    json log = json::parse(Cli("log mega://org/race --json -n 100", &rc, token, endpoint), nullptr, false);
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(static_cast<int>(log.size()), landed + 1);  // + initial commit
    // The last landed content of both files is readable.
    Cli("pull -q mega://org/race " + work_.path() + "/race-out", &rc, token, endpoint);
    EXPECT_EQ(rc, 0);
    std::printf("concurrent pushes: %d landed, %d conflicts\n", landed, conflicts);
  }

  TempDir hub_root_{"cli-hub"};
  TempDir work_{"cli-work"};
  MegahubProcess server_;
  std::string token_, read_token_;
};

TEST_F(HubCliTest, PushPullLsLogRm) {
  std::string src = work_.path() + "/src";
  constexpr int kFiles = 20;
  constexpr size_t kSize = 200 * 1024;
  for (int i = 0; i < kFiles; ++i) WriteFile(src + "/t/" + std::to_string(i) + ".bin", RandomData(kSize, i));
  WriteFile(src + "/index.json", "{\"files\": 20}");
  int rc = -1;
  std::string out = Cli("push " + src + " mega://org/model@main/ckpt/step-1 --json", &rc);
  ASSERT_EQ(rc, 0) << Stderr();
  json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  std::string c1 = j["commit"];
  EXPECT_EQ(c1.size(), 40u);
  uint64_t total = j["total_bytes"];
  EXPECT_EQ(total, kFiles * kSize + 13);
  EXPECT_GE(j["uploaded_bytes"].get<uint64_t>(), kFiles * kSize);

  // Second version: 10% of the files changed uploads <= 15% of the bytes,
  // measured at the server.
  WriteFile(src + "/t/4.bin", RandomData(kSize, 1004));
  WriteFile(src + "/t/15.bin", RandomData(kSize, 1015));
  uint64_t before = ServerBytes();
  out = Cli("push " + src + " mega://org/model@main/ckpt/step-1 --json", &rc);
  ASSERT_EQ(rc, 0) << Stderr();
  uint64_t sent = ServerBytes() - before;
  json j2 = json::parse(out, nullptr, false);
  std::printf("second push: client reports %llu uploaded, server received %llu of %llu bytes (%.1f%%)\n",
              (unsigned long long)j2["uploaded_bytes"].get<uint64_t>(), (unsigned long long)sent,
              (unsigned long long)total, 100.0 * sent / total);
  EXPECT_LE(sent, total * 15 / 100);
  EXPECT_LE(j2["uploaded_bytes"].get<uint64_t>(), total * 15 / 100);
  std::string c2 = j2["commit"];

  // pull the new head, and the old commit.
  out = Cli("pull mega://org/model@main/ckpt/step-1 " + work_.path() + "/out -q", &rc);
  ASSERT_EQ(rc, 0) << Stderr();
  for (int i = 0; i < kFiles; ++i) {
    std::string name = "/t/" + std::to_string(i) + ".bin";
    EXPECT_EQ(ReadFile(work_.path() + "/out" + name), ReadFile(src + name)) << name;
  }
  out = Cli("pull mega://org/model@" + c1 + "/ckpt/step-1/t/4.bin " + work_.path() + "/old -q", &rc);
  ASSERT_EQ(rc, 0) << Stderr();
  EXPECT_EQ(ReadFile(work_.path() + "/old/4.bin"), RandomData(kSize, 4));

  out = Cli("ls mega://org/model/ckpt/step-1", &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("mega://org/model/ckpt/step-1/index.json"));
  EXPECT_THAT(out, HasSubstr("mega://org/model/ckpt/step-1/t/"));
  out = Cli("log mega://org/model --json", &rc);
  ASSERT_EQ(rc, 0);
  json log = json::parse(out, nullptr, false);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0]["commit"], c2);
  EXPECT_EQ(log[1]["commit"], c1);
  out = Cli("rm -r mega://org/model/ckpt/step-1/t", &rc);
  ASSERT_EQ(rc, 0) << Stderr();
  out = Cli("ls -r mega://org/model --json", &rc);
  EXPECT_EQ(json::parse(out, nullptr, false).size(), 1u);

  // Errors: bad URI = usage (2); read-only token = failure (1), nothing committed.
  Cli("ls mega://org//x", &rc);
  EXPECT_EQ(rc, 2);
  Cli("push " + src + " mega://org/model --json", &rc, read_token_);
  EXPECT_EQ(rc, 1);
  Cli("push " + src + " mega://org/model --json", &rc, "");
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(Stderr(), HasSubstr("Unauthenticated"));
  out = Cli("log mega://org/model --json", &rc);
  EXPECT_EQ(json::parse(out, nullptr, false).size(), 4u);  // + the rm commit only
}

TEST_F(HubCliTest, ConcurrentPushProcessesRemote) { ConcurrentPushes("", token_); }

TEST_F(HubCliTest, ConcurrentPushProcessesEmbedded) {
  ConcurrentPushes("file://" + work_.path() + "/embedded-hub", "");
}

}  // namespace
}  // namespace megackpt
