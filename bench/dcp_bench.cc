// `megackpt bench dcp`: distributed save/load throughput of the FileSystemWriter
// and FileSystemReader next to the machine's limits, measured the same way in the
// same run (docs/architecture.md, performance model).
//
//  - state: 16 F32 tensors of --size/16 bytes, each sharded by rows over the
//    ranks; every rank's shards live in one pre-faulted buffer per tensor.
//  - save_gbps: Save with sync (every data file fsynced, then the metadata
//    commit) of the whole state; ceiling durable_write_gbps: the best of 1, 2
//    and ranks x threads plain writers, each writing its part of the same total
//    to its own file with large pwrites and fdatasync (bench_util.h, ceilings).
//  - save_nosync_gbps vs pagecache_write_gbps: the same without any fsync;
//    also over checksummed_write_gbps, the same plain writers computing the
//    block CRC-32s the writer computes (bench_util.h kChecksummedWrite): what
//    the framework costs beyond its checksums.
//  - load_gbps: Load into caller-allocated, pre-faulted tensors reused across
//    repetitions (warm page cache, like the limit), every byte verified (the
//    default); load_unverified_gbps: the same with VerifyMode::kOff (the two
//    in turns after each warm-read round, bench_util.h TimeLoadRows); ceiling
//    pagecache_read_gbps: the best of 1, 2 and N threads preading byte ranges
//    of a cached file into a reused, pre-faulted buffer.
//  - peak_extra_rss_bytes: peak RSS during one synchronous save minus the RSS
//    before it (the state itself is already resident).
//  Each: one dropped warm-up, then --reps runs; min/median/max (JSON: also
//  <row>_gbps_by_rep and <ceiling>_gbps_by_round, every one in order). Every
//  repetition runs the row's ceiling round right before the row (interleaved:
//  a limit measured minutes later, in another machine state, is no limit).
//  The durable saves all run before the no-sync ones, not in turns with them.
//  Before every save, and before every write of the limits, the other's files
//  are removed and PrepareFreshWrite (untimed) writes back dirty pages and
//  primes the free memory (PrimeFreeMemory): both start from the same state.
//  --over-previous: the checkpoint folder is kept instead, so every save
//  writes over the previous one and its superseded files are garbage
//  (FileSystem::RemoveGarbage), and the plain writers write next to it; the
//  preparation (PrepareWriteOverPrevious) first waits for the frees of the
//  last save's garbage. JSON "over_previous".
#include "dcp_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dist/process_group.h"
#include "rank_runner.h"
#include "row_sharded_state.h"

