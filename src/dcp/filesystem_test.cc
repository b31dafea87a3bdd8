// Single-process tests of the FileSystemWriter/Reader through Save/Load:
// round trips, strided tensors, minimal reads, faults, crash safety, async save.
#include "megackpt/dcp/filesystem.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "dcp/block_hashes.h"
#include "dcp/synthetic.h"
#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/endian.h"
#include "megackpt/dcp/checkpoint.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;

using testing::TempDir;

std::vector<std::string> DataFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : stdfs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.ends_with(".distcp")) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tensor Iota(DType dt, Shape shape, uint32_t seed) {
  Tensor t = Tensor::Empty(dt, std::move(shape)).value();
  auto* p = static_cast<uint8_t*>(t.data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>((i * 131 + seed) >> 1);
  return t;
}

void FlipFileByte(const std::string& file, uint64_t at) { test_util::XorFileByte(file, at, 0x20); }

std::string ReadFileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(FileSystemCheckpoint, SyntheticRoundTripAndRebuild) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(7, 1 << 20);
  auto state = synthetic::BuildRankState(spec, 1, 0, 0, true);
  ASSERT_TRUE(state.ok());
  auto writer = NewFileSystemWriter(dir.path());
  ASSERT_TRUE(Save(*state, *writer).ok());
  EXPECT_TRUE(stdfs::exists(dir.path() + "/.metadata"));
  // Load into another layout of the same world size.
  for (int variant = 0; variant < synthetic::kNumLayouts; ++variant) {
    auto dest = synthetic::BuildRankState(spec, 1, 0, variant, false);
    ASSERT_TRUE(dest.ok());
    auto reader = NewFileSystemReader(dir.path());
    Status s = Load(*dest, *reader);
    ASSERT_TRUE(s.ok()) << s.ToString();
    Status v = synthetic::VerifyRankState(spec, *dest);
    ASSERT_TRUE(v.ok()) << "variant " << variant << ": " << v.ToString();
  }
  // Rebuild the nested structure from the checkpoint alone.
  auto reader = NewFileSystemReader(dir.path());
  auto md = reader->ReadMetadata();
  ASSERT_TRUE(md.ok());
  auto rebuilt = BuildStateDictFromMetadata(*md);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
  ASSERT_TRUE(Load(*rebuilt, *reader).ok());
  Status v = synthetic::VerifyRankState(spec, *rebuilt);
  EXPECT_TRUE(v.ok()) << v.ToString();
  ASSERT_TRUE(rebuilt->Find("model") && rebuilt->Find("model")->is_dict());
  ASSERT_TRUE(rebuilt->Find("model")->dict().Find("layers")->is_list());
  ASSERT_TRUE(
      rebuilt->Find("optim")->dict().Find("state")->list()[0].dict().Find("step")->is_bytes());
}

// The data files' directory entries go out before their bytes, so the commit
// does not wait for the folder's block behind the data's writeback
// (WriteOutNewEntries).
TEST(FileSystemCheckpoint, FolderIsSyncedAfterCreatingTheDataFilesAndBeforeWritingThem) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(7, 1 << 20);
  auto state = synthetic::BuildRankState(spec, 1, 0, 0, true);
  ASSERT_TRUE(state.ok());
  for (bool sync : {false, true}) {
    auto recording = std::make_shared<testing::InstrumentedFileSystem>();
    FileSystemWriterOptions wo;
    wo.fs = recording;
    wo.sync = sync;
    wo.thread_count = 3;
    const std::string path = dir.path() + "/ckpt";
    ASSERT_TRUE(Save(*state, *NewFileSystemWriter(path, wo)).ok());
    const std::vector<std::string> events = recording->Events();
    EXPECT_EQ(std::count_if(events.begin(), events.end(),
                            [](const std::string& e) { return e.rfind("create __", 0) == 0; }),
              3)
        << "sync " << sync;
    EXPECT_EQ(testing::CheckEntriesWrittenOutBeforeData(events, "ckpt", ".distcp"), "")
        << "sync " << sync;
  }
}

