// MegaStorageWriter / MegaStorageReader end to end (threads backend): resharded
// round trips with and without a mapping, one test per seed defect of
// spec/dcp.md §4, commit failures, corruption, Hugging Face layouts,
// consolidation (+ an independent safetensors reader in Python) and the CLI.
#include "megackpt/dcp/mega_storage.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "core/test_files.h"
#include "dcp/synthetic.h"
#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/dcp/storage_factory.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/mega_encoder.h"  // MegaBlockSizeFor
#include "megackpt/format/safetensors.h"
#include "test_util.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

using test_util::RunCommand;
using test_util::RunMegackpt;
using testing::FilesIn;
using testing::RoundRobinMapping;
using testing::RunThreadRanksForTest;
using testing::ShardsIn;

// A fresh folder, removed at the end.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("mega-storage") {}
};

using WriterFactory = std::function<std::unique_ptr<StorageWriter>(int rank)>;

WriterFactory MegaWriterAt(const std::string& dir, std::optional<FqnToIndexMapping> mapping = {},
                           MegaStorageWriterOptions o = {}) {
  return [=](int) { return std::make_unique<MegaStorageWriter>(dir, mapping, o); };
}

// A `dtype` tensor of `shape` whose element i is start + step * i, stored as a
// T (the C++ type of dtype's elements).
template <typename T>
Result<Tensor> Ramp(DType dtype, Shape shape, double start, double step = 1) {
  MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(dtype, std::move(shape)));
  T* p = static_cast<T*>(t.data());
  for (uint64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<T>(start + step * static_cast<double>(i));
  return t;
}

// A ShardedTensor of `global` (of `shard`'s dtype) whose only local shard is
// `shard` at `offsets` (the same tensor: a load writes into `shard`).
ShardedTensor OneShard(Shape global, Shape offsets, Tensor shard) {
  const DType dtype = shard.dtype();
  return ShardedTensor{dtype, std::move(global), {Shard{std::move(offsets), std::move(shard)}}};
}

Status SaveSynthetic(const synthetic::Spec& spec, int world, const WriterFactory& make,
                     int variant = 0) {
  return RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
    auto writer = make(g.rank());
    return testing::SaveSyntheticRank(spec, *writer, &g, variant);
  });
}

// Loads at `world` with layout `variant` and verifies every rank's bytes.
Status LoadSynthetic(const synthetic::Spec& spec, const std::string& path, int world, int variant,
                     MegaStorageReaderOptions o = {}) {
  return RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
    MegaStorageReader reader(path, o);
    return testing::LoadAndVerifySyntheticRank(spec, reader, &g, variant);
  });
}

format::ShardIndex ReadIndex(const std::string& path) {
  auto idx = format::ReadShardIndexFile(path);
  EXPECT_TRUE(idx.ok()) << idx.status().ToString();
  return idx.ok() ? *idx : format::ShardIndex();
}

// Every fqn of `spec`.
std::set<std::string> SpecFqns(const synthetic::Spec& spec) {
  std::set<std::string> out;
  for (const auto& e : spec.entries) out.insert(e.fqn);
  return out;
}

// fqns covered by an index (weight_map + tensorplay.dcp.sharded).
std::set<std::string> IndexFqns(const format::ShardIndex& idx) {
  std::set<std::string> out;
  for (const auto& [fqn, f] : idx.weight_map) out.insert(fqn);
  auto it = idx.extra_fields.find(std::string(kDcpIndexShardedKey));
  if (it != idx.extra_fields.end()) {
    json j = json::parse(it->second);
    for (auto e = j.begin(); e != j.end(); ++e) out.insert(e.key());
  }
  return out;
}

// Names are model-0000k-of-0000M.mega for k = 1..M, M = the number of files.
void ExpectGloballyNumbered(const std::vector<std::string>& shards) {
  ASSERT_GE(shards.size(), 2u);
  for (size_t i = 0; i < shards.size(); ++i) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.mega", i + 1, shards.size());
    EXPECT_EQ(shards[i], want);
  }
}

std::string Slurp(const std::string& path) { return *ReadLocalFile(path); }

// The path of the shard of `dir` that stores a tensor named `fqn` ("" if none).
std::string ShardHolding(const std::string& dir, const std::string& fqn) {
  for (const auto& f : ShardsIn(dir)) {
    auto r = format::MegaReader::OpenFile(dir + "/" + f);
    if (r.ok() && (*r)->Find(fqn) != nullptr) return dir + "/" + f;
  }
  return "";
}

void FlipByte(const std::string& path, uint64_t offset) {
  ::megackpt::test_util::XorFileByte(path, offset, 0x5A);
}

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

TEST(MegaStorage, ReshardRoundTripWithoutMapping) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(11, 300 << 10);
  const std::string ckpt = dir.path("c");
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(ckpt)).ok());
  // One file per rank, plus one per extra chunk of a tensor a rank holds twice
  // (uneven layouts): model-0000k-of-0000M.mega for k = 1..M.
  ExpectGloballyNumbered(ShardsIn(ckpt));
  for (auto [world, variant] : std::vector<std::pair<int, int>>{{1, 0}, {3, 1}, {2, 4}, {4, 2}}) {
    Status s = LoadSynthetic(spec, ckpt, world, variant);
    EXPECT_TRUE(s.ok()) << "load at " << world << " variant " << variant << ": " << s.ToString();
  }
}

// MegaStorageWriterOptions::direct_io: the shards skip the page cache and
// hold the bytes a buffered save writes (the synthetic spec's tensors have odd sizes, so the direct
// writer meets partial blocks and sources off the 4 KiB grid): the same
// header length and the same payload bytes after it (the headers differ in
// the save id and so in their CRC; a load checks them), and load back
// verified at another world size.
TEST(MegaStorage, DirectIoSaveWritesTheSameShards) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(13, 700 << 10);
  MegaStorageWriterOptions direct;
  direct.direct_io = true;
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("buffered"))).ok());
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("direct"), {}, direct)).ok());
  testing::ExpectSavedAroundThePageCache(dir.path("direct"), dir.path("buffered"), ".mega");
  const auto shards = ShardsIn(dir.path("buffered"));
  ASSERT_FALSE(shards.empty());
  ASSERT_EQ(ShardsIn(dir.path("direct")), shards);
  for (const std::string& name : shards) {
    const std::string a = test_util::ReadFileOrEmpty(dir.path("buffered") + "/" + name);
    const std::string b = test_util::ReadFileOrEmpty(dir.path("direct") + "/" + name);
    auto ra = format::MegaReader::OpenFile(dir.path("buffered") + "/" + name);
    auto rb = format::MegaReader::OpenFile(dir.path("direct") + "/" + name);
    ASSERT_TRUE(ra.ok() && rb.ok()) << name;
    const uint64_t header = (*ra)->header_length();
    EXPECT_EQ((*rb)->header_length(), header) << name;
    EXPECT_EQ(a.size(), b.size()) << name;
    EXPECT_TRUE(a.size() >= header && a.compare(header, std::string::npos, b, header) == 0)
        << name << ": the payload differs from the buffered save's";
  }
  Status s = LoadSynthetic(spec, dir.path("direct"), 3, 1);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST(MegaStorage, ReshardRoundTripWithMapping) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(12, 300 << 10);
  const std::string ckpt = dir.path("c");
  ASSERT_TRUE(SaveSynthetic(spec, 3, MegaWriterAt(ckpt, RoundRobinMapping(spec, 4))).ok());
  for (auto [world, variant] : std::vector<std::pair<int, int>>{{1, 3}, {2, 1}, {3, 5}}) {
    Status s = LoadSynthetic(spec, ckpt, world, variant);
    EXPECT_TRUE(s.ok()) << "load at " << world << " variant " << variant << ": " << s.ToString();
  }
}

