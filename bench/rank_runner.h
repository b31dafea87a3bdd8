// The ranks of a save/load bench (bench dcp, bench mega): either `world` threads
// of this process (the threads backend, dist::RunThreadRanks) or this process as
// one rank under mpirun (--backend mpi). The bench keeps one state per rank of
// this process and indexes it with LocalIndex.
#ifndef MEGACKPT_BENCH_RANK_RUNNER_H_
#define MEGACKPT_BENCH_RANK_RUNNER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"  // CeilingKind, CeilingRounds, PlainIo
#include "megackpt/core/status.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::bench {

// The untimed preparation of a RankRunner::Run that writes `path` afresh, like
// the ceilings' writes: PrepareFreshWrite of `path` with `bytes` (rank 0 removes
// it and primes the free memory; after a barrier every other process syncs).
// An empty path: no preparation.
struct FreshWrite {
  std::string path;
  uint64_t bytes = 0;
  // Optional, untimed: runs on every process after the preparation, right
  // before the timed run (a ceiling round that writes no file, e.g. memcpy,
  // measured in the state the preparation leaves the machine in).
  std::function<Status()> then;
  // Keep `path`: the timed write goes over the previous one
  // (PrepareWriteOverPrevious; every process first waits for its own
  // background frees, fs::FinishBackgroundFrees).
  bool over_previous = false;
};

class RankRunner {
 public:
  // mpi null: `world` thread ranks in this process. Else this process is rank
  // mpi->rank() of mpi->world_size() (`world` is ignored); mpi must outlive
  // the runner.
  RankRunner(dist::ProcessGroup* mpi, int world);

  bool is_mpi() const { return mpi_ != nullptr; }
  int world() const { return world_; }
  // This process's rank (threads backend: 0, the one that prints).
  int rank() const;
  // The ranks this process holds: the global ranks of its states, in order.
  std::vector<int> LocalRanks() const;
  // Index of rank group `g`'s state among LocalRanks().
  int LocalIndex(const dist::ProcessGroup& g) const { return mpi_ ? 0 : g.rank(); }

  // Runs fn on every rank, after `fresh`, and returns the wall time: threads:
  // of the whole multi-thread run; MPI: the ranks start together (barrier) and
  // the slowest rank's time counts. Any rank's error fails every process's call.
  Result<double> Run(const std::function<Status(dist::ProcessGroup&)>& fn,
                     const FreshWrite& fresh = FreshWrite());

  // Rank 0: how many Runs with FreshWrite::over_previous found a commit
  // (`path`/.metadata) before their preparation, i.e. wrote over a save (the
  // bench's JSON "saves_over_a_commit"; others: 0).
  int runs_over_a_commit() const { return runs_over_a_commit_; }

  // The largest `mine` of every process (threads: mine).
  Result<double> Max(double mine);
  // CommitAfterLastWrite over every rank's SaveStats; `local`: this process's
  // ranks' stats (MPI: gathered from every process).
  Result<double> CommitAfterLastWrite(const std::vector<dcp::SaveStats>& local);
  // Makes one process's status everyone's: the first error of any process, or
  // OK (threads: s). Every process must call it.
  Status Agree(Status s);
  // `value` of rank 0 on every process (threads: value).
  Result<std::string> FromRank0(std::string value);

 private:
  dist::ProcessGroup* mpi_;
  int world_;
  int runs_over_a_commit_ = 0;
};

// The ceiling rounds of a save/load bench (bench_util.h CeilingRounds: best
// of 1, 2 and `parallelism` plain writers/readers), run by rank 0 alone next
// to each row; the other processes wait for its status.
class LeadCeilings {
 public:
  // Rank 0 makes the plain-I/O files under `dir` (bytes each round moves)
  // and buffers of `pages` (the state's); every process gets rank 0's status.
  // `runner` must outlive this.
  static Result<std::unique_ptr<LeadCeilings>> Create(RankRunner* runner, const std::string& dir,
                                                      uint64_t bytes, int parallelism, int warmup,
                                                      StatePages pages);
  ~LeadCeilings();

  // One round of `kind` on rank 0, status shared. Write kinds (page-cache
  // write, write + fsync) first remove `checkpoint`, the folder the row saves
  // into (CeilingRounds::WriteRound), or with `over_previous` keep it. Every
  // process first waits for its background frees (fs::FinishBackgroundFrees):
  // no earlier save's garbage is being freed while a ceiling runs.
  Status Round(CeilingKind kind, const std::string& checkpoint, bool over_previous = false);
  // The CRC block size of the kChecksummedWrite rounds (PlainIo::set_crc_block):
  // the one the bench's writer picks for its state.
  void SetCrcBlock(uint64_t bytes) {
    if (io_) io_->set_crc_block(bytes);
  }
  // Rank 0: every ceiling measured, and removes the files; others: empty.
  SaveLoadCeilings Finish();

 private:
  explicit LeadCeilings(RankRunner* runner) : runner_(runner) {}
  RankRunner* runner_;
  std::unique_ptr<PlainIo> io_;  // rank 0 only
  std::unique_ptr<CeilingRounds> rounds_;
};

// Runs a save/load bench named `name` ("dcp", "mega") on `backend` ("threads":
// bench(nullptr, ...); "mpi": bench(the MPI group, ...), under mpirun) and
// reports it from rank 0 (PrintBenchResult: the table, or JSON with `json`);
// the other MPI ranks print only an error, on stderr. Returns the exit code.
int RunSaveLoadBench(std::string_view name, const std::string& backend, bool json,
                     const std::function<Status(dist::ProcessGroup* mpi, nlohmann::json* out,
                                                std::string* table)>& bench);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_RANK_RUNNER_H_
