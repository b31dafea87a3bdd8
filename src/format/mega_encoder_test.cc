// MegaEncoder: the one MEGA layout/payload writer. Byte-identical to MegaWriter
// for the same tensors (any order, any threads, positioned or sequential
// sinks), known answers for the owned keys (block CRC table, header CRC), and
// the reader's checks of them.
#include "megackpt/format/mega_encoder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/test_files.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {
namespace {

namespace stdfs = std::filesystem;

// A sequential sink: Append only, bytes kept in memory.
class AppendOnlyFile final : public WritableFile {
 public:
  explicit AppendOnlyFile(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_.size(); }
  Status Append(std::span<const std::byte> data) override {
    bytes_.append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::OK();
  }
  Status Sync() override { return Status::OK(); }
  Status Close() override { return Status::OK(); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string name_;
  std::string bytes_;
};

// A positioned sink in memory that records the size and end of every WriteAt,
// and says it writes with direct I/O when `direct` (as a local file that took
// UseDirectIo does).
class RecordingFile final : public WritableFile {
 public:
  explicit RecordingFile(bool direct) : direct_(direct) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_.size(); }
  bool supports_write_at() const override { return true; }
  bool direct_io() const override { return direct_; }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_.size() < offset + data.size()) bytes_.resize(offset + data.size());
    std::memcpy(bytes_.data() + offset, data.data(), data.size());
    writes_.push_back({offset, data.size()});
    return Status::OK();
  }
  Status Append(std::span<const std::byte> data) override { return WriteAt(bytes_.size(), data); }
  Status Sync() override { return Status::OK(); }
  Status Close() override { return Status::OK(); }
  const std::string& bytes() const { return bytes_; }
  // (offset, size) of every WriteAt, in order.
  const std::vector<std::pair<uint64_t, uint64_t>>& writes() const { return writes_; }

 private:
  const bool direct_;
  std::string name_ = "recorded.mega";
  std::mutex mu_;
  std::string bytes_;
  std::vector<std::pair<uint64_t, uint64_t>> writes_;
};

using ::megackpt::test_util::TempDir;

