// `megackpt demo` and `megackpt bench dcp` as a user runs them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/test_files.h"
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
  CliRun r = Cli("demo --out " + dir.path("c") +
                 " --world-size 2 --load-world-size 3 --size 3MB --seed 11");
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

// `demo --direct-io` saves around the page cache, with either storage, in
// one-shot demos and in the training loop (--steps, the checkpoint manager).
TEST(DcpCli, DemoDirectIoSavesAroundThePageCache) {
  TempDir dir;
  for (const std::string storage : {"fs", "mega"}) {
    SCOPED_TRACE(storage);
    const std::string ext = storage == "mega" ? ".mega" : ".distcp";
    CliRun r = Cli("demo --mode save --direct-io --size 3MB --storage " + storage + " --out " +
                   dir.path(storage));
    ASSERT_EQ(r.code, 0) << r.out;
    megackpt::dcp::testing::ExpectSavedAroundThePageCache(dir.path(storage), "", ext);
    r = Cli("demo --mode load --load-world-size 1 --size 3MB --storage " + storage + " --out " +
            dir.path(storage));
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("every byte identical"), std::string::npos) << r.out;
    // The loop reloads its newest step at the end; step 1 stays unread.
    r = Cli("demo --steps 2 --full-saves --direct-io --size 3MB --storage " + storage + " --out " +
            dir.path(storage + "-run"));
    ASSERT_EQ(r.code, 0) << r.out;
    megackpt::dcp::testing::ExpectSavedAroundThePageCache(
        dir.path(storage + "-run") + "/step-000000001", "", ext);
  }
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
  // --state-pages 4k: the state, its load destinations and the limits' buffers in
  // 4 KiB pages (bench_util.h StatePages); the run still checks every loaded row.
  CliRun r = Cli("bench dcp --size 2MB --world-size 2 --reps 1 --state-pages 4k --json --dir " +
                 dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["state_pages"], "4k") << r.out;
  CliRun bad = Cli("bench dcp --size 2MB --state-pages 2m");  // a usage error naming the option
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--state-pages"), std::string::npos) << bad.out;
  for (const char* key : {"save_gbps", "save_nosync_gbps", "load_gbps", "durable_write_gbps",
                          "pagecache_write_gbps", "pagecache_read_gbps", "peak_extra_rss_bytes"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j[key].is_number()) << key;
  }
  EXPECT_GT(j["save_gbps"].get<double>(), 0);
  EXPECT_GT(j["load_gbps"].get<double>(), 0);
  EXPECT_EQ(j["world_size"].get<int>(), 2);
  // The ceilings: the best of 1, 2 and ranks x I/O threads (2 x 2) plain threads.
  EXPECT_EQ(j["ceiling_parallelism"].get<int>(), 4);
  // checksummed_write: the reference of the no-sync saves (bench_util.h
  // kChecksummedWrite), measured like the ceilings, in the writers' 2 MiB pieces.
  for (const char* stem :
       {"durable_write", "pagecache_write", "pagecache_read", "checksummed_write"}) {
    const auto& by = j[std::string(stem) + "_gbps_by_parallelism"];
    ASSERT_TRUE(by.is_object()) << stem;
    double best = 0;
    for (const char* p : {"1", "2", "4"}) {
      ASSERT_TRUE(by.contains(p)) << stem << " " << p;
      best = std::max(best, by[p].get<double>());
    }
    EXPECT_EQ(j[std::string(stem) + "_gbps"].get<double>(), best) << stem;
    const int p = j[std::string(stem) + "_parallelism"].get<int>();
    EXPECT_EQ(by[std::to_string(p)].get<double>(), best) << stem;
  }
  EXPECT_EQ(j["checksummed_write_pwrite_bytes"].get<uint64_t>(), 2u << 20);
  // Every repetition of the rows and every round of their limits, in order:
  // --reps 1 gives one of each, and their median is that one.
  for (const char* row : {"save", "save_nosync", "load", "load_unverified"}) {
    const auto& by = j[std::string(row) + "_gbps_by_rep"];
    ASSERT_TRUE(by.is_array()) << row;
    ASSERT_EQ(by.size(), 1u) << row;
    EXPECT_EQ(by[0].get<double>(), j[std::string(row) + "_gbps"].get<double>()) << row;
  }
  for (const char* stem :
       {"durable_write", "pagecache_write", "pagecache_read", "checksummed_write"}) {
    const auto& by = j[std::string(stem) + "_gbps_by_round"];
    ASSERT_TRUE(by.is_array()) << stem;
    ASSERT_EQ(by.size(), 1u) << stem;
    EXPECT_EQ(by[0].get<double>(), j[std::string(stem) + "_gbps"].get<double>()) << stem;
  }
  // Every ratio above 1.05 is flagged, and only those.
  for (const char* ratio :
       {"save_vs_durable_write", "save_nosync_vs_pagecache_write", "load_vs_pagecache_read",
        "load_unverified_vs_pagecache_read", "save_nosync_vs_checksummed_write"}) {
    ASSERT_TRUE(j.contains(ratio)) << ratio;
    const bool flagged = j.contains(std::string(ratio) + "_ceiling_too_low");
    EXPECT_EQ(flagged, j[ratio].get<double>() > 1.05) << ratio;
  }
}

