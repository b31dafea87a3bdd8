// Distributed checkpoints under mpirun (tests/cmake/dcp.cmake runs this with 2
// and 4 ranks): save from every MPI rank, load back resharded through MPI and
// at other world sizes through the threads backend, and faults that must reach
// every rank as the same clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dcp/synthetic.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;

using testing::ThrowingSavePlanner;

// Every test: a fresh MPI group of all ranks and a folder they share (rank 0
// creates it and removes it at the end).
class DcpMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    g = testing::NewMpiGroupForTest();
    ASSERT_TRUE(g);
    dir = std::make_unique<testing::SharedDir>(*g, "dcp-mpi");
  }

  std::unique_ptr<dist::ProcessGroup> g;
  std::unique_ptr<testing::SharedDir> dir;  // destroyed before the group
};

TEST_F(DcpMpi, SaveThenResharedLoads) {
  auto spec = synthetic::MakeSpec(77, 700 << 10);
  const std::string ckpt = dir->path("c");
  {
    Status s = testing::SaveSyntheticRank(spec, *NewFileSystemWriter(ckpt), g.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Same world size through MPI, every tensor in another layout.
  for (int variant : {1, 3}) {
    Status s =
        testing::LoadAndVerifySyntheticRank(spec, *NewFileSystemReader(ckpt), g.get(), variant);
    ASSERT_TRUE(s.ok()) << "variant " << variant << ": " << s.ToString();
  }
  // Other world sizes: rank 0 loads with 1..4 threads ranks.
  if (g->rank() == 0) {
    for (int load_world : {1, 2, 3, 4}) {
      auto results = dist::RunThreadRanks(load_world, [&](dist::ProcessGroup& tg) -> Status {
        return testing::LoadAndVerifySyntheticRank(spec, *NewFileSystemReader(ckpt), &tg, 2);
      });
      for (const Status& s : results)
        EXPECT_TRUE(s.ok()) << "load world " << load_world << ": " << s.ToString();
    }
  }
}

TEST_F(DcpMpi, AsyncSaveThenLoad) {
  const int world = g->world_size();
  auto spec = synthetic::MakeSpec(78, 300 << 10);
  auto sd = synthetic::BuildRankState(spec, world, g->rank(), 0, true);
  ASSERT_TRUE(sd.ok());
  AsyncSaveOptions opts;
  opts.pool = StagingPool::Create(100 << 10);
  AsyncSaveHandle h = AsyncSave(*sd, NewFileSystemWriter(dir->path("a")), g.get(), opts);
  ASSERT_TRUE(h.staged.get().ok());
  Status done = h.done.get();
  ASSERT_TRUE(done.ok()) << done.ToString();
  Status loaded =
      testing::LoadAndVerifySyntheticRank(spec, *NewFileSystemReader(dir->path("a")), g.get(), 5);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
}

TEST_F(DcpMpi, ThrowOnOneRankFailsEveryRank) {
  auto spec = synthetic::MakeSpec(79, 100 << 10);
  auto sd = synthetic::BuildRankState(spec, g->world_size(), g->rank(), 0, true);
  ASSERT_TRUE(sd.ok());
  ThrowingSavePlanner planner(g->rank() == 1, "rank one exploded");
  SaveOptions so;
  so.planner = &planner;
  Status s = Save(*sd, *NewFileSystemWriter(dir->path("t")), g.get(), so);
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_NE(s.message().find("rank 1: "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rank one exploded"), std::string::npos) << s.message();
  EXPECT_TRUE(g->Barrier().ok());
  EXPECT_FALSE(stdfs::exists(dir->path("t") + "/.metadata"));
}

TEST_F(DcpMpi, MissingAndCorruptFilesFailEveryRank) {
  const int world = g->world_size();
  auto spec = synthetic::MakeSpec(80, 200 << 10);
  const std::string ckpt = dir->path("c");
  ASSERT_TRUE(testing::SaveSyntheticRank(spec, *NewFileSystemWriter(ckpt), g.get()).ok());
  auto load = [&]() {
    auto sd = synthetic::BuildRankState(spec, world, g->rank(), 1, false);
    return Load(*sd, *NewFileSystemReader(ckpt), g.get());
  };
  // A data file written by the last rank disappears.
  std::string victim;
  if (g->rank() == 0) {
    for (auto& e : stdfs::directory_iterator(ckpt)) {
      if (e.path().extension() == ".distcp") victim = std::max(victim, e.path().string());
    }
    stdfs::rename(victim, victim + ".hidden");
  }
  ASSERT_TRUE(g->Barrier().ok());
  Status s = load();
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find("is missing"), std::string::npos) << s.message();
  ASSERT_TRUE(g->Barrier().ok());
  if (g->rank() == 0) {
    stdfs::rename(victim + ".hidden", victim);
    std::ofstream(ckpt + "/.metadata", std::ios::trunc) << "not json";
  }
  ASSERT_TRUE(g->Barrier().ok());
  s = load();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(".metadata"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace megackpt::dcp