namespace megackpt::bench {
namespace {

constexpr int kWarmup = 1;
constexpr int kTensors = 16;  // RowShardedLayout's defaults: 16 tensors of 4 KiB F32 rows
using RankState = RowShardedRank;

Result<RankState> BuildState(uint64_t size, int world, int rank, StatePages pages) {
  return BuildRowShardedRank(RowShardedLayout{.pages = pages}, size, world, rank);
}

uint64_t GlobalBytes(uint64_t size) { return RowShardedLayout{}.BytesFor(size); }

Status Bench(const DcpBenchOptions& o, dist::ProcessGroup* mpi, nlohmann::json* out,
             std::string* table) {
  RankRunner runner(mpi, o.world_size);
  const int world = runner.world();
  const int my_rank = runner.rank();
  const uint64_t bytes = GlobalBytes(o.size);
  // Rank 0 picks the folder; MPI ranks learn it.
  std::unique_ptr<TempDir> tmp;
  std::string base = o.dir;
  if (my_rank == 0 && base.empty()) {
    tmp = std::make_unique<TempDir>("megackpt-bench-dcp");
    base = tmp->path();
  }
  MEGA_ASSIGN_OR_RETURN(base, runner.FromRank0(base));
  const std::string ckpt = base + "/ckpt";

  // This process's ranks' states (threads: every rank; MPI: its own).
  std::vector<RankState> states;
  for (int r : runner.LocalRanks()) {
    MEGA_ASSIGN_OR_RETURN(RankState st, BuildState(o.size, world, r, o.pages));
    states.push_back(std::move(st));
  }
  // Each save's SaveStats, per rank of this process.
  std::vector<dcp::SaveStats> save_stats(states.size());
  auto save_fn = [&](bool sync) {
    return [&, sync](dist::ProcessGroup& g) -> Status {
      dcp::FileSystemWriterOptions wo;
      wo.sync = sync;
      wo.direct_io = o.direct_io;
      wo.thread_count = o.threads;
      auto writer = dcp::NewFileSystemWriter(ckpt, wo);
      dcp::SaveOptions so;
      so.stats = &save_stats[runner.LocalIndex(g)];
      return dcp::Save(states[runner.LocalIndex(g)].save, *writer, &g, so);
    };
  };
  auto last_commit = [&]() { return runner.CommitAfterLastWrite(save_stats); };
  auto load_fn = [&](dcp::VerifyMode verify) {
    return [&, verify](dist::ProcessGroup& g) -> Status {
      dcp::FileSystemReaderOptions ro;
      ro.thread_count = o.threads;
      ro.verify = verify;
      auto reader = dcp::NewFileSystemReader(ckpt, ro);
      return dcp::Load(states[runner.LocalIndex(g)].load, *reader, &g);
    };
  };

  // Peak extra memory of one synchronous save (first, before other buffers).
  MEGA_RETURN_IF_ERROR(runner.Run(save_fn(true)).status());  // warm the files' paths
  const bool reset_ok = ResetPeakRss();
  const uint64_t rss_before = CurrentRssBytes();
  MEGA_RETURN_IF_ERROR(runner.Run(save_fn(true)).status());
  uint64_t peak_extra = PeakRssBytes() > rss_before ? PeakRssBytes() - rss_before : 0;
  MEGA_ASSIGN_OR_RETURN(double worst_extra, runner.Max(static_cast<double>(peak_extra)));
  peak_extra = static_cast<uint64_t>(worst_extra);

  // Every repetition runs a row's ceiling round (bench_util.h CeilingRounds:
  // best of 1, 2 and world x threads plain writers/readers) next to the row
  // itself, so both see the same machine state. Rank 0 alone runs the ceilings;
  // the other ranks wait for its status.
  const int parallelism = world * std::max(1, o.threads);
  MEGA_ASSIGN_OR_RETURN(auto ceilings, LeadCeilings::Create(&runner, base + "/limit", bytes,
                                                            parallelism, kWarmup, o.pages));
  // The block size the FileSystemWriter picks for the state's 4 KiB rows
  // (kAutoChecksumBlockSize: core AutoCrcBlockSize of a row, at most 256 KiB).
  const uint64_t crc_block = AutoCrcBlockSize(RowShardedLayout{}.cols * 4, 256ull << 10);
  ceilings->SetCrcBlock(crc_block);
  auto ceiling_round = [&](CeilingKind kind) {
    return ceilings->Round(kind, ckpt, o.over_previous);
  };
  const FreshWrite fresh{.path = ckpt, .bytes = bytes, .over_previous = o.over_previous};
  SaveLoadSeconds secs;
  // The durable saves, then the no-sync saves (as bench mega). On a VM the
  // host's own writing of a durable save's bytes slows the guest's next ~10 s
  // of memory-bound work; in turns, the no-sync row and its ceiling were both
  // measured in that wake (docs/benchmarks.md, "After a durable write").
  for (bool sync : {true, false}) {
    // The last no-sync save is loaded below.
    MEGA_RETURN_IF_ERROR(TimeSaveRow(
        kWarmup, o.reps,
        [&] {
          if (sync) return ceiling_round(CeilingKind::kDurableWrite);
          MEGA_RETURN_IF_ERROR(ceiling_round(CeilingKind::kPageCacheWrite));
          return ceiling_round(CeilingKind::kChecksummedWrite);
        },
        [&]() -> Result<std::pair<double, double>> {
          MEGA_ASSIGN_OR_RETURN(double dt, runner.Run(save_fn(sync), fresh));
          MEGA_ASSIGN_OR_RETURN(double commit, last_commit());
          return std::pair{dt, commit};
        },
        sync ? &secs.save : &secs.save_nosync,
        sync ? &secs.save_commit : &secs.save_nosync_commit));
  }
  // The loads' destinations, made only for the load rows (row_sharded_state.h).
  Status made;
  for (RankState& st : states) {
    if (made.ok()) made = st.AddLoadDestinations();
  }
  MEGA_RETURN_IF_ERROR(runner.Agree(made));
  MEGA_RETURN_IF_ERROR(TimeLoadRows(
      kWarmup, o.reps, [&] { return ceiling_round(CeilingKind::kWarmRead); },
      [&](bool verified) {
        return runner.Run(load_fn(verified ? dcp::VerifyMode::kAll : dcp::VerifyMode::kOff));
      },
      &secs.load, &secs.load_unverified));
  // The benchmark measures real loads: the last one must have restored the bytes.
  Status loaded;
  for (size_t r = 0; r < states.size() && loaded.ok(); ++r) {
    loaded = states[r].CheckLoaded("bench dcp: rank " + std::to_string(runner.LocalRanks()[r]));
  }
  MEGA_RETURN_IF_ERROR(runner.Agree(loaded));
  states.clear();
  const SaveLoadCeilings ceil = ceilings->Finish();  // rank 0's; removes the ceiling's files
  MEGA_RETURN_IF_ERROR(runner.Agree(Status::OK()));  // every process is done with the files
  if (my_rank != 0) return Status::OK();
  std::error_code ec;
  if (!o.dir.empty()) std::filesystem::remove_all(ckpt, ec);

  (*out)["size_bytes"] = bytes;
  (*out)["world_size"] = world;
  (*out)["backend"] = mpi ? "mpi" : "threads";
  (*out)["threads_per_rank"] = o.threads;
  (*out)["reps"] = o.reps;
  const SaveLoadRows r = SaveLoadRowsFrom(secs, bytes, ceil);
  PutSaveLoadRows(out, r, ceil, parallelism);
  (*out)["direct_io"] = o.direct_io;
  (*out)["state_pages"] = StatePagesName(o.pages);
  (*out)["over_previous"] = o.over_previous;
  (*out)["saves_over_a_commit"] = runner.runs_over_a_commit();
  (*out)["peak_extra_rss_bytes"] = peak_extra;
  (*out)["peak_rss_reset_ok"] = reset_ok;

  char head[512];
  std::snprintf(
      head, sizeof head,
      "megackpt bench dcp: %.2f GB state (%d row-sharded F32 tensors, %s pages), world %d "
      "(%s), %d I/O threads/rank, %d reps after %d warm-up%s%s\n",
      bytes / 1e9, kTensors, StatePagesName(o.pages), world, mpi ? "mpi" : "threads", o.threads,
      o.reps, kWarmup, FreshWriteNote(o.direct_io).c_str(), OverPreviousNote(o.over_previous));
  *table += head;
  char cols[128];
  std::snprintf(cols, sizeof cols, "%-34s %8s %8s %8s   %s\n", "GB/s", "min", "median", "max",
                "vs ceiling  [per rep: min med max]");
  *table += cols;
  *table += CeilingRow("ceiling: write + fdatasync", ceil.durable) + "\n";
  *table +=
      FormatRow("save (durable, default)", r.save, ceil.durable.best.median, r.save_paired) + "\n";
  *table += CommitRow("its commit", r.save_commit) + "\n";
  *table += CeilingRow("ceiling: page-cache write", ceil.pagecache_write) + "\n";
  *table += FormatRow("save --no-sync", r.save_nosync, ceil.pagecache_write.best.median,
                      r.nosync_paired) +
            "\n";
  *table += CommitRow("its commit", r.nosync_commit) + "\n";
  *table += CeilingRow("ref: checksummed write", ceil.checksummed_write) + "\n";
  *table += FormatRow("save --no-sync over it", r.save_nosync, ceil.checksummed_write.best.median,
                      r.nosync_checksummed_paired) +
            "\n";
  *table += CeilingRow("ceiling: warm read", ceil.warm_read) + "\n";
  *table +=
      FormatRow("load (verified, default)", r.load, ceil.warm_read.best.median, r.load_paired) +
      "\n";
  *table += FormatRow("load, verification off (kOff)", r.load_unverified,
                      ceil.warm_read.best.median, r.unverified_paired) +
            "\n";
  *table += "ceilings, best of 1, 2 and " + std::to_string(parallelism) +
            " (ranks x I/O threads) plain threads:\n";
  for (const Ceiling* c : {&ceil.durable, &ceil.pagecache_write, &ceil.warm_read}) {
    *table += "  " + DescribeCeiling(*c) + "\n";
  }
  *table += "reference, not a limit of the machine (bench_util.h kChecksummedWrite):\n  " +
            DescribeCeiling(ceil.checksummed_write) + ", block CRC-32s of " +
            std::to_string(crc_block) + " B before each pwrite\n";
  char mem[200];
  if (peak_extra < (1u << 20)) {
    // The peak never rose (by a MiB) above the RSS before the save: the save
    // reused memory that was already resident. Not a measured zero.
    std::snprintf(mem, sizeof mem,
                  "peak extra RSS during a synchronous save: < 1 MiB (not above the baseline)%s\n",
                  reset_ok ? "" : " (peak reset not permitted: upper bound)");
  } else {
    std::snprintf(mem, sizeof mem, "peak extra RSS during a synchronous save: %.1f MiB%s\n",
                  peak_extra / 1048576.0,
                  reset_ok ? "" : " (peak reset not permitted: upper bound)");
  }
  *table += mem;
  return Status::OK();
}

}  // namespace

int RunDcpBench(const DcpBenchOptions& options) {
  return RunSaveLoadBench("dcp", options.backend, options.json,
                          [&](dist::ProcessGroup* mpi, nlohmann::json* out, std::string* table) {
                            return Bench(options, mpi, out, table);
                          });
}

}  // namespace megackpt::bench
