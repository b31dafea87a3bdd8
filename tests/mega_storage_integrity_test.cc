// Integrity of MEGA-storage loads (issue 11): every byte a load hands to the
// caller is verified, the shard header protects itself, and the resharded-read
// budget holds with verification on.
//
//  - CorruptionSweep: single-bit flips spread over every byte region of a
//    checkpoint saved at 2 ranks (shard headers, tensor payloads, alignment
//    gaps, block CRC tables, .metadata, the index), each followed by loads at
//    1, 2 and 3 ranks (threads backend) with and without .metadata: no load
//    may succeed with wrong bytes; every error names the flipped shard (shard
//    flips) or a path in the checkpoint folder (.metadata / index flips name
//    the shard or the reference that no longer matches).
//  - ReadBudget: resharded loads (2 -> 3 and 2 -> 2 ranks, every layout
//    change of the demo) read <= 1.10x the bytes their destinations need,
//    counted by an instrumented filesystem, with verification on.
//  - HeaderFlips: every byte of a shard header, flipped: the shard fails to
//    open (DataLoss naming the file), or the flip hit the header-checksum key
//    itself and the storage reader refuses the shard.
//  - LargePieceReadInParts: one large whole piece is read by several threads
//    (the format reader's block items, their CRC partials combined): exact
//    bytes, no byte read twice, a flip in any part is DataLoss naming shard and
//    tensor; the same for a shard without block CRCs (TensorPlay's) and for a
//    safetensors file.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "core/test_files.h"
#include "dcp/mega_storage_files.h"
#include "dcp/synthetic.h"
#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/mega_encoder.h"
#include "megackpt/format/safetensors.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;
using testing::RunThreadRanksForTest;

class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("mega-integrity") {}
};

Status SaveAt(const synthetic::Spec& spec, const std::string& dir, int world) {
  return RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
    MegaStorageWriterOptions o;
    o.sync = false;
    MegaStorageWriter writer(dir, std::nullopt, o);
    return testing::SaveSyntheticRank(spec, writer, &g);
  });
}

struct LoadOutcome {
  bool silent = false;  // a rank's load succeeded with wrong bytes
  std::string error;    // the first load error ("" = every rank loaded)
  std::string silent_what;
};

// Loads at `world` / `variant`; separates load errors from wrong bytes.
LoadOutcome LoadAt(const synthetic::Spec& spec, const std::string& dir, int world, int variant,
                   std::shared_ptr<fs::FileSystem> fs = nullptr) {
  LoadOutcome out;
  std::mutex mu;
  Status st = RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
    MegaStorageReaderOptions o;
    o.thread_count = 1;
    o.fs = fs;
    MegaStorageReader reader(dir, o);
    MEGA_ASSIGN_OR_RETURN(StateDict sd,
                          synthetic::BuildRankState(spec, world, g.rank(), variant, false));
    Status load = Load(sd, reader, &g);
    if (!load.ok()) return load;
    Status check = synthetic::VerifyRankState(spec, sd);
    if (!check.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      out.silent = true;
      out.silent_what = check.ToString();
    }
    return Status::OK();
  });
  if (!st.ok()) out.error = st.ToString();
  return out;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void FlipBit(const std::string& path, uint64_t offset, int bit) {
  ::megackpt::test_util::XorFileByte(path, offset, static_cast<uint8_t>(1 << bit));
}

