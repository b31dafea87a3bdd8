// MegaStorageWriter/Reader under mpirun (tests/cmake/dcp.cmake; main() in
// tests/dist_mpi_gtest_main.cc): every MPI rank saves its part, the checkpoint is
// loaded back resharded (MPI ranks with another layout, and one process), with
// and without an fqn_to_index_mapping; consolidation runs collectively.
#include <gtest/gtest.h>
#include <unistd.h>

#include "dcp/synthetic.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/format/index_file.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dcp {
namespace {

std::unique_ptr<dist::ProcessGroup> NewGroup() { return testing::NewMpiGroupForTest(); }

// A folder created by rank 0 and known to all; removed by rank 0 at the end.
class SharedDir : public testing::SharedDir {
 public:
  explicit SharedDir(dist::ProcessGroup& g) : testing::SharedDir(g, "mega-mpi") {}
};

// Every rank's verdict, combined.
Status All(dist::ProcessGroup& g, const Status& s) { return g.AllReduceStatus(s); }

Status SaveFromRanks(dist::ProcessGroup& g, const synthetic::Spec& spec, const std::string& dir,
                     std::optional<FqnToIndexMapping> mapping) {
  MegaStorageWriter writer(dir, std::move(mapping));
  return testing::SaveSyntheticRank(spec, writer, &g);
}

Status LoadOnRanks(dist::ProcessGroup& g, const synthetic::Spec& spec, const std::string& dir, int variant) {
  MegaStorageReader reader(dir);
  return testing::LoadAndVerifySyntheticRank(spec, reader, &g, variant);
}

Status LoadInOneProcess(const synthetic::Spec& spec, const std::string& dir, int variant) {
  MegaStorageReader reader(dir);
  return testing::LoadAndVerifySyntheticRank(spec, reader, nullptr, variant);
}

TEST(MegaStorageMpi, SaveAndReshardedLoadWithoutMapping) {
  auto g = NewGroup();
  ASSERT_NE(g, nullptr);
  SharedDir dir(*g);
  auto spec = synthetic::MakeSpec(301, 400 << 10);
  const std::string ckpt = dir.path("c");
  Status s = All(*g, SaveFromRanks(*g, spec, ckpt, std::nullopt));
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = All(*g, LoadOnRanks(*g, spec, ckpt, 3));
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (g->rank() == 0) {
    EXPECT_TRUE(LoadInOneProcess(spec, ckpt, 1).ok());
    // The index covers every rank's items.
    auto idx = format::ReadShardIndexFile(ckpt + "/model.mega.index.json");
    ASSERT_TRUE(idx.ok());
    // Default layout: thread_count (2) files per rank.
    EXPECT_GE(testing::ShardsIn(ckpt).size(), 2u * static_cast<size_t>(g->world_size()));
  }
}

// files_per_rank = 1 over MPI: one file per rank (and one more per extra chunk
// of an fqn a rank holds twice), still resharding.
TEST(MegaStorageMpi, OneFilePerRankLayout) {
  auto g = NewGroup();
  ASSERT_NE(g, nullptr);
  SharedDir dir(*g);
  auto spec = synthetic::MakeSpec(303, 400 << 10);
  const std::string ckpt = dir.path("c");
  MegaStorageWriterOptions o;
  o.files_per_rank = 1;
  MegaStorageWriter writer(ckpt, std::nullopt, o);
  Status s = All(*g, testing::SaveSyntheticRank(spec, writer, g.get()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = All(*g, LoadOnRanks(*g, spec, ckpt, 1));
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (g->rank() == 0) {
    EXPECT_TRUE(LoadInOneProcess(spec, ckpt, 2).ok());
    EXPECT_GE(testing::ShardsIn(ckpt).size(), static_cast<size_t>(g->world_size()));
    EXPECT_LT(testing::ShardsIn(ckpt).size(), 2u * static_cast<size_t>(g->world_size()) + 2);
  }
}

TEST(MegaStorageMpi, SaveWithMappingThenCollectiveConsolidation) {
  auto g = NewGroup();
  ASSERT_NE(g, nullptr);
  SharedDir dir(*g);
  auto spec = synthetic::MakeSpec(302, 400 << 10);
  FqnToIndexMapping mapping = testing::RoundRobinMapping(spec, 3);
  const std::string ckpt = dir.path("c");
  Status s = All(*g, SaveFromRanks(*g, spec, ckpt, mapping));
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = All(*g, LoadOnRanks(*g, spec, ckpt, 2));
  EXPECT_TRUE(s.ok()) << s.ToString();
  ConsolidateOptions o;
  o.fqn_to_index_mapping = mapping;
  auto r = Consolidate(ckpt, dir.path("whole"), o, g.get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files.size(), 3u);
  s = All(*g, LoadOnRanks(*g, spec, dir.path("whole"), 4));
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (g->rank() == 0) {
    auto idx = format::ReadShardIndexFile(dir.path("whole/model.mega.index.json"));
    ASSERT_TRUE(idx.ok());
    EXPECT_EQ(idx->weight_map.size(), spec.entries.size());
    for (const auto& e : spec.entries) {
      EXPECT_EQ(idx->weight_map.at(e.fqn),
                "model-0000" + std::to_string(mapping.at(e.fqn)) + "-of-00003.mega");
    }
  }
}

}  // namespace
}  // namespace megackpt::dcp
