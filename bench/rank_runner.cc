// RankRunner (rank_runner.h).
#include "rank_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "bench_report.h"
#include "bench_util.h"
#include "megackpt/fs/filesystem.h"  // FinishBackgroundFrees

namespace megackpt::bench {

RankRunner::RankRunner(dist::ProcessGroup* mpi, int world)
    : mpi_(mpi), world_(mpi ? mpi->world_size() : std::max(1, world)) {}

int RankRunner::rank() const { return mpi_ ? mpi_->rank() : 0; }

std::vector<int> RankRunner::LocalRanks() const {
  if (mpi_) return {mpi_->rank()};
  std::vector<int> ranks(world_);
  for (int r = 0; r < world_; ++r) ranks[r] = r;
  return ranks;
}

Result<double> RankRunner::Run(const std::function<Status(dist::ProcessGroup&)>& fn,
                               const FreshWrite& fresh) {
  if (!fresh.path.empty()) {
    // Rank 0 removes the target, then (after a barrier, so no process writes
    // back the old checkpoint's dirty pages while they are being discarded)
    // every other process syncs: the remove-then-sync of PrepareFreshWrite.
    // Over the previous save: every process's background frees end before
    // rank 0's preparation.
    if (fresh.over_previous) {
      fs::FinishBackgroundFrees();
      if (mpi_) MEGA_RETURN_IF_ERROR(mpi_->Barrier());
    }
    if (rank() == 0) {
      if (fresh.over_previous) {
        std::error_code ec;
        if (std::filesystem::exists(fresh.path + "/.metadata", ec)) ++runs_over_a_commit_;
        PrepareWriteOverPrevious(fresh.path, fresh.bytes);
      } else {
        PrepareFreshWrite(fresh.path, fresh.bytes);
      }
    }
    if (mpi_) {
      MEGA_RETURN_IF_ERROR(mpi_->Barrier());
      if (rank() != 0) sync();
    }
  }
  if (fresh.then) MEGA_RETURN_IF_ERROR(fresh.then());
  if (!mpi_) {
    const double t0 = NowSeconds();
    auto results = dist::RunThreadRanks(world_, fn);
    const double dt = NowSeconds() - t0;
    for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
    return dt;
  }
  MEGA_RETURN_IF_ERROR(mpi_->Barrier());
  const double t0 = NowSeconds();
  Status s = fn(*mpi_);
  const double dt = NowSeconds() - t0;
  MEGA_RETURN_IF_ERROR(mpi_->AllReduceStatus(s));
  return Max(dt);
}

Result<double> RankRunner::Max(double mine) {
  if (!mpi_) return mine;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", mine);
  MEGA_ASSIGN_OR_RETURN(auto all, mpi_->AllGather(buf));
  double worst = mine;
  for (const auto& x : all) worst = std::max(worst, std::stod(x));
  return worst;
}

Result<double> RankRunner::CommitAfterLastWrite(const std::vector<dcp::SaveStats>& local) {
  if (!mpi_) return bench::CommitAfterLastWrite(local);
  const dcp::SaveStats mine = local.empty() ? dcp::SaveStats() : local[0];
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.17g %.17g %.17g", mine.plan_seconds, mine.write_seconds,
                mine.commit_seconds);
  MEGA_ASSIGN_OR_RETURN(auto all, mpi_->AllGather(buf));
  std::vector<dcp::SaveStats> ranks(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    if (std::sscanf(all[r].c_str(), "%lf %lf %lf", &ranks[r].plan_seconds, &ranks[r].write_seconds,
                    &ranks[r].commit_seconds) != 3) {
      return InternalError("bench: rank " + std::to_string(r) + " sent malformed save stats \"" +
                           all[r] + "\"");
    }
  }
  return bench::CommitAfterLastWrite(ranks);
}

Status RankRunner::Agree(Status s) {
  if (!mpi_) return s;
  return mpi_->AllReduceStatus(s);
}

Result<std::string> RankRunner::FromRank0(std::string value) {
  if (!mpi_) return value;
  return mpi_->Broadcast(std::move(value), 0);
}

Result<std::unique_ptr<LeadCeilings>> LeadCeilings::Create(RankRunner* runner,
                                                           const std::string& dir, uint64_t bytes,
                                                           int parallelism, int warmup,
                                                           StatePages pages) {
  std::unique_ptr<LeadCeilings> c(new LeadCeilings(runner));
  Status made;
  if (runner->rank() == 0) {
    auto io = PlainIo::Create(dir, bytes, pages);
    made = io.status();
    if (io.ok()) {
      c->io_ = std::move(*io);
      c->rounds_ = std::make_unique<CeilingRounds>(*c->io_, parallelism, warmup);
    }
  }
  // At once, not after the other processes' collective timeout.
  MEGA_RETURN_IF_ERROR(runner->Agree(made));
  return c;
}

LeadCeilings::~LeadCeilings() = default;

Status LeadCeilings::Round(CeilingKind kind, const std::string& checkpoint, bool over_previous) {
  fs::FinishBackgroundFrees();
  MEGA_RETURN_IF_ERROR(runner_->Agree(Status::OK()));  // on every process
  Status s;
  if (rounds_) {
    const bool write = WritesFiles(kind);
    s = write ? rounds_->WriteRound(kind, checkpoint, over_previous) : rounds_->Round(kind);
  }
  return runner_->Agree(s);
}

SaveLoadCeilings LeadCeilings::Finish() {
  SaveLoadCeilings all;
  if (rounds_) all = rounds_->GetAll();
  rounds_.reset();
  io_.reset();  // removes the files
  return all;
}

int RunSaveLoadBench(std::string_view name, const std::string& backend, bool json,
                     const std::function<Status(dist::ProcessGroup* mpi, nlohmann::json* out,
                                                std::string* table)>& bench) {
  std::unique_ptr<dist::ProcessGroup> mpi;
  if (backend == "mpi") {
    auto g = dist::NewMpiProcessGroup();
    if (!g.ok()) return PrintBenchResult(name, g.status(), nlohmann::json::object(), "", json);
    mpi = std::move(*g);
  }
  nlohmann::json out = nlohmann::json::object();
  std::string table;
  const Status s = bench(mpi.get(), &out, &table);
  if (mpi && mpi->rank() != 0) {
    // Rank 0 prints the result; stdout holds one JSON object. An error goes
    // to stderr from every rank (a rank's own may differ from rank 0's).
    return s.ok() ? 0 : PrintBenchResult(name, s, out, table, /*json=*/false);
  }
  return PrintBenchResult(name, s, out, table, json);
}

}  // namespace megackpt::bench