// The commit's names are looked up before the data is written only where a
// lookup fills a cache (FileSystemCapabilities::cached_name_lookups).
TEST(FileSystemCheckpoint, CommitNamesAreLookedUpEarlyOnlyWhereLookupsAreCached) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(3, 1 << 16);
  auto state = synthetic::BuildRankState(spec, 1, 0, 0, true);
  ASSERT_TRUE(state.ok());
  for (bool cached : {true, false}) {
    auto recording = std::make_shared<testing::InstrumentedFileSystem>();
    recording->cached_name_lookups = cached;
    FileSystemWriterOptions wo;
    wo.fs = recording;
    wo.overwrite = true;  // no lookup of .metadata at set-up
    const std::string path = dir.path() + "/ckpt" + std::to_string(cached);
    ASSERT_TRUE(Save(*state, *NewFileSystemWriter(path, wo)).ok());
    const std::vector<std::string> events = recording->Events();
    const auto lookup = std::find(events.begin(), events.end(), "lookup .metadata");
    const auto first_write = std::find_if(events.begin(), events.end(), [](const std::string& e) {
      return e.rfind("write ", 0) == 0;
    });
    if (cached) {
      EXPECT_TRUE(lookup != events.end() && lookup < first_write);
    } else {
      EXPECT_TRUE(lookup == events.end());
    }
  }
}

TEST(FileSystemCheckpoint, StridedSourceAndDestination) {
  TempDir dir;
  // Source: a transposed view of a [6, 10] buffer, i.e. a [10, 6] strided tensor.
  Tensor base = Iota(DType::kF32, {6, 10}, 3);
  Tensor src =
      Tensor::FromBlobStrided(base.data(), DType::kF32, {10, 6}, {1, 10}, base.owner()).value();
  StateDict sd;
  sd.Set("t", StateValue(src));
  FileSystemWriterOptions wo;
  wo.max_write_bytes = 1 << 16;
  auto writer = NewFileSystemWriter(dir.path(), wo);
  ASSERT_TRUE(Save(sd, *writer).ok());
  // Destination: column shards that are themselves strided views.
  Tensor dbase = Tensor::Empty(DType::kF32, {6, 10}, true).value();
  Tensor dview =
      Tensor::FromBlobStrided(dbase.data(), DType::kF32, {10, 6}, {1, 10}, dbase.owner()).value();
  StateDict dest;
  dest.Set("t", StateValue(ShardedTensor{DType::kF32,
                                         {10, 6},
                                         {Shard{{0, 0}, dview.Narrow(1, 0, 4).value()},
                                          Shard{{0, 4}, dview.Narrow(1, 4, 2).value()}}}));
  auto reader = NewFileSystemReader(dir.path());
  Status s = Load(dest, *reader);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(TensorBytesEqual(dview, src));
}

// ---- resharded loads of a tensor saved in 3 row blocks ----------------------

// The tensor of the resharded-read tests: F32, 1.5 MiB.
const Shape kRowBlocksGlobal{768, 512};

// Saves `full` (a "w" of kRowBlocksGlobal) at `dir` as 3 row blocks of 256 rows.
void SaveInThreeRowBlocks(const Tensor& full, const std::string& dir) {
  std::vector<Shard> shards;
  for (int r = 0; r < 3; ++r)
    shards.push_back(Shard{{256 * r, 0}, full.Narrow(0, 256 * r, 256).value()});
  StateDict sd;
  sd.Set("w", StateValue(ShardedTensor{DType::kF32, kRowBlocksGlobal, shards}));
  ASSERT_TRUE(Save(sd, *NewFileSystemWriter(dir)).ok());
}

// The destination boxes of the resharded-read tests.
struct ReadBox {
  const char* name;
  Shape offsets, sizes;
  uint64_t runs;  // storage runs of the box (rows, or 1 per chunk for whole rows)
};
const ReadBox kReadBoxes[] = {
    {"rows crossing chunks", {200, 0}, {300, 512}, 2},
    {"columns", {0, 128}, {768, 256}, 768},
    {"2-D block", {100, 64}, {400, 200}, 400},
    {"single row", {500, 0}, {1, 512}, 1},
};

// Loads box `c` of `full` (saved by SaveInThreeRowBlocks at `dir`) through a
// FileSystemReader with options `ro` (its fs replaced by a byte-counting one),
// expects exactly the box's bytes, and sets *bytes_read to the data bytes read
// and *bytes_needed to the box's. A failed load is a fatal failure.
void LoadBoxCountingReads(const Tensor& full, const std::string& dir, const ReadBox& c,
                          FileSystemReaderOptions ro, uint64_t* bytes_read,
                          uint64_t* bytes_needed) {
  auto counting = std::make_shared<testing::InstrumentedFileSystem>();
  ro.fs = counting;
  Tensor dst = Tensor::Empty(DType::kF32, c.sizes, true).value();
  StateDict dest;
  dest.Set("w", StateValue(ShardedTensor{DType::kF32, kRowBlocksGlobal, {Shard{c.offsets, dst}}}));
  Status s = Load(dest, *NewFileSystemReader(dir, ro));
  ASSERT_TRUE(s.ok()) << c.name << ": " << s.ToString();
  Tensor want = full;
  for (int d = 0; d < 2; ++d) want = want.Narrow(d, c.offsets[d], c.sizes[d]).value();
  EXPECT_TRUE(TensorBytesEqual(dst, want)) << c.name;
  *bytes_read = counting->data_bytes_read.load();
  *bytes_needed = dst.nbytes();
}