// The async row's memcpy ceiling names both copies per thread count, so the
// staging copy (streaming stores) can be read against its own kind.
TEST(DcpCli, BenchMegaJsonHasTheMemcpyCeilingByCopy) {
  TempDir dir;
  stdfs::create_directories(dir.path("b"));
  // stderr apart: the unverified-load row warns there.
  CliRun r = megackpt::test_util::RunMegackpt(
      "bench mega --size 2MB --reps 1 --json --dir " + dir.path("b"),
      {.stderr_to = megackpt::test_util::StderrTo::kErr});
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const auto& by = j["memcpy_gbps_by_config"];
  ASSERT_TRUE(by.is_object()) << r.out;
  double best = 0;
  for (const char* key : {"1/memcpy", "1/streaming", "2/memcpy", "2/streaming"}) {
    ASSERT_TRUE(by.contains(key)) << key << " in " << by;
    EXPECT_GT(by[key].get<double>(), 0) << key;
    best = std::max(best, by[key].get<double>());
  }
  EXPECT_EQ(by.size(), 4u) << by;
  EXPECT_EQ(j["memcpy_gbps"].get<double>(), best);
  const std::string best_key = std::to_string(j["memcpy_parallelism"].get<int>()) +
                               (j["memcpy_streaming"].get<bool>() ? "/streaming" : "/memcpy");
  EXPECT_EQ(by[best_key].get<double>(), best) << best_key;
  // The fresh writes' preparation: writes below 64 MiB never wait for a free
  // page reporting pass (bench_util.h PrimeFreeMemory), on any machine.
  const auto& rep = j["fresh_write_reporting"];
  ASSERT_TRUE(rep.is_object()) << r.out;
  EXPECT_TRUE(rep["on"].is_boolean()) << rep;
  EXPECT_EQ(rep["waits"].get<int>(), 0) << rep;
  EXPECT_EQ(rep["passes_seen"].get<int>(), 0) << rep;
  EXPECT_EQ(rep["seconds"].get<double>(), 0.0) << rep;
  EXPECT_EQ(j["state_pages"], "huge") << r.out;  // the default
  // The no-sync saves' reference: plain writers computing the MEGA writer's CRCs.
  EXPECT_GT(j["checksummed_write_gbps"].get<double>(), 0) << r.out;
  EXPECT_TRUE(j["save_nosync_vs_checksummed_write_paired"].is_number()) << r.out;
}

