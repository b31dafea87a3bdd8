// The corruption sweep (issue 11): single-bit flips spread over every file of a
// checkpoint saved from 2 ranks (threads backend), each followed by loads at 1,
// 2 and 3 ranks (the demo's re-sharding) and by dcp::VerifyDcpCheckpoint (the
// library call behind `megackpt verify`). A load either fails with an error
// naming the damaged file, or returns exactly the saved bytes; verify fails
// naming the file whenever the flip hit a stored byte. Used by
// corruption_sweep_test.cc for fs and MEGA storage.
#ifndef MEGACKPT_TESTS_CORRUPTION_SWEEP_H_
#define MEGACKPT_TESTS_CORRUPTION_SWEEP_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dcp/synthetic.h"
#include "dcp/test_util.h"
#include "megackpt/core/file.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dcp::sweep {

struct Storage {
  const char* name;
  std::function<std::unique_ptr<StorageWriter>(const std::string& dir)> writer;
  std::function<std::unique_ptr<StorageReader>(const std::string& dir)> reader;
};

struct Flip {
  std::string file;  // base name
  uint64_t offset = 0;
  int bit = 0;
  bool stored = false;  // inside a stored piece (verify must fail)
  std::string fqn;      // that piece's entry (errors must name it)
};

inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline dist::ProcessGroupOptions SweepGroupOptions() {
  dist::ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

inline Status SaveAt2(const synthetic::Spec& spec, const Storage& storage, const std::string& dir) {
  auto results = dist::RunThreadRanks(
      2,
      [&](dist::ProcessGroup& g) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, 2, g.rank(), 0, true));
        auto w = storage.writer(dir);
        return Save(sd, *w, &g);
      },
      SweepGroupOptions());
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Loads at `world` with the demo's load sharding (variant 1). OK only when
// every rank got exactly the saved bytes; the first error otherwise, and
// *silent set when a rank's load returned OK with wrong bytes.
inline Status LoadAt(const synthetic::Spec& spec, const Storage& storage, const std::string& dir,
                     int world, bool* silent) {
  std::vector<int> wrong(world, 0);
  auto results = dist::RunThreadRanks(
      world,
      [&](dist::ProcessGroup& g) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd,
                              synthetic::BuildRankState(spec, world, g.rank(), 1, false));
        auto r = storage.reader(dir);
        MEGA_RETURN_IF_ERROR(Load(sd, *r, &g));
        Status v = synthetic::VerifyRankState(spec, sd);
        if (!v.ok()) wrong[g.rank()] = 1;
        return Status::OK();
      },
      SweepGroupOptions());
  *silent = std::count(wrong.begin(), wrong.end(), 1) > 0;
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

