// Incremental saves through the CheckpointManager: 0%, 10% and 100% of the
// tensors changed; references survive the deletion of older steps and gc; a
// flipped byte in a referenced file is caught by every step using it; forced
// full saves; strided tensors; async saves; two thread ranks loaded at four.
#include "dcp/incremental.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "core/test_files.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint_manager.h"

namespace megackpt::dcp {
namespace {

using testing::TempDir;
namespace stdfs = std::filesystem;

constexpr int kTensors = 20;
constexpr int64_t kElems = 16384;  // 64 KiB of F32 per tensor
constexpr uint64_t kTensorBytes = kElems * 4;

// A training state of kTensors tensors; tensor i holds version gen[i]. With
// world > 1, each tensor is row-sharded over the ranks.
struct State {
  std::vector<std::shared_ptr<std::vector<float>>> buffers;
  StateDict sd;
};

State MakeState(const std::vector<int>& gen, int world = 1, int rank = 0, bool fill = true) {
  State st;
  const int64_t rows = 16, cols = kElems / rows, my_rows = rows / world;
  for (int i = 0; i < kTensors; ++i) {
    auto buf = std::make_shared<std::vector<float>>(my_rows * cols, -1.0f);
    for (int64_t k = 0; fill && k < my_rows * cols; ++k) {
      (*buf)[k] = static_cast<float>(gen[i] * 1000003 + i * 7919 + (rank * my_rows * cols + k));
    }
    st.buffers.push_back(buf);
    Tensor t = Tensor::FromBlob(buf->data(), DType::kF32, {my_rows, cols}).value();
    const std::string name = "layer" + std::to_string(i);
    if (world == 1) {
      st.sd.Set(name, StateValue(t));
    } else {
      ShardedTensor s;
      s.dtype = DType::kF32;
      s.global_shape = {rows, cols};
      s.shards.push_back({{rank * my_rows, 0}, t});
      st.sd.Set(name, StateValue(std::move(s)));
    }
  }
  st.sd.Set("meta",
            StateValue::Bytes(fill ? "gen0=" + std::to_string(gen[0]) : std::string(8, '?')));
  return st;
}

::testing::AssertionResult Same(const State& got, const std::vector<int>& gen, int world = 1,
                                int rank = 0) {
  State want = MakeState(gen, world, rank);
  for (int i = 0; i < kTensors; ++i) {
    if (*got.buffers[i] != *want.buffers[i])
      return ::testing::AssertionFailure() << "layer" << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

CheckpointManagerOptions IncrementalOptions(int keep_last = 0) {
  CheckpointManagerOptions o;
  o.storage_options.sync = false;
  o.incremental.enabled = true;
  o.incremental.block_size = 16 << 10;
  o.retention.keep_last = keep_last;
  return o;
}

StepInfo Info(CheckpointManager& m, int64_t step) {
  const std::vector<StepInfo> steps = m.Steps().value();
  for (const StepInfo& s : steps) {
    if (s.step == step) return s;
  }
  ADD_FAILURE() << "no step " << step;
  return {};
}

// Saves the state of `gen` as steps 1 and 2 of `m`: nothing changed, so step
// 2 writes no byte and references every item of step 1. A failed save is a
// fatal failure.
void SaveTwiceUnchanged(CheckpointManager& m, const std::vector<int>& gen) {
  State s = MakeState(gen);
  ASSERT_TRUE(m.Save(1, s.sd).ok());
  ASSERT_TRUE(m.Save(2, s.sd).ok());
  EXPECT_EQ(Info(m, 2).bytes_written, 0u);
}

// Bytes of the data files a step's own save wrote (named by its save id).
uint64_t OwnFileBytes(const std::string& dir) {
  std::string md;
  std::getline(std::ifstream(dir + "/.metadata"), md, '\0');
  const size_t at = md.find("\"save_id\":\"");
  const std::string id = md.substr(at + 11, 16);
  uint64_t total = 0;
  for (const auto& e : stdfs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("__" + id, 0) == 0) total += e.file_size();
  }
  return total;
}

void FlipByte(const std::string& file, uint64_t offset) {
  ::megackpt::test_util::XorFileByte(file, offset, 0x04);
}

TEST(BlockHashesTest, RecordRoundTripsAndRejectsJunk) {
  std::string data(100000, 'x');
  data[70000] = 'y';
  BlockHashes h = HashBlocks(AsBytes(data), 32768);
  ASSERT_EQ(h.digests.size(), 4u);
  EXPECT_EQ(h.digests[0], h.digests[1]);
  EXPECT_NE(h.digests[1], h.digests[2]);
  auto back = DecodeBlockHashes(EncodeBlockHashes(h));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, h);
  EXPECT_EQ(HashBlocks({}, 64).digests.size(), 1u);
  for (std::string bad :
       {"", "crc32:00", "xxh3-128/", "xxh3-128/0/00000000000000000000000000000000",
        "xxh3-128/64/0123", "xxh3-128/64/0000000000000000000000000000000g"}) {
    EXPECT_FALSE(DecodeBlockHashes(bad).has_value()) << bad;
  }
}

// XXH3-128 of no bytes (the published test vector), and a stream fed in any
// pieces hashes like the whole.
TEST(BlockHashesTest, KnownAnswerAndAnyPiecesHashLikeTheWhole) {
  const BlockHashes empty = HashBlocks({}, 64);
  ASSERT_EQ(empty.digests.size(), 1u);
  EXPECT_EQ(empty.digests[0], (BlockDigest{0x99aa06d3014798d8ull, 0x6001c324468d497full}));
  EXPECT_EQ(EncodeBlockHashes(empty), "xxh3-128/64/99aa06d3014798d86001c324468d497f");
  std::string data(10000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + (i >> 7));
  const BlockHashes whole = HashBlocks(AsBytes(data), 4096);
  ASSERT_EQ(whole.digests.size(), 3u);  // the last one of 1808 bytes
  for (size_t piece : {1, 7, 4095, 4096, 5000}) {
    BlockHasher h(4096);
    for (size_t at = 0; at < data.size(); at += piece)
      h.Add(AsBytes(std::string_view(data).substr(at, piece)));
    EXPECT_EQ(h.Finish(), whole) << piece;
  }
  EXPECT_EQ(whole.digests[2],
            HashBlocks(AsBytes(std::string_view(data).substr(8192)), 4096).digests[0]);
}

class ChangedFractionTest : public ::testing::TestWithParam<int> {};

TEST_P(ChangedFractionTest, WritesOnlyTheChangedTensors) {
  const int changed = GetParam();  // of kTensors
  TempDir tmp("incr-frac");
  auto m = CheckpointManager::Open(tmp.path("run"), IncrementalOptions()).value();
  std::vector<int> gen(kTensors, 1);
  State s1 = MakeState(gen);
  ASSERT_TRUE(m->Save(1, s1.sd).ok());
  EXPECT_EQ(Info(*m, 1).bytes_referenced, 0u);
  for (int i = 0; i < changed; ++i) gen[(i * 7) % kTensors] = 2;
  State s2 = MakeState(gen);
  ASSERT_TRUE(m->Save(2, s2.sd).ok());
  StepInfo info = Info(*m, 2);
  const uint64_t changed_bytes = changed * kTensorBytes;
  const uint64_t meta_bytes = 5 + std::to_string(gen[0]).size();
  EXPECT_EQ(info.base_step, 1);
  // The bytes value "meta" changes with gen[0] only.
  const bool meta_changed = gen[0] != 1;
  EXPECT_EQ(info.bytes_written, changed_bytes + (meta_changed ? meta_bytes : 0));
  EXPECT_EQ(info.bytes_referenced, info.stored_bytes - info.bytes_written);
  // What hit the disk: the changed bytes plus item alignment, nothing more.
  const uint64_t own = OwnFileBytes(m->StepPath(2));
  EXPECT_LE(own, changed_bytes * 12 / 10 + 4096) << own;
  if (changed == 0) {
    EXPECT_LT(own, kTensors * kTensorBytes / 100);
  }
  // Loads on its own, bit-exact, through the normal reader.
  State into = MakeState(gen, 1, 0, false);
  auto loaded = m->Load(into.sd, 2);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(Same(into, gen));
  EXPECT_TRUE(m->VerifyStep(2).ok());
  // The referenced files are the same inodes (hard links), inside the folder.
  for (const auto& e : stdfs::directory_iterator(m->StepPath(2))) {
    if (e.path().extension() != ".distcp") continue;
    EXPECT_EQ(e.path().parent_path(), stdfs::path(m->StepPath(2)));
  }
}

INSTANTIATE_TEST_SUITE_P(ZeroTenHundredPercent, ChangedFractionTest, ::testing::Values(0, 2, 20));

// The record a step's .metadata holds for item `fqn`.
BlockHashes RecordOf(const std::string& dir, const std::string& fqn) {
  std::ifstream in(dir + "/.metadata", std::ios::binary);
  auto md = DecodeMetadata(std::string(std::istreambuf_iterator<char>(in), {}));
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  for (const auto& [index, info] : md->storage_data) {
    if (index.fqn == fqn) return DecodeBlockHashes(info.extra).value_or(BlockHashes{});
  }
  ADD_FAILURE() << "no " << fqn << " in " << dir;
  return {};
}

std::span<const std::byte> BytesOf(const std::vector<float>& v) {
  return std::as_bytes(std::span(v));
}

// A full save in incremental mode hashes nothing before writing (the writer
// threads hash while they write), yet records every item's block hashes; a
// save with everything changed compares only the first block of each item.
TEST(IncrementalTest, FullSaveRecordsHashesWithoutAPrePass) {
  TempDir tmp("incr-fused");
  CheckpointManagerOptions o = IncrementalOptions();
  o.incremental.stats = std::make_shared<IncrementalStats>();
  auto m = CheckpointManager::Open(tmp.path("run"), o).value();
  std::vector<int> gen(kTensors, 1);
  State s1 = MakeState(gen);
  ASSERT_TRUE(m->Save(1, s1.sd).ok());
  EXPECT_EQ(o.incremental.stats->bytes_compared, 0u);
  EXPECT_EQ(o.incremental.stats->items_written, kTensors + 1u);
  EXPECT_EQ(o.incremental.stats->items_referenced, 0u);
  const uint64_t bs = o.incremental.block_size;
  for (int i = 0; i < kTensors; ++i) {
    const BlockHashes r = RecordOf(m->StepPath(1), "layer" + std::to_string(i));
    EXPECT_EQ(r.digests.size(), kTensorBytes / bs);
    EXPECT_EQ(r, HashBlocks(BytesOf(*s1.buffers[i]), bs)) << i;
  }
  EXPECT_EQ(RecordOf(m->StepPath(1), "meta"), HashBlocks(AsBytes("gen0=1"), bs));
  // Everything changed: one block of each tensor compared, and the 6 bytes of "meta".
  std::fill(gen.begin(), gen.end(), 2);
  State s2 = MakeState(gen);
  ASSERT_TRUE(m->Save(2, s2.sd).ok());
  EXPECT_EQ(o.incremental.stats->bytes_compared, kTensors * bs + 6);
  EXPECT_EQ(o.incremental.stats->items_written, 2 * (kTensors + 1u));
  EXPECT_EQ(o.incremental.stats->items_referenced, 0u);
  EXPECT_EQ(RecordOf(m->StepPath(2), "layer3"), HashBlocks(BytesOf(*s2.buffers[3]), bs));
  // Nothing changed: every byte compared, everything referenced.
  ASSERT_TRUE(m->Save(3, s2.sd).ok());
  EXPECT_EQ(o.incremental.stats->bytes_compared, kTensors * bs + 6 + kTensors * kTensorBytes + 6);
  EXPECT_EQ(o.incremental.stats->items_referenced, kTensors + 1u);
  EXPECT_EQ(Info(*m, 3).bytes_written, 0u);
}

// The comparison stops at an item's first differing block, but never before
// it: a change in only the last block, or only a middle one, is written.
TEST(IncrementalTest, ChangeOnlyInTheLastOrAMiddleBlockIsWritten) {
  TempDir tmp("incr-last");
  CheckpointManagerOptions o = IncrementalOptions();
  o.incremental.stats = std::make_shared<IncrementalStats>();
  auto m = CheckpointManager::Open(tmp.path("run"), o).value();
  const uint64_t bs = o.incremental.block_size;  // 4 blocks per tensor
  ASSERT_EQ(kTensorBytes, 4 * bs);
  std::vector<int> gen(kTensors, 1);
  State s = MakeState(gen);
  ASSERT_TRUE(m->Save(1, s.sd).ok());
  const uint64_t before = o.incremental.stats->bytes_compared;
  s.buffers[3]->back() += 1;             // last element: block 3 only
  (*s.buffers[5])[kElems / 2 + 1] += 1;  // block 2 only
  (*s.buffers[7])[0] += 1;               // block 0
  ASSERT_TRUE(m->Save(2, s.sd).ok());
  EXPECT_EQ(Info(*m, 2).bytes_written, 3 * kTensorBytes);
  // Unchanged: all 4 blocks; layer3: 4, layer5: 3, layer7: 1; "meta": its 6 bytes.
  EXPECT_EQ(o.incremental.stats->bytes_compared - before,
            (kTensors - 3) * kTensorBytes + (4 + 3 + 1) * bs + 6);
  State into = MakeState(gen, 1, 0, false);
  ASSERT_TRUE(m->Load(into.sd, 2).ok());
  for (int i = 0; i < kTensors; ++i) EXPECT_EQ(*into.buffers[i], *s.buffers[i]) << i;
  EXPECT_EQ(RecordOf(m->StepPath(2), "layer3"), HashBlocks(BytesOf(*s.buffers[3]), bs));
}

TEST(IncrementalTest, ReferencesSurviveDeletionOfOlderStepsAndGc) {
  TempDir tmp("incr-del");
  auto m = CheckpointManager::Open(tmp.path("run"), IncrementalOptions(/*keep_last=*/1)).value();
  std::vector<int> gen(kTensors, 1);
  for (int step = 1; step <= 4; ++step) {
    gen[step % kTensors] = step;  // one tensor per step
    State s = MakeState(gen);
    ASSERT_TRUE(m->Save(step, s.sd).ok());
  }
  std::vector<int64_t> complete;
  const std::vector<StepInfo> steps = m->Steps().value();
  for (const StepInfo& s : steps) complete.push_back(s.step);
  EXPECT_EQ(complete, (std::vector<int64_t>{4}));
  EXPECT_FALSE(stdfs::exists(m->StepPath(1)));
  StepInfo info = Info(*m, 4);
  EXPECT_GT(info.bytes_referenced, info.bytes_written);  // mostly step 1's data, step 1 gone
  State into = MakeState(gen, 1, 0, false);
  ASSERT_TRUE(m->Load(into.sd).ok());
  EXPECT_TRUE(Same(into, gen));
  EXPECT_TRUE(m->LatestValid().ok());
  // Another incremental step, then the older one removed by gc.
  gen[0] = 9;
  State s5 = MakeState(gen);
  ASSERT_TRUE(m->Save(5, s5.sd).ok());
  ASSERT_TRUE(m->GarbageCollect().ok());
  State into5 = MakeState(gen, 1, 0, false);
  ASSERT_TRUE(m->Load(into5.sd, 5).ok());
  EXPECT_TRUE(Same(into5, gen));
}

TEST(IncrementalTest, FlippedByteInAReferencedFileIsCaughtByEveryStepUsingIt) {
  TempDir tmp("incr-flip");
  auto m = CheckpointManager::Open(tmp.path("run"), IncrementalOptions()).value();
  std::vector<int> gen(kTensors, 1);
  ASSERT_NO_FATAL_FAILURE(SaveTwiceUnchanged(*m, gen));
  std::string file;
  for (const auto& e : stdfs::directory_iterator(m->StepPath(1))) {
    if (e.path().extension() == ".distcp" && e.file_size() > kTensorBytes) file = e.path().string();
  }
  ASSERT_FALSE(file.empty());
  FlipByte(file, 1000);
  for (int64_t step : {1, 2}) {
    State into = MakeState(gen, 1, 0, false);
    Status st = m->Load(into.sd, step).status();
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << "step " << step << ": " << st.ToString();
    EXPECT_NE(st.message().find(stdfs::path(file).filename().string()), std::string::npos)
        << st.ToString();
    EXPECT_EQ(m->VerifyStep(step).code(), StatusCode::kDataLoss);
  }
  EXPECT_EQ(m->LatestValid().status().code(), StatusCode::kNotFound);
}

// Block CRC tables live in the data files, so a referenced item's table comes
// with the hard-linked file (its StorageInfo carries the offset): a flipped
// table byte in step 1's file is caught when loading step 2.
TEST(IncrementalTest, FlippedTableByteInAReferencedFileIsCaughtByTheLaterStep) {
  TempDir tmp("incr-table-flip");
  auto m = CheckpointManager::Open(tmp.path("run"), IncrementalOptions()).value();
  std::vector<int> gen(kTensors, 1);
  ASSERT_NO_FATAL_FAILURE(SaveTwiceUnchanged(*m, gen));
  std::ifstream in(m->StepPath(2) + "/.metadata", std::ios::binary);
  auto md = DecodeMetadata(std::string(std::istreambuf_iterator<char>(in), {}));
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  const StorageInfo& info = md->storage_data.begin()->second;
  ASSERT_TRUE(info.block_table_offset.has_value());
  const std::string file = m->StepPath(1) + "/" + info.relative_path;
  ASSERT_TRUE(stdfs::exists(file));
  FlipByte(file, *info.block_table_offset + 1);
  State into = MakeState(gen, 1, 0, false);
  Status st = m->Load(into.sd, 2).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find(info.relative_path), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("data or its checksum table is damaged"), std::string::npos)
      << st.ToString();
}

TEST(IncrementalTest, FullSavesForcedEveryNthAndOnRequest) {
  TempDir tmp("incr-full");
  CheckpointManagerOptions o = IncrementalOptions();
  o.incremental.full_every = 2;
  auto m = CheckpointManager::Open(tmp.path("run"), o).value();
  std::vector<int> gen(kTensors, 1);
  State s = MakeState(gen);
  for (int step = 1; step <= 5; ++step) ASSERT_TRUE(m->Save(step, s.sd).ok());
  std::vector<std::optional<int64_t>> bases;
  const std::vector<StepInfo> steps = m->Steps().value();
  for (const StepInfo& i : steps) bases.push_back(i.base_step);
  EXPECT_EQ(bases,
            (std::vector<std::optional<int64_t>>{std::nullopt, 1, std::nullopt, 3, std::nullopt}));
  EXPECT_EQ(Info(*m, 3).bytes_referenced, 0u);
  StepSaveOptions full;
  full.force_full = true;
  ASSERT_TRUE(m->Save(6, s.sd, full).ok());
  EXPECT_EQ(Info(*m, 6).base_step, std::nullopt);
  EXPECT_EQ(Info(*m, 6).bytes_referenced, 0u);
  // Without incremental saves nothing is referenced.
  auto plain = CheckpointManager::Open(tmp.path("plain"), {}).value();
  ASSERT_TRUE(plain->Save(1, s.sd).ok());
  ASSERT_TRUE(plain->Save(2, s.sd).ok());
  EXPECT_EQ(Info(*plain, 2).bytes_referenced, 0u);
}

TEST(IncrementalTest, StridedTensorsAndAsyncSaves) {
  TempDir tmp("incr-strided");
  auto m = CheckpointManager::Open(tmp.path("run"), IncrementalOptions()).value();
  std::vector<float> big(256 * 512);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  Tensor whole = Tensor::FromBlob(big.data(), DType::kF32, {256, 512}).value();
  auto state = [&] {
    StateDict sd;
    sd.Set("cols", StateValue(whole.Narrow(1, 128, 256).value()));  // non-contiguous view
    sd.Set("rows", StateValue(whole.Narrow(0, 0, 64).value()));
    return sd;
  };
  ASSERT_TRUE(m->Save(1, state()).ok());
  ASSERT_TRUE(m->Save(2, state()).ok());
  EXPECT_EQ(Info(*m, 2).bytes_written, 0u);
  big[100 * 512 + 200] = -1;  // inside "cols" only (rows 0-63 are "rows")
  auto h = m->AsyncSave(3, state());
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->done.get().ok());
  EXPECT_EQ(Info(*m, 3).bytes_written, 256u * 256 * 4);
  std::vector<float> cols(256 * 256, 0);
  StateDict into;
  into.Set("cols", StateValue(Tensor::FromBlob(cols.data(), DType::kF32, {256, 256}).value()));
  std::vector<float> rows(64 * 512, 0);
  into.Set("rows", StateValue(Tensor::FromBlob(rows.data(), DType::kF32, {64, 512}).value()));
  ASSERT_TRUE(m->Load(into, 3).ok());
  EXPECT_EQ(cols[100 * 256 + 72], -1.0f);
  EXPECT_EQ(cols[0], 128.0f);
  EXPECT_EQ(rows[513], 513.0f);
}

