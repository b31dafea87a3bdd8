// MegaStorageWriter's file layout (docs/mega-storage.md §1, Naming): without an
// fqn_to_index_mapping every rank's items are split over files_per_rank files
// (0 = thread_count), balanced by bytes; an explicit mapping keeps one file per
// bucket per rank; files_per_rank = 1 is the one-file-per-rank layout. Every
// layout round-trips, reshards, rebuilds from headers and verifies.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/test_files.h"
#include "dcp/synthetic.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/mega.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;
using testing::RunThreadRanksForTest;
using testing::ShardsIn;

class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("mega-layout") {}
};

// Rank r holds "r<r>.t0".."r<r>.t3" of 400, 300, 200 and 100 F32 elements
// (value = r * 10000 + tensor * 1000 + element index).
constexpr int kElems[] = {400, 300, 200, 100};

std::string Fqn(int rank, int t) { return "r" + std::to_string(rank) + ".t" + std::to_string(t); }

float Value(int rank, int t, int e) { return static_cast<float>(rank * 10000 + t * 1000 + e); }

StateDict RankState(int rank, bool fill) {
  StateDict sd;
  for (int t = 0; t < 4; ++t) {
    Tensor x = *Tensor::Empty(DType::kF32, {kElems[t]}, true);
    if (fill) {
      for (int e = 0; e < kElems[t]; ++e) static_cast<float*>(x.data())[e] = Value(rank, t, e);
    }
    sd.Set(Fqn(rank, t), x);
  }
  return sd;
}

Status SaveRanks(const std::string& dir, int world, std::optional<FqnToIndexMapping> mapping,
                 MegaStorageWriterOptions o) {
  return RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
    MegaStorageWriter writer(dir, mapping, o);
    return Save(RankState(g.rank(), true), writer, &g);
  });
}

// Loads every rank's tensors into one process and checks every element.
void ExpectAllRanksLoad(const std::string& dir, int saved_world) {
  StateDict sd;
  for (int r = 0; r < saved_world; ++r) {
    for (int t = 0; t < 4; ++t) sd.Set(Fqn(r, t), *Tensor::Empty(DType::kF32, {kElems[t]}, true));
  }
  MegaStorageReader reader(dir);
  Status s = Load(sd, reader);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < saved_world; ++r) {
    for (int t = 0; t < 4; ++t) {
      const float* p = static_cast<const float*>(sd.Find(Fqn(r, t))->tensor().data());
      for (int e = 0; e < kElems[t]; ++e)
        ASSERT_EQ(p[e], Value(r, t, e)) << Fqn(r, t) << "[" << e << "]";
    }
  }
}

// fqn -> the file .metadata names for it.
std::map<std::string, std::string> FileOfFqn(const std::string& dir) {
  auto text = ReadLocalFile(dir + "/.metadata");
  EXPECT_TRUE(text.ok());
  auto md = DecodeMetadata(text.ok() ? *text : "");
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  std::map<std::string, std::string> out;
  if (!md.ok()) return out;
  for (const auto& [key, info] : md->storage_data) out[key.fqn] = info.relative_path;
  return out;
}

// The tensor names of a shard, in file order.
std::vector<std::string> TensorsOf(const std::string& file) {
  auto r = format::MegaReader::OpenFile(file);
  EXPECT_TRUE(r.ok()) << file << ": " << r.status().ToString();
  std::vector<std::string> out;
  if (!r.ok()) return out;
  for (const auto& t : (*r)->tensors()) out.push_back(t.name);
  return out;
}

std::string Numbered(int n, int of) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.mega", n, of);
  return buf;
}