// Offsets to flip in a shard: spread over the header (preamble, metadata,
// directory, padding), every tensor's payload (first, middle, last byte), the
// gaps between tensors and the block CRC table.
std::vector<uint64_t> ShardOffsets(const std::string& path) {
  std::vector<uint64_t> out;
  auto r = format::MegaReader::OpenFile(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return out;
  const format::MegaReader& m = **r;
  const uint64_t h = m.header_length();
  for (uint64_t k = 0; k < 16; ++k) out.push_back(k * (h - 1) / 15);
  uint64_t prev_end = h;
  for (const format::MegaTensorInfo& t : m.tensors()) {
    if (t.file_offset > prev_end) out.push_back(prev_end);  // alignment gap
    if (t.logical_nbytes > 0) {
      out.push_back(t.file_offset + (t.tensor_id % 2 ? t.logical_nbytes / 2 : 0));
      out.push_back(t.file_offset + t.logical_nbytes - 1);
    }
    if (t.block_size > 0 && t.logical_nbytes > 0) out.push_back(t.block_table_offset);
    prev_end = t.file_offset + t.logical_nbytes;
  }
  out.push_back(m.file_size() - 1);
  return out;
}

std::vector<uint64_t> SpreadOffsets(const std::string& path, int count) {
  const uint64_t n = stdfs::file_size(path);
  std::vector<uint64_t> out;
  for (int k = 0; k < count; ++k) out.push_back(static_cast<uint64_t>(k) * (n - 1) / (count - 1));
  return out;
}

TEST(MegaStorageIntegrity, CorruptionSweep) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  const synthetic::Spec spec = synthetic::MakeSpec(11, 256 << 10);
  ASSERT_TRUE(SaveAt(spec, ckpt, 2).ok());
  for (int world : {1, 2, 3}) {
    LoadOutcome clean = LoadAt(spec, ckpt, world, 1);
    ASSERT_TRUE(clean.error.empty() && !clean.silent) << clean.error << clean.silent_what;
  }
  std::vector<std::string> files;
  for (const auto& e : stdfs::directory_iterator(ckpt))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  int flips = 0, errors = 0, silent = 0;
  for (const std::string& name : files) {
    const std::string path = ckpt + "/" + name;
    const bool shard = name.ends_with(".mega");
    const std::vector<uint64_t> offsets = shard ? ShardOffsets(path) : SpreadOffsets(path, 16);
    for (size_t k = 0; k < offsets.size(); ++k) {
      const int bit = static_cast<int>(k % 8);
      const std::string original = ReadFileBytes(path);
      FlipBit(path, offsets[k], bit);
      ++flips;
      for (bool with_metadata : {true, false}) {
        if (!with_metadata && name == ".metadata") continue;
        if (!with_metadata) stdfs::rename(ckpt + "/.metadata", dir.path("metadata.away"));
        for (int world : {1, 2, 3}) {
          const int variant = 1 + (world + static_cast<int>(k)) % 3;
          LoadOutcome o = LoadAt(spec, ckpt, world, variant);
          SCOPED_TRACE(name + " byte " + std::to_string(offsets[k]) + " bit " +
                       std::to_string(bit) + " world " + std::to_string(world) +
                       (with_metadata ? "" : " without .metadata"));
          if (o.silent) {
            ++silent;
            ADD_FAILURE() << "silent corruption: " << o.silent_what;
          }
          if (!o.error.empty()) {
            ++errors;
            if (shard) {
              EXPECT_NE(o.error.find(name), std::string::npos) << o.error;
            } else {
              // A corrupt reference is reported with the file it names (e.g.
              // a shard name that does not exist), in the checkpoint folder.
              EXPECT_NE(o.error.find(ckpt), std::string::npos) << o.error;
            }
          }
        }
        if (!with_metadata) stdfs::rename(dir.path("metadata.away"), ckpt + "/.metadata");
      }
      std::ofstream(path, std::ios::binary | std::ios::trunc) << original;
    }
  }
  EXPECT_EQ(silent, 0);
  EXPECT_GT(errors, flips);  // most flips are caught (gaps and padding cannot change a load)
  RecordProperty("flips", flips);
}

TEST(MegaStorageIntegrity, ReadBudget) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  const synthetic::Spec spec = synthetic::MakeSpec(21, 24 << 20);
  ASSERT_TRUE(SaveAt(spec, ckpt, 2).ok());
  for (int world : {3, 2}) {
    for (int variant : {1, 2, 3}) {
      auto counting = std::make_shared<testing::InstrumentedFileSystem>();
      counting->data_marker = ".mega";
      std::atomic<uint64_t> needed{0};
      Status st = RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
        MegaStorageReaderOptions o;
        o.fs = counting;
        MegaStorageReader reader(ckpt, o);
        MEGA_ASSIGN_OR_RETURN(StateDict sd,
                              synthetic::BuildRankState(spec, world, g.rank(), variant, false));
        MEGA_RETURN_IF_ERROR(Load(sd, reader, &g));
        MEGA_RETURN_IF_ERROR(synthetic::VerifyRankState(spec, sd));
        needed += synthetic::RankStateBytes(sd);
        return Status::OK();
      });
      ASSERT_TRUE(st.ok()) << st.ToString();
      const double ratio = static_cast<double>(counting->data_bytes_read.load()) / needed.load();
      EXPECT_LE(ratio, 1.10) << "world " << world << " variant " << variant << ": read "
                             << counting->data_bytes_read.load() << " for " << needed.load();
      std::printf("world %d variant %d: %.4fx\n", world, variant, ratio);
    }
  }
}

