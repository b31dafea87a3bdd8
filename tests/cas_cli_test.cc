// The `megackpt cas` and `megackpt bench cas` command lines, as acceptance
// uses them (JSON shapes, inclusive ranges, exit codes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/test_files.h"
#include "test_util.h"

namespace {

using CliRun = megackpt::test_util::CommandResult;
using megackpt::test_util::ReadFileOrEmpty;

// `megackpt ARGS`: stdout in `out`, stderr in `err`.
CliRun Exec(const std::string& args) {
  return megackpt::test_util::RunMegackpt(args, {.stderr_to = megackpt::test_util::StderrTo::kErr});
}

class CasCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path();
    data_ = megackpt::test_util::RandomData(3'000'000, 5);
    input_ = dir_ + "/input.bin";
    megackpt::test_util::WriteFileCreatingDirs(input_, data_);
  }
  megackpt::test_util::TempDir tmp_{"cas-cli"};
  std::string dir_, input_, data_;
};

TEST_F(CasCliTest, PutGetChunkStat) {
  const std::string store = dir_ + "/store";
  CliRun put = Exec("cas put --store " + store + " " + input_ + " --json");
  ASSERT_EQ(put.code, 0) << put.out << put.err;
  auto j = nlohmann::json::parse(put.out);
  for (const char* key : {"file_hash", "size", "new_bytes", "chunks", "new_chunks"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["size"], data_.size());
  EXPECT_EQ(j["new_bytes"], data_.size());
  EXPECT_EQ(j["chunks"], j["new_chunks"]);
  const std::string hash = j["file_hash"];
  EXPECT_EQ(hash.size(), 64u);

  CliRun chunk = Exec("cas chunk " + input_ + " --json");
  ASSERT_EQ(chunk.code, 0);
  auto c = nlohmann::json::parse(chunk.out);
  EXPECT_EQ(c["file_hash"], hash);
  EXPECT_EQ(c["boundaries"].size(), j["chunks"].get<size_t>());
  EXPECT_EQ(c["chunk_hashes"].size(), c["boundaries"].size());
  EXPECT_EQ(c["boundaries"].back(), data_.size());

  CliRun again = Exec("cas put --store " + store + " " + input_ + " --json");
  ASSERT_EQ(again.code, 0);
  EXPECT_EQ(nlohmann::json::parse(again.out)["new_bytes"], 0);

  const std::string out = dir_ + "/out.bin";
  ASSERT_EQ(Exec("cas get --store " + store + " " + hash + " " + out).code, 0);
  EXPECT_TRUE(ReadFileOrEmpty(out) == data_);
  ASSERT_EQ(Exec("cas get --store " + store + " " + hash + " " + out + " --range 1000-1999").code,
            0);
  EXPECT_TRUE(ReadFileOrEmpty(out) == data_.substr(1000, 1000));  // END is inclusive

  CliRun stat = Exec("cas stat --store " + store + " --json");
  ASSERT_EQ(stat.code, 0);
  auto s = nlohmann::json::parse(stat.out);
  EXPECT_EQ(s["files"], 1);
  EXPECT_EQ(s["logical_bytes"], data_.size());

  EXPECT_EQ(Exec("cas verify --store " + store).code, 0);
  EXPECT_EQ(Exec("cas gc --store " + store + " --json").code, 0);
  // Usage errors: 2. Unknown file: 1.
  EXPECT_EQ(Exec("cas get --store " + store + " nothex " + out).code, 2);
  EXPECT_EQ(Exec("cas get --store " + store + " " + hash + " " + out + " --range 9-3").code, 2);
  EXPECT_EQ(Exec("cas get --store " + store + " " + std::string(64, '1') + " " + out).code, 1);
}

TEST_F(CasCliTest, BenchJson) {
  CliRun r = Exec("bench cas --size 4MiB --reps 1 --warmup 0 --dir " + dir_ + "/bench --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* key : {"chunk_gbps", "hash_gbps", "put_gbps", "get_gbps", "memcpy_gbps",
                          "chunk_hash_compress_1t_gbps", "chunk_hash_compress_2t_gbps"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_GT(j[key].get<double>(), 0) << key;
  }
}

}  // namespace
