// `megackpt demo` and `megackpt bench dcp` as a user runs them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "dcp/test_util.h"
#include "test_util.h"

namespace {

namespace stdfs = std::filesystem;

using CliRun = megackpt::test_util::CommandResult;
// `megackpt ARGS` (stdout and stderr together).
CliRun Cli(const std::string& args) { return megackpt::test_util::RunMegackpt(args); }

// A fresh folder, removed at the end.
class TempDir : public megackpt::dcp::testing::TempDir {
 public:
  TempDir() : megackpt::dcp::testing::TempDir("dcp-cli") {}
};

TEST(DcpCli, DemoSavesAndReloadsResharded) {
  TempDir dir;
  CliRun r = Cli("demo --out " + dir.path("c") + " --world-size 2 --load-world-size 3 --size 3MB --seed 11");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("save   2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("load   3 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every byte identical"), std::string::npos) << r.out;
  // Load the same checkpoint again at world size 1.
  r = Cli("demo --out " + dir.path("c") + " --mode load --load-world-size 1 --size 3MB --seed 11");
  EXPECT_EQ(r.code, 0) << r.out;
  // A different seed describes a different state (other shapes): a clear failure.
  r = Cli("demo --out " + dir.path("c") + " --mode load --load-world-size 2 --size 3MB --seed 12");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("shape mismatch for 'model.embed'"), std::string::npos) << r.out;
}

TEST(DcpCli, DemoReportsCorruptionAndMissingCheckpoints) {
  TempDir dir;
  CliRun r = Cli("demo --out " + dir.path("c") + " --world-size 1 --mode save --size 2MB");
  ASSERT_EQ(r.code, 0) << r.out;
  for (auto& e : stdfs::directory_iterator(dir.path("c"))) {
    if (e.path().extension() != ".distcp") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
    f.seekp(stdfs::file_size(e.path()) / 2);
    f.put('\x7f');
  }
  r = Cli("demo --out " + dir.path("c") + " --mode load --load-world-size 1 --size 2MB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("DataLoss"), std::string::npos) << r.out;
  r = Cli("demo --out " + dir.path("nothing") + " --mode load --size 2MB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("NotFound"), std::string::npos) << r.out;
}

TEST(DcpCli, UsageErrors) {
  EXPECT_EQ(Cli("demo --out /tmp/x --mode sideways").code, 2);
  EXPECT_EQ(Cli("demo --out /tmp/x --size lots").code, 2);
  EXPECT_EQ(Cli("demo").code, 2);  // --out is required
  CliRun help = Cli("demo --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--load-world-size"), std::string::npos);
}

TEST(DcpCli, BenchJsonHasEveryKey) {
  TempDir dir;
  stdfs::create_directories(dir.path("b"));
  CliRun r = Cli("bench dcp --size 2MB --world-size 2 --reps 1 --json --dir " + dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  for (const char* key : {"save_gbps", "save_nosync_gbps", "load_gbps", "durable_write_gbps",
                          "pagecache_write_gbps", "pagecache_read_gbps", "peak_extra_rss_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j[key].is_number()) << key;
  }
  EXPECT_GT(j["save_gbps"].get<double>(), 0);
  EXPECT_GT(j["load_gbps"].get<double>(), 0);
  EXPECT_EQ(j["world_size"].get<int>(), 2);
}

}  // namespace
