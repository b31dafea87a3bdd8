// Resharded loads of F4 (two elements per byte) tensors: saved sharded over 2
// thread ranks (rows, columns, 2-D blocks), loaded at world sizes 1, 3 and 4 in
// other shardings through FileSystemReader and MegaStorageReader, every nibble
// compared with the source; corrupt bytes inside an F4 partial read are
// DataLoss; the span planner of f4_box.h on tiny spans.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <random>
#include <tuple>

#include "core/test_files.h"
#include "dcp/f4_box.h"
#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/core/packed.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/mega.h"

namespace megackpt::dcp {
namespace {

using testing::TempDir;

// ---- reference nibble access (independent of packed.cc) ---------------------

uint8_t NibbleAt(const Tensor& t, uint64_t i) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return i % 2 == 0 ? p[i / 2] & 0x0F : p[i / 2] >> 4;
}

void SetNibble(const Tensor& t, uint64_t i, uint8_t v) {
  auto* p = static_cast<uint8_t*>(t.data());
  p[i / 2] = i % 2 == 0 ? static_cast<uint8_t>((p[i / 2] & 0xF0) | v)
                        : static_cast<uint8_t>((p[i / 2] & 0x0F) | (v << 4));
}

uint64_t Numel(const Shape& s) {
  uint64_t n = 1;
  for (int64_t x : s) n *= static_cast<uint64_t>(x);
  return n;
}

// Flat index in `global` of element `e` (flat) of the box at `offsets` of shape `sizes`.
uint64_t GlobalFlat(const Shape& global, const Shape& offsets, const Shape& sizes, uint64_t e) {
  const size_t nd = global.size();
  Shape idx(nd);
  for (size_t d = nd; d-- > 0;) {
    idx[d] = static_cast<int64_t>(e % static_cast<uint64_t>(sizes[d]));
    e /= static_cast<uint64_t>(sizes[d]);
  }
  uint64_t f = 0;
  for (size_t d = 0; d < nd; ++d) f = f * static_cast<uint64_t>(global[d]) + offsets[d] + idx[d];
  return f;
}

Tensor RandomF4(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::Empty(DType::kF4, shape).value();
  std::mt19937 rng(seed);
  auto* p = static_cast<uint8_t*>(t.data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

// The box of `src` as a fresh F4 tensor (saved shards).
Tensor Extract(const Tensor& src, const Shape& offsets, const Shape& sizes) {
  Tensor t = Tensor::Empty(DType::kF4, sizes, true).value();
  for (uint64_t e = 0; e < t.numel(); ++e) {
    SetNibble(t, e, NibbleAt(src, GlobalFlat(src.shape(), offsets, sizes, e)));
  }
  return t;
}

// A destination box whose every element differs from what the load must write.
Tensor Poisoned(const Tensor& src, const Shape& offsets, const Shape& sizes) {
  Tensor t = Tensor::Empty(DType::kF4, sizes, true).value();
  for (uint64_t e = 0; e < t.numel(); ++e) {
    SetNibble(t, e, NibbleAt(src, GlobalFlat(src.shape(), offsets, sizes, e)) ^ 0x0F);
  }
  return t;
}

// Every element of `got` (the box at `offsets`) equals the source's.
Status CompareBox(const std::string& what, const Tensor& src, const Shape& offsets,
                  const Tensor& got) {
  uint64_t bad = 0;
  std::string first;
  for (uint64_t e = 0; e < got.numel(); ++e) {
    const uint64_t g = GlobalFlat(src.shape(), offsets, got.shape(), e);
    if (NibbleAt(got, e) != NibbleAt(src, g)) {
      if (bad++ == 0) {
        first = "element " + std::to_string(e) + " (global " + std::to_string(g) + "): got " +
                std::to_string(NibbleAt(got, e)) + ", want " + std::to_string(NibbleAt(src, g));
      }
    }
  }
  if (bad == 0) return Status::OK();
  return InternalError(what + " at " + ShapeToString(offsets) + ShapeToString(got.shape()) + ": " +
                       std::to_string(bad) + " wrong elements, first " + first);
}

// ---- layouts ------------------------------------------------------------------

struct Box {
  Shape offsets, sizes;
};

// The grid of boxes with grid[d] parts along dim d (uneven parts, row-major).
std::vector<Box> Grid(const Shape& global, const std::vector<int>& grid) {
  std::vector<Box> out{Box{{}, {}}};
  for (size_t d = 0; d < global.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out) {
      for (int p = 0; p < grid[d]; ++p) {
        const int64_t lo = global[d] * p / grid[d], hi = global[d] * (p + 1) / grid[d];
        Box nb = b;
        nb.offsets.push_back(lo);
        nb.sizes.push_back(hi - lo);
        next.push_back(nb);
      }
    }
    out = std::move(next);
  }
  return out;
}

enum class Layout { kRows, kCols, kBlocks, kWhole };

const char* LayoutName(Layout l) {
  switch (l) {
    case Layout::kRows:
      return "rows";
    case Layout::kCols:
      return "cols";
    case Layout::kBlocks:
      return "blocks";
    case Layout::kWhole:
      return "whole";
  }
  return "?";
}

// The boxes rank `rank` of `world` holds: rows / last-dim columns split over
// the ranks, or a 2 x ... x 3 block grid dealt round-robin (several chunks per
// rank, some ranks none).
std::vector<Box> BoxesOf(Layout layout, const Shape& global, int world, int rank) {
  std::vector<int> grid(global.size(), 1);
  if (layout == Layout::kWhole) return {Box{Shape(global.size(), 0), global}};
  if (layout == Layout::kRows) grid.front() = world;
  if (layout == Layout::kCols) grid.back() = world;
  if (layout == Layout::kBlocks) {
    grid.front() = 2;
    grid.back() = 3;
  }
  std::vector<Box> all = Grid(global, grid), mine;
  for (size_t i = 0; i < all.size(); ++i) {
    if (static_cast<int>(i % world) == rank && Numel(all[i].sizes) > 0) mine.push_back(all[i]);
  }
  return mine;
}

struct Source {
  std::vector<std::pair<std::string, Tensor>> tensors;
};

Source MakeSource() {
  Source s;
  s.tensors.push_back({"a", RandomF4({7, 5}, 1)});
  s.tensors.push_back({"b", RandomF4({9, 3, 5}, 2)});
  s.tensors.push_back({"c", RandomF4({13}, 3)});
  return s;
}

// ---- backends -----------------------------------------------------------------

enum class Backend { kFs, kFsSmallBlocksAllTouched, kMega, kMegaVerifyPartial };

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kFs:
      return "fs";
    case Backend::kFsSmallBlocksAllTouched:
      return "fs_small_blocks";
    case Backend::kMega:
      return "mega";
    case Backend::kMegaVerifyPartial:
      return "mega_verify_partial";
  }
  return "?";
}