TEST(MegaStorageIntegrity, HeaderFlips) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  const synthetic::Spec spec = synthetic::MakeSpec(5, 64 << 10);
  ASSERT_TRUE(SaveAt(spec, ckpt, 1).ok());
  std::string path;
  for (const auto& e : stdfs::directory_iterator(ckpt)) {
    if (e.path().extension() == ".mega") path = e.path().string();
  }
  ASSERT_FALSE(path.empty());
  uint64_t header_length;
  {
    auto r = format::MegaReader::OpenFile(path);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE((*r)->header_checksummed());
    header_length = (*r)->header_length();
  }
  const std::string original = ReadFileBytes(path);
  int refused_at_open = 0, refused_by_storage = 0;
  for (uint64_t off = 0; off < header_length; ++off) {
    FlipBit(path, off, static_cast<int>(off % 8));
    auto r = format::MegaReader::OpenFile(path);
    FlipBit(path, off, static_cast<int>(off % 8));  // back
    if (!r.ok()) {
      ++refused_at_open;
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << off << ": " << r.status().ToString();
      EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().ToString();
      continue;
    }
    // Only a flip inside the header-checksum key's own name can hide it; the
    // storage reader then refuses the shard.
    EXPECT_FALSE((*r)->header_checksummed()) << "byte " << off << " flipped, header still verifies";
    Status s = mega_storage::CheckShardIntegrity(path, **r);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "byte " << off;
    ++refused_by_storage;
  }
  EXPECT_EQ(ReadFileBytes(path), original);
  EXPECT_EQ(refused_at_open + refused_by_storage, static_cast<int>(header_length));
  EXPECT_LE(refused_by_storage, static_cast<int>(format::kMegaHeaderCrcKey.size()));
}

// A flipped byte inside a partially read box is DataLoss naming the shard and
// tensor, while the same slice of an intact tensor loads (block CRCs: no
// whole-tensor pass needed).
TEST(MegaStorageIntegrity, PartialReadOfFlippedBlockFails) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  Tensor w = *Tensor::Empty(DType::kF32, {256, 256});
  auto* p = static_cast<float*>(w.data());
  for (int i = 0; i < 256 * 256; ++i) p[i] = static_cast<float>(i);
  StateDict sd;
  sd.Set("w", w);
  MegaStorageWriter writer(ckpt);
  ASSERT_TRUE(Save(sd, writer).ok());
  uint64_t at;
  {
    auto r = format::MegaReader::OpenFile(ckpt + "/model.mega");
    ASSERT_TRUE(r.ok());
    at = (*r)->Find("w")->file_offset + 4 * (100 * 256 + 3);  // row 100, column 3
  }
  FlipBit(ckpt + "/model.mega", at, 2);
  auto load_box = [&](Shape offsets, Shape sizes) {
    ShardedTensor st;
    st.dtype = DType::kF32;
    st.global_shape = {256, 256};
    st.shards.push_back({offsets, *Tensor::Empty(DType::kF32, sizes, true)});
    StateDict dst;
    dst.Set("w", st);
    MegaStorageReader r(ckpt);
    return Load(dst, r);
  };
  EXPECT_TRUE(load_box({0, 0}, {64, 256}).ok());    // rows 0..63: intact
  EXPECT_TRUE(load_box({0, 128}, {256, 64}).ok());  // columns 128..191: intact
  for (Status s : {load_box({96, 0}, {8, 256}), load_box({0, 0}, {256, 8})}) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_NE(s.message().find("model.mega"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.ToString();
  }
}