// A resharded load reads at most 1.05x the bytes its destination needs.
TEST(FileSystemCheckpoint, ReshardedLoadReadsOnlyWhatItNeeds) {
  TempDir dir;
  Tensor full = Iota(DType::kF32, kRowBlocksGlobal, 11);
  ASSERT_NO_FATAL_FAILURE(SaveInThreeRowBlocks(full, dir.path()));
  FileSystemReaderOptions ro;
  ro.verify = VerifyMode::kOff;  // the exact-range path; verified: the next test
  for (const ReadBox& c : kReadBoxes) {
    uint64_t read = 0, needed = 0;
    ASSERT_NO_FATAL_FAILURE(LoadBoxCountingReads(full, dir.path(), c, ro, &read, &needed));
    const double ratio = static_cast<double>(read) / static_cast<double>(needed);
    EXPECT_LE(ratio, 1.05) << c.name << ": read " << read << " for " << needed;
    EXPECT_GE(ratio, 1.0) << c.name;
  }
}

// Verified (default) resharded loads read whole checksum blocks, each once:
// at most one block more at each end of every storage run, with the automatic
// block size (1/16 of a 2 KiB row here: 128 B).
TEST(FileSystemCheckpoint, VerifiedReshardedLoadReadsWholeBlocksOnly) {
  TempDir dir;
  Tensor full = Iota(DType::kF32, kRowBlocksGlobal, 11);
  ASSERT_NO_FATAL_FAILURE(SaveInThreeRowBlocks(full, dir.path()));
  auto md = NewFileSystemReader(dir.path())->ReadMetadata();
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  const uint64_t bs = md->storage_data.begin()->second.block_size;
  EXPECT_EQ(bs, 128u);
  for (const ReadBox& c : kReadBoxes) {
    uint64_t read = 0, needed = 0;
    ASSERT_NO_FATAL_FAILURE(
        LoadBoxCountingReads(full, dir.path(), c, FileSystemReaderOptions{}, &read, &needed));
    // Data: whole blocks only, at most two partial blocks per run. Tables (in
    // the data file, so counted too): 4 bytes per block of at most the stored
    // rows the box touches (a read fetches the table slice of a group of runs
    // at once, gaps between its runs included).
    const uint64_t row_blocks = 512 * 4 / bs;
    const uint64_t table_bytes = 4 * row_blocks * static_cast<uint64_t>(c.sizes[0]);
    EXPECT_GE(read, needed) << c.name;
    EXPECT_LE(read, needed + 2 * bs * c.runs + table_bytes) << c.name;
  }
}

// Saves a F32 tensor 'w' (256x300) and a 1000-byte value 'b' with one writer
// thread (so into one data file, the bytes value first).
void SaveTensorAndBytes(const std::string& path) {
  StateDict sd;
  sd.Set("w", StateValue(Iota(DType::kF32, {256, 300}, 1)));
  sd.Set("b", StateValue::Bytes(std::string(1000, 'x')));
  FileSystemWriterOptions wo;
  wo.thread_count = 1;
  ASSERT_TRUE(Save(sd, *NewFileSystemWriter(path, wo)).ok());
}