// The shards' directory entries go out before their bytes (WriteOutNewEntries),
// at every world size: each rank syncs the folder after creating its shards.
TEST(MegaStorage, FolderIsSyncedAfterCreatingTheShardsAndBeforeWritingThem) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(6, 1 << 20);
  for (int world : {1, 2}) {
    const std::string path = dir.path() + "/ckpt" + std::to_string(world);
    std::vector<std::shared_ptr<testing::InstrumentedFileSystem>> recording(world);
    for (auto& r : recording) r = std::make_shared<testing::InstrumentedFileSystem>();
    Status s = SaveSynthetic(spec, world, [&](int rank) {
      MegaStorageWriterOptions o;
      o.fs = recording[rank];
      o.sync = false;
      o.thread_count = 2;
      return std::make_unique<MegaStorageWriter>(path, std::nullopt, o);
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(testing::CheckEntriesWrittenOutBeforeData(recording[r]->Events(),
                                                          "ckpt" + std::to_string(world), ".mega"),
                "")
          << "world " << world << ", rank " << r;
    }
  }
}

TEST(MegaStorage, FactoryBuildsMegaBackend) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(13, 64 << 10);
  auto w = MakeStorageWriter("mega", dir.path("c"));
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(SaveSynthetic(spec, 1, [&](int) {
                return std::move(*MakeStorageWriter("mega", dir.path("c")));
              }).ok());
  auto r = MakeStorageReader("mega", dir.path("c"));
  ASSERT_TRUE(r.ok());
  auto md = (*r)->ReadMetadata();
  EXPECT_TRUE(md.ok()) << md.status().ToString();
}

TEST(MegaStorage, ResaveSamePathLeavesOnlyTheNewCheckpoint) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  auto a = synthetic::MakeSpec(21, 200 << 10);
  auto b = synthetic::MakeSpec(22, 150 << 10);
  ASSERT_TRUE(SaveSynthetic(a, 2, MegaWriterAt(ckpt)).ok());
  auto first = ShardsIn(ckpt);
  ASSERT_TRUE(SaveSynthetic(b, 3, MegaWriterAt(ckpt)).ok());
  auto second = ShardsIn(ckpt);
  ASSERT_TRUE(LoadSynthetic(b, ckpt, 2, 1).ok());
  // The first save's files are gone; the second's are exactly the index's.
  for (const auto& f : first) EXPECT_EQ(std::count(second.begin(), second.end(), f), 0) << f;
  format::ShardIndex idx = ReadIndex(ckpt + "/model.mega.index.json");
  std::set<std::string> referenced;
  auto md = MegaStorageReader(ckpt).ReadMetadata();
  ASSERT_TRUE(md.ok());
  for (const auto& [k, info] : md->storage_data) referenced.insert(info.relative_path);
  EXPECT_EQ(std::set<std::string>(second.begin(), second.end()), referenced);
  // A third save returns to plain names (the id-named ones are taken, plain are free).
  ASSERT_TRUE(SaveSynthetic(a, 2, MegaWriterAt(ckpt)).ok());
  EXPECT_EQ(ShardsIn(ckpt), first);
  EXPECT_TRUE(LoadSynthetic(a, ckpt, 1, 0).ok());
  // No temp files left anywhere.
  for (const auto& f : FilesIn(ckpt)) EXPECT_EQ(f.find(".tmp."), std::string::npos) << f;
}

TEST(MegaStorage, AsyncSaveInWavesSplitsShardsAcrossWriteDataCalls) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(31, 400 << 10);
  const std::string ckpt = dir.path("a");
  Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, 2, g.rank(), 0, true));
    AsyncSaveOptions opts;
    opts.pool = StagingPool::Create(48 << 10);  // far smaller than a shard: many waves
    AsyncSaveHandle h = AsyncSave(sd, std::make_shared<MegaStorageWriter>(ckpt), &g, opts);
    MEGA_RETURN_IF_ERROR(h.staged.get());
    return h.done.get();
  });
  ASSERT_TRUE(ranks.ok()) << ranks.ToString();
  ExpectGloballyNumbered(ShardsIn(ckpt));
  Status s = LoadSynthetic(spec, ckpt, 3, 2);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A state of 64 MiB or more is staged whole with streaming stores, in byte
// ranges that need not be 16-byte aligned (odd tensor sizes): the save holds the
// caller's bytes as they were when `staged` was set, though the caller then
// overwrites every tensor.
TEST(MegaStorage, AsyncSaveOfALargeStateStagesExactBytes) {
  TempDir dir;
  const std::string ckpt = dir.path("a");
  const std::vector<std::pair<std::string, int64_t>> sizes = {
      {"big", (64 << 20) + 3}, {"odd", 4099}, {"tiny", 5}, {"second", (3 << 20) + 17}};
  StateDict sd, want;
  std::mt19937_64 rng(42);
  for (const auto& [name, n] : sizes) {
    Tensor t = *Tensor::Empty(DType::kU8, {n});
    Tensor copy = *Tensor::Empty(DType::kU8, {n});
    auto* p = static_cast<uint8_t*>(t.data());
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(rng() >> 56);
    std::memcpy(copy.data(), t.data(), static_cast<size_t>(n));
    sd.Set(name, StateValue(t));
    want.Set(name, StateValue(copy));
  }
  AsyncSaveOptions opts;
  opts.pool = StagingPool::Create(80 << 20);  // the whole state fits: staged before the save
  AsyncSaveHandle h = AsyncSave(sd, std::make_shared<MegaStorageWriter>(ckpt), nullptr, opts);
  ASSERT_TRUE(h.staged.get().ok());
  for (const auto& [name, n] : sizes)
    std::memset(sd.Find(name)->tensor().data(), 0xAB, static_cast<size_t>(n));
  Status done = h.done.get();
  ASSERT_TRUE(done.ok()) << done.ToString();
  StateDict loaded;
  for (const auto& [name, n] : sizes) loaded.Set(name, StateValue(*Tensor::Empty(DType::kU8, {n})));
  MegaStorageReader reader(ckpt);
  Status s = Load(loaded, reader);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const auto& [name, n] : sizes) {
    EXPECT_TRUE(TensorBytesEqual(loaded.Find(name)->tensor(), want.Find(name)->tensor())) << name;
  }
}

// A filesystem whose files only append (like an upload stream).
class SequentialOnlyFs : public testing::InstrumentedFileSystem {
 public:
  fs::FileSystemCapabilities capabilities() const override {
    fs::FileSystemCapabilities c = InstrumentedFileSystem::capabilities();
    c.positioned_writes = false;
    return c;
  }
  Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(auto f, InstrumentedFileSystem::OpenForWrite(path));
    return std::unique_ptr<WritableFile>(new Sequential(std::move(f)));
  }

 private:
  class Sequential : public WritableFile {
   public:
    explicit Sequential(std::unique_ptr<WritableFile> f) : f_(std::move(f)) {}
    const std::string& name() const override { return f_->name(); }
    Status Append(std::span<const std::byte> d) override { return f_->Append(d); }
    uint64_t size() const override { return f_->size(); }
    Status Sync() override { return f_->Sync(); }
    Status Close() override { return f_->Close(); }

   private:
    std::unique_ptr<WritableFile> f_;
  };
};

