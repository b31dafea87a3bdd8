// `megackpt bench reshard`: what verification costs on loads, at the save's
// world size and resharded.
//
//  - state: 16 F32 matrices of --size/16 bytes, rows split evenly over
//    --save-world ranks (threads backend), saved once per storage (fs:
//    FileSystemWriter, mega: MegaStorageWriter) without fsync.
//  - loads at --save-world ranks (every rank reads exactly the pieces it saved)
//    and at --load-world ranks (row boundaries differ: partial reads of stored
//    pieces), each with verification on (the default: every byte handed over is
//    covered by a checked CRC, reads widened to whole checksum blocks) and off
//    (VerifyMode::kOff / verify_checksums = false), into pre-faulted, reused
//    destinations from a warm page cache. GB/s count the state's bytes.
//  - bytes_read_ratio: bytes the loading process read (rchar of
//    /proc/self/io, i.e. read/pread system calls, metadata and headers included)
//    over the state's bytes, for one load.
//  Each: one dropped warm-up, then --reps runs; min/median/max. After the last
//  load of each kind every destination byte is checked against the state.
#include "reshard_bench.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_report.h"
#include "bench_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "row_sharded_state.h"

namespace megackpt::bench {
namespace {

constexpr int kWarmup = 1;

// rchar of this process: bytes read through read(2)/pread(2)-like calls.
uint64_t ReadCharBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

using RankFn = std::function<Status(dist::ProcessGroup&, RowShardedRank&)>;

Result<double> RunRanks(std::vector<RowShardedRank>& ranks, const RankFn& fn) {
  const double t0 = NowSeconds();
  auto results = dist::RunThreadRanks(static_cast<int>(ranks.size()), [&](dist::ProcessGroup& g) {
    return fn(g, ranks[g.rank()]);
  });
  const double dt = NowSeconds() - t0;
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return dt;
}

struct LoadRow {
  Summary gbps;
  double bytes_read_ratio = 0;
};

class StorageBench {
 public:
  StorageBench(const ReshardBenchOptions& o, std::string storage, std::string ckpt)
      : o_(o), storage_(std::move(storage)), ckpt_(std::move(ckpt)) {}

  Status Save() {
    std::vector<RowShardedRank> ranks;
    for (int r = 0; r < o_.save_world; ++r) {
      MEGA_ASSIGN_OR_RETURN(auto st, BuildRowShardedRank(layout_, o_.size, o_.save_world, r));
      ranks.push_back(std::move(st));
    }
    return RunRanks(ranks,
                    [&](dist::ProcessGroup& g, RowShardedRank& st) -> Status {
                      if (storage_ == "fs") {
                        dcp::FileSystemWriterOptions wo;
                        wo.sync = false;
                        wo.thread_count = o_.threads;
                        auto writer = dcp::NewFileSystemWriter(ckpt_, wo);
                        return dcp::Save(st.save, *writer, &g);
                      }
                      dcp::MegaStorageWriterOptions wo;
                      wo.sync = false;
                      wo.thread_count = o_.threads;
                      dcp::MegaStorageWriter writer(ckpt_, std::nullopt, wo);
                      return dcp::Save(st.save, writer, &g);
                    })
        .status();
  }

  // Loads at `world` ranks, verification on or off.
  Result<LoadRow> Load(int world, bool verify) {
    std::vector<RowShardedRank> ranks;
    for (int r = 0; r < world; ++r) {
      MEGA_ASSIGN_OR_RETURN(auto st, BuildRowShardedRank(layout_, o_.size, world, r));
      MEGA_RETURN_IF_ERROR(st.AddLoadDestinations());
      st.save = dcp::StateDict();  // only the destinations are used
      st.save_shards.clear();
      ranks.push_back(std::move(st));
    }
    const RankFn fn = [&](dist::ProcessGroup& g, RowShardedRank& st) -> Status {
      if (storage_ == "fs") {
        dcp::FileSystemReaderOptions ro;
        ro.thread_count = o_.threads;
        ro.verify = verify ? dcp::VerifyMode::kAll : dcp::VerifyMode::kOff;
        auto reader = dcp::NewFileSystemReader(ckpt_, ro);
        return dcp::Load(st.load, *reader, &g);
      }
      dcp::MegaStorageReaderOptions ro;
      ro.thread_count = o_.threads;
      ro.verify_checksums = verify;
      dcp::MegaStorageReader reader(ckpt_, ro);
      return dcp::Load(st.load, reader, &g);
    };
    LoadRow row;
    std::vector<double> secs;
    for (int i = 0; i < kWarmup + o_.reps; ++i) {
      const uint64_t before = ReadCharBytes();
      MEGA_ASSIGN_OR_RETURN(double dt, RunRanks(ranks, fn));
      const uint64_t read = ReadCharBytes() - before;
      if (i >= kWarmup) secs.push_back(dt);
      row.bytes_read_ratio = static_cast<double>(read) / static_cast<double>(bytes());
    }
    for (const RowShardedRank& st : ranks) {
      MEGA_RETURN_IF_ERROR(st.CheckLoaded("bench reshard: a " + storage_ + " load at world size " +
                                          std::to_string(world)));
    }
    row.gbps = Summarize(ToGbps(secs, bytes()));
    return row;
  }