// FileSystemWriterOptions::hash_block_size: the writer threads hash each item
// while writing it, and its record in StorageInfo::extra equals HashBlocks of
// its stored (dense, row-major) bytes -- as the data file holds them, and as
// the tensor's elements are in row-major order: a contiguous tensor with a short
// last block, a strided one (copied through the write buffer in slabs that do
// not end on block boundaries), bytes values, empty items.
TEST(FileSystemCheckpoint, HashRecordsEqualHashBlocksOfTheStoredBytes) {
  constexpr uint64_t kBlock = 5000;
  Tensor w = Iota(DType::kF32, {256, 300}, 1);  // 307200 bytes: 61 blocks and 2200
  Tensor base = Iota(DType::kF32, {300, 200}, 5);
  Tensor strided =
      Tensor::FromBlobStrided(base.data(), DType::kF32, {200, 300}, {1, 200}, base.owner()).value();
  Tensor dense = Tensor::Empty(DType::kF32, {200, 300}).value();
  ASSERT_TRUE(CopyTensor(strided, dense).ok());
  std::string b(12345, '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i * 7 + 3);
  StateDict sd;
  sd.Set("w", StateValue(w));
  sd.Set("s", StateValue(strided));
  sd.Set("e", StateValue(Tensor::Empty(DType::kF32, {0, 4}).value()));
  sd.Set("b", StateValue::Bytes(b));
  sd.Set("nb", StateValue::Bytes(""));
  auto bytes_of = [](const Tensor& t) {
    return std::span<const std::byte>(static_cast<const std::byte*>(t.data()), t.nbytes());
  };
  const std::map<std::string, BlockHashes> want = {{"w", HashBlocks(bytes_of(w), kBlock)},
                                                   {"s", HashBlocks(bytes_of(dense), kBlock)},
                                                   {"e", HashBlocks({}, kBlock)},
                                                   {"b", HashBlocks(AsBytes(b), kBlock)},
                                                   {"nb", HashBlocks({}, kBlock)}};
  EXPECT_EQ(want.at("w").digests.size(), 62u);
  EXPECT_EQ(want.at("s").digests.size(), 48u);
  for (uint64_t hash_block : {uint64_t{0}, kBlock}) {
    TempDir dir;
    FileSystemWriterOptions wo;
    wo.max_write_bytes = 1 << 16;  // "s" (240000 bytes) goes through the buffer in 4 slabs
    wo.hash_block_size = hash_block;
    ASSERT_TRUE(Save(sd, *NewFileSystemWriter(dir.path(), wo)).ok());
    auto md = DecodeMetadata(ReadFileText(dir.path() + "/.metadata"));
    ASSERT_TRUE(md.ok()) << md.status().ToString();
    ASSERT_EQ(md->storage_data.size(), want.size());
    for (const auto& [idx, info] : md->storage_data) {
      if (hash_block == 0) {
        EXPECT_TRUE(info.extra.empty()) << ToString(idx);
        continue;
      }
      auto got = DecodeBlockHashes(info.extra);
      ASSERT_TRUE(got.has_value()) << ToString(idx) << ": " << info.extra;
      EXPECT_EQ(*got, want.at(idx.fqn)) << ToString(idx);
      EXPECT_EQ(info.extra, EncodeBlockHashes(want.at(idx.fqn))) << ToString(idx);
      const std::string file = ReadFileText(dir.path() + "/" + info.relative_path);
      ASSERT_LE(info.offset + info.length, file.size());
      EXPECT_EQ(*got, HashBlocks(AsBytes(std::string_view(file).substr(info.offset, info.length)),
                                 kBlock))
          << ToString(idx);
    }
  }
}

TEST(FileSystemCheckpoint, FlippedByteIsDataLossNamingFileAndTensor) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(SaveTensorAndBytes(dir.path()));
  auto files = DataFiles(dir.path());
  ASSERT_EQ(files.size(), 1u);
  const std::string data = dir.path() + "/" + files[0];
  // Flip one byte inside the tensor (stored after the bytes value, which is smaller).
  FlipFileByte(data, 200000);
  StateDict dest;
  dest.Set("w", StateValue(Tensor::Empty(DType::kF32, {256, 300}).value()));
  Status s = Load(dest, *NewFileSystemReader(dir.path()));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(files[0]), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("checksum mismatch"), std::string::npos) << s.message();
}

// Each item's block CRC table is stored in its data file right after its bytes
// (u32 little-endian per block); .metadata records only where it is.
TEST(FileSystemCheckpoint, BlockCrcTablesFollowTheirItemInTheDataFile) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(SaveTensorAndBytes(dir.path()));
  const std::string meta_text = ReadFileText(dir.path() + "/.metadata");
  EXPECT_EQ(meta_text.find("block_crc32"), std::string::npos);
  EXPECT_NE(meta_text.find("\"block_table_offset\":"), std::string::npos);
  auto md = DecodeMetadata(meta_text);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  ASSERT_EQ(md->storage_data.size(), 2u);
  for (const auto& [idx, info] : md->storage_data) {
    const std::string file = ReadFileText(dir.path() + "/" + info.relative_path);
    ASSERT_NE(info.block_size, 0u) << ToString(idx);
    ASSERT_TRUE(info.block_table_offset.has_value()) << ToString(idx);
    EXPECT_TRUE(info.block_crc32.empty());
    const uint64_t at = *info.block_table_offset;
    EXPECT_EQ(at, (info.offset + info.length + 3) / 4 * 4)
        << ToString(idx);  // right after the bytes
    const uint64_t blocks = BlockCount(info);
    ASSERT_LE(at + 4 * blocks, file.size());
    const auto* bytes = reinterpret_cast<const std::byte*>(file.data());
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t from = info.offset + b * info.block_size;
      const uint64_t n = std::min(info.block_size, info.offset + info.length - from);
      ASSERT_EQ(LoadLE32(file.data() + at + 4 * b),
                Crc32(std::span<const std::byte>(bytes + from, n)))
          << ToString(idx) << " block " << b;
    }
  }
  // A damaged table entry is a mismatch of its block, named like damaged data.
  const StorageInfo& w = md->storage_data.at(MetadataIndex("w", Shape{0, 0}));
  const std::string data = dir.path() + "/" + w.relative_path;
  FlipFileByte(data, *w.block_table_offset + 4 * 5 + 2);
  StateDict dest;
  dest.Set("w", StateValue(Tensor::Empty(DType::kF32, {256, 300}).value()));
  Status s = Load(dest, *NewFileSystemReader(dir.path()));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(w.relative_path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'w'[0, 0] block 5,"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("data or its checksum table is damaged"), std::string::npos)
      << s.message();
  // Unverified loads do not read tables: the same load succeeds with kOff.
  FileSystemReaderOptions off;
  off.verify = VerifyMode::kOff;
  EXPECT_TRUE(Load(dest, *NewFileSystemReader(dir.path(), off)).ok());
  // A partial load that does not touch block 5 verifies against the rest of the table.
  Tensor rows = Tensor::Empty(DType::kF32, {10, 300}).value();
  StateDict part;
  part.Set("w", StateValue(ShardedTensor{DType::kF32, {256, 300}, {Shard{{100, 0}, rows}}}));
  EXPECT_TRUE(Load(part, *NewFileSystemReader(dir.path())).ok());
  // A file cut inside the table is truncated, for verified loads.
  stdfs::resize_file(data, *w.block_table_offset + 8);
  s = Load(dest, *NewFileSystemReader(dir.path()));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("checksum table of 'w'"), std::string::npos) << s.message();
}

