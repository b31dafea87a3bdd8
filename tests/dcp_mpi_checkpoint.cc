// Distributed checkpoints under mpirun (tests/cmake/dcp.cmake runs this with 2
// and 4 ranks): save from every MPI rank, load back resharded through MPI and
// at other world sizes through the threads backend, and faults that must reach
// every rank as the same clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dcp/synthetic.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/process_group.h"

namespace megackpt::dcp {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<ProcessGroup> Group() {
  ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(60);
  auto g = NewMpiProcessGroup(o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(*g) : nullptr;
}

// A folder all ranks share (rank 0 creates it), removed by rank 0 at the end.
class SharedDir {
 public:
  explicit SharedDir(ProcessGroup& g) : g_(g) {
    std::string p;
    if (g.rank() == 0) {
      std::string tmpl = (fs::temp_directory_path() / "dcp-mpi-XXXXXX").string();
      p = mkdtemp(tmpl.data());
    }
    path_ = g.Broadcast(p, 0).value();
  }
  ~SharedDir() {
    g_.Barrier().IgnoreError();
    if (g_.rank() == 0) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  std::string path(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  ProcessGroup& g_;
  std::string path_;
};

TEST(DcpMpi, SaveThenResharedLoads) {
  auto g = Group();
  ASSERT_TRUE(g);
  SharedDir dir(*g);
  const int world = g->world_size();
  auto spec = synthetic::MakeSpec(77, 700 << 10);
  const std::string ckpt = dir.path("c");
  {
    auto sd = synthetic::BuildRankState(spec, world, g->rank(), 0, true);
    ASSERT_TRUE(sd.ok());
    Status s = Save(*sd, *NewFileSystemWriter(ckpt), g.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Same world size through MPI, every tensor in another layout.
  for (int variant : {1, 3}) {
    auto sd = synthetic::BuildRankState(spec, world, g->rank(), variant, false);
    ASSERT_TRUE(sd.ok());
    Status s = Load(*sd, *NewFileSystemReader(ckpt), g.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
    Status v = synthetic::VerifyRankState(spec, *sd);
    EXPECT_TRUE(v.ok()) << "variant " << variant << ": " << v.ToString();
  }
  // Other world sizes: rank 0 loads with 1..4 threads ranks.
  if (g->rank() == 0) {
    for (int load_world : {1, 2, 3, 4}) {
      auto results = RunThreadRanks(load_world, [&](ProcessGroup& tg) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd,
                              synthetic::BuildRankState(spec, load_world, tg.rank(), 2, false));
        MEGA_RETURN_IF_ERROR(Load(sd, *NewFileSystemReader(ckpt), &tg));
        return synthetic::VerifyRankState(spec, sd);
      });
      for (const Status& s : results) EXPECT_TRUE(s.ok()) << "load world " << load_world << ": " << s.ToString();
    }
  }
}

TEST(DcpMpi, AsyncSaveThenLoad) {
  auto g = Group();
  ASSERT_TRUE(g);
  SharedDir dir(*g);
  const int world = g->world_size();
  auto spec = synthetic::MakeSpec(78, 300 << 10);
  auto sd = synthetic::BuildRankState(spec, world, g->rank(), 0, true);
  ASSERT_TRUE(sd.ok());
  AsyncSaveOptions opts;
  opts.pool = StagingPool::Create(100 << 10);
  AsyncSaveHandle h = AsyncSave(*sd, NewFileSystemWriter(dir.path("a")), g.get(), opts);
  ASSERT_TRUE(h.staged.get().ok());
  Status done = h.done.get();
  ASSERT_TRUE(done.ok()) << done.ToString();
  auto dest = synthetic::BuildRankState(spec, world, g->rank(), 5, false);
  ASSERT_TRUE(Load(*dest, *NewFileSystemReader(dir.path("a")), g.get()).ok());
  EXPECT_TRUE(synthetic::VerifyRankState(spec, *dest).ok());
}

class ThrowOnRank1 : public SavePlanner {
 public:
  explicit ThrowOnRank1(int rank) : inner_(NewDefaultSavePlanner()), rank_(rank) {}
  Status SetUp(const StateDict& sd, const std::optional<StorageMeta>& m, bool c) override {
    return inner_->SetUp(sd, m, c);
  }
  Result<SavePlan> CreateLocalPlan() override { return inner_->CreateLocalPlan(); }
  Result<GlobalSavePlan> CreateGlobalPlan(std::vector<SavePlan> p) override {
    return inner_->CreateGlobalPlan(std::move(p));
  }
  Result<SavePlan> FinishPlan(SavePlan p) override { return inner_->FinishPlan(std::move(p)); }
  Result<ResolvedData> ResolveData(const WriteItem& item) override {
    if (rank_ == 1) throw std::runtime_error("rank one exploded");
    return inner_->ResolveData(item);
  }

 private:
  std::unique_ptr<SavePlanner> inner_;
  int rank_;
};

TEST(DcpMpi, ThrowOnOneRankFailsEveryRank) {
  auto g = Group();
  ASSERT_TRUE(g);
  SharedDir dir(*g);
  auto spec = synthetic::MakeSpec(79, 100 << 10);
  auto sd = synthetic::BuildRankState(spec, g->world_size(), g->rank(), 0, true);
  ASSERT_TRUE(sd.ok());
  ThrowOnRank1 planner(g->rank());
  SaveOptions so;
  so.planner = &planner;
  Status s = Save(*sd, *NewFileSystemWriter(dir.path("t")), g.get(), so);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("rank 1: "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank one exploded"), std::string::npos) << s.message();
  EXPECT_TRUE(g->Barrier().ok());
  EXPECT_FALSE(fs::exists(dir.path("t") + "/.metadata"));
}

TEST(DcpMpi, MissingAndCorruptFilesFailEveryRank) {
  auto g = Group();
  ASSERT_TRUE(g);
  SharedDir dir(*g);
  const int world = g->world_size();
  auto spec = synthetic::MakeSpec(80, 200 << 10);
  const std::string ckpt = dir.path("c");
  {
    auto sd = synthetic::BuildRankState(spec, world, g->rank(), 0, true);
    ASSERT_TRUE(Save(*sd, *NewFileSystemWriter(ckpt), g.get()).ok());
  }
  auto load = [&]() {
    auto sd = synthetic::BuildRankState(spec, world, g->rank(), 1, false);
    return Load(*sd, *NewFileSystemReader(ckpt), g.get());
  };
  // A data file written by the last rank disappears.
  std::string victim;
  if (g->rank() == 0) {
    for (auto& e : fs::directory_iterator(ckpt)) {
      if (e.path().extension() == ".distcp") victim = std::max(victim, e.path().string());
    }
    fs::rename(victim, victim + ".hidden");
  }
  ASSERT_TRUE(g->Barrier().ok());
  Status s = load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("is missing"), std::string::npos) << s.message();
  ASSERT_TRUE(g->Barrier().ok());
  if (g->rank() == 0) {
    fs::rename(victim + ".hidden", victim);
    std::ofstream(ckpt + "/.metadata", std::ios::trunc) << "not json";
  }
  ASSERT_TRUE(g->Barrier().ok());
  s = load();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(".metadata"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace megackpt::dcp