TEST(MegaStorage, SequentialSinkWritesTheSameShards) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(32, 200 << 10);
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("pos"))).ok());
  MegaStorageWriterOptions o;
  o.fs = std::make_shared<SequentialOnlyFs>();
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("seq"), std::nullopt, o)).ok());
  ASSERT_EQ(ShardsIn(dir.path("pos")), ShardsIn(dir.path("seq")));
  EXPECT_TRUE(LoadSynthetic(spec, dir.path("seq"), 3, 1).ok());
  // Same tensors, same offsets and checksums (only the save id differs).
  for (const auto& f : ShardsIn(dir.path("pos"))) {
    auto a = format::MegaReader::OpenFile(dir.path("pos/" + f));
    auto b = format::MegaReader::OpenFile(dir.path("seq/" + f));
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
    for (size_t i = 0; i < (*a)->tensors().size(); ++i) {
      EXPECT_EQ((*a)->tensors()[i].name, (*b)->tensors()[i].name);
      EXPECT_EQ((*a)->tensors()[i].file_offset, (*b)->tensors()[i].file_offset);
      EXPECT_EQ((*a)->tensors()[i].checksum, (*b)->tensors()[i].checksum);
    }
  }
}

TEST(MegaStorage, WithoutCollectivesEveryRankSavesAlone) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    StateDict sd;
    MEGA_ASSIGN_OR_RETURN(Tensor t, Ramp<float>(DType::kF32, {4, 4}, g.rank() * 100));
    sd.Set("w", t);
    MegaStorageWriter writer(ckpt);
    SaveOptions so;
    so.use_collectives = false;
    return Save(sd, writer, &g, so);
  });
  ASSERT_TRUE(ranks.ok()) << ranks.ToString();
  EXPECT_TRUE(stdfs::exists(ckpt + "/.metadata"));
  EXPECT_TRUE(stdfs::exists(ckpt + "/.metadata.rank1"));
  for (int r : {0, 1}) {
    MegaStorageReaderOptions o;
    o.metadata_rank = r == 0 ? -1 : r;
    StateDict sd;
    Tensor t = *Tensor::Empty(DType::kF32, {4, 4}, true);
    sd.Set("w", t);
    MegaStorageReader reader(ckpt, o);
    ASSERT_TRUE(Load(sd, reader).ok());
    EXPECT_EQ(static_cast<float*>(t.data())[5], static_cast<float>(r * 100 + 5));
  }
}

// ---------------------------------------------------------------------------
// One test per seed defect (spec/dcp.md §4)
// ---------------------------------------------------------------------------

// Three ranks, each with its own tensors, a replicated one and a sharded one.
// The seed wrote "model.mega" on every rank (last writer wins) and the index
// knew only the coordinator's items.
TEST(MegaStorageSeedDefects, SeedDefect1_UniqueFileNamesAcrossRanks) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  Status ranks = RunThreadRanksForTest(3, [&](dist::ProcessGroup& g) -> Status {
    StateDict sd;
    MEGA_ASSIGN_OR_RETURN(Tensor own, Ramp<int32_t>(DType::kI32, {8}, g.rank() * 1000));
    sd.Set("rank" + std::to_string(g.rank()) + ".w", own);
    MEGA_ASSIGN_OR_RETURN(Tensor rep, Tensor::Empty(DType::kI32, {2}));
    static_cast<int32_t*>(rep.data())[0] = 7;
    static_cast<int32_t*>(rep.data())[1] = 9;
    sd.Set("replicated", rep);
    MEGA_ASSIGN_OR_RETURN(Tensor part, Ramp<int32_t>(DType::kI32, {2, 2}, g.rank() * 4));
    sd.Set("sharded", OneShard({6, 2}, {2 * g.rank(), 0}, part));
    return Save(sd, *MegaWriterAt(ckpt)(g.rank()), &g);
  });
  ASSERT_TRUE(ranks.ok()) << ranks.ToString();
  auto shards = ShardsIn(ckpt);
  // Distinct files for every rank, none overwritten: thread_count (2) files per
  // rank by default (each rank holds 2 or 3 items).
  ASSERT_EQ(shards.size(), 6u);
  EXPECT_EQ(std::set<std::string>(shards.begin(), shards.end()).size(), 6u);
  format::ShardIndex idx = ReadIndex(ckpt + "/model.mega.index.json");
  EXPECT_EQ(IndexFqns(idx),
            (std::set<std::string>{"rank0.w", "rank1.w", "rank2.w", "replicated", "sharded"}));
  EXPECT_EQ(idx.weight_map.at("rank2.w"), shards[4]);  // rank 2's first file: its largest item
  // Every rank's data comes back (the seed lost two ranks' files).
  StateDict sd;
  for (int r = 0; r < 3; ++r)
    sd.Set("rank" + std::to_string(r) + ".w", *Tensor::Empty(DType::kI32, {8}, true));
  sd.Set("replicated", *Tensor::Empty(DType::kI32, {2}, true));
  sd.Set("sharded", *Tensor::Empty(DType::kI32, {6, 2}, true));
  MegaStorageReader reader(ckpt);
  ASSERT_TRUE(Load(sd, reader).ok());
  for (int r = 0; r < 3; ++r) {
    const auto* p =
        static_cast<const int32_t*>(sd.Find("rank" + std::to_string(r) + ".w")->tensor().data());
    EXPECT_EQ(p[3], r * 1000 + 3);
  }
  const auto* sp = static_cast<const int32_t*>(sd.Find("sharded")->tensor().data());
  for (int i = 0; i < 12; ++i) EXPECT_EQ(sp[i], i);
}

// The seed named files with the rank's own highest bucket ("-of-<local max>").
TEST(MegaStorageSeedDefects, SeedDefect2_GlobalFileCountInNames) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  FqnToIndexMapping mapping{{"a", 1}, {"b", 2}, {"c", 3}};
  Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    StateDict sd;
    // Rank 0 holds only bucket 1; rank 1 buckets 2 and 3.
    for (const char* name :
         g.rank() == 0 ? std::vector<const char*>{"a"} : std::vector<const char*>{"b", "c"}) {
      MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {3}, true));
      sd.Set(name, t);
    }
    return Save(sd, *MegaWriterAt(ckpt, mapping)(g.rank()), &g);
  });
  ASSERT_TRUE(ranks.ok()) << ranks.ToString();
  EXPECT_EQ(ShardsIn(ckpt),
            (std::vector<std::string>{"model-00001-of-00003.mega", "model-00002-of-00003.mega",
                                      "model-00003-of-00003.mega"}));
  format::ShardIndex idx = ReadIndex(ckpt + "/model.mega.index.json");
  EXPECT_EQ(idx.weight_map.at("a"), "model-00001-of-00003.mega");
  EXPECT_EQ(idx.weight_map.at("b"), "model-00002-of-00003.mega");
  EXPECT_EQ(idx.weight_map.at("c"), "model-00003-of-00003.mega");
}