// A large item is read in stretches of many MiB, each checksummed in the
// read's own pass (ReadExactlyAtWithCrc32: 8 MiB mapped windows on a local
// file): whole and row-sliced loads are bit-exact, and a flipped byte in the
// first window, a middle one or the last block, or in the block table, is
// DataLoss naming the file, the tensor and the block.
TEST(FileSystemCheckpoint, FlipsInALargeItemAreFoundByTheFusedRead) {
  TempDir dir;
  Tensor big = Iota(DType::kF32, {6144, 1024}, 3);  // 24 MiB, 4 KiB rows
  {
    StateDict sd;
    sd.Set("big", StateValue(big));
    FileSystemWriterOptions wo;
    wo.thread_count = 1;
    ASSERT_TRUE(Save(sd, *NewFileSystemWriter(dir.path(), wo)).ok());
  }
  auto md = DecodeMetadata(ReadFileText(dir.path() + "/.metadata"));
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  const StorageInfo& info = md->storage_data.at(MetadataIndex("big", Shape{0, 0}));
  ASSERT_NE(info.block_size, 0u);
  ASSERT_TRUE(info.block_table_offset.has_value());
  const std::string data = dir.path() + "/" + info.relative_path;
  auto load_whole = [&]() -> Status {
    StateDict dest;
    Tensor out = Tensor::Empty(DType::kF32, {6144, 1024}).value();
    dest.Set("big", StateValue(out));
    MEGA_RETURN_IF_ERROR(Load(dest, *NewFileSystemReader(dir.path())));
    if (std::memcmp(out.data(), big.data(), big.nbytes()) != 0)
      return InternalError("bytes differ");
    return Status::OK();
  };
  auto load_rows = [&]() -> Status {  // rows 1000..3999: 12 MiB from inside the item
    Tensor rows = Tensor::Empty(DType::kF32, {3000, 1024}).value();
    StateDict part;
    part.Set("big", StateValue(ShardedTensor{DType::kF32, {6144, 1024}, {Shard{{1000, 0}, rows}}}));
    MEGA_RETURN_IF_ERROR(Load(part, *NewFileSystemReader(dir.path())));
    const auto* want = static_cast<const std::byte*>(big.data()) + 1000 * 4096;
    if (std::memcmp(rows.data(), want, rows.nbytes()) != 0) return InternalError("bytes differ");
    return Status::OK();
  };
  ASSERT_TRUE(load_whole().ok());
  ASSERT_TRUE(load_rows().ok());
  const uint64_t n = big.nbytes(), bs = info.block_size;
  for (uint64_t rel : {uint64_t{100}, uint64_t{(13u << 20) + 7}, n - 5}) {
    SCOPED_TRACE("byte " + std::to_string(rel) + " of the item");
    FlipFileByte(data, info.offset + rel);
    Status s = load_whole();
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find(info.relative_path), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("'big'[0, 0] block " + std::to_string(rel / bs) + ","),
              std::string::npos)
        << s.message();
    const bool in_rows = rel >= 1000 * 4096 && rel < 4000 * 4096;
    EXPECT_EQ(load_rows().code(), in_rows ? StatusCode::kDataLoss : StatusCode::kOk);
    FlipFileByte(data, info.offset + rel);  // back
  }
  FlipFileByte(data, *info.block_table_offset + 4 * (n / bs / 2) + 1);
  Status s = load_whole();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("'big'[0, 0] block " + std::to_string(n / bs / 2) + ","),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("data or its checksum table is damaged"), std::string::npos);
}