inline void FlipBit(const std::string& path, uint64_t offset, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Flip positions, deterministic: every stored piece (and its block CRC table,
// when the data file holds one) at its first byte, its last byte and one
// interior byte; every file at its first and last byte and at
// `per_file` evenly spread offsets (headers, padding, metadata text).
inline std::vector<Flip> PlanFlips(const std::string& dir, const Metadata& md, size_t per_file) {
  std::vector<Flip> flips;
  struct Range {
    uint64_t begin, end;
    std::string fqn;
  };
  std::map<std::string, std::vector<Range>> stored;
  uint64_t h = 11;
  for (const auto& [idx, info] : md.storage_data) {
    stored[info.relative_path].push_back({info.offset, info.offset + info.length, idx.fqn});
    if (info.length == 0) continue;
    h = Mix(h);
    for (uint64_t at :
         {info.offset, info.offset + info.length - 1, info.offset + h % info.length}) {
      flips.push_back(
          Flip{info.relative_path, at, static_cast<int>(Mix(h + at) % 8), true, idx.fqn});
    }
    // A block CRC table in the data file (fs storage) is part of the piece too:
    // its first, last and one interior byte.
    const uint64_t table_bytes = 4 * BlockCount(info);
    if (info.block_table_offset && table_bytes > 0) {
      const uint64_t t = *info.block_table_offset;
      stored[info.relative_path].push_back({t, t + table_bytes, idx.fqn});
      for (uint64_t at : {t, t + table_bytes - 1, t + h % table_bytes}) {
        flips.push_back(
            Flip{info.relative_path, at, static_cast<int>(Mix(h ^ at) % 8), true, idx.fqn});
      }
    }
  }
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string();
    const uint64_t size = e.file_size();
    if (size == 0) continue;
    std::set<uint64_t> at = {0, size - 1};
    for (size_t k = 1; k <= per_file; ++k) at.insert(size * k / (per_file + 1));
    for (uint64_t a : at) {
      Flip f{name, a, 0, false, ""};
      for (const Range& r : stored[name]) {
        if (a >= r.begin && a < r.end) {
          f.stored = true;
          f.fqn = r.fqn;
        }
      }
      h = Mix(h + a);
      f.bit = static_cast<int>(h % 8);
      flips.push_back(std::move(f));
    }
  }
  return flips;
}

// Runs the sweep; returns the number of flips tried.
inline size_t RunSweep(const Storage& storage, uint64_t state_bytes, size_t per_file) {
  testing::TempDir t(std::string("sweep-") + storage.name);
  const std::string dir = t.path("ckpt");
  const synthetic::Spec spec = synthetic::MakeSpec(7, state_bytes);
  Status saved = SaveAt2(spec, storage, dir);
  EXPECT_TRUE(saved.ok()) << saved.ToString();
  if (!saved.ok()) return 0;
  auto text = ReadLocalFile(dir + "/.metadata");
  EXPECT_TRUE(text.ok());
  auto md = DecodeMetadata(*text);
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  if (!md.ok()) return 0;
  for (int world : {1, 2, 3}) {
    bool silent = false;
    Status s = LoadAt(spec, storage, dir, world, &silent);
    EXPECT_TRUE(s.ok() && !silent) << "pristine load at " << world << ": " << s.ToString();
  }
  const std::vector<Flip> flips = PlanFlips(dir, *md, per_file);
  size_t silent_loads = 0;
  for (const Flip& f : flips) {
    const std::string path = dir + "/" + f.file;
    FlipBit(path, f.offset, f.bit);
    const std::string where =
        f.file + " byte " + std::to_string(f.offset) + " bit " + std::to_string(f.bit);
    for (int world : {1, 2, 3}) {
      bool silent = false;
      Status s = LoadAt(spec, storage, dir, world, &silent);
      if (silent) {
        ++silent_loads;
        ADD_FAILURE() << storage.name << ": SILENT load at world " << world << " after flipping "
                      << where;
      }
      if (!s.ok()) {
        EXPECT_NE(s.message().find(f.file), std::string::npos)
            << storage.name << ": error at world " << world << " after flipping " << where
            << " does not name the file: " << s.ToString();
        if (f.stored) {
          EXPECT_NE(s.message().find("'" + f.fqn + "'"), std::string::npos)
              << storage.name << ": error at world " << world << " after flipping " << where
              << " does not name the tensor '" << f.fqn << "': " << s.ToString();
        }
      }
    }
    auto report = VerifyDcpCheckpoint(dir);
    std::string problems;
    if (!report.ok()) {
      problems = report.status().ToString();
    } else {
      for (const Status& p : report->problems) problems += p.ToString() + "\n";
    }
    if (f.stored) {
      EXPECT_FALSE(problems.empty()) << storage.name << ": verify passed after flipping " << where;
      EXPECT_NE(problems.find("'" + f.fqn + "'"), std::string::npos)
          << storage.name << ": verify after flipping " << where << " does not name '" << f.fqn
          << "': " << problems;
    }
    if (!problems.empty()) {
      EXPECT_NE(problems.find(f.file), std::string::npos)
          << storage.name << ": verify after flipping " << where
          << " does not name the file: " << problems;
    }
    FlipBit(path, f.offset, f.bit);  // restore
  }
  EXPECT_EQ(silent_loads, 0u);
  return flips.size();
}

}  // namespace megackpt::dcp::sweep

#endif  // MEGACKPT_TESTS_CORRUPTION_SWEEP_H_