// The seed reported file sizes as size_in_bytes and total_size.
TEST(MegaStorageSeedDefects, SeedDefect3_SizesAreTensorBytes) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(41, 200 << 10);
  const std::string ckpt = dir.path("c");
  std::mutex mu;
  std::map<std::string, uint64_t> written_per_rank;
  Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, 2, g.rank(), 0, true));
    MegaStorageWriter w(ckpt);
    SaveStats stats;
    SaveOptions so;
    so.stats = &stats;
    MEGA_RETURN_IF_ERROR(Save(sd, w, &g, so));
    std::lock_guard<std::mutex> lock(mu);
    written_per_rank[std::to_string(g.rank())] = stats.bytes_written;
    return Status::OK();
  });
  ASSERT_TRUE(ranks.ok()) << ranks.ToString();
  format::ShardIndex idx = ReadIndex(ckpt + "/model.mega.index.json");
  ASSERT_TRUE(idx.total_size.has_value());
  EXPECT_EQ(*idx.total_size, spec.total_bytes);  // every tensor/bytes value once, no headers
  uint64_t file_bytes = 0;
  for (const auto& f : ShardsIn(ckpt)) file_bytes += stdfs::file_size(ckpt + "/" + f);
  EXPECT_GT(file_bytes, *idx.total_size);
  EXPECT_EQ(written_per_rank["0"] + written_per_rank["1"], spec.total_bytes);
  auto md = MegaStorageReader(ckpt).ReadMetadata();
  ASSERT_TRUE(md.ok());
  for (const auto& [key, info] : md->storage_data) {
    const auto& entry = md->state_dict_metadata.at(key.fqn);
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      for (const auto& c : t->chunks) {
        if (c.offsets == *key.offset) {
          EXPECT_EQ(info.length, *ChunkNbytes(t->properties.dtype, c.sizes));
        }
      }
    }
  }
}

// The seed could not represent a tensor sharded over ranks. Ours stores each
// chunk under its fqn with its offsets in tensorplay.dcp.entries, and Metadata
// rebuilt from the headers alone equals the committed one.
TEST(MegaStorageSeedDefects, SeedDefect4_ShardedTensorChunksRecordedInShards) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(42, 200 << 10);
  const std::string ckpt = dir.path("c");
  ASSERT_TRUE(SaveSynthetic(spec, 3, MegaWriterAt(ckpt)).ok());
  auto committed = MegaStorageReader(ckpt).ReadMetadata();
  ASSERT_TRUE(committed.ok());
  auto rebuilt = RebuildMetadataFromShards(ckpt);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
  ASSERT_EQ(rebuilt->state_dict_metadata.size(), committed->state_dict_metadata.size());
  int sharded = 0;
  for (const auto& [fqn, value] : committed->state_dict_metadata) {
    const auto& other = rebuilt->state_dict_metadata.at(fqn);
    if (const auto* t = std::get_if<TensorStorageMetadata>(&value)) {
      const auto& u = std::get<TensorStorageMetadata>(other);
      EXPECT_EQ(t->size, u.size) << fqn;
      EXPECT_EQ(t->properties.dtype, u.properties.dtype) << fqn;
      auto key = [](const ChunkStorageMetadata& c) { return std::make_pair(c.offsets, c.sizes); };
      std::set<std::pair<Shape, Shape>> a, b;
      for (const auto& c : t->chunks) a.insert(key(c));
      for (const auto& c : u.chunks) b.insert(key(c));
      EXPECT_EQ(a, b) << fqn;
      if (t->chunks.size() > 1) ++sharded;
    } else {
      EXPECT_TRUE(std::holds_alternative<BytesStorageMetadata>(other)) << fqn;
    }
  }
  EXPECT_GT(sharded, 3);
  EXPECT_EQ(rebuilt->planner_data.object_paths, committed->planner_data.object_paths);
  // In the shard: the tensor is named by its fqn, its offsets are in the entries key.
  bool saw_offset = false;
  for (const auto& f : ShardsIn(ckpt)) {
    auto r = format::MegaReader::OpenFile(ckpt + "/" + f);
    ASSERT_TRUE(r.ok());
    auto entries = json::parse(std::string(*(*r)->metadata().GetString(kDcpEntriesKey)));
    for (const auto& t : (*r)->tensors()) {
      ASSERT_TRUE(entries.contains(t.name)) << t.name;
      for (int64_t o : entries[t.name].value("offsets", std::vector<int64_t>{}))
        saw_offset |= o != 0;
    }
  }
  EXPECT_TRUE(saw_offset);
  // Loading through the rebuilt Metadata reshards correctly.
  ASSERT_TRUE(stdfs::remove(ckpt + "/.metadata"));
  EXPECT_TRUE(LoadSynthetic(spec, ckpt, 2, 3).ok());
}

// The seed could not store bytes values in a tensors-only shard.
TEST(MegaStorageSeedDefects, SeedDefect5_BytesRoundTripAsBytes) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  std::string binary("\0\x01\xff payload \0 with NULs", 24);
  StateDict sd;
  sd.Set("blob", StateValue::Bytes(binary));
  sd.Set("empty", StateValue::Bytes(""));
  sd.Set("w", *Tensor::Empty(DType::kF32, {2}, true));
  MegaStorageWriter w(ckpt);
  ASSERT_TRUE(Save(sd, w).ok());
  // Stored as a U8 tensor marked "bytes" (in one of the rank's two files).
  auto r = format::MegaReader::OpenFile(ShardHolding(ckpt, "blob"));
  ASSERT_TRUE(r.ok());
  const format::MegaTensorInfo* t = (*r)->Find("blob");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kU8);
  EXPECT_EQ(t->shape, Shape{24});
  auto entries = json::parse(std::string(*(*r)->metadata().GetString(kDcpEntriesKey)));
  EXPECT_EQ(entries["blob"]["kind"], "bytes");
  // Read back as bytes, also through rebuilt Metadata.
  for (bool drop_metadata : {false, true}) {
    if (drop_metadata) stdfs::remove(ckpt + "/.metadata");
    StateDict back;
    back.Set("blob", StateValue::Bytes("x"));
    back.Set("empty", StateValue::Bytes("not empty"));
    back.Set("w", *Tensor::Empty(DType::kF32, {2}, true));
    MegaStorageReader reader(ckpt);
    ASSERT_TRUE(Load(back, reader).ok());
    EXPECT_EQ(back.Find("blob")->bytes(), binary);
    EXPECT_EQ(back.Find("empty")->bytes(), "");
  }
}