// Checkpoints written before the tables moved into the data files record them
// inline in .metadata (block_crc32 hex). tests/testdata/dcp-fs-inline-crc/ is
// one, written by megackpt main at 9a86eb6 (see make_inline_crc.cc.txt there):
// it loads, whole and in part, and is verified block by block.
TEST(FileSystemCheckpoint, LoadsCheckpointWithInlineBlockCrcTables) {
  TempDir dir;
  const std::string src = MEGACKPT_SOURCE_DIR "/tests/testdata/dcp-fs-inline-crc";
  stdfs::create_directories(dir.path());
  for (const auto& e : stdfs::directory_iterator(src)) {
    stdfs::copy_file(e.path(), dir.path() + "/" + e.path().filename().string());
  }
  auto md = NewFileSystemReader(dir.path())->ReadMetadata();
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  const StorageInfo& w = md->storage_data.at(MetadataIndex("w", Shape{0, 0}));
  EXPECT_FALSE(w.block_table_offset.has_value());
  EXPECT_EQ(w.block_size, 64u);
  EXPECT_EQ(w.block_crc32.size(), 8u);
  auto expected = [](int64_t i) { return static_cast<float>(i) * 0.5f - 3.0f; };
  StateDict dest;
  dest.Set("w", StateValue(Tensor::Empty(DType::kF32, {4, 32}).value()));
  dest.Set("note", StateValue::Bytes(""));
  Status s = Load(dest, *NewFileSystemReader(dir.path()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto* p = static_cast<const float*>(dest.Find("w")->tensor().data());
  for (int64_t i = 0; i < 128; ++i) ASSERT_EQ(p[i], expected(i)) << i;
  EXPECT_EQ(dest.Find("note")->bytes(), std::string(300, 'n'));
  // A column slice: whole 64-byte blocks are read and verified.
  Tensor cols = Tensor::Empty(DType::kF32, {4, 8}).value();
  StateDict part;
  part.Set("w", StateValue(ShardedTensor{DType::kF32, {4, 32}, {Shard{{0, 20}, cols}}}));
  s = Load(part, *NewFileSystemReader(dir.path()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  const auto* c = static_cast<const float*>(cols.data());
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t k = 0; k < 8; ++k)
      ASSERT_EQ(c[r * 8 + k], expected(r * 32 + 20 + k)) << r << "," << k;
  }
  // Damaged data is caught against the inline table.
  FlipFileByte(dir.path() + "/" + w.relative_path, w.offset + 200);
  s = Load(dest, *NewFileSystemReader(dir.path()));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find(w.relative_path), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'w'[0, 0] block 3,"), std::string::npos) << s.message();
}

TEST(FileSystemCheckpoint, MissingTruncatedAndCorruptFiles) {
  TempDir dir;
  StateDict sd;
  sd.Set("w", StateValue(Iota(DType::kF32, {64, 64}, 1)));
  FileSystemWriterOptions wo;
  wo.thread_count = 1;
  auto dest = [] {
    StateDict d;
    d.Set("w", StateValue(Tensor::Empty(DType::kF32, {64, 64}).value()));
    return d;
  };
  // No checkpoint at all.
  {
    StateDict d = dest();
    Status s = Load(d, *NewFileSystemReader(dir.path("nothing")));
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_NE(s.message().find(".metadata not found"), std::string::npos) << s.message();
  }
  ASSERT_TRUE(Save(sd, *NewFileSystemWriter(dir.path(), wo)).ok());
  const std::string data = dir.path() + "/" + DataFiles(dir.path())[0];
  // Truncated data file.
  stdfs::copy_file(data, data + ".bak");
  stdfs::resize_file(data, 1000);
  {
    StateDict d = dest();
    Status s = Load(d, *NewFileSystemReader(dir.path()));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  }
  // Missing data file.
  stdfs::remove(data);
  {
    StateDict d = dest();
    Status s = Load(d, *NewFileSystemReader(dir.path()));
    EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
    EXPECT_NE(s.message().find("is missing"), std::string::npos) << s.message();
  }
  stdfs::rename(data + ".bak", data);
  // Corrupt metadata.
  const std::string meta = dir.path() + "/.metadata";
  std::string text;
  {
    std::ifstream in(meta);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(meta, std::ios::trunc);
    out << text.substr(0, text.size() / 2);
  }
  {
    StateDict d = dest();
    Status s = Load(d, *NewFileSystemReader(dir.path()));
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find(".metadata"), std::string::npos) << s.message();
  }
}

// Sets *sd to a one-entry state ("x": bytes "1") and saves it at `dir`: the
// existing checkpoint of the overwrite = false tests. Returns writer options
// that refuse to overwrite it.
FileSystemWriterOptions SaveExistingCheckpoint(const std::string& dir, StateDict* sd) {
  sd->Set("x", StateValue::Bytes("1"));
  EXPECT_TRUE(Save(*sd, *NewFileSystemWriter(dir)).ok());
  FileSystemWriterOptions wo;
  wo.overwrite = false;
  return wo;
}

TEST(FileSystemCheckpoint, OverwriteFalseRefusesExistingCheckpoint) {
  TempDir dir;
  StateDict sd;
  const FileSystemWriterOptions wo = SaveExistingCheckpoint(dir.path(), &sd);
  Status s = Save(sd, *NewFileSystemWriter(dir.path(), wo));
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  EXPECT_TRUE(Save(sd, *NewFileSystemWriter(dir.path("fresh"), wo)).ok());
}

// Re-saving into the same folder: a failure at any point before the commit
// leaves the previous checkpoint loadable; after the commit only the new save's
// files remain.
TEST(FileSystemCheckpoint, ResaveIsCrashSafe) {
  TempDir dir;
  auto state_with = [](uint32_t seed) {
    StateDict sd;
    sd.Set("w", StateValue(Iota(DType::kF32, {128, 32}, seed)));
    sd.Set("b", StateValue::Bytes("version " + std::to_string(seed)));
    return sd;
  };
  auto load_b = [&]() -> std::string {
    StateDict d;
    d.Set("w", StateValue(Tensor::Empty(DType::kF32, {128, 32}).value()));
    d.Set("b", StateValue::Bytes(""));
    Status s = Load(d, *NewFileSystemReader(dir.path()));
    return s.ok() ? d.Find("b")->bytes() : s.ToString();
  };
  ASSERT_TRUE(Save(state_with(1), *NewFileSystemWriter(dir.path())).ok());
  const auto first_files = DataFiles(dir.path());
  EXPECT_EQ(load_b(), "version 1");

  // (a) A data file cannot be created: the save fails, its files are removed.
  {
    auto faulty = std::make_shared<testing::InstrumentedFileSystem>();
    faulty->fail_open_for_write = [](const std::string& p) { return p.ends_with("_1.distcp"); };
    FileSystemWriterOptions wo;
    wo.fs = faulty;
    Status s = Save(state_with(2), *NewFileSystemWriter(dir.path(), wo));
    EXPECT_EQ(s.code(), StatusCode::kIOError) << s.ToString();
    EXPECT_EQ(load_b(), "version 1");
    EXPECT_EQ(DataFiles(dir.path()), first_files);
  }
  // (b) The commit itself fails.
  {
    auto faulty = std::make_shared<testing::InstrumentedFileSystem>();
    faulty->fail_write_atomically = [](const std::string&) { return true; };
    FileSystemWriterOptions wo;
    wo.fs = faulty;
    Status s = Save(state_with(3), *NewFileSystemWriter(dir.path(), wo));
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(load_b(), "version 1");
    EXPECT_EQ(DataFiles(dir.path()), first_files);
  }
  // (c) A crash after the data was written, before the commit: nobody cleans up.
  {
    class CrashingWriter : public StorageWriter {
     public:
      explicit CrashingWriter(std::unique_ptr<StorageWriter> w) : w_(std::move(w)) {}
      Status Reset(std::string_view id) override { return w_->Reset(id); }
      bool ValidateCheckpointId(std::string_view id) const override {
        return w_->ValidateCheckpointId(id);
      }
      Status SetUpStorageWriter(const StorageSetUp& s) override {
        return w_->SetUpStorageWriter(s);
      }
      Result<SavePlan> PrepareLocalPlan(SavePlan p) override {
        return w_->PrepareLocalPlan(std::move(p));
      }
      Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> p) override {
        return w_->PrepareGlobalPlan(std::move(p));
      }
      Result<std::vector<WriteResult>> WriteData(const SavePlan& p, SavePlanner& pl) override {
        return w_->WriteData(p, pl);
      }
      Status Finish(const Metadata&, const std::vector<std::vector<WriteResult>>&) override {
        return AbortedError("simulated crash before the commit");
      }
      void Abort() override {}  // the process is gone: no cleanup
      std::optional<StorageMeta> GetStorageMeta() const override { return w_->GetStorageMeta(); }

     private:
      std::unique_ptr<StorageWriter> w_;
    };
    CrashingWriter crashing(NewFileSystemWriter(dir.path()));
    EXPECT_FALSE(Save(state_with(4), crashing).ok());
    EXPECT_EQ(load_b(), "version 1");
    EXPECT_GT(DataFiles(dir.path()).size(), first_files.size());  // orphans of the crash
  }
  // A successful save commits and removes every older data file.
  ASSERT_TRUE(Save(state_with(5), *NewFileSystemWriter(dir.path())).ok());
  EXPECT_EQ(load_b(), "version 5");
  for (const auto& f : DataFiles(dir.path())) {
    EXPECT_EQ(std::find(first_files.begin(), first_files.end(), f), first_files.end()) << f;
  }
  auto reader = NewFileSystemReader(dir.path());
  auto md = reader->ReadMetadata();
  ASSERT_TRUE(md.ok());
  std::set<std::string> referenced;
  for (const auto& [idx, info] : md->storage_data) referenced.insert(info.relative_path);
  EXPECT_EQ(referenced.size(), DataFiles(dir.path()).size());
}