// One whole piece of 96 MiB is read by every reader thread, in the format
// reader's 16 MiB items; its checksum is checked as a whole from the items'
// combined CRC-32 partials, with or without block CRCs in the shard.
TEST(MegaStorageIntegrity, LargePieceReadInParts) {
  TempDir dir;
  const std::string ckpt = dir.path("c");
  const int64_t rows = 24 << 10, cols = 1024;  // 96 MiB of F32: six items
  Tensor w = *Tensor::Empty(DType::kF32, {rows, cols});
  auto* p = static_cast<float*>(w.data());
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = static_cast<float>(i % 100003) * 0.5f;
  StateDict sd;
  sd.Set("big", w);
  {
    MegaStorageWriterOptions o;
    o.sync = false;
    MegaStorageWriter writer(ckpt, std::nullopt, o);
    ASSERT_TRUE(Save(sd, writer).ok());
  }
  auto load = [&](const std::string& path, bool verify,
                  testing::InstrumentedFileSystem* counting) -> Result<Tensor> {
    MEGA_ASSIGN_OR_RETURN(Tensor dst, Tensor::Empty(DType::kF32, {rows, cols}, true));
    StateDict out;
    out.Set("big", dst);
    MegaStorageReaderOptions o;
    o.thread_count = 4;
    o.verify_checksums = verify;
    if (counting) o.fs = std::shared_ptr<fs::FileSystem>(counting, [](fs::FileSystem*) {});
    MegaStorageReader reader(path, o);
    MEGA_RETURN_IF_ERROR(Load(out, reader));
    return dst;
  };
  // Each file: a verified load through a counting filesystem (exact bytes,
  // several threads each read >= one item, no byte read twice: besides the
  // header, which precedes `offset`, only the payload), then flips in the
  // first, a middle and the last item: DataLoss naming file and tensor when
  // verifying, the flipped byte handed back when not.
  auto check = [&](const std::string& file, const std::string& load_path, uint64_t offset,
                   const std::string& marker, bool checksummed) {
    SCOPED_TRACE(file);
    {
      testing::InstrumentedFileSystem counting;
      counting.data_marker = marker;
      auto got = load(load_path, true, &counting);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(std::memcmp(got->data(), w.data(), w.nbytes()), 0);
      EXPECT_GE(counting.ThreadsThatRead(16 << 20), 2u) << "one thread read the whole piece";
      EXPECT_LE(counting.data_bytes_read.load(), w.nbytes() + offset + (64 << 10));
    }
    for (uint64_t at : {uint64_t{12345}, w.nbytes() / 2 + 7, w.nbytes() - 3}) {
      FlipBit(file, offset + at, 5);
      if (checksummed) {
        auto got = load(load_path, true, nullptr);
        EXPECT_EQ(got.status().code(), StatusCode::kDataLoss)
            << at << ": " << got.status().ToString();
        const std::string base = stdfs::path(file).filename().string();
        EXPECT_NE(got.status().message().find(base), std::string::npos) << got.status().ToString();
        EXPECT_NE(got.status().message().find("'big'"), std::string::npos)
            << got.status().ToString();
      }
      auto raw = load(load_path, false, nullptr);
      ASSERT_TRUE(raw.ok()) << raw.status().ToString();
      EXPECT_NE(std::memcmp(raw->data(), w.data(), w.nbytes()), 0);
      FlipBit(file, offset + at, 5);  // back
    }
  };
  {
    auto r = format::MegaReader::OpenFile(ckpt + "/model.mega");
    ASSERT_TRUE(r.ok());
    ASSERT_GT((*r)->Find("big")->block_size, 0u);
    check(ckpt + "/model.mega", ckpt, (*r)->Find("big")->file_offset, ".mega", true);
  }
  // A shard without block CRCs (TensorPlay's tp.save writes none): its CRC-32
  // covers the tensor only as a whole, and is still checked once.
  const std::string plain = dir.path("plain.mega");
  {
    format::MegaWriter mw;
    ASSERT_TRUE(mw.AddTensor("big", w).ok());
    ASSERT_TRUE(mw.WriteFile(plain, false).ok());
    auto r = format::MegaReader::OpenFile(plain);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ((*r)->Find("big")->block_size, 0u);
    check(plain, plain, (*r)->Find("big")->file_offset, ".mega", true);
  }
  // safetensors carries no checksums: split the same way, nothing to verify.
  const std::string st = dir.path("model.safetensors");
  {
    std::vector<std::pair<std::string, Tensor>> ts = {{"big", w}};
    ASSERT_TRUE(format::SaveSafetensorsFile(st, ts).ok());
    auto r = format::SafetensorsReader::Open(st);
    ASSERT_TRUE(r.ok());
    check(st, st, (*r)->header().data_offset(), ".safetensors", false);
  }
}

}  // namespace
}  // namespace megackpt::dcp