  uint64_t bytes() const { return layout_.BytesFor(o_.size); }

 private:
  const ReshardBenchOptions& o_;
  RowShardedLayout layout_;
  std::string storage_, ckpt_;
};

Status Bench(const ReshardBenchOptions& o, nlohmann::json* out, std::string* table) {
  std::unique_ptr<TempDir> tmp;
  const std::string base = BenchDir(o.dir, "megackpt-bench-reshard", &tmp);
  std::vector<std::string> storages;
  if (o.storage == "fs" || o.storage == "both") storages.push_back("fs");
  if (o.storage == "mega" || o.storage == "both") storages.push_back("mega");
  const uint64_t bytes = RowShardedLayout{}.BytesFor(o.size);
  (*out)["size_bytes"] = bytes;
  (*out)["save_world_size"] = o.save_world;
  (*out)["load_world_size"] = o.load_world;
  (*out)["threads_per_rank"] = o.threads;
  (*out)["reps"] = o.reps;
  char head[256];
  std::snprintf(
      head, sizeof head,
      "megackpt bench reshard: %.2f GB state (16 row-sharded F32 tensors) saved at world %d, "
      "loaded at %d and %d (threads), %d I/O threads/rank, %d reps after %d warm-up\n",
      bytes / 1e9, o.save_world, o.save_world, o.load_world, o.threads, o.reps, kWarmup);
  *table += head;
  char cols[160];
  std::snprintf(cols, sizeof cols, "%-40s %8s %8s %8s   %-12s %s\n", "GB/s", "min", "median", "max",
                "vs kOff", "bytes read / state");
  *table += cols;
  for (const std::string& storage : storages) {
    const std::string ckpt = base + "/" + storage;
    StorageBench b(o, storage, ckpt);
    MEGA_RETURN_IF_ERROR(b.Save());
    for (int world : {o.save_world, o.load_world}) {
      const bool resharded = world != o.save_world;
      MEGA_ASSIGN_OR_RETURN(LoadRow off, b.Load(world, false));
      MEGA_ASSIGN_OR_RETURN(LoadRow on, b.Load(world, true));
      const std::string key = storage + (resharded ? "_reshard_load" : "_load");
      auto put = [&](const std::string& k, const LoadRow& r) {
        PutSummary(out, k + "_gbps", r.gbps);
        (*out)[k + "_bytes_read_ratio"] = r.bytes_read_ratio;
      };
      put(key, on);
      put(key + "_unverified", off);
      const double ratio = off.gbps.median > 0 ? on.gbps.median / off.gbps.median : 0;
      (*out)[key + "_verified_vs_unverified"] = ratio;
      for (const auto& [label, r, vs] : {std::tuple{"verified (default)", on, ratio},
                                         std::tuple{"verification off", off, 1.0}}) {
        char line[256];
        std::snprintf(line, sizeof line, "%-40s %8.2f %8.2f %8.2f   %-12.3f %.3f\n",
                      (storage + " load at " + std::to_string(world) + ", " + label).c_str(),
                      r.gbps.min, r.gbps.median, r.gbps.max, vs, r.bytes_read_ratio);
        *table += line;
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(ckpt, ec);
  }
  return Status::OK();
}

}  // namespace

int RunReshardBench(const ReshardBenchOptions& options) {
  nlohmann::json out = nlohmann::json::object();
  std::string table;
  Status s = Bench(options, &out, &table);
  return PrintBenchResult("reshard", s, out, table, options.json);
}

}  // namespace megackpt::bench