// The seed read whole shards (and downloaded whole remote files) to get a slice.
TEST(MegaStorageSeedDefects, SeedDefect6_ReadsOnlyNeededRanges) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  Tensor big = *Tensor::Empty(DType::kF32, {1024, 1024});  // 4 MiB
  auto* p = static_cast<float*>(big.data());
  for (int i = 0; i < 1024 * 1024; ++i) p[i] = static_cast<float>(i);
  StateDict sd;
  sd.Set("big", big);
  sd.Set("other", *Tensor::Empty(DType::kF32, {1024, 1024}, true));
  // One file, so "other" makes it twice the size of "big".
  MegaStorageWriterOptions one_file;
  one_file.files_per_rank = 1;
  MegaStorageWriter w(ckpt, std::nullopt, one_file);
  ASSERT_TRUE(Save(sd, w).ok());
  const uint64_t file_size = stdfs::file_size(ckpt + "/model.mega");
  for (bool rows : {true, false}) {
    // A destination holding 16 rows (or 16 columns) of "big" only.
    auto counting = std::make_shared<testing::InstrumentedFileSystem>();
    counting->data_marker = ".mega";
    Shape box = rows ? Shape{16, 1024} : Shape{1024, 16};
    Shard shard{rows ? Shape{512, 0} : Shape{0, 512}, *Tensor::Empty(DType::kF32, box, true)};
    StateDict dst;
    dst.Set("big", OneShard({1024, 1024}, shard.offsets, shard.tensor));
    MegaStorageReaderOptions o;
    o.fs = counting;
    MegaStorageReader reader(ckpt, o);
    ASSERT_TRUE(Load(dst, reader).ok());
    const float* q = static_cast<const float*>(shard.tensor.data());
    const uint64_t needed = 16 * 1024 * 4;
    for (int i = 0; i < 16 * 1024; i += 997) {
      int r = rows ? 512 + i / 1024 : i / 16;
      int c = rows ? i % 1024 : 512 + i % 16;
      EXPECT_EQ(q[i], static_cast<float>(r * 1024 + c));
    }
    // Data widened to whole CRC blocks (a 16-column slice reads one block of
    // each row), plus the header (one 4 KiB aligned region); never the 8 MiB file.
    const uint64_t block = format::MegaBlockSizeFor(DType::kF32, {1024, 1024});
    const uint64_t widened = rows ? needed : 1024 * std::max<uint64_t>(block, 16 * 4);
    EXPECT_LT(counting->data_bytes_read.load(), widened + 128 * 1024) << "rows=" << rows;
    EXPECT_LT(counting->data_bytes_read.load(), file_size / 20);
  }
}

// The seed's .metadata was a pickle. Ours is a documented JSON encoding, and a
// checkpoint whose .metadata cannot be decoded (TensorPlay's pickle) still loads.
TEST(MegaStorageSeedDefects, SeedDefect7_PortableMetadataAndPickleFallback) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(47, 150 << 10);
  const std::string ckpt = dir.path("c");
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(ckpt)).ok());
  std::string text = Slurp(ckpt + "/.metadata");
  auto j = json::parse(text);
  EXPECT_EQ(j["format"], "megackpt-dcp-metadata");
  // Replace it with a Python pickle (protocol 4 header + junk).
  {
    std::ofstream f(ckpt + "/.metadata", std::ios::binary | std::ios::trunc);
    f << std::string("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00\x8c\x08Metadata\x94.", 23);
  }
  MegaStorageReader reader(ckpt);
  auto md = reader.ReadMetadata();
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(reader.source(), CheckpointSource::kMegaShardHeaders);
  EXPECT_TRUE(LoadSynthetic(spec, ckpt, 3, 1).ok());

  // A TensorPlay-style checkpoint: plain tp.save shards (no tensorplay.dcp.* keys),
  // model.mega.index.json and a pickle .metadata.
  const std::string tp = dir.path("tp");
  stdfs::create_directories(tp);
  Tensor a = *Ramp<float>(DType::kF32, {6, 4}, 0, 0.5);
  Tensor b = *Ramp<int64_t>(DType::kI64, {3}, 0, -1);
  format::MegaWriter w1, w2;
  ASSERT_TRUE(w1.AddTensor("layer.a", a).ok());
  ASSERT_TRUE(w2.AddTensor("layer.b", b).ok());
  ASSERT_TRUE(w1.WriteFile(tp + "/model-00001-of-00002.mega").ok());
  ASSERT_TRUE(w2.WriteFile(tp + "/model-00002-of-00002.mega").ok());
  format::ShardIndex idx;
  idx.total_size = 24 * 4 + 3 * 8;
  idx.weight_map = {{"layer.a", "model-00001-of-00002.mega"},
                    {"layer.b", "model-00002-of-00002.mega"}};
  ASSERT_TRUE(format::WriteShardIndexFile(tp + "/model.mega.index.json", idx).ok());
  {
    std::ofstream f(tp + "/.metadata", std::ios::binary);
    f << std::string("\x80\x05\x95pickle", 10);
  }
  // Resharded: two ranks, each half the rows of layer.a.
  Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    MEGA_ASSIGN_OR_RETURN(Tensor half, Tensor::Empty(DType::kF32, {3, 4}, true));
    StateDict sd;
    sd.Set("layer.a", OneShard({6, 4}, {3 * g.rank(), 0}, half));
    MEGA_ASSIGN_OR_RETURN(Tensor bb, Tensor::Empty(DType::kI64, {3}, true));
    sd.Set("layer.b", bb);
    MegaStorageReader r(tp);
    MEGA_RETURN_IF_ERROR(Load(sd, r, &g));
    for (int i = 0; i < 12; ++i) {
      if (static_cast<float*>(half.data())[i] != (12 * g.rank() + i) * 0.5f) {
        return DataLossError("layer.a differs at " + std::to_string(i));
      }
    }
    if (static_cast<int64_t*>(bb.data())[2] != -2) return DataLossError("layer.b differs");
    return Status::OK();
  });
  EXPECT_TRUE(ranks.ok()) << ranks.ToString();
}

// In-process failures during a re-save: the previous checkpoint stays, and
// Abort removes this save's files and nothing else. (The fork + SIGKILL test is
// in mega_storage_crash_test.cc.)
TEST(MegaStorageSeedDefects, SeedDefect8_FailedSaveKeepsPreviousCheckpoint) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  auto old_spec = synthetic::MakeSpec(51, 200 << 10);
  auto new_spec = synthetic::MakeSpec(52, 200 << 10);
  ASSERT_TRUE(SaveSynthetic(old_spec, 2, MegaWriterAt(ckpt)).ok());
  // An unrelated file in the folder survives everything.
  { std::ofstream(ckpt + "/README.txt") << "mine"; }
  const auto before = FilesIn(ckpt);
  const std::string index_before = Slurp(ckpt + "/model.mega.index.json");

  // (a) the commit (.metadata rename) fails.
  auto fail_commit = std::make_shared<testing::InstrumentedFileSystem>();
  fail_commit->fail_write_atomically = [](const std::string& p) {
    return p.ends_with("/.metadata");
  };
  MegaStorageWriterOptions o;
  o.fs = fail_commit;
  Status s = SaveSynthetic(new_spec, 2, MegaWriterAt(ckpt, std::nullopt, o));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(FilesIn(ckpt), before);
  EXPECT_EQ(Slurp(ckpt + "/model.mega.index.json"), index_before);  // restored
  EXPECT_TRUE(LoadSynthetic(old_spec, ckpt, 2, 1).ok());

  // (b) one rank cannot create its shard: every rank fails, nothing changes.
  auto fail_rank1 = std::make_shared<testing::InstrumentedFileSystem>();
  fail_rank1->fail_open_for_write = [](const std::string& p) {
    return p.find("-00002-of-") != std::string::npos;
  };
  o.fs = fail_rank1;
  s = SaveSynthetic(new_spec, 2, MegaWriterAt(ckpt, std::nullopt, o));
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(FilesIn(ckpt), before);
  EXPECT_TRUE(LoadSynthetic(old_spec, ckpt, 1, 0).ok());

  // (c) a successful save afterwards replaces it completely.
  ASSERT_TRUE(SaveSynthetic(new_spec, 2, MegaWriterAt(ckpt)).ok());
  EXPECT_TRUE(LoadSynthetic(new_spec, ckpt, 3, 2).ok());
  EXPECT_TRUE(stdfs::exists(ckpt + "/README.txt"));
}