TEST(FileSystemCheckpoint, WriterExceptionBecomesError) {
  TempDir dir;
  StateDict sd;
  sd.Set("x", StateValue(Iota(DType::kU8, {100}, 1)));
  testing::ThrowingSavePlanner planner(/*throws=*/true, "boom in resolve");
  SaveOptions so;
  so.planner = &planner;
  FileSystemWriterOptions wo;
  wo.thread_count = 1;
  Status s = Save(sd, *NewFileSystemWriter(dir.path(), wo), nullptr, so);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("boom in resolve"), std::string::npos) << s.message();
  EXPECT_TRUE(DataFiles(dir.path()).empty());
  EXPECT_FALSE(stdfs::exists(dir.path() + "/.metadata"));
}

TEST(AsyncSave, StagesInPiecesThroughABoundedReusablePool) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(3, 3 << 20);
  auto state = synthetic::BuildRankState(spec, 1, 0, 0, true);
  ASSERT_TRUE(state.ok());
  auto pool = StagingPool::Create(1 << 20);  // smaller than the state: several waves
  for (int round = 0; round < 2; ++round) {
    AsyncSaveOptions opts;
    opts.pool = pool;
    std::shared_ptr<StorageWriter> writer = NewFileSystemWriter(dir.path());
    StateDict copy = *state;  // views of the same memory
    AsyncSaveHandle h = AsyncSave(copy, writer, nullptr, opts);
    ASSERT_TRUE(h.staged.get().ok());
    // After staging the caller may overwrite its tensors.
    auto flat = FlattenStateDict(copy, nullptr).value();
    std::vector<std::string> saved_bytes;
    for (auto& fe : flat) {
      if (fe.value->is_tensor())
        std::memset(fe.value->tensor().data(), 0x55, fe.value->tensor().nbytes());
    }
    Status done = h.done.get();
    ASSERT_TRUE(done.ok()) << done.ToString();
    EXPECT_LE(pool->reserved_bytes(), pool->capacity_bytes());
    auto dest = synthetic::BuildRankState(spec, 1, 0, 2, false);
    ASSERT_TRUE(Load(*dest, *NewFileSystemReader(dir.path())).ok());
    Status v = synthetic::VerifyRankState(spec, *dest);
    ASSERT_TRUE(v.ok()) << v.ToString();
    state = synthetic::BuildRankState(spec, 1, 0, 0, true);  // restore for round 2
  }
}

TEST(AsyncSave, FailureReachesBothFutures) {
  TempDir dir;
  StateDict sd;
  const FileSystemWriterOptions wo = SaveExistingCheckpoint(dir.path(), &sd);
  AsyncSaveHandle h = AsyncSave(sd, NewFileSystemWriter(dir.path(), wo));
  EXPECT_EQ(h.done.get().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(h.staged.get().code(), StatusCode::kAlreadyExists);
}

TEST(FileSystemCheckpoint, NoCollectivesWritesPerRankMetadata) {
  TempDir dir;
  StateDict sd;
  sd.Set("x", StateValue::Bytes("one"));
  SaveOptions so;
  so.use_collectives = false;
  ASSERT_TRUE(Save(sd, *NewFileSystemWriter(dir.path()), nullptr, so).ok());
  StateDict d;
  d.Set("x", StateValue::Bytes(""));
  LoadOptions lo;
  lo.use_collectives = false;
  ASSERT_TRUE(Load(d, *NewFileSystemReader(dir.path()), nullptr, lo).ok());
  EXPECT_EQ(d.Find("x")->bytes(), "one");
}

}  // namespace
}  // namespace megackpt::dcp
