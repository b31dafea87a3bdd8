// `megackpt demo` and `megackpt bench dcp` as a user runs them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code = -1;
  std::string out;
};

CliRun Cli(const std::string& args) {
  const std::string cmd = std::string(MEGACKPT_BINARY_DIR) + "/tools/megackpt " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dcp-cli-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  std::string path_;
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
  for (auto& e : fs::directory_iterator(dir.path("c"))) {
    if (e.path().extension() != ".distcp") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
    f.seekp(fs::file_size(e.path()) / 2);
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
  fs::create_directories(dir.path("b"));
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