// The seed had no integrity check. A flipped byte in any tensor of any shard is
// a DataLoss naming the file and the tensor.
TEST(MegaStorageSeedDefects, SeedDefect9_ChecksumVerified) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(61, 100 << 10);
  const std::string good = dir.path("good");
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(good, RoundRobinMapping(spec, 2))).ok());
  int checked = 0;
  std::mt19937_64 rng(7);
  for (const auto& shard : ShardsIn(good)) {
    auto reader = format::MegaReader::OpenFile(good + "/" + shard);
    ASSERT_TRUE(reader.ok());
    for (const auto& t : (*reader)->tensors()) {
      if (t.logical_nbytes == 0) continue;
      if (rng() % 3 != 0 && checked > 0) continue;  // a sample keeps the test fast
      const std::string bad = dir.path("bad" + std::to_string(checked));
      stdfs::copy(good, bad);
      FlipByte(bad + "/" + shard, t.file_offset + rng() % t.logical_nbytes);
      // A load at the save layout reads every stored piece whole: verified.
      Status s = LoadSynthetic(spec, bad, 2, 0);
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << shard << " " << t.name << ": " << s.ToString();
      EXPECT_NE(s.message().find(shard), std::string::npos) << s.ToString();
      EXPECT_NE(s.message().find(t.name), std::string::npos) << s.ToString();
      // The verify pass finds it too.
      Status v = VerifyMegaCheckpoint(bad);
      EXPECT_EQ(v.code(), StatusCode::kDataLoss) << v.ToString();
      EXPECT_NE(v.message().find(t.name), std::string::npos) << v.ToString();
      stdfs::remove_all(bad);
      ++checked;
    }
  }
  EXPECT_GT(checked, 5);
  EXPECT_TRUE(VerifyMegaCheckpoint(good).ok());
  // A flipped header byte is reported naming the file.
  const std::string bad = dir.path("badhdr");
  stdfs::copy(good, bad);
  const std::string shard = ShardsIn(good)[0];
  FlipByte(bad + "/" + shard, 5);  // inside the version field
  Status s = LoadSynthetic(spec, bad, 1, 0);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(shard), std::string::npos) << s.ToString();
}

TEST(MegaStorage, PartialReadVerifyPassCatchesCorruptionOutsideTheSlice) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  StateDict sd;
  sd.Set("w", *Tensor::Empty(DType::kF32, {64, 64}, true));
  MegaStorageWriter w(ckpt);
  ASSERT_TRUE(Save(sd, w).ok());
  auto reader = format::MegaReader::OpenFile(ckpt + "/model.mega");
  ASSERT_TRUE(reader.ok());
  FlipByte(ckpt + "/model.mega", (*reader)->Find("w")->file_offset + 4 * 64 * 60);  // row 60
  reader->reset();
  auto load_rows_0_to_8 = [&](bool verify) {
    StateDict dst;
    dst.Set("w", OneShard({64, 64}, {0, 0}, *Tensor::Empty(DType::kF32, {8, 64}, true)));
    MegaStorageReaderOptions o;
    o.verify_partial_reads = verify;
    MegaStorageReader r(ckpt, o);
    return Load(dst, r);
  };
  EXPECT_TRUE(load_rows_0_to_8(false).ok());  // the slice itself is intact
  Status s = load_rows_0_to_8(true);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("model.mega"), std::string::npos);
}

TEST(MegaStorage, ShardReplacedAfterCommitIsDetected) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  StateDict sd;
  sd.Set("w", *Tensor::Empty(DType::kF32, {16}, true));
  MegaStorageWriter w(ckpt);
  ASSERT_TRUE(Save(sd, w).ok());
  // Someone rewrites model.mega with other (valid, self-consistent) contents.
  Tensor other = *Tensor::Empty(DType::kF32, {16}, true);
  static_cast<float*>(other.data())[0] = 1;
  format::MegaWriter mw;
  ASSERT_TRUE(mw.AddTensor("w", other).ok());
  ASSERT_TRUE(mw.WriteFile(ckpt + "/model.mega").ok());
  StateDict back;
  back.Set("w", *Tensor::Empty(DType::kF32, {16}, true));
  MegaStorageReader r(ckpt);
  Status s = Load(back, r);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
}

TEST(MegaStorage, MixedSavesWithoutMetadataAreRefused) {
  TempDir dir;
  auto a = synthetic::MakeSpec(71, 100 << 10);
  ASSERT_TRUE(SaveSynthetic(a, 2, MegaWriterAt(dir.path("x"))).ok());
  ASSERT_TRUE(SaveSynthetic(a, 2, MegaWriterAt(dir.path("y"))).ok());
  // Shard 2 of another save of the same state: a torn mix for an index reader.
  const std::string last = ShardsIn(dir.path("y")).back();
  ASSERT_EQ(last, ShardsIn(dir.path("x")).back());
  stdfs::copy_file(dir.path("y/" + last), dir.path("x/" + last),
                   stdfs::copy_options::overwrite_existing);
  stdfs::remove(dir.path("x/.metadata"));
  auto md = RebuildMetadataFromShards(dir.path("x"));
  EXPECT_EQ(md.status().code(), StatusCode::kDataLoss) << md.status().ToString();
  EXPECT_NE(md.status().message().find("different saves"), std::string::npos);
  // A missing shard is an error too, never a silent partial load.
  stdfs::remove(dir.path("y/" + last));
  stdfs::remove(dir.path("y/.metadata"));
  md = RebuildMetadataFromShards(dir.path("y"));
  EXPECT_EQ(md.status().code(), StatusCode::kNotFound) << md.status().ToString();
}

// ---------------------------------------------------------------------------
// Hugging Face layouts
// ---------------------------------------------------------------------------

