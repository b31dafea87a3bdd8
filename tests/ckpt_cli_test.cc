// `megackpt demo --steps`, `megackpt ckpt ls|latest|gc` and `megackpt diff` as a
// user runs them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/test_files.h"
#include "dcp/test_util.h"
#include "test_util.h"

namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using CliRun = megackpt::test_util::CommandResult;

CliRun Cli(const std::string& args) { return megackpt::test_util::RunMegackpt(args); }
CliRun CliSplit(const std::string& args) {
  return megackpt::test_util::RunMegackpt(args, {.stderr_to = megackpt::test_util::StderrTo::kErr});
}

std::string FirstDataFile(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : stdfs::directory_iterator(dir)) {
    if (e.path().extension() == ".distcp") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files.empty() ? "" : files[0];
}

void FlipByte(const std::string& file, uint64_t offset) {
  ::megackpt::test_util::XorFileByte(file, offset, 0x01);
}

TEST(CkptCli, TrainingLoopDemoLsLatestGcDiff) {
  megackpt::dcp::testing::TempDir dir("ckpt-cli");
  const std::string root = dir.path("run");
  CliRun r =
      Cli("demo --out " + root +
          " --steps 4 --change-fraction 0.25 --size 2MB --world-size 2 --keep-last 3 --full-saves");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("reload of step 4 at 3 rank(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("kept steps: 2 3 4"), std::string::npos) << r.out;

  r = CliSplit("ckpt ls " + root + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  json ls = json::parse(r.out);
  EXPECT_EQ(ls["latest"], 4);
  ASSERT_EQ(ls["steps"].size(), 3u);
  for (const auto& s : ls["steps"]) {
    EXPECT_TRUE(s["complete"].get<bool>());
    EXPECT_EQ(s["storage"], "fs");
    EXPECT_GT(s["stored_bytes"].get<uint64_t>(), 1000000u);
    EXPECT_TRUE(s["metric"].is_number());
  }
  r = CliSplit("ckpt latest " + root);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "4\n");

  // Steps 3 -> 4 changed a quarter of the entries (the demo's --change-fraction).
  r = CliSplit("diff " + root + "/step-000000003 " + root + "/step-000000004 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  json d = json::parse(r.out);
  EXPECT_TRUE(d["added"].empty());
  EXPECT_TRUE(d["removed"].empty());
  const size_t changed = d["changed"].size();
  const size_t total = changed + d["unchanged"].get<size_t>();
  EXPECT_GT(changed, 0u);
  EXPECT_LT(changed, total / 2) << r.out;
  for (const auto& c : d["changed"]) {
    EXPECT_EQ(c["what"], "values");
    EXPECT_GT(c["changed_bytes"].get<uint64_t>(), 0u);
  }
  r = Cli("diff " + root + "/step-000000004 " + root + "/step-000000004");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("0 changed"), std::string::npos) << r.out;

  // A flipped byte in the newest step: `latest --valid` names it and falls back.
  FlipByte(FirstDataFile(root + "/step-000000004"), 64);
  r = CliSplit("ckpt latest " + root + " --valid");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "3\n");
  EXPECT_NE(r.err.find("skipped step 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("DataLoss"), std::string::npos) << r.err;
  r = CliSplit("ckpt ls " + root + " --verify --json");
  ASSERT_EQ(r.code, 0);
  ls = json::parse(r.out);
  EXPECT_FALSE(ls["steps"][2]["valid"].get<bool>());
  EXPECT_TRUE(ls["steps"][1]["valid"].get<bool>());

  // An incomplete folder is listed as such, and gc removes it with the rules' victims.
  stdfs::create_directories(root + "/step-000000009");
  r = CliSplit("ckpt ls " + root + " --json");
  ls = json::parse(r.out);
  ASSERT_EQ(ls["steps"].size(), 4u);
  EXPECT_FALSE(ls["steps"][3]["complete"].get<bool>());
  EXPECT_EQ(ls["latest"], 4);
  r = CliSplit("ckpt gc " + root + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["removed"], json::array({9}));
  r = CliSplit("ckpt gc " + root + " --keep-last 1 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["removed"], json::array({2, 3}));
  EXPECT_FALSE(stdfs::exists(root + "/step-000000002"));

  // Errors: no checkpoint is exit 1, a usage error exit 2.
  r = Cli("ckpt latest " + dir.path("empty"));
  EXPECT_EQ(r.code, 1) << r.out;
  r = Cli("diff " + dir.path("nothing") + " " + root + "/step-000000004");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("not found"), std::string::npos) << r.out;
  r = Cli("ckpt gc");
  EXPECT_EQ(r.code, 2) << r.out;
}

TEST(CkptCli, IncrementalDemoReferencesUnchangedEntries) {
  megackpt::dcp::testing::TempDir dir("ckpt-cli-incr");
  const std::string root = dir.path("run");
  CliRun r =
      Cli("demo --out " + root + " --steps 3 --change-fraction 0.1 --size 2MB --world-size 2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("incremental saves"), std::string::npos) << r.out;
  r = CliSplit("ckpt ls " + root + " --json --verify");
  ASSERT_EQ(r.code, 0) << r.err;
  json ls = json::parse(r.out);
  ASSERT_EQ(ls["steps"].size(), 3u);
  EXPECT_EQ(ls["steps"][0]["bytes_referenced"], 0);
  for (int i : {1, 2}) {
    const auto& s = ls["steps"][i];
    EXPECT_TRUE(s["valid"].get<bool>());
    EXPECT_EQ(s["base_step"], i);
    EXPECT_GT(s["bytes_referenced"].get<uint64_t>(), s["bytes_written"].get<uint64_t>())
        << s.dump();
  }
}

}  // namespace