Tensor Filled(DType dtype, Shape shape, uint8_t seed) {
  Tensor t = *Tensor::Empty(dtype, std::move(shape));
  auto* p = static_cast<uint8_t*>(t.data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(seed * 31 + i * 7);
  return t;
}

std::string ReadAll(const std::string& path) { return *ReadLocalFile(path); }

struct Case {
  std::string name;
  Tensor tensor;
};

std::vector<Case> SampleTensors() {
  std::vector<Case> v;
  v.push_back({"layers.0.w", Filled(DType::kF32, {17, 33}, 1)});
  v.push_back({"layers.0.b", Filled(DType::kBF16, {33}, 2)});
  v.push_back({"scalar", Filled(DType::kI64, {}, 3)});
  v.push_back({"empty", Filled(DType::kF16, {0, 5}, 4)});
  v.push_back({"bytes.blob", Filled(DType::kU8, {1000}, 5)});
  v.push_back({"name with \"quotes\" and ü", Filled(DType::kI8, {3, 3}, 6)});
  v.push_back({"big", Filled(DType::kF64, {300, 700}, 7)});  // > 1 MiB: several pieces
  // A strided view (every other column).
  Tensor base = Filled(DType::kI32, {40, 64}, 8);
  v.push_back({"strided", *Tensor::FromBlobStrided(base.data(), DType::kI32, {40, 32}, {64, 2},
                                                   base.owner())});
  // An odd-sized tensor then an empty one: the file ends in an alignment gap.
  v.push_back({"odd", Filled(DType::kI8, {3}, 9)});
  v.push_back({"trailing_empty", Filled(DType::kF32, {0}, 10)});
  return v;
}

MegaMetadata UserMetadata() {
  MegaMetadata md;
  EXPECT_TRUE(md.Add("tensorplay.dcp.version", MetaValue::U32(1)).ok());
  EXPECT_TRUE(md.Add("tensorplay.dcp.entries", MetaValue::String("{\"x\": 1}")).ok());
  return md;
}

void ExpectSameBytesAsMegaWriter(MegaChecksumType checksum, uint64_t tensor_alignment,
                                 bool reverse_order, int threads) {
  TempDir dir;
  auto tensors = SampleTensors();
  // Reference: MegaWriter, TensorPlay profile.
  MegaWriterOptions wo;
  wo.checksum = checksum;
  wo.tensor_alignment = tensor_alignment;
  MegaWriter ref(wo);
  const MegaMetadata user = UserMetadata();
  for (const MetaEntry& e : user.entries()) ASSERT_TRUE(ref.AddMetadata(e.key, e.value).ok());
  for (const auto& c : tensors) ASSERT_TRUE(ref.AddTensor(c.name, c.tensor).ok());
  ASSERT_TRUE(ref.WriteFile(dir.File("ref.mega"), false).ok());

  std::vector<MegaEncoderTensor> specs;
  for (const auto& c : tensors)
    specs.push_back({c.name, c.tensor.dtype(), c.tensor.shape(), checksum});
  MegaEncoderOptions so;
  so.checksum = checksum;
  so.tensor_alignment = tensor_alignment;
  auto file = CreateLocalFile(dir.File("ours.mega"));
  ASSERT_TRUE(file.ok());
  auto w = MegaEncoder::Plan(dir.File("ours.mega"), specs, UserMetadata(), so);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (reverse_order) std::reverse(order.begin(), order.end());
  std::vector<std::thread> pool;
  std::atomic<size_t> next{0};
  std::atomic<int> failures{0};
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t k = next++; k < order.size(); k = next++) {
        if (!(*w)->WriteTensor(**file, order[k], tensors[order[k]].tensor).ok()) ++failures;
      }
    });
  }
  for (auto& t : pool) t.join();
  ASSERT_EQ(failures.load(), 0);
  EXPECT_FALSE((*w)->WriteTensor(**file, 0, tensors[0].tensor).ok())
      << "second write must be refused";
  ASSERT_TRUE((*w)->FinishPositioned(**file).ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(ReadAll(dir.File("ours.mega")), ReadAll(dir.File("ref.mega")));
  // A sequential sink gets the same bytes.
  {
    auto seq = MegaEncoder::Plan(dir.File("seq.mega"), specs, UserMetadata(), so);
    ASSERT_TRUE(seq.ok());
    AppendOnlyFile sink(dir.File("seq.mega"));
    std::vector<Tensor> ts;
    for (const auto& c : tensors) ts.push_back(c.tensor);
    ASSERT_TRUE((*seq)->WriteSequential(sink, ts).ok());
    EXPECT_EQ(sink.bytes(), ReadAll(dir.File("ref.mega")));
  }
  // And it parses and verifies.
  auto reader = MegaReader::OpenFile(dir.File("ours.mega"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->VerifyAll().ok());
}

TEST(MegaEncoderTest, SameBytesAsMegaWriterCrc32) {
  ExpectSameBytesAsMegaWriter(MegaChecksumType::kCrc32, 64, false, 1);
}
TEST(MegaEncoderTest, SameBytesAsMegaWriterAnyOrderAnyThreads) {
  ExpectSameBytesAsMegaWriter(MegaChecksumType::kCrc32, 64, true, 3);
}
TEST(MegaEncoderTest, SameBytesAsMegaWriterPackedSha256) {
  ExpectSameBytesAsMegaWriter(MegaChecksumType::kSha256, 1, true, 2);
}
TEST(MegaEncoderTest, SameBytesAsMegaWriterNoChecksum) {
  ExpectSameBytesAsMegaWriter(MegaChecksumType::kNone, 4096, false, 2);
}

TEST(MegaEncoderTest, FinishBeforeAllWrittenFails) {
  TempDir dir;
  auto file = CreateLocalFile(dir.File("x.mega"));
  ASSERT_TRUE(file.ok());
  auto w = MegaEncoder::Plan("x.mega", {{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}}, {}, {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->WriteTensor(**file, 0, Filled(DType::kF32, {4}, 1)).ok());
  EXPECT_EQ((*w)->FinishPositioned(**file).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->WriteTensor(**file, 1, Filled(DType::kF32, {5}, 1)).code(),
            StatusCode::kInvalidArgument);
}

// A tensor's payload goes out in pieces of core's WritePieceFor(file):
// kCrcWritePiece through the page cache, kDirectWritePiece on a direct-I/O
// file (both 2 MiB today), each ending on a multiple of its size; the file's
// bytes are the same either way.
TEST(MegaEncoderTest, WritesInPiecesOfWritePieceFor) {
  const Tensor t = Filled(DType::kF32, {(5 << 20) / 4 + 25}, 9);  // 5 MiB + 100 B
  std::string bytes[2];
  for (bool direct : {false, true}) {
    MegaEncoderOptions o;
    o.tensor_alignment = 64;  // pieces then end on piece multiples, not a few bytes short
    auto w = MegaEncoder::Plan("recorded.mega",
                               {{"a", DType::kU8, {3}}, {"w", DType::kF32, t.shape()}}, {}, o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    RecordingFile file(direct);
    ASSERT_TRUE((*w)->WriteTensor(file, 1, t).ok());
    const uint64_t piece = direct ? kDirectWritePiece : kCrcWritePiece;
    EXPECT_EQ(WritePieceFor(file), piece);
    ASSERT_GE(file.writes().size(), 3u);
    uint64_t largest = 0;
    for (size_t k = 0; k < file.writes().size(); ++k) {
      const auto [offset, size] = file.writes()[k];
      largest = std::max(largest, size);
      EXPECT_LE(size, piece) << "write " << k;
      if (k + 1 < file.writes().size()) {
        EXPECT_EQ((offset + size) % piece, 0u) << "write " << k << " ends off a piece";
      }
    }
    EXPECT_EQ(largest, piece);
    ASSERT_TRUE((*w)->WriteTensor(file, 0, Filled(DType::kU8, {3}, 2)).ok());
    ASSERT_TRUE((*w)->FinishPositioned(file).ok());
    bytes[direct] = file.bytes();
  }
  EXPECT_EQ(bytes[0], bytes[1]);
}

TEST(MegaEncoderTest, RejectsDuplicateNames) {
  TempDir dir;
  auto w = MegaEncoder::Plan("x.mega", {{"a", DType::kF32, {4}}, {"a", DType::kF32, {4}}}, {}, {});
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
}

TEST(MegaEncoderTest, BlockSizeKnownAnswers) {
  EXPECT_EQ(MegaBlockSizeFor(DType::kF32, {1024, 1024}), 256u);  // 4 KiB rows / 16
  EXPECT_EQ(MegaBlockSizeFor(DType::kBF16, {4096, 4096}), 512u);
  EXPECT_EQ(MegaBlockSizeFor(DType::kF32, {8, 3}), 64u);             // clamped up
  EXPECT_EQ(MegaBlockSizeFor(DType::kU8, {2, 1 << 22}), 64u << 10);  // clamped down
  EXPECT_EQ(MegaBlockSizeFor(DType::kF32, {100000}), 64u << 10);     // 1-d
  EXPECT_EQ(MegaBlockSizeFor(DType::kF32, {}), 64u << 10);           // 0-d
  EXPECT_EQ(MegaBlockSizeFor(DType::kF32, {0, 5}), 0u);              // empty
}

// The owned keys as bytes: the block table of each tensor follows its bytes,
// holds the CRC-32 of each block; the header CRC covers [0, header_length).
TEST(MegaEncoderTest, BlockTableAndHeaderCrcKnownAnswers) {
  TempDir dir;
  const std::string path = dir.File("b.mega");
  Tensor a = Filled(DType::kF32, {4, 64}, 1);  // 256-byte rows: block 64, 16 blocks
  Tensor b = Filled(DType::kU8, {3}, 2);       // 1-d: block 64 KiB, 1 block
  MegaEncoderOptions o;
  o.tensor_alignment = 64;
  o.block_checksums = true;
  o.header_checksum = true;
  auto enc = MegaEncoder::Plan(path, {{"a", DType::kF32, {4, 64}}, {"b", DType::kU8, {3}}}, {}, o);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  EXPECT_EQ((*enc)->block_size(0), 64u);
  EXPECT_EQ((*enc)->block_size(1), 64u << 10);
  auto file = CreateLocalFile(path);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*enc)->WriteTensor(**file, 1, b).ok());
  ASSERT_TRUE((*enc)->WriteTensor(**file, 0, a).ok());
  ASSERT_TRUE((*enc)->FinishPositioned(**file).ok());
  ASSERT_TRUE((*file)->Close().ok());
  const std::string bytes = ReadAll(path);
  auto r = MegaReader::OpenFile(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->header_checksummed());
  const MegaTensorInfo& ta = (*r)->tensors()[0];
  EXPECT_EQ(ta.block_size, 64u);
  EXPECT_EQ(ta.block_table_offset, ta.file_offset + 1024);  // right after its bytes
  for (int k = 0; k < 16; ++k) {
    uint32_t want = Crc32(a.Bytes().subspan(64 * k, 64)), got;
    std::memcpy(&got, bytes.data() + ta.block_table_offset + 4 * k, 4);
    EXPECT_EQ(got, want) << k;
  }
  const MegaTensorInfo& tb = (*r)->tensors()[1];
  EXPECT_EQ(tb.file_offset, (ta.block_table_offset + 64 + 63) / 64 * 64);
  uint32_t got;
  std::memcpy(&got, bytes.data() + tb.block_table_offset, 4);
  EXPECT_EQ(got, Crc32(b.Bytes()));
  EXPECT_EQ(bytes.size(), tb.block_table_offset + 4);
  // Header CRC: the last header entry's u32, over the header with it zeroed.
  const uint64_t h = (*r)->header_length();
  const MegaMetadata& md = (*r)->header_metadata();
  EXPECT_EQ(md.entries().back().key, kMegaHeaderCrcKey);
  std::string header = bytes.substr(0, h);
  const uint32_t stored = static_cast<uint32_t>(*md.entries().back().value.AsUint64());
  const size_t at =
      header.find("megackpt.header_crc32") + std::string("megackpt.header_crc32").size() + 4;
  std::memset(header.data() + at, 0, 4);
  EXPECT_EQ(Crc32(AsBytes(header)), stored);
  EXPECT_TRUE((*r)->VerifyAll().ok());
  // Partial reads verify and return the right bytes.
  std::vector<std::byte> part(100);
  ASSERT_TRUE((*r)->ReadRange(0, 30, part).ok());
  EXPECT_EQ(0, std::memcmp(part.data(), a.Bytes().data() + 30, 100));
}

// Names, keys and strings must be valid UTF-8 without NUL: refused by the
// writers, and by the reader (escaped in the message) when a file has them.
TEST(MegaEncoderTest, NulAndInvalidUtf8AreRefused) {
  TempDir dir;
  MegaWriter w;
  EXPECT_EQ(w.AddTensor(std::string("a\0b", 3), Filled(DType::kU8, {2}, 1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddMetadata("k", MetaValue::String("x\xffy")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddMetadata(std::string("k\0", 2), MetaValue::U8(1)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(
      MegaEncoder::Plan("x", {{std::string("a\0b", 3), DType::kU8, {2}}}, {}, {}).status().code(),
      StatusCode::kInvalidArgument);
  // Files holding them: written clean, then patched.
  MegaWriterOptions o;
  o.profile = MegaProfile::kBare;
  MegaWriter clean(o);
  ASSERT_TRUE(clean.AddMetadata("note", MetaValue::String("xAy")).ok());
  ASSERT_TRUE(clean.AddTensor("aXb", Filled(DType::kU8, {2}, 1)).ok());
  ASSERT_TRUE(clean.WriteFile(dir.File("c.mega"), false).ok());
  const std::string good = ReadAll(dir.File("c.mega"));
  auto patched = [&](std::string_view from, char to) {
    std::string b = good;
    b[b.find(from) + 1] = to;
    const std::string p = dir.File("p.mega");
    std::ofstream(p, std::ios::binary | std::ios::trunc) << b;
    return MegaReader::OpenFile(p).status();
  };
  Status nul = patched("aXb", '\0');
  EXPECT_EQ(nul.code(), StatusCode::kDataLoss);
  EXPECT_NE(nul.message().find("'a\\x00b'"), std::string::npos) << nul.ToString();
  Status bad = patched("xAy", '\xff');
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.message().find("'x\\xffy'"), std::string::npos) << bad.ToString();
}

}  // namespace
}  // namespace megackpt::format
