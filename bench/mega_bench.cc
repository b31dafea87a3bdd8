// `megackpt bench mega`: save/load throughput of MegaStorageWriter and
// MegaStorageReader next to the machine's limits, measured the same way in the
// same run (docs/architecture.md, performance model).
//
//  - state: --tensors (16) F32 tensors of --size/--tensors bytes, each sharded by rows over the
//    ranks (--world-size threads, or the processes of mpirun with --backend mpi,
//    rank_runner.h); every rank's shards are pre-faulted. Rank 0 alone runs
//    the ceilings and prints.
//    bench/torch_peer.py builds the same state for torch.save and torch DCP.
//  - save_gbps: Save with sync (every shard fsynced, then index and .metadata
//    commit) into an empty folder; ceiling durable_write_gbps: the best of 1, 2
//    and ranks x threads plain writers (own files, large pwrites + fdatasync).
//  - save_nosync_gbps vs pagecache_write_gbps: the same without fsync; also
//    over checksummed_write_gbps, the same plain writers computing the block
//    CRC-32s the MEGA writer computes (bench_util.h kChecksummedWrite): what
//    the format and framework cost beyond their checksums.
//  - load_gbps: Load into caller-allocated, pre-faulted tensors reused across
//    repetitions (warm page cache); ceiling pagecache_read_gbps: best of 1, 2
//    and N threads preading byte ranges of a cached file into a reused buffer.
//    load_unverified_gbps: the same with verify_checksums off; the two in
//    turns after each warm-read round (bench_util.h TimeLoadRows).
//  - *_paired ratios: each repetition against the ceiling round right before
//    it (bench_util.h PairedRatio), min/median/max.
//  - async_blocked_seconds: how long the caller is blocked in AsyncSave (until
//    its tensors are staged and it may modify them), staging pool reused across
//    saves, vs sync_save_seconds (the median durable save) and vs the time the
//    memcpy ceiling (best of 1, 2, N threads) takes to copy the state; its
//    round runs after the save's fresh-write preparation (AsyncBlocked).
//    async_blocked_seconds_by_rep / memcpy_gbps_by_round: the pairs.
//  Each: one dropped warm-up, then --reps runs; min/median/max (JSON: also
//  <row>_gbps_by_rep and <ceiling>_gbps_by_round, every one in order). Every
//  repetition runs the row's ceiling round right before the row (interleaved:
//  a limit measured minutes later, in another machine state, is no limit).
//  Before every save, and before every write of the limits, the other's files
//  are removed and PrepareFreshWrite (untimed) writes back dirty pages and
//  primes the free memory (PrimeFreeMemory): both start from the same state.
//  --over-previous: the checkpoint folder is kept instead, so every save
//  writes over the previous one and its superseded files are garbage
//  (FileSystem::RemoveGarbage), and the plain writers write next to it; the
//  preparation (PrepareWriteOverPrevious) first waits for the frees of the
//  last save's garbage. JSON "over_previous".
#include "mega_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/mega_encoder.h"
#include "rank_runner.h"
#include "row_sharded_state.h"

namespace megackpt::bench {
namespace {

constexpr int kWarmup = 1;
// A rank's row-sharded state (bench/row_sharded_state.h) and its async staging pool.
struct RankState {
  RowShardedRank state;
  uint64_t bytes = 0;
  std::shared_ptr<dcp::StagingPool> pool;
};

class Bench {
 public:
  Bench(const MegaBenchOptions& o, std::string ckpt, RankRunner* runner)
      : o_(o), ckpt_(std::move(ckpt)), runner_(runner) {}

  // This process's ranks' states (threads: every rank; MPI: its own).
  Status Setup() {
    for (int r : runner_->LocalRanks()) {
      RankState st;
      MEGA_ASSIGN_OR_RETURN(st.state, BuildRowShardedRank(layout(), o_.size, runner_->world(), r));
      for (const Tensor& t : st.state.save_shards) st.bytes += t.nbytes();
      states_.push_back(std::move(st));
    }
    return Status::OK();
  }