TEST(MegaStorage, LoadsHuggingFaceLayoutResharded) {
  TempDir dir;
  const std::string hf = dir.path("hf");
  stdfs::create_directories(hf);
  Tensor w = *Ramp<uint16_t>(DType::kBF16, {10, 6}, 0, 3);  // raw BF16 bits 0, 3, 6, ...
  Tensor b = *Ramp<float>(DType::kF32, {6}, 0.25);
  std::vector<std::pair<std::string, Tensor>> f1{{"model.w", w}};
  std::vector<std::pair<std::string, Tensor>> f2{{"model.b", b}};
  ASSERT_TRUE(
      format::SaveSafetensorsFile(hf + "/model-00001-of-00002.safetensors", f1, {{"format", "pt"}})
          .ok());
  ASSERT_TRUE(
      format::SaveSafetensorsFile(hf + "/model-00002-of-00002.safetensors", f2, {{"format", "pt"}})
          .ok());
  format::ShardIndex idx;
  idx.total_size = 60 * 2 + 6 * 4;
  idx.weight_map = {{"model.w", "model-00001-of-00002.safetensors"},
                    {"model.b", "model-00002-of-00002.safetensors"}};
  ASSERT_TRUE(format::WriteShardIndexFile(hf + "/model.safetensors.index.json", idx).ok());
  for (std::string path : {hf, hf + "/model.safetensors.index.json"}) {
    Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
      // Column split: rank r holds columns [3r, 3r+3) of model.w (strided reads).
      MEGA_ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(DType::kBF16, {10, 3}, true));
      StateDict sd;
      sd.Set("model.w", OneShard({10, 6}, {0, 3 * g.rank()}, part));
      MEGA_ASSIGN_OR_RETURN(Tensor bb, Tensor::Empty(DType::kF32, {6}, true));
      sd.Set("model.b", bb);
      MegaStorageReader reader(path);
      MEGA_RETURN_IF_ERROR(Load(sd, reader, &g));
      if (reader.source() != CheckpointSource::kSafetensors) return InternalError("source");
      for (int r = 0; r < 10; ++r) {
        for (int c = 0; c < 3; ++c) {
          uint16_t want = static_cast<uint16_t>((r * 6 + 3 * g.rank() + c) * 3);
          if (static_cast<uint16_t*>(part.data())[r * 3 + c] != want) {
            return DataLossError("model.w differs at " + std::to_string(r) + "," +
                                 std::to_string(c));
          }
        }
      }
      if (static_cast<float*>(bb.data())[5] != 5.25f) return DataLossError("model.b differs");
      return Status::OK();
    });
    EXPECT_TRUE(ranks.ok()) << path << ": " << ranks.ToString();
  }
  // One lone .safetensors file.
  const std::string single = dir.path("single.safetensors");
  ASSERT_TRUE(format::SaveSafetensorsFile(single, f1).ok());
  StateDict sd;
  Tensor back = *Tensor::Empty(DType::kBF16, {10, 6}, true);
  sd.Set("model.w", back);
  MegaStorageReader reader(single);
  ASSERT_TRUE(Load(sd, reader).ok());
  EXPECT_TRUE(TensorBytesEqual(back, w));
}

// ---------------------------------------------------------------------------
// Consolidation
// ---------------------------------------------------------------------------

// Every fqn of the index maps to the one file that holds it whole.
void ExpectTruthfulIndex(const std::string& dir, const std::string& index_name,
                         const synthetic::Spec& spec) {
  format::ShardIndex idx = ReadIndex(dir + "/" + index_name);
  EXPECT_EQ(idx.extra_fields.count(std::string(kDcpIndexShardedKey)), 0u);
  std::set<std::string> fqns;
  uint64_t total = 0;
  for (const auto& [fqn, file] : idx.weight_map) {
    fqns.insert(fqn);
    const auto& e = *std::find_if(spec.entries.begin(), spec.entries.end(),
                                  [&](const auto& x) { return x.fqn == fqn; });
    Shape want = e.is_bytes ? Shape{static_cast<int64_t>(e.bytes_len)} : e.shape;
    Shape have;
    if (file.ends_with(".safetensors")) {
      auto r = format::SafetensorsReader::Open(dir + "/" + file);
      ASSERT_TRUE(r.ok());
      ASSERT_NE((*r)->Find(fqn), nullptr) << fqn;
      have = (*r)->Find(fqn)->shape;
    } else {
      auto r = format::MegaReader::OpenFile(dir + "/" + file);
      ASSERT_TRUE(r.ok());
      ASSERT_NE((*r)->Find(fqn), nullptr) << fqn;
      have = (*r)->Find(fqn)->shape;
    }
    EXPECT_EQ(have, want) << fqn << " in " << file;
    total += e.is_bytes ? e.bytes_len : *LogicalNbytes(e.dtype, e.shape);
  }
  EXPECT_EQ(fqns, SpecFqns(spec));
  EXPECT_EQ(idx.total_size.value_or(0), total);
  // No file holds a tensor the index does not map to it.
  for (const auto& f : idx.ShardFiles()) {
    EXPECT_EQ(idx.TensorsInShard(f).size(),
              f.ends_with(".mega")
                  ? (*format::MegaReader::OpenFile(dir + "/" + f))->tensors().size()
                  : (*format::SafetensorsReader::Open(dir + "/" + f))->tensors().size());
  }
}

TEST(MegaStorageConsolidate, MegaWithShardSizeLimitIsTruthfulAndReloads) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(81, 400 << 10);
  ASSERT_TRUE(SaveSynthetic(spec, 3, MegaWriterAt(dir.path("src"))).ok());
  ConsolidateOptions o;
  o.max_shard_size = 120 << 10;
  auto r = Consolidate(dir.path("src"), dir.path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->files.size(), 2u);
  for (size_t i = 0; i < r->files.size(); ++i) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.mega", i + 1, r->files.size());
    EXPECT_EQ(r->files[i], want);
  }
  ExpectTruthfulIndex(dir.path("dst"), "model.mega.index.json", spec);
  EXPECT_TRUE(LoadSynthetic(spec, dir.path("dst"), 2, 5).ok());
  // The source is untouched and still loads.
  EXPECT_TRUE(LoadSynthetic(spec, dir.path("src"), 1, 0).ok());
  // A clean reader (the CLI's inspect and verify) reads it by the format's own rules.
  test_util::CommandResult cli = RunMegackpt("verify " + dir.path("dst"));
  EXPECT_EQ(cli.code, 0) << cli.out;
  cli = RunMegackpt("inspect --json " + dir.path("dst/model.mega.index.json"));
  EXPECT_EQ(cli.code, 0) << cli.out;
  EXPECT_NE(cli.out.find("model.embed"), std::string::npos);
}

TEST(MegaStorageConsolidate, SaveOptionConsolidatesInPlace) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(82, 300 << 10);
  const std::string ckpt = dir.path("c");
  MegaStorageWriterOptions o;
  o.consolidate = true;
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(ckpt, RoundRobinMapping(spec, 3), o)).ok());
  // Buckets of the mapping decide the files; every file is whole tensors.
  auto shards = ShardsIn(ckpt);
  EXPECT_EQ(shards.size(), 3u);
  ExpectTruthfulIndex(ckpt, "model.mega.index.json", spec);
  EXPECT_TRUE(LoadSynthetic(spec, ckpt, 3, 1).ok());
  auto md = MegaStorageReader(ckpt).ReadMetadata();
  ASSERT_TRUE(md.ok());
  for (const auto& [fqn, v] : md->state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&v)) {
      EXPECT_EQ(t->chunks.size(), 1u) << fqn;
    }
  }
  // Only the consolidated checkpoint's files remain.
  std::set<std::string> expected(shards.begin(), shards.end());
  expected.insert({".metadata", "model.mega.index.json"});
  auto all = FilesIn(ckpt);
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()), expected);
  test_util::CommandResult verify = RunMegackpt("verify " + ckpt);
  EXPECT_EQ(verify.code, 0) << verify.out;
}

TEST(MegaStorageConsolidate, FailedConsolidationAfterCommitKeepsTheSavedCheckpoint) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(86, 200 << 10);
  const std::string ckpt = dir.path("c");
  auto fail = std::make_shared<testing::InstrumentedFileSystem>();
  // The sharded save has more than two files; the consolidated output has two.
  fail->fail_open_for_write = [](const std::string& p) { return p.ends_with("-of-00002.mega"); };
  MegaStorageWriterOptions o;
  o.consolidate = true;
  o.fs = fail;
  Status s = SaveSynthetic(spec, 2, MegaWriterAt(ckpt, RoundRobinMapping(spec, 2), o));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("consolidation failed"), std::string::npos) << s.ToString();
  // Every rank aborted, yet no committed shard was removed: the sharded save loads.
  Status l = LoadSynthetic(spec, ckpt, 3, 1);
  EXPECT_TRUE(l.ok()) << l.ToString();
}