// --over-previous: every save of `bench dcp` and `bench mega` writes over the
// previous one (the folder holds its commit), and the JSON says so; without
// it every save starts from an emptied folder.
TEST(DcpCli, BenchOverPreviousSavesOverACommit) {
  TempDir dir;
  stdfs::create_directories(dir.path("b"));
  // Timed saves, each rep after one warm-up (--reps 1): dcp 2 durable + 2
  // no-sync, all after its untimed RSS saves; mega 2 + 2 + 2 async, the first
  // one the bench's first save.
  for (auto [bench, over] : {std::pair{"dcp", 4}, std::pair{"mega", 5}}) {
    for (bool on : {true, false}) {
      CliRun r = megackpt::test_util::RunMegackpt(
          std::string("bench ") + bench + " --size 2MB --reps 1 --json --dir " + dir.path("b") +
              (on ? " --over-previous" : ""),
          {.stderr_to = megackpt::test_util::StderrTo::kErr});
      ASSERT_EQ(r.code, 0) << bench << " " << r.out;
      auto j = nlohmann::json::parse(r.out, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << r.out;
      EXPECT_EQ(j["over_previous"].get<bool>(), on) << bench;
      EXPECT_EQ(j["saves_over_a_commit"].get<int>(), on ? over : 0) << bench;
      EXPECT_GT(j["save_nosync_gbps"].get<double>(), 0) << bench;
      EXPECT_GT(j["save_gbps"].get<double>(), 0) << bench;
    }
  }
  CliRun help = Cli("bench mega --help");
  EXPECT_NE(help.out.find("--over-previous"), std::string::npos) << help.out;
}

// ---- every layout: inspect / verify / convert / consolidate (issue 11) ----------------

// The summary line both inspect and verify print for a DCP folder.
std::string CountLine(const std::string& out) {
  size_t a = out.find(" checkpoint, ");
  if (a == std::string::npos) return "";
  size_t b = out.find(" in ", a);
  return out.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

void FlipByte(const stdfs::path& file, uint64_t offset) {
  ::megackpt::test_util::XorFileByte(file, offset, 0x01);
}

std::vector<stdfs::path> FilesWith(const std::string& dir, const std::string& ext) {
  std::vector<stdfs::path> out;
  for (auto& e : stdfs::directory_iterator(dir)) {
    if (e.path().extension() == ext) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// `verify DIR` of an fs checkpoint reads every block; byte 0 of the first data
// file (a partial-block case the issue found silent) fails it, naming the file
// and the tensor, and so does a resharded load.
TEST(DcpCli, VerifyChecksEveryBlockOfAnFsCheckpoint) {
  TempDir dir;
  const std::string c = dir.path("c");
  ASSERT_EQ(Cli("demo --out " + c + " --world-size 2 --mode save --size 2MB").code, 0);
  CliRun ok = Cli("verify " + c);
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("dcp-fs checkpoint"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("read and verified"), std::string::npos) << ok.out;
  auto data = FilesWith(c, ".distcp");
  ASSERT_FALSE(data.empty());
  FlipByte(data[0], 0);
  CliRun bad = Cli("verify " + c);
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("DataLoss"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find(data[0].filename().string()), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("checksum mismatch in '"), std::string::npos) << bad.out;
  for (int world : {1, 3}) {
    CliRun load = Cli("demo --out " + c + " --mode load --size 2MB --load-world-size " +
                      std::to_string(world));
    EXPECT_EQ(load.code, 1) << load.out;
    EXPECT_NE(load.out.find("DataLoss"), std::string::npos) << load.out;
  }
}

// inspect and verify agree on what a sharded MEGA checkpoint holds (the issue:
// 15 tensors / 6.7 MB vs 45 pieces / 17.4 MB), and on an fs one.
TEST(DcpCli, InspectAndVerifyAgreeOnEveryLayout) {
  TempDir dir;
  for (const char* storage : {"fs", "mega"}) {
    const std::string c = dir.path(storage);
    ASSERT_EQ(Cli(std::string("demo --out ") + c + " --storage " + storage +
                  " --world-size 2 --mode save --size 2MB")
                  .code,
              0);
    CliRun inspect = Cli("inspect " + c);
    CliRun verify = Cli("verify " + c);
    ASSERT_EQ(inspect.code, 0) << inspect.out;
    ASSERT_EQ(verify.code, 0) << verify.out;
    EXPECT_FALSE(CountLine(inspect.out).empty()) << inspect.out;
    EXPECT_EQ(CountLine(inspect.out), CountLine(verify.out)) << inspect.out << verify.out;
    CliRun js = Cli("inspect --json " + c);
    ASSERT_EQ(js.code, 0) << js.out;
    auto j = nlohmann::json::parse(js.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << js.out;
    EXPECT_EQ(j["format"], std::string("dcp-") + storage);
    // The line says "N tensors + M bytes values": the JSON lists the same.
    const std::string line = CountLine(inspect.out);
    EXPECT_NE(line.find(std::to_string(j["tensors"].size()) + " tensors + " +
                        std::to_string(j["bytes"].size()) + " bytes values"),
              std::string::npos)
        << line;
  }
}

// convert never drops an entry: sharded input (what MegaStorageWriter writes
// from 2 ranks, and any fs checkpoint) is refused naming consolidate; after
// consolidate, convert carries every entry.
TEST(DcpCli, ConvertRefusesShardedInputAndConsolidateFixesIt) {
  TempDir dir;
  for (const char* storage : {"mega", "fs"}) {
    const std::string c = dir.path(std::string("src-") + storage);
    ASSERT_EQ(Cli(std::string("demo --out ") + c + " --storage " + storage +
                  " --world-size 2 --mode save --size 2MB")
                  .code,
              0);
    CliRun conv = Cli("convert " + c + " " + dir.path(std::string("out-") + storage));
    EXPECT_EQ(conv.code, 1) << conv.out;
    EXPECT_NE(conv.out.find("megackpt consolidate"), std::string::npos) << conv.out;
    EXPECT_EQ(conv.out.find("converted"), std::string::npos) << conv.out;
    // An index handed over directly is refused too (it lists chunked tensors).
    if (std::string(storage) == "mega") {
      CliRun idx = Cli("convert " + c + "/model.mega.index.json " + dir.path("out-index"));
      EXPECT_EQ(idx.code, 1) << idx.out;
      EXPECT_NE(idx.out.find("megackpt consolidate"), std::string::npos) << idx.out;
    }
    const std::string whole = dir.path(std::string("whole-") + storage);
    CliRun cons = Cli("consolidate " + c + " " + whole);
    ASSERT_EQ(cons.code, 0) << cons.out;
    CliRun inspect = Cli("inspect " + c);
    CliRun after = Cli("verify " + whole);
    ASSERT_EQ(after.code, 0) << after.out;
    // Same entries and bytes, now 0 sharded.
    const std::string before_line = CountLine(inspect.out), after_line = CountLine(after.out);
    EXPECT_EQ(before_line.substr(0, before_line.find(" (")),
              after_line.substr(0, after_line.find(" (")))
        << before_line << " vs " << after_line;
    CliRun st =
        Cli("convert " + whole + " " + dir.path(std::string("st-") + storage) + ".safetensors");
    ASSERT_EQ(st.code, 0) << st.out;
    auto j = nlohmann::json::parse(Cli("inspect --json " + whole).out, nullptr, false);
    ASSERT_FALSE(j.is_discarded());
    const size_t entries = j["tensors"].size() + j["bytes"].size();
    EXPECT_NE(st.out.find("converted " + std::to_string(entries) + " tensors"), std::string::npos)
        << st.out;
  }
}

// A FIFO where a checkpoint file should be: every command fails at once
// (before: inspect, verify, convert and demo --mode load blocked forever).
TEST(DcpCli, FifoInsteadOfAFileIsRefusedWithoutBlocking) {
  TempDir dir;
  const std::string c = dir.path("c");
  ASSERT_EQ(Cli("demo --out " + c + " --storage mega --world-size 1 --mode save --size 1MB").code,
            0);
  auto shards = FilesWith(c, ".mega");
  ASSERT_FALSE(shards.empty());
  stdfs::remove(shards[0]);
  ASSERT_EQ(mkfifo(shards[0].c_str(), 0600), 0);
  for (const std::string& cmd :
       {"inspect " + c + "/model.mega.index.json", "verify " + c + "/model.mega.index.json",
        "verify " + c, "convert " + c + "/model.mega.index.json " + dir.path("o"),
        "demo --out " + c + " --storage mega --mode load --size 1MB"}) {
    CliRun r = Cli(cmd);  // a hang here is the bug (ctest's timeout)
    EXPECT_NE(r.code, 0) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("FIFO"), std::string::npos) << cmd << ": " << r.out;
  }
  // The index itself, and an fs checkpoint's .metadata, as FIFOs.
  const std::string index = c + "/model.mega.index.json";
  stdfs::remove(index);
  ASSERT_EQ(mkfifo(index.c_str(), 0600), 0);
  CliRun r = Cli("inspect " + index);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FIFO"), std::string::npos) << r.out;
  const std::string f = dir.path("f");
  ASSERT_EQ(Cli("demo --out " + f + " --world-size 1 --mode save --size 1MB").code, 0);
  stdfs::remove(f + "/.metadata");
  ASSERT_EQ(mkfifo((f + "/.metadata").c_str(), 0600), 0);
  for (const std::string& cmd :
       {"inspect " + f, "verify " + f, "demo --out " + f + " --mode load --size 1MB"}) {
    CliRun m = Cli(cmd);
    EXPECT_EQ(m.code, 1) << cmd << ": " << m.out;
    EXPECT_NE(m.out.find("FIFO"), std::string::npos) << cmd << ": " << m.out;
  }
}

// A save leaves the folder holding exactly the new checkpoint, and inspect /
// verify describe that one (before: a MEGA save's model.mega + index stayed
// beside an fs save and were reported as OK).
TEST(DcpCli, SavingAnotherLayoutRemovesTheOldFiles) {
  TempDir dir;
  const std::string c = dir.path("c");
  ASSERT_EQ(Cli("demo --out " + c + " --storage mega --world-size 2 --mode save --size 1MB").code,
            0);
  ASSERT_FALSE(FilesWith(c, ".mega").empty());
  ASSERT_EQ(Cli("demo --out " + c + " --storage fs --world-size 2 --mode save --size 1MB").code, 0);
  EXPECT_TRUE(FilesWith(c, ".mega").empty());
  EXPECT_FALSE(stdfs::exists(c + "/model.mega.index.json"));
  EXPECT_FALSE(FilesWith(c, ".distcp").empty());
  CliRun v = Cli("verify " + c);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("dcp-fs"), std::string::npos) << v.out;
  ASSERT_EQ(Cli("demo --out " + c + " --storage mega --world-size 2 --mode save --size 1MB").code,
            0);
  EXPECT_TRUE(FilesWith(c, ".distcp").empty());
  EXPECT_FALSE(FilesWith(c, ".mega").empty());
  v = Cli("verify " + c);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_NE(v.out.find("dcp-mega"), std::string::npos) << v.out;
  EXPECT_EQ(
      Cli("demo --out " + c + " --storage mega --mode load --size 1MB --load-world-size 3").code,
      0);
}

// A folder whose .metadata is pickled (TensorPlay's / torch's own writers) is
// not a megackpt DCP folder: inspect and verify read its index and shards, as
// the MEGA reader does (and as before DCP folders were understood).
TEST(DcpCli, PickledMetadataFolderIsReadThroughItsIndex) {
  TempDir dir;
  const std::string c = dir.path("c");
  ASSERT_EQ(Cli("demo --out " + c + " --storage mega --world-size 1 --mode save --size 1MB").code,
            0);
  std::ofstream(c + "/.metadata", std::ios::trunc | std::ios::binary) << "\x80\x04\x95pickled";
  CliRun v = Cli("verify " + c);
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_EQ(v.out.find("dcp-mega"), std::string::npos) << v.out;
  CliRun i = Cli("inspect " + c);
  EXPECT_EQ(i.code, 0) << i.out;
}

}  // namespace