  RowShardedLayout layout() const {
    return RowShardedLayout{.tensors = o_.tensors, .pages = o_.pages};
  }
  uint64_t bytes() const { return layout().BytesFor(o_.size); }

  // Runs fn on every rank (RankRunner::Run); `fresh` empties the checkpoint
  // folder first (untimed), and then runs `then` (untimed, FreshWrite::then).
  // Returns the wall time.
  Result<double> Run(bool fresh, const std::function<Status(dist::ProcessGroup&, RankState&)>& fn,
                     std::function<Status()> then = nullptr) {
    return runner_->Run(
        [&](dist::ProcessGroup& g) { return fn(g, states_[runner_->LocalIndex(g)]); },
        fresh ? FreshWrite{ckpt_, bytes(), std::move(then), o_.over_previous} : FreshWrite{});
  }

  // One timed save of SaveFn(sync): {seconds, its commit after the last
  // rank's data (CommitAfterLastWrite)}; a repetition of TimeSaveRow.
  Result<std::pair<double, double>> TimedSave(bool sync) {
    MEGA_ASSIGN_OR_RETURN(double dt, Run(true, SaveFn(sync)));
    MEGA_ASSIGN_OR_RETURN(double commit, runner_->CommitAfterLastWrite(save_stats_));
    return std::pair{dt, commit};
  }

  // Fills save_stats_[rank].
  std::function<Status(dist::ProcessGroup&, RankState&)> SaveFn(bool sync) {
    save_stats_.assign(states_.size(), dcp::SaveStats());
    return [this, sync](dist::ProcessGroup& g, RankState& st) -> Status {
      dcp::MegaStorageWriterOptions wo;
      wo.sync = sync;
      wo.direct_io = o_.direct_io;
      wo.thread_count = o_.threads;
      dcp::MegaStorageWriter writer(ckpt_, std::nullopt, wo);
      dcp::SaveOptions so;
      so.stats = &save_stats_[runner_->LocalIndex(g)];
      return dcp::Save(st.state.save, writer, &g, so);
    };
  }

  // `verify` false: MegaStorageReaderOptions::verify_checksums off (the
  // reader warns on stderr once per load).
  std::function<Status(dist::ProcessGroup&, RankState&)> LoadFn(bool verify) {
    return [this, verify](dist::ProcessGroup& g, RankState& st) -> Status {
      dcp::MegaStorageReaderOptions ro;
      ro.thread_count = o_.threads;
      ro.verify_checksums = verify;
      dcp::MegaStorageReader reader(ckpt_, ro);
      return dcp::Load(st.state.load, reader, &g);
    };
  }

  // Durable async saves; returns per-rep blocked seconds (slowest rank).
  // Each rank's staging pool (room for its whole state: staged whole before the
  // save, so the caller is released as soon as everything is copied) exists
  // only for this row: its arena is made in the warm-up save and freed after the
  // row, so it is not resident during the other rows.
  // `before` (untimed) runs right before every save, after its fresh-write
  // preparation: the interleaved memcpy round. The memcpy writes no file, so it
  // can run there, and it must: on the benchmark VM the removal and prime of
  // the preparation leave the memory bandwidth up to half lower for a while, and a
  // memcpy round run before the preparation measured another machine
  // (docs/benchmarks.md, "The async row's memcpy round after the preparation").
  Result<std::vector<double>> AsyncBlocked(const std::function<Status()>& before) {
    for (RankState& st : states_)
      st.pool = dcp::StagingPool::Create(st.bytes + (o_.tensors + 1) * 4096);
    std::vector<double> blocked;
    for (int i = 0; i < kWarmup + o_.reps; ++i) {
      std::mutex mu;
      double worst = 0;
      MEGA_RETURN_IF_ERROR(
          Run(
              true,
              [&](dist::ProcessGroup& g, RankState& st) -> Status {
                dcp::MegaStorageWriterOptions wo;
                wo.thread_count = o_.threads;
                auto writer = std::make_shared<dcp::MegaStorageWriter>(ckpt_, std::nullopt, wo);
                dcp::AsyncSaveOptions ao;
                ao.pool = st.pool;
                const double t0 = NowSeconds();
                dcp::AsyncSaveHandle h = dcp::AsyncSave(st.state.save, writer, &g, ao);
                Status staged = h.staged.get();
                const double dt = NowSeconds() - t0;
                Status done = h.done.get();
                {
                  std::lock_guard<std::mutex> lock(mu);
                  worst = std::max(worst, dt);
                }
                MEGA_RETURN_IF_ERROR(staged);
                return done;
              },
              before)
              .status());
      MEGA_ASSIGN_OR_RETURN(worst, runner_->Max(worst));  // the slowest process's
      if (i >= kWarmup) blocked.push_back(worst);
    }
    for (RankState& st : states_) st.pool.reset();
    return blocked;
  }