TEST(IncrementalTest, TwoThreadRanksLoadedAtFour) {
  TempDir tmp("incr-threads");
  const std::string root = tmp.path("run");
  std::vector<int> gen(kTensors, 1);
  std::vector<int> last;
  Status s = testing::RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    CheckpointManagerOptions o = IncrementalOptions(2);
    o.group = &g;
    MEGA_ASSIGN_OR_RETURN(auto m, CheckpointManager::Open(root, o));
    std::vector<int> mine = gen;
    for (int step = 1; step <= 3; ++step) {
      mine[(step * 3) % kTensors] = step + 10;
      mine[(step * 3 + 1) % kTensors] = step + 10;
      State st = MakeState(mine, 2, g.rank());
      MEGA_RETURN_IF_ERROR(m->Save(step, st.sd));
    }
    if (g.rank() == 0) last = mine;
    return Status::OK();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto m = CheckpointManager::Open(root, IncrementalOptions()).value();
  StepInfo info = Info(*m, 3);
  EXPECT_EQ(info.bytes_written, 2 * kTensorBytes);  // the two tensors step 3 changed
  EXPECT_GT(info.bytes_referenced, 0u);
  s = testing::RunThreadRanksForTest(4, [&](dist::ProcessGroup& g) -> Status {
    CheckpointManagerOptions o = IncrementalOptions();
    o.group = &g;
    MEGA_ASSIGN_OR_RETURN(auto rm, CheckpointManager::Open(root, o));
    State into = MakeState(last, 4, g.rank(), false);
    MEGA_ASSIGN_OR_RETURN(ValidStep v, rm->Load(into.sd));
    if (v.step != 3) return InternalError("loaded step " + std::to_string(v.step));
    auto same = Same(into, last, 4, g.rank());
    return same ? Status::OK() : DataLossError(same.message());
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
}

}  // namespace
}  // namespace megackpt::dcp