TEST(MegaStorageConsolidate, CollectiveOverThreadRanks) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(83, 300 << 10);
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("src"))).ok());
  Status ranks = RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    ConsolidateOptions o;
    o.max_shard_size = 64 << 10;
    return Consolidate(dir.path("src"), dir.path("dst"), o, &g).status();
  });
  ASSERT_TRUE(ranks.ok()) << ranks.ToString();
  ExpectTruthfulIndex(dir.path("dst"), "model.mega.index.json", spec);
  EXPECT_TRUE(LoadSynthetic(spec, dir.path("dst"), 3, 2).ok());
}

TEST(MegaStorageConsolidate, SafetensorsExportParsesWithPythonNumpy) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(84, 200 << 10);
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("src"))).ok());
  ConsolidateOptions o;
  o.format = ConsolidateFormat::kSafetensors;
  o.max_shard_size = 100 << 10;
  auto r = Consolidate(dir.path("src"), dir.path("hf"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectTruthfulIndex(dir.path("hf"), "model.safetensors.index.json", spec);
  EXPECT_TRUE(LoadSynthetic(spec, dir.path("hf"), 2, 3).ok());
  // Independent reader: Python's json + numpy, nothing of ours.
  const std::string script = dir.path("read.py");
  {
    std::ofstream f(script);
    f << R"PY(
import hashlib, json, struct, sys, os
import numpy as np
d = sys.argv[1]
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
dt = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
      "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BF16": np.uint16, "BOOL": np.bool_}
total = 0
for name in sorted(index["weight_map"]):
    path = os.path.join(d, index["weight_map"][name])
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        info = header[name]
        begin, end = info["data_offsets"]
        fh.seek(8 + n + begin)
        raw = fh.read(end - begin)
    arr = np.frombuffer(raw, dtype=dt[info["dtype"]]).reshape(info["shape"])
    assert arr.nbytes == end - begin
    total += arr.nbytes
    print(name, info["dtype"], list(arr.shape), hashlib.sha256(arr.tobytes()).hexdigest())
assert total == index["metadata"]["total_size"], (total, index["metadata"]["total_size"])
)PY";
  }
  test_util::CommandResult python = RunCommand("/usr/bin/python3 " + script + " " + dir.path("hf"),
                                               {.stderr_to = test_util::StderrTo::kOut});
  const std::string& out = python.out;
  ASSERT_EQ(python.code, 0) << out;
  // Compare with the expected global content of every entry.
  std::map<std::string, std::string> py;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream ls(line);
    std::string name, dtype, shape, digest;
    ls >> name >> dtype;
    std::getline(ls, shape, ']');
    ls >> digest;
    py[name] = digest;
  }
  ASSERT_EQ(py.size(), spec.entries.size()) << out;
  for (const auto& e : spec.entries) {
    std::string want;
    if (e.is_bytes) {
      want = ToHex(Sha256Of(AsBytes(synthetic::BytesValue(spec, e))));
    } else {
      Tensor t = *Tensor::Empty(e.dtype, e.shape);
      ASSERT_TRUE(synthetic::FillBox(spec, e, Shape(e.shape.size(), 0), t).ok());
      want = ToHex(Sha256Of(t.Bytes()));
    }
    EXPECT_EQ(py[e.fqn], want) << e.fqn;
  }
}

// /proc/self/status field in bytes (VmRSS, VmHWM), 0 when unavailable.
uint64_t ProcStatusBytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoull(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}

TEST(MegaStorageConsolidate, StreamingMemoryIsBoundedByTheLargestTensor) {
  TempDir dir;
  constexpr int kTensors = 16;  // 16 x 4 MiB = 64 MiB of state
  ASSERT_TRUE(
      dist::RunThreadRanks(
          2,
          [&](dist::ProcessGroup& g) -> Status {
            StateDict sd;
            for (int t = 0; t < kTensors; ++t) {
              MEGA_ASSIGN_OR_RETURN(Tensor part, Tensor::Empty(DType::kF32, {512, 1024}, true));
              static_cast<float*>(part.data())[7] = static_cast<float>(t + g.rank());
              std::string name = "t";
              name += std::to_string(t);
              sd.Set(std::move(name), OneShard({1024, 1024}, {512 * g.rank(), 0}, part));
            }
            MegaStorageWriter w(dir.path("src"));
            return Save(sd, w, &g);
          })[0]
          .ok());
  {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    if (!clear.good()) GTEST_SKIP() << "cannot reset the peak RSS here";
  }
  const uint64_t before = ProcStatusBytes("VmRSS");
  ConsolidateOptions o;
  o.max_shard_size = 16ull << 20;
  o.sync = false;
  auto r = Consolidate(dir.path("src"), dir.path("dst"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const uint64_t peak = ProcStatusBytes("VmHWM");
  ASSERT_GT(before, 0u);
  EXPECT_EQ(r->files.size(), 4u);
  // Two threads, each assembling one 4 MiB tensor at a time: far below the 64 MiB model.
  EXPECT_LT(peak - std::min(peak, before), 24ull << 20) << "peak " << peak << " before " << before;
  std::printf("[ info ] consolidation of 64 MiB: peak RSS growth %.1f MiB\n",
              (peak - std::min(peak, before)) / 1048576.0);
}

TEST(MegaStorageConsolidate, CliConsolidate) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(85, 150 << 10);
  ASSERT_TRUE(SaveSynthetic(spec, 2, MegaWriterAt(dir.path("src"))).ok());
  test_util::CommandResult r = RunMegackpt("consolidate " + dir.path("src") + " " + dir.path("a") +
                                           " --format safetensors --max-shard-size 50000");
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectTruthfulIndex(dir.path("a"), "model.safetensors.index.json", spec);
  r = RunMegackpt("consolidate " + dir.path("src") + " " + dir.path("b"));
  ASSERT_EQ(r.code, 0) << r.out;
  ExpectTruthfulIndex(dir.path("b"), "model.mega.index.json", spec);
  EXPECT_TRUE(stdfs::exists(dir.path("b/model.mega")));
  r = RunMegackpt("consolidate " + dir.path("nothing-here") + " " + dir.path("c"));
  EXPECT_EQ(r.code, 1) << r.out;
  r = RunMegackpt("consolidate " + dir.path("src") + " " + dir.path("c") + " --format xml");
  EXPECT_EQ(r.code, 2) << r.out;
  // A corrupt source is reported with file and tensor, and DST is not created.
  auto shard = ShardsIn(dir.path("src"))[0];
  auto reader = format::MegaReader::OpenFile(dir.path("src/" + shard));
  ASSERT_TRUE(reader.ok());
  const format::MegaTensorInfo* victim = nullptr;
  for (const auto& t : (*reader)->tensors()) {
    if (t.logical_nbytes > 0) victim = &t;
  }
  ASSERT_NE(victim, nullptr);
  FlipByte(dir.path("src/" + shard), victim->file_offset);
  r = RunMegackpt("consolidate " + dir.path("src") + " " + dir.path("d"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(shard), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(victim->name), std::string::npos) << r.out;
  EXPECT_FALSE(stdfs::exists(dir.path("d/.metadata")));
}

}  // namespace
}  // namespace megackpt::dcp