std::unique_ptr<StorageWriter> MakeWriter(Backend b, const std::string& path) {
  if (b == Backend::kFs || b == Backend::kFsSmallBlocksAllTouched) {
    FileSystemWriterOptions o;
    o.sync = false;
    if (b == Backend::kFsSmallBlocksAllTouched) o.checksum_block_size = 8;
    return NewFileSystemWriter(path, o);
  }
  MegaStorageWriterOptions o;
  o.sync = false;
  return std::make_unique<MegaStorageWriter>(path, std::nullopt, o);
}

std::unique_ptr<StorageReader> MakeReader(Backend b, const std::string& path) {
  if (b == Backend::kFs || b == Backend::kFsSmallBlocksAllTouched) {
    FileSystemReaderOptions o;
    o.thread_count = 3;
    if (b == Backend::kFsSmallBlocksAllTouched) o.verify = VerifyMode::kAllTouchedBlocks;
    return NewFileSystemReader(path, o);
  }
  MegaStorageReaderOptions o;
  o.thread_count = 3;
  o.verify_partial_reads = b == Backend::kMegaVerifyPartial;
  return std::make_unique<MegaStorageReader>(path, o);
}

Status SaveSharded(const Source& src, Backend backend, const std::string& path, Layout layout,
                   int world) {
  auto results = dist::RunThreadRanks(world, [&](dist::ProcessGroup& g) -> Status {
    StateDict sd;
    for (const auto& [name, t] : src.tensors) {
      ShardedTensor st{DType::kF4, t.shape(), {}};
      for (const Box& b : BoxesOf(layout, t.shape(), world, g.rank())) {
        st.shards.push_back(Shard{b.offsets, Extract(t, b.offsets, b.sizes)});
      }
      sd.Set(name, StateValue(std::move(st)));
    }
    auto writer = MakeWriter(backend, path);
    return Save(sd, *writer, &g);
  });
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Loads at `world` ranks in `layout` and compares every element of every
// destination chunk with the source.
Status LoadAndCompare(const Source& src, Backend backend, const std::string& path, Layout layout,
                      int world) {
  auto results = dist::RunThreadRanks(world, [&](dist::ProcessGroup& g) -> Status {
    StateDict sd;
    std::vector<std::tuple<std::string, Shape, Tensor>> dests;
    for (const auto& [name, t] : src.tensors) {
      if (layout == Layout::kWhole) {
        Tensor d = Poisoned(t, Shape(t.ndim(), 0), t.shape());
        dests.emplace_back(name, Shape(t.ndim(), 0), d);
        sd.Set(name, StateValue(d));
        continue;
      }
      ShardedTensor st{DType::kF4, t.shape(), {}};
      for (const Box& b : BoxesOf(layout, t.shape(), world, g.rank())) {
        Tensor d = Poisoned(t, b.offsets, b.sizes);
        dests.emplace_back(name, b.offsets, d);
        st.shards.push_back(Shard{b.offsets, d});
      }
      sd.Set(name, StateValue(std::move(st)));
    }
    auto reader = MakeReader(backend, path);
    MEGA_RETURN_IF_ERROR(Load(sd, *reader, &g));
    for (const auto& [name, offsets, d] : dests) {
      const Tensor* s = nullptr;
      for (const auto& [n, t] : src.tensors) {
        if (n == name) s = &t;
      }
      MEGA_RETURN_IF_ERROR(
          CompareBox("'" + name + "' rank " + std::to_string(g.rank()), *s, offsets, d));
    }
    return Status::OK();
  });
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

class F4ReshardTest : public ::testing::TestWithParam<std::tuple<Backend, Layout>> {};

TEST_P(F4ReshardTest, EveryNibbleAtWorldSizes134) {
  const auto [backend, save_layout] = GetParam();
  TempDir dir("f4-reshard");
  const Source src = MakeSource();
  Status s = SaveSharded(src, backend, dir.path(), save_layout, 2);
  ASSERT_TRUE(s.ok()) << s.ToString();
  int loads = 0;
  for (int world : {1, 3, 4}) {
    for (Layout layout : {Layout::kRows, Layout::kCols, Layout::kBlocks, Layout::kWhole}) {
      if (layout == Layout::kWhole && world != 1) continue;
      Status l = LoadAndCompare(src, backend, dir.path(), layout, world);
      EXPECT_TRUE(l.ok()) << "load at world " << world << " as " << LayoutName(layout) << ": "
                          << l.ToString();
      ++loads;
    }
  }
  EXPECT_EQ(loads, 10);
}

INSTANTIATE_TEST_SUITE_P(
    SavedOver2Ranks, F4ReshardTest,
    ::testing::Combine(::testing::Values(Backend::kFs, Backend::kFsSmallBlocksAllTouched,
                                         Backend::kMega, Backend::kMegaVerifyPartial),
                       ::testing::Values(Layout::kRows, Layout::kCols, Layout::kBlocks)),
    [](const ::testing::TestParamInfo<std::tuple<Backend, Layout>>& info) {
      return std::string(BackendName(std::get<0>(info.param))) + "_" +
             LayoutName(std::get<1>(info.param));
    });

// A compressed and chunked F4 tensor in a lone .mega file (no DCP keys: one
// whole tensor), loaded in shards: partial boxes go through the decoded range.
TEST(F4ReshardMega, CompressedChunkedTensorInShards) {
  TempDir dir("f4-reshard-zstd");
  // Compressible: nibbles repeat with period 11.
  Tensor t = Tensor::Empty(DType::kF4, {37, 41}).value();
  for (uint64_t e = 0; e < t.numel(); ++e) SetNibble(t, e, static_cast<uint8_t>((e * 7) % 11));
  format::MegaWriterOptions wo;
  wo.compression = format::MegaCodec::kZstd;
  wo.chunk_bytes = 128;
  format::MegaWriter w(wo);
  ASSERT_TRUE(w.AddTensor("w", t).ok());
  auto written = w.WriteFile(dir.path("model.mega"), false);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_FALSE(written->tensors[0].is_plain());
  for (Layout layout : {Layout::kRows, Layout::kCols, Layout::kBlocks}) {
    for (int world : {3, 4}) {
      auto results = dist::RunThreadRanks(world, [&](dist::ProcessGroup& g) -> Status {
        ShardedTensor st{DType::kF4, t.shape(), {}};
        std::vector<Box> boxes = BoxesOf(layout, t.shape(), world, g.rank());
        for (const Box& b : boxes)
          st.shards.push_back(Shard{b.offsets, Poisoned(t, b.offsets, b.sizes)});
        StateDict sd;
        sd.Set("w", StateValue(st));
        MegaStorageReader reader(dir.path("model.mega"));
        MEGA_RETURN_IF_ERROR(Load(sd, reader, &g));
        for (const Shard& sh : st.shards)
          MEGA_RETURN_IF_ERROR(CompareBox("w", t, sh.offsets, sh.tensor));
        return Status::OK();
      });
      for (const Status& s : results) {
        EXPECT_TRUE(s.ok()) << LayoutName(layout) << " at " << world << ": " << s.ToString();
      }
    }
  }
}

// The tensor and the boxes of the partial-read tests below.
const Shape kPartialGlobal{768, 1023};
const Box kPartialBoxes[] = {
    Box{{201, 0}, {299, 1023}},  // rows crossing a chunk boundary, odd start
    Box{{0, 0}, {768, 128}},     // columns
    Box{{100, 64}, {400, 201}},  // 2-D block, odd width
};

// Saves `full` (an F4 tensor "w" of kPartialGlobal) as three row shards of 256
// rows with the fs writer at `dir`.
void SaveThreeRowShards(const Tensor& full, const std::string& dir) {
  std::vector<Shard> shards;
  for (int r = 0; r < 3; ++r) {
    shards.push_back(Shard{{256 * r, 0}, Extract(full, {256 * r, 0}, {256, 1023})});
  }
  StateDict sd;
  sd.Set("w", StateValue(ShardedTensor{DType::kF4, kPartialGlobal, shards}));
  Status s = Save(sd, *MakeWriter(Backend::kFs, dir));
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// The data bytes a partial load read and the bytes of its destination box.
struct PartialLoad {
  uint64_t bytes_read = 0, bytes_needed = 0;
  double ratio() const { return static_cast<double>(bytes_read) / bytes_needed; }
};

// Loads box `c` of `full` (saved by SaveThreeRowShards at `dir`) into a
// poisoned destination through a FileSystemReader with options `ro` (its fs
// replaced by a byte-counting one), checks every element and fills *load. A
// failed load is a fatal failure.
void LoadPartialBox(const Tensor& full, const std::string& dir, const Box& c,
                    FileSystemReaderOptions ro, PartialLoad* load) {
  auto counting = std::make_shared<testing::InstrumentedFileSystem>();
  ro.fs = counting;
  Tensor dst = Poisoned(full, c.offsets, c.sizes);
  StateDict dest;
  dest.Set("w", StateValue(ShardedTensor{DType::kF4, kPartialGlobal, {Shard{c.offsets, dst}}}));
  Status s = Load(dest, *NewFileSystemReader(dir, ro));
  ASSERT_TRUE(s.ok()) << s.ToString();
  Status cmp = CompareBox("w", full, c.offsets, dst);
  EXPECT_TRUE(cmp.ok()) << cmp.ToString();
  load->bytes_read = counting->data_bytes_read.load();
  load->bytes_needed = dst.nbytes();
}

// Partial F4 boxes read little more than they need: whole-row ranges starting
// mid-byte, column slices and 2-D blocks of odd widths (the same 1.05x bound as
// other dtypes; each run costs at most one extra byte).
TEST(F4ReshardFs, ReadsAboutWhatItNeeds) {
  TempDir dir("f4-reshard-bytes");
  const Tensor full = RandomF4(kPartialGlobal, 21);
  ASSERT_NO_FATAL_FAILURE(SaveThreeRowShards(full, dir.path()));
  // The exact-range read path: verified loads read whole checksum blocks,
  // which for 64-byte column slices of 512-byte F4 rows is about twice the
  // bytes (VerifiedReadsWholeBlocksOnce below).
  FileSystemReaderOptions ro;
  ro.verify = VerifyMode::kOff;
  for (const Box& c : kPartialBoxes) {
    PartialLoad load;
    ASSERT_NO_FATAL_FAILURE(LoadPartialBox(full, dir.path(), c, ro, &load));
    EXPECT_LE(load.ratio(), 1.05) << ShapeToString(c.offsets) << ShapeToString(c.sizes) << ": read "
                                  << load.bytes_read << " for " << load.bytes_needed;
    EXPECT_GE(load.ratio(), 1.0);
  }
}

// The same boxes with verification on (the default): every byte comes from a
// verified checksum block; the reads are whole blocks, so the ratio is bounded
// by the block size (64 B here) per run, and a flipped bit anywhere in a block
// the box touches fails the load.
TEST(F4ReshardFs, VerifiedReadsWholeBlocksOnce) {
  TempDir dir("f4-reshard-verified");
  const Tensor full = RandomF4(kPartialGlobal, 21);
  ASSERT_NO_FATAL_FAILURE(SaveThreeRowShards(full, dir.path()));
  for (const Box& c : kPartialBoxes) {
    PartialLoad load;
    ASSERT_NO_FATAL_FAILURE(LoadPartialBox(full, dir.path(), c, FileSystemReaderOptions{}, &load));
    // Whole blocks, plus their CRC table entries (4 B per 64 B block, read from the data file).
    EXPECT_LE(load.ratio(), 2.1 * (1 + 4.0 / 64))
        << ShapeToString(c.offsets) << ShapeToString(c.sizes);
    EXPECT_GE(load.ratio(), 1.0);
  }
}

// Consolidating an F4 checkpoint saved in 2-D blocks (chunks that start and end
// mid-byte in the whole tensor) gives whole tensors that load back exactly.
TEST(F4ReshardMega, ConsolidateBlocks) {
  TempDir dir("f4-consolidate");
  const Source src = MakeSource();
  Status s = SaveSharded(src, Backend::kMega, dir.path("sharded"), Layout::kBlocks, 2);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto r = Consolidate(dir.path("sharded"), dir.path("whole"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->entries, src.tensors.size());
  for (Layout layout : {Layout::kWhole, Layout::kCols}) {
    Status l = LoadAndCompare(src, Backend::kMega, dir.path("whole"), layout,
                              layout == Layout::kWhole ? 1 : 3);
    EXPECT_TRUE(l.ok()) << LayoutName(layout) << ": " << l.ToString();
  }
}

// Many small odd-length chunks loaded into one destination on 4 reader
// threads: neighbouring items write the two nibbles of shared bytes
// concurrently (the planner serializes those commits), none may be lost.
TEST(F4ReshardFs, ConcurrentCommitsIntoSharedBytes) {
  TempDir dir("f4-reshard-concurrent");
  const Shape global{1201};
  const Tensor full = RandomF4(global, 33);
  std::vector<Shard> shards;
  for (int64_t off = 0, k = 0; off < global[0]; ++k) {
    const int64_t len = std::min<int64_t>(1 + 2 * (k % 3), global[0] - off);  // 1, 3, 5, ...
    shards.push_back(Shard{{off}, Extract(full, {off}, {len})});
    off += len;
  }
  StateDict sd;
  sd.Set("v", StateValue(ShardedTensor{DType::kF4, global, shards}));
  for (Backend b : {Backend::kFs, Backend::kMega}) {
    ASSERT_TRUE(Save(sd, *MakeWriter(b, dir.path(BackendName(b)))).ok());
    for (int round = 0; round < 3; ++round) {
      Tensor dst = Poisoned(full, {0}, global);
      StateDict dest;
      dest.Set("v", StateValue(dst));
      std::unique_ptr<StorageReader> reader;
      if (b == Backend::kFs) {
        FileSystemReaderOptions ro;
        ro.thread_count = 4;
        reader = NewFileSystemReader(dir.path(BackendName(b)), ro);
      } else {
        MegaStorageReaderOptions ro;
        ro.thread_count = 4;
        reader = std::make_unique<MegaStorageReader>(dir.path(BackendName(b)), ro);
      }
      Status s = Load(dest, *reader);
      ASSERT_TRUE(s.ok()) << s.ToString();
      Status c = CompareBox(BackendName(b), full, {0}, dst);
      ASSERT_TRUE(c.ok()) << c.ToString();
    }
  }
}

// ---- corruption ------------------------------------------------------------------

// Flips the bits of the stored byte holding element `elem` of `fqn`'s chunk at
// `offsets`.
void CorruptElement(Backend backend, const std::string& path, const std::string& fqn,
                    const Shape& offsets, uint64_t elem) {
  auto reader = MakeReader(backend, path);
  auto md = reader->ReadMetadata();
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  auto it = md->storage_data.find(MetadataIndex(fqn, offsets));
  ASSERT_NE(it, md->storage_data.end());
  const std::string file = path + "/" + it->second.relative_path;
  ::megackpt::test_util::XorFileByte(file, it->second.offset + elem / 2, 0xFF);
}

struct CorruptCase {
  Backend backend;
  uint64_t block_size;  // fs only
  VerifyMode verify;    // fs only
  Box load;             // destination box (partial F4 read of the one stored chunk)
};

TEST(F4ReshardCorruption, FlippedByteInsidePartialRangeIsDataLoss) {
  const Shape global{64, 33};
  const Tensor t = RandomF4(global, 9);
  // Element (20, 5) is inside each load box below.
  const uint64_t elem = 20 * 33 + 5;
  const CorruptCase cases[] = {
      // Rows 11..29, whole rows: odd start, so an F4 span read; the 64-byte block
      // holding the flipped byte is covered by the read and verified.
      {Backend::kFs, 64, VerifyMode::kReadBlocks, Box{{11, 0}, {19, 33}}},
      // A column box: every touched block read whole.
      {Backend::kFs, 256 << 10, VerifyMode::kAllTouchedBlocks, Box{{10, 3}, {20, 7}}},
      // MEGA with verify_partial_reads: the stored tensor is verified once.
      {Backend::kMegaVerifyPartial, 0, VerifyMode::kReadBlocks, Box{{10, 3}, {20, 7}}},
  };
  for (const CorruptCase& c : cases) {
    SCOPED_TRACE(BackendName(c.backend));
    TempDir dir("f4-corrupt");
    StateDict sd;
    sd.Set("w", StateValue(t));
    std::unique_ptr<StorageWriter> writer;
    if (c.backend == Backend::kFs) {
      FileSystemWriterOptions wo;
      wo.sync = false;
      wo.checksum_block_size = c.block_size;
      writer = NewFileSystemWriter(dir.path(), wo);
    } else {
      writer = MakeWriter(c.backend, dir.path());
    }
    ASSERT_TRUE(Save(sd, *writer).ok());
    auto load = [&]() -> Status {
      Tensor d = Tensor::Empty(DType::kF4, c.load.sizes, true).value();
      StateDict dest;
      dest.Set("w", StateValue(ShardedTensor{DType::kF4, global, {Shard{c.load.offsets, d}}}));
      std::unique_ptr<StorageReader> reader;
      if (c.backend == Backend::kFs) {
        FileSystemReaderOptions ro;
        ro.verify = c.verify;
        reader = NewFileSystemReader(dir.path(), ro);
      } else {
        reader = MakeReader(c.backend, dir.path());
      }
      MEGA_RETURN_IF_ERROR(Load(dest, *reader));
      return CompareBox("w", t, c.load.offsets, d);
    };
    Status before = load();
    ASSERT_TRUE(before.ok()) << before.ToString();
    CorruptElement(c.backend, dir.path(), "w", Shape{0, 0}, elem);
    Status after = load();
    EXPECT_EQ(after.code(), StatusCode::kDataLoss) << after.ToString();
    EXPECT_NE(after.message().find("'w'"), std::string::npos) << after.message();
  }
}

// ---- the default load planner ----------------------------------------------------

// Boxes that are byte-aligned views keep the Narrow fast path (the reader writes
// into the caller's memory); others get a temporary that CommitTensor copies in,
// writing only the box's nibbles.
TEST(F4ReshardPlanner, ViewsWhenAlignedTemporariesOtherwise) {
  const Shape global{7, 5};
  const Tensor src = RandomF4(global, 41);
  struct Case {
    std::vector<ChunkStorageMetadata> chunks;
    bool views;
  };
  const Case cases[] = {
      // Rows [0, 2) (10 elements) and [2, 7) (ends at the end, owns the padding).
      {{{{0, 0}, {2, 5}}, {{2, 0}, {5, 5}}}, true},
      // Rows [0, 3) (odd count, shares byte 7) and [3, 7) (starts mid-byte).
      {{{{0, 0}, {3, 5}}, {{3, 0}, {4, 5}}}, false},
  };
  for (const Case& c : cases) {
    Metadata md;
    md.state_dict_metadata["w"] = TensorStorageMetadata{{DType::kF4, false}, global, c.chunks};
    Tensor dest = Poisoned(src, {0, 0}, global);
    auto* bytes = static_cast<uint8_t*>(dest.data());
    bytes[dest.nbytes() - 1] = static_cast<uint8_t>((bytes[dest.nbytes() - 1] & 0x0F) | 0xA0);
    StateDict sd;
    sd.Set("w", StateValue(dest));
    auto planner = NewDefaultLoadPlanner();
    ASSERT_TRUE(planner->SetUp(&sd, md, true).ok());
    auto plan = planner->CreateLocalPlan();
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_EQ(plan->items.size(), 2u);
    for (const ReadItem& item : plan->items) {
      auto t = planner->ResolveTensor(item);
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      ASSERT_EQ(t->shape(), item.lengths);
      const auto* p = static_cast<const std::byte*>(t->data());
      const auto* d = static_cast<const std::byte*>(dest.data());
      const bool inside = p >= d && p < d + dest.nbytes();
      EXPECT_EQ(inside, c.views) << ShapeToString(item.dest_offsets);
      // What a reader would do: write the stored box's bytes (for a view that
      // ends the tensor, its padding nibble too).
      Tensor box = Extract(src, item.dest_offsets, item.lengths);
      std::memcpy(t->data(), box.data(), box.nbytes());
      ASSERT_TRUE(planner->CommitTensor(item, *t).ok());
    }
    Status cmp = CompareBox("w", src, {0, 0}, dest);
    EXPECT_TRUE(cmp.ok()) << cmp.ToString();
    if (!c.views) {
      // Temporaries never touch the padding nibble.
      EXPECT_EQ(bytes[dest.nbytes() - 1] >> 4, 0xA);
    }
  }
}

// ---- the span planner ----------------------------------------------------------

// With tiny spans (runs split, few runs per span), the spans still cover every
// element of the box exactly once, never exceed the limit, and copying span by
// span from byte windows rebuilds the box.
TEST(F4BoxSpans, TinySpansCoverTheBoxExactly) {
  std::mt19937 rng(5);
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 300; ++iter) {
    const size_t nd = 1 + iter % 3;
    Shape stored(nd), start(nd), lengths(nd);
    for (size_t d = 0; d < nd; ++d) {
      stored[d] = uni(1, 9);
      lengths[d] = uni(1, stored[d]);
      start[d] = uni(0, stored[d] - lengths[d]);
    }
    const Tensor chunk = RandomF4(stored, static_cast<uint32_t>(iter));
    const uint64_t max_span = static_cast<uint64_t>(uni(2, 6));
    const double overhead = iter % 2 ? 0.05 : std::numeric_limits<double>::infinity();
    Tensor dst = Poisoned(chunk, start, lengths);
    std::vector<int> seen(Numel(lengths), 0);
    Status s = ForEachF4Span(stored, start, lengths, max_span, overhead, [&](const F4Span& span) {
      if (span.end - span.begin > max_span) return InternalError("span too long");
      for (const F4Piece& p : span.pieces) {
        for (uint64_t k = 0; k < p.n; ++k) {
          ++seen[p.dst_elem + k];
          if (GlobalFlat(stored, start, lengths, p.dst_elem + k) != p.src_elem + k) {
            return InternalError("piece maps to the wrong element");
          }
        }
      }
      // Only the span's bytes, as a reader would have them in staging.
      std::vector<std::byte> window(static_cast<const std::byte*>(chunk.data()) + span.begin,
                                    static_cast<const std::byte*>(chunk.data()) + span.end);
      return CopyF4Span(span, window.data(), span.begin, stored, dst);
    });
    ASSERT_TRUE(s.ok()) << s.ToString() << " iteration " << iter;
    for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e], 1) << "element " << e;
    Status c = CompareBox("span copy", chunk, start, dst);
    ASSERT_TRUE(c.ok()) << c.ToString();
  }
}

}  // namespace
}  // namespace megackpt::dcp
