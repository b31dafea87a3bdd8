// MegaStorageWriter/Reader under mpirun (tests/cmake/dcp.cmake; main() in
// tests/dist_mpi_gtest_main.cc): every MPI rank saves its part, the checkpoint is
// loaded back resharded (MPI ranks with another layout, and one process), with
// and without an fqn_to_index_mapping; consolidation runs collectively.
#include <gtest/gtest.h>
#include <unistd.h>

#include <optional>

#include "dcp/synthetic.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/index_file.h"

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
                     std::optional<FqnToIndexMapping> mapping, MegaStorageWriterOptions o = {}) {
  MegaStorageWriter writer(dir, std::move(mapping), o);
  return testing::SaveSyntheticRank(spec, writer, &g);
}

Status LoadOnRanks(dist::ProcessGroup& g, const synthetic::Spec& spec, const std::string& dir,
                   int variant) {
  MegaStorageReader reader(dir);
  return testing::LoadAndVerifySyntheticRank(spec, reader, &g, variant);
}

Status LoadInOneProcess(const synthetic::Spec& spec, const std::string& dir, int variant) {
  MegaStorageReader reader(dir);
  return testing::LoadAndVerifySyntheticRank(spec, reader, nullptr, variant);
}

// Every test: the MPI group and a folder all its ranks share, with the
// checkpoint at ckpt_.
class MegaStorageMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    g_ = NewGroup();
    ASSERT_NE(g_, nullptr);
    dir_.emplace(*g_);
    ckpt_ = dir_->path("c");
  }

  // Saves `spec` at ckpt_ from every rank (a MegaStorageWriter with `mapping`
  // and `o`), then loads it back on every rank at layout `variant`. A save
  // that fails on any rank is a fatal failure (on every rank).
  void SaveThenLoadOnRanks(const synthetic::Spec& spec,
                           const std::optional<FqnToIndexMapping>& mapping,
                           const MegaStorageWriterOptions& o, int variant) {
    Status s = All(*g_, SaveFromRanks(*g_, spec, ckpt_, mapping, o));
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = All(*g_, LoadOnRanks(*g_, spec, ckpt_, variant));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }

  std::unique_ptr<dist::ProcessGroup> g_;
  std::optional<SharedDir> dir_;  // declared after g_: removed before the group goes
  std::string ckpt_;
};

TEST_F(MegaStorageMpi, SaveAndReshardedLoadWithoutMapping) {
  auto spec = synthetic::MakeSpec(301, 400 << 10);
  ASSERT_NO_FATAL_FAILURE(SaveThenLoadOnRanks(spec, std::nullopt, {}, 3));
  if (g_->rank() == 0) {
    EXPECT_TRUE(LoadInOneProcess(spec, ckpt_, 1).ok());
    // The index covers every rank's items.
    auto idx = format::ReadShardIndexFile(ckpt_ + "/model.mega.index.json");
    ASSERT_TRUE(idx.ok());
    // Default layout: thread_count (2) files per rank.
    EXPECT_GE(testing::ShardsIn(ckpt_).size(), 2u * static_cast<size_t>(g_->world_size()));
  }
}

// files_per_rank = 1 over MPI: one file per rank (and one more per extra chunk
// of an fqn a rank holds twice), still resharding.
TEST_F(MegaStorageMpi, OneFilePerRankLayout) {
  auto spec = synthetic::MakeSpec(303, 400 << 10);
  MegaStorageWriterOptions o;
  o.files_per_rank = 1;
  ASSERT_NO_FATAL_FAILURE(SaveThenLoadOnRanks(spec, std::nullopt, o, 1));
  if (g_->rank() == 0) {
    EXPECT_TRUE(LoadInOneProcess(spec, ckpt_, 2).ok());
    EXPECT_GE(testing::ShardsIn(ckpt_).size(), static_cast<size_t>(g_->world_size()));
    EXPECT_LT(testing::ShardsIn(ckpt_).size(), 2u * static_cast<size_t>(g_->world_size()) + 2);
  }
}

TEST_F(MegaStorageMpi, SaveWithMappingThenCollectiveConsolidation) {
  auto spec = synthetic::MakeSpec(302, 400 << 10);
  FqnToIndexMapping mapping = testing::RoundRobinMapping(spec, 3);
  ASSERT_NO_FATAL_FAILURE(SaveThenLoadOnRanks(spec, mapping, {}, 2));
  ConsolidateOptions o;
  o.fqn_to_index_mapping = mapping;
  const std::string whole = dir_->path("whole");
  auto r = Consolidate(ckpt_, whole, o, g_.get());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files.size(), 3u);
  Status s = All(*g_, LoadOnRanks(*g_, spec, whole, 4));
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (g_->rank() == 0) {
    auto idx = format::ReadShardIndexFile(whole + "/model.mega.index.json");
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