TEST(MegaStorageLayout, DefaultTwoThreadSaveWritesTwoFilesPerRankBalancedByBytes) {
  for (int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    TempDir dir;
    const std::string ckpt = dir.path("c");
    ASSERT_TRUE(SaveRanks(ckpt, world, std::nullopt, {}).ok());  // thread_count 2, files_per_rank 0
    std::vector<std::string> want;
    for (int n = 1; n <= 2 * world; ++n) want.push_back(Numbered(n, 2 * world));
    ASSERT_EQ(ShardsIn(ckpt), want);
    const auto file_of = FileOfFqn(ckpt);
    for (int r = 0; r < world; ++r) {
      // Largest first onto the lightest file: {400, 100} and {300, 200}; each
      // file keeps the plan order. Files are numbered (rank, k).
      const std::string f0 = Numbered(2 * r + 1, 2 * world), f1 = Numbered(2 * r + 2, 2 * world);
      EXPECT_EQ(file_of.at(Fqn(r, 0)), f0);
      EXPECT_EQ(file_of.at(Fqn(r, 3)), f0);
      EXPECT_EQ(file_of.at(Fqn(r, 1)), f1);
      EXPECT_EQ(file_of.at(Fqn(r, 2)), f1);
      EXPECT_EQ(TensorsOf(ckpt + "/" + f0), (std::vector<std::string>{Fqn(r, 0), Fqn(r, 3)}));
      EXPECT_EQ(TensorsOf(ckpt + "/" + f1), (std::vector<std::string>{Fqn(r, 1), Fqn(r, 2)}));
    }
    // The index lists every file.
    auto idx = format::ReadShardIndexFile(ckpt + "/model.mega.index.json");
    ASSERT_TRUE(idx.ok()) << idx.status().ToString();
    std::set<std::string> indexed;
    for (const auto& [fqn, f] : idx->weight_map) indexed.insert(f);
    EXPECT_EQ(indexed, std::set<std::string>(want.begin(), want.end()));
    ExpectAllRanksLoad(ckpt, world);
  }
}

TEST(MegaStorageLayout, FilesPerRankFollowsTheKnobAndTheItemCount) {
  TempDir dir;
  MegaStorageWriterOptions o;
  o.files_per_rank = 3;  // more files than threads: still one task per file
  ASSERT_TRUE(SaveRanks(dir.path("three"), 1, std::nullopt, o).ok());
  EXPECT_EQ(ShardsIn(dir.path("three")),
            (std::vector<std::string>{Numbered(1, 3), Numbered(2, 3), Numbered(3, 3)}));
  // 400 | 300 | 200 + 100.
  EXPECT_EQ(TensorsOf(dir.path("three/") + Numbered(3, 3)),
            (std::vector<std::string>{Fqn(0, 2), Fqn(0, 3)}));
  ExpectAllRanksLoad(dir.path("three"), 1);
  // Never more files than items; automatic follows thread_count.
  o.files_per_rank = 0;
  o.thread_count = 8;
  ASSERT_TRUE(SaveRanks(dir.path("auto8"), 1, std::nullopt, o).ok());
  EXPECT_EQ(ShardsIn(dir.path("auto8")).size(), 4u);
  ExpectAllRanksLoad(dir.path("auto8"), 1);
}

TEST(MegaStorageLayout, FilesPerRankOneIsOneFilePerRank) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  MegaStorageWriterOptions o;
  o.files_per_rank = 1;
  ASSERT_TRUE(SaveRanks(ckpt, 2, std::nullopt, o).ok());
  ASSERT_EQ(ShardsIn(ckpt), (std::vector<std::string>{Numbered(1, 2), Numbered(2, 2)}));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(TensorsOf(ckpt + "/" + Numbered(r + 1, 2)),
              (std::vector<std::string>{Fqn(r, 0), Fqn(r, 1), Fqn(r, 2), Fqn(r, 3)}));
  }
  ExpectAllRanksLoad(ckpt, 2);
  // One rank, one file: model.mega.
  ASSERT_TRUE(SaveRanks(dir.path("one"), 1, std::nullopt, o).ok());
  EXPECT_EQ(ShardsIn(dir.path("one")), std::vector<std::string>{"model.mega"});
}