  Status CheckLoaded() const {
    for (size_t r = 0; r < states_.size(); ++r) {
      MEGA_RETURN_IF_ERROR(states_[r].state.CheckLoaded("bench mega: rank " +
                                                        std::to_string(runner_->LocalRanks()[r])));
    }
    return Status::OK();
  }

  // The loads' destinations, made only for the load rows.
  Status AddLoadDestinations() {
    for (RankState& st : states_) MEGA_RETURN_IF_ERROR(st.state.AddLoadDestinations());
    return Status::OK();
  }

  void FreeState() { states_.clear(); }

 private:
  MegaBenchOptions o_;
  std::string ckpt_;
  RankRunner* runner_;
  std::vector<RankState> states_;
  std::vector<dcp::SaveStats> save_stats_;  // of the last SaveFn run, per rank
};

Status RunAll(const MegaBenchOptions& o, dist::ProcessGroup* mpi, nlohmann::json* out,
              std::string* table) {
  RankRunner runner(mpi, o.world_size);
  const bool lead = runner.rank() == 0;  // runs the ceilings and prints
  // Rank 0 picks the folder; MPI ranks learn it.
  std::unique_ptr<TempDir> tmp;
  std::string base = o.dir;
  if (lead && base.empty()) {
    tmp = std::make_unique<TempDir>("megackpt-bench-mega");
    base = tmp->path();
  }
  // Rank 0's own steps end in Agree: its error reaches the other processes
  // at once instead of after their collectives' timeout.
  Status made;
  if (lead) {
    std::error_code ec;
    std::filesystem::create_directories(base, ec);
    if (ec) made = IOError("cannot create the bench folder " + base + ": " + ec.message());
  }
  MEGA_RETURN_IF_ERROR(runner.Agree(made));
  MEGA_ASSIGN_OR_RETURN(base, runner.FromRank0(base));
  const std::string ckpt = base + "/ckpt";
  Bench bench(o, ckpt, &runner);
  MEGA_RETURN_IF_ERROR(runner.Agree(bench.Setup()));
  const uint64_t bytes = bench.bytes();

  // Every repetition runs the row's ceiling round (bench_util.h CeilingRounds:
  // best of 1, 2 and ranks x threads) right before the row: both see the same
  // machine state. Rank 0 alone runs the ceilings; the other processes wait
  // for its status.
  const int world = runner.world();
  const int parallelism = world * std::max(1, o.threads);
  MEGA_ASSIGN_OR_RETURN(auto ceilings, LeadCeilings::Create(&runner, base + "/limit", bytes,
                                                            parallelism, kWarmup, o.pages));
  // The block size the MEGA writer picks for the state's rows.
  const uint64_t crc_block = format::MegaBlockSizeFor(DType::kF32, {1, RowShardedLayout{}.cols});
  ceilings->SetCrcBlock(crc_block);
  auto round = [&](CeilingKind kind) {
    return [&, kind]() { return ceilings->Round(kind, ckpt, o.over_previous); };
  };
  // The no-sync saves' rounds: the ceiling, then the checksummed-write reference.
  const auto nosync_rounds = [&]() -> Status {
    MEGA_RETURN_IF_ERROR(round(CeilingKind::kPageCacheWrite)());
    return round(CeilingKind::kChecksummedWrite)();
  };
  SaveLoadSeconds secs;
  MEGA_RETURN_IF_ERROR(TimeSaveRow(
      kWarmup, o.reps, round(CeilingKind::kDurableWrite), [&] { return bench.TimedSave(true); },
      &secs.save, &secs.save_commit));
  MEGA_RETURN_IF_ERROR(TimeSaveRow(
      kWarmup, o.reps, nosync_rounds, [&] { return bench.TimedSave(false); }, &secs.save_nosync,
      &secs.save_nosync_commit));
  MEGA_ASSIGN_OR_RETURN(auto blocked, bench.AsyncBlocked(round(CeilingKind::kMemcpy)));
  // The folder now holds the last async save; load it both ways after each
  // warm-read round, in turns (TimeLoadRows).
  MEGA_RETURN_IF_ERROR(runner.Agree(bench.AddLoadDestinations()));
  MEGA_RETURN_IF_ERROR(TimeLoadRows(
      kWarmup, o.reps, round(CeilingKind::kWarmRead),
      [&](bool verified) { return bench.Run(false, bench.LoadFn(verified)); }, &secs.load,
      &secs.load_unverified));
  MEGA_RETURN_IF_ERROR(runner.Agree(bench.CheckLoaded()));
  bench.FreeState();
  MEGA_RETURN_IF_ERROR(runner.Agree(Status::OK()));  // every process is done with the files
  if (!lead) return Status::OK();
  std::error_code ec;
  std::filesystem::remove_all(ckpt, ec);
  const SaveLoadCeilings ceil = ceilings->Finish();  // removes the ceiling's files
  const double memcpy_seconds =
      ceil.memcpy.best.median > 0 ? bytes / ceil.memcpy.best.median / 1e9 : 0;
  const SaveLoadRows r = SaveLoadRowsFrom(secs, bytes, ceil);
  // Blocked seconds over the memcpy round's seconds right before each save.
  std::vector<double> blocked_vs_memcpy;
  for (size_t i = 0; i < blocked.size() && i < ceil.memcpy.best_by_round.size(); ++i) {
    if (ceil.memcpy.best_by_round[i] > 0) {
      blocked_vs_memcpy.push_back(blocked[i] / (bytes / ceil.memcpy.best_by_round[i] / 1e9));
    }
  }
  const Summary blocked_p = Summarize(blocked_vs_memcpy);
  const Summary sync_s = Summarize(secs.save);
  const Summary blocked_s = Summarize(blocked);

  (*out)["bench"] = "mega";
  (*out)["bytes"] = bytes;
  (*out)["tensors"] = o.tensors;
  (*out)["world_size"] = world;
  (*out)["backend"] = runner.is_mpi() ? "mpi" : "threads";
  (*out)["reps"] = o.reps;
  PutSaveLoadRows(out, r, ceil, parallelism);
  (*out)["direct_io"] = o.direct_io;
  (*out)["state_pages"] = StatePagesName(o.pages);
  (*out)["over_previous"] = o.over_previous;
  (*out)["saves_over_a_commit"] = runner.runs_over_a_commit();
  PutSummary(out, "sync_save_seconds", sync_s);
  PutSummary(out, "async_blocked_seconds", blocked_s);
  (*out)["async_blocked_fraction"] = sync_s.median > 0 ? blocked_s.median / sync_s.median : 0;
  // The caller's blocked time against the ceiling's time to copy the state
  // (goal <= 1.5); its inverse is a speed ratio, checked like the others.
  (*out)["memcpy_state_seconds"] = memcpy_seconds;
  (*out)["async_blocked_vs_memcpy"] = memcpy_seconds > 0 ? blocked_s.median / memcpy_seconds : 0;
  PutPairedRatio(out, "async_blocked_vs_memcpy", blocked_p);
  // Each repetition's blocked seconds, in order; with memcpy_gbps_by_round
  // (PutCeiling: the memcpy round right before each), the pairs behind the
  // per-repetition ratios.
  (*out)["async_blocked_seconds_by_rep"] = blocked;
  PutRatio(out, "async_staging_vs_memcpy",
           blocked_s.median > 0 ? memcpy_seconds / blocked_s.median : 0);

  char head[512];
  std::snprintf(head, sizeof head,
                "megackpt bench mega: %.3f GB state (%d F32 tensors, row-sharded, %s pages), world "
                "size %d (%s), %d reps after %d warm-up; GB/s min / median / max, vs ceiling "
                "[per rep: min med max]%s%s\n",
                bytes / 1e9, o.tensors, StatePagesName(o.pages), world,
                runner.is_mpi() ? "mpi" : "threads", o.reps, kWarmup,
                FreshWriteNote(o.direct_io).c_str(), OverPreviousNote(o.over_previous));
  *table = head;
  *table += FormatRow("save (durable)", r.save, ceil.durable.best.median, r.save_paired) + "\n";
  *table += CeilingRow("  ceiling: write + fsync", ceil.durable) + "\n";
  *table += CommitRow("its commit", r.save_commit) + "\n";
  *table += FormatRow("save --no-sync", r.save_nosync, ceil.pagecache_write.best.median,
                      r.nosync_paired) +
            "\n";
  *table += CeilingRow("  ceiling: page-cache write", ceil.pagecache_write) + "\n";
  *table += CommitRow("its commit", r.nosync_commit) + "\n";
  *table += FormatRow("save --no-sync over the ref", r.save_nosync,
                      ceil.checksummed_write.best.median, r.nosync_checksummed_paired) +
            "\n";
  *table += CeilingRow("  ref: checksummed write", ceil.checksummed_write) + "\n";
  *table += FormatRow("load (verified, reused tensors)", r.load, ceil.warm_read.best.median,
                      r.load_paired) +
            "\n";
  *table += FormatRow("load, verify_checksums off", r.load_unverified, ceil.warm_read.best.median,
                      r.unverified_paired) +
            "\n";
  *table += CeilingRow("  ceiling: warm read", ceil.warm_read) + "\n";
  *table += CeilingRow("  ceiling: memcpy", ceil.memcpy) + "\n";
  char tail[768];
  std::snprintf(
      tail, sizeof tail,
      "seconds min / median / max\n"
      "  sync save          %8.4f %8.4f %8.4f\n"
      "  async blocked      %8.4f %8.4f %8.4f   (%.1f%% of the sync save; %.2fx the "
      "ceiling's memcpy of the state, %.4f s, per rep [%.2f %.2f %.2f]; goal <= 1.5x)%s\n",
      sync_s.min, sync_s.median, sync_s.max, blocked_s.min, blocked_s.median, blocked_s.max,
      sync_s.median > 0 ? 100.0 * blocked_s.median / sync_s.median : 0.0,
      memcpy_seconds > 0 ? blocked_s.median / memcpy_seconds : 0.0, memcpy_seconds, blocked_p.min,
      blocked_p.median, blocked_p.max,
      blocked_s.median > 0 && memcpy_seconds / blocked_s.median > kCeilingSlack ? kCeilingTooLow
                                                                                : "");
  *table += tail;
  *table += "ceilings, best of 1, 2 and " + std::to_string(parallelism) +
            " (ranks x I/O threads) plain threads:\n";
  for (const Ceiling* c : {&ceil.durable, &ceil.pagecache_write, &ceil.warm_read, &ceil.memcpy}) {
    *table += "  " + DescribeCeiling(*c) + "\n";
  }
  *table += "reference, not a limit of the machine (bench_util.h kChecksummedWrite):\n  " +
            DescribeCeiling(ceil.checksummed_write) + ", block CRC-32s of " +
            std::to_string(crc_block) + " B before each pwrite\n";
  return Status::OK();
}

}  // namespace

int RunMegaBench(const MegaBenchOptions& options) {
  MegaBenchOptions o = options;
  o.world_size = std::max(1, o.world_size);
  o.reps = std::max(1, o.reps);
  return RunSaveLoadBench("mega", o.backend, o.json,
                          [&](dist::ProcessGroup* mpi, nlohmann::json* out, std::string* table) {
                            return RunAll(o, mpi, out, table);
                          });
}

}  // namespace megackpt::bench