TEST(MegaStorageLayout, ExplicitMappingKeepsOneFilePerBucketPerRank) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  FqnToIndexMapping mapping;
  for (int r = 0; r < 2; ++r) {
    mapping[Fqn(r, 0)] = 1;
    mapping[Fqn(r, 1)] = 1;
    mapping[Fqn(r, 2)] = 2;
    mapping[Fqn(r, 3)] = 2;
  }
  MegaStorageWriterOptions o;
  o.thread_count = 4;
  o.files_per_rank = 4;  // ignored with a mapping
  ASSERT_TRUE(SaveRanks(ckpt, 2, mapping, o).ok());
  ASSERT_EQ(ShardsIn(ckpt), (std::vector<std::string>{Numbered(1, 4), Numbered(2, 4),
                                                      Numbered(3, 4), Numbered(4, 4)}));
  // (bucket, rank) order: b1 r0, b1 r1, b2 r0, b2 r1.
  EXPECT_EQ(TensorsOf(ckpt + "/" + Numbered(1, 4)),
            (std::vector<std::string>{Fqn(0, 0), Fqn(0, 1)}));
  EXPECT_EQ(TensorsOf(ckpt + "/" + Numbered(2, 4)),
            (std::vector<std::string>{Fqn(1, 0), Fqn(1, 1)}));
  EXPECT_EQ(TensorsOf(ckpt + "/" + Numbered(3, 4)),
            (std::vector<std::string>{Fqn(0, 2), Fqn(0, 3)}));
  EXPECT_EQ(TensorsOf(ckpt + "/" + Numbered(4, 4)),
            (std::vector<std::string>{Fqn(1, 2), Fqn(1, 3)}));
  ExpectAllRanksLoad(ckpt, 2);
}

// The synthetic spec (sharded tensors, uneven chunks, bytes values) over the
// multi-file layout: resharded loads at other world sizes, Metadata rebuilt
// from the shard headers alone, every checksum verified.
TEST(MegaStorageLayout, MultiFileLayoutReshardsRebuildsAndVerifies) {
  for (auto [world, files] : std::vector<std::pair<int, int>>{{1, 3}, {2, 0}, {2, 3}}) {
    SCOPED_TRACE("world " + std::to_string(world) + " files_per_rank " + std::to_string(files));
    TempDir dir;
    const std::string ckpt = dir.path("c");
    auto spec = synthetic::MakeSpec(77 + world + files, 300 << 10);
    MegaStorageWriterOptions o;
    o.files_per_rank = files;
    Status s = RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
      MegaStorageWriter writer(ckpt, std::nullopt, o);
      return testing::SaveSyntheticRank(spec, writer, &g);
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    const size_t per_rank = files == 0 ? 2 : static_cast<size_t>(files);
    EXPECT_GE(ShardsIn(ckpt).size(), per_rank * world);
    // No file holds two pieces of one fqn.
    for (const auto& f : ShardsIn(ckpt)) {
      auto names = TensorsOf(ckpt + "/" + f);
      EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << f;
    }
    for (auto [lw, variant] : std::vector<std::pair<int, int>>{{1, 0}, {2, 1}, {3, 4}}) {
      s = RunThreadRanksForTest(lw, [&](dist::ProcessGroup& g) -> Status {
        MegaStorageReader reader(ckpt);
        return testing::LoadAndVerifySyntheticRank(spec, reader, &g, variant);
      });
      EXPECT_TRUE(s.ok()) << "load at " << lw << " variant " << variant << ": " << s.ToString();
    }
    EXPECT_TRUE(VerifyMegaCheckpoint(ckpt).ok());
    auto rebuilt = RebuildMetadataFromShards(ckpt);
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
    // Without .metadata the reader rebuilds it from the index and headers.
    stdfs::remove(ckpt + "/.metadata");
    s = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
      MegaStorageReader reader(ckpt);
      Status st = testing::LoadAndVerifySyntheticRank(spec, reader, &g, 2);
      if (st.ok() && reader.source() != CheckpointSource::kMegaShardHeaders) {
        return InternalError("expected metadata rebuilt from shard headers");
      }
      return st;
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

}  // namespace
}  // namespace megackpt::dcp
