// One test per malformed-input error: the reader returns DataLoss with a
// message that names the file and what is wrong, never crashes, and never
// allocates from a lying length.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "format/mega_internal.h"
#include "format/mega_test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/memory_file.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {
namespace {

using mega_internal::ByteWriter;
using mega_test::OpenBytes;

constexpr char kName[] = "bad.mega";

MegaTensorInfo Raw(std::string name, DType dtype, Shape shape, uint64_t offset,
                   MegaChecksumType ck = MegaChecksumType::kNone, std::string_view payload = {}) {
  MegaTensorInfo t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.logical_nbytes = *LogicalNbytes(dtype, t.shape);
  t.stored_nbytes = t.logical_nbytes;
  t.payload_offset = offset;
  t.checksum_type = ck;
  if (ck != MegaChecksumType::kNone) t.checksum = mega_internal::ChecksumOf(ck, AsBytes(payload));
  t.dir_flags = mega_internal::DirFlagsFor(t);
  return t;
}

// A small valid file, edited by each test before Build().
struct Spec {
  MegaMetadata md;
  std::vector<MegaTensorInfo> tensors;
  std::vector<MegaSegment> segments;
  std::vector<MegaMoeExpert> moe;
  uint64_t alignment = 32;
  std::string payload;

  Spec() {
    (void)md.Add("general.architecture", MetaValue::String("test"));
    (void)md.Add("general.alignment", MetaValue::U32(32));
    payload = std::string(28, '\0');
    for (int i = 0; i < 28; ++i) payload[i] = static_cast<char>(i * 7);
    tensors.push_back(
        Raw("a", DType::kF32, {2, 3}, 0, MegaChecksumType::kCrc32, payload.substr(0, 24)));
    tensors.push_back(
        Raw("b", DType::kU8, {4}, 24, MegaChecksumType::kSha256, payload.substr(24, 4)));
  }
  std::string Build() const {
    return mega_internal::EncodeHeader(md, tensors, segments, moe, alignment) + payload;
  }
};

Status OpenStatus(const std::string& bytes) {
  auto r = OpenBytes(kName, bytes);
  return r.status();
}

#define EXPECT_DATA_LOSS(bytes, needle)                                       \
  do {                                                                        \
    Status s_ = OpenStatus(bytes);                                            \
    EXPECT_EQ(s_.code(), StatusCode::kDataLoss) << s_.ToString();             \
    EXPECT_TRUE(s_.message().starts_with(kName)) << s_.ToString();            \
    EXPECT_NE(s_.message().find(needle), std::string::npos) << s_.ToString(); \
  } while (0)

// Table-driven violations: each case builds a broken file; opening it must fail
// with DataLoss naming the file and the case's needle.
struct Violation {
  const char* needle;
  std::function<std::string()> build;
};

void ExpectViolations(const std::vector<Violation>& cases) {
  for (const Violation& c : cases) {
    SCOPED_TRACE(c.needle);
    EXPECT_DATA_LOSS(c.build(), c.needle);
  }
}

// The bytes of a SpecT made from `args`, then changed by `mutate`.
template <typename SpecT, typename... Args>
std::function<std::string()> Broken(std::function<void(SpecT&)> mutate, Args... args) {
  return [=] {
    SpecT s(args...);
    mutate(s);
    return s.Build();
  };
}

using Pieces = std::vector<std::pair<uint64_t, uint64_t>>;  // ChunkSpec (offset, size)

TEST(MegaMalformedTest, ValidBaselineParses) {
  auto r = OpenBytes(kName, Spec().Build());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->VerifyAll().ok());
}

TEST(MegaMalformedTest, TruncationAtEveryOffset) {
  std::vector<std::string> files = {
      Spec().Build(), mega_test::FileBytes(std::string(MEGACKPT_SOURCE_DIR) +
                                           "/tests/testdata/mega-reference/g08_zstd.mega")};
  {  // A chunked file too.
    MegaWriterOptions o;
    o.alignment = 64;
    o.chunk_bytes = 40;
    MegaWriter w(o);
    EXPECT_TRUE(w.AddTensor("c", mega_test::MakeTensor(DType::kI16, {50}, 1)).ok());
    files.push_back(mega_test::WriteToMemory(w));
  }
  for (const std::string& full : files) {
    for (size_t n = 0; n < full.size(); ++n) {
      Status s = OpenStatus(full.substr(0, n));
      ASSERT_FALSE(s.ok()) << "prefix of " << n << " bytes parsed";
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
      EXPECT_TRUE(s.message().starts_with(kName)) << s.ToString();
    }
  }
}

TEST(MegaMalformedTest, BadMagic) {
  std::string b = Spec().Build();
  b[0] = 'X';
  EXPECT_DATA_LOSS(b, "bad magic");
}

TEST(MegaMalformedTest, BadVersion) {
  std::string b = Spec().Build();
  b[4] = 2;
  EXPECT_DATA_LOSS(b, "unsupported version 2");
}

TEST(MegaMalformedTest, DuplicateTensorNames) {
  Spec s;
  s.tensors[1].name = "a";
  EXPECT_DATA_LOSS(s.Build(), "duplicate tensor name 'a'");
}

TEST(MegaMalformedTest, DuplicateMetadataKeys) {
  Spec s;
  std::string b = s.Build();
  // Rename "general.architecture" -> "general.alignment\0\0\0" is awkward; build by hand instead.
  ByteWriter w;
  w.U32(kMegaMagic);
  w.U32(1);
  w.U64(0);
  w.U64(2);
  MetaCodec::EncodeEntry("k", MetaValue::U8(1), w);
  MetaCodec::EncodeEntry("k", MetaValue::U8(2), w);
  w.Zeros(64);
  EXPECT_DATA_LOSS(w.data(), "duplicate key 'k'");
}

TEST(MegaMalformedTest, UnknownMetadataValueType) {
  ByteWriter w;
  w.U32(kMegaMagic);
  w.U32(1);
  w.U64(0);
  w.U64(1);
  w.String("k");
  w.U32(13);
  w.Zeros(64);
  EXPECT_DATA_LOSS(w.data(), "unknown value type 13");
}

TEST(MegaMalformedTest, OverlappingRanges) {
  Spec s;
  s.tensors[1].payload_offset = 20;
  EXPECT_DATA_LOSS(s.Build(), "overlaps");
}

TEST(MegaMalformedTest, RangeOutsideFile) {
  Spec s;
  s.tensors[1].payload_offset = 26;
  EXPECT_DATA_LOSS(s.Build(), "tensor 'b': payload range [26, +4) exceeds the payload size 28");
  s.tensors[1].payload_offset = UINT64_MAX - 1;  // overflow
  EXPECT_DATA_LOSS(s.Build(), "exceeds the payload size");
}

TEST(MegaMalformedTest, UnknownDirFlags) {
  Spec s;
  s.tensors[0].dir_flags |= 64;
  EXPECT_DATA_LOSS(s.Build(), "tensor 'a': unknown dir_flags bits");
}

TEST(MegaMalformedTest, UnknownTensorFlags) {
  Spec s;
  s.tensors[0].tensor_flags = 4;
  s.tensors[0].dir_flags |= kMegaDirHasTensorFlags;
  EXPECT_DATA_LOSS(s.Build(), "unknown tensor_flags");
}

TEST(MegaMalformedTest, UnknownCodec) {
  Spec s;
  s.tensors[0].tensor_flags = kMegaTensorCompressed;
  s.tensors[0].codec = static_cast<MegaCodec>(7);
  s.tensors[0].dir_flags |= kMegaDirHasTensorFlags | kMegaDirHasCodec;
  EXPECT_DATA_LOSS(s.Build(), "unknown codec 7");
}

TEST(MegaMalformedTest, CodecAndFlagsDisagree) {
  Spec s;
  s.tensors[0].codec = MegaCodec::kZstd;
  s.tensors[0].dir_flags |= kMegaDirHasCodec;
  EXPECT_DATA_LOSS(s.Build(), "on an uncompressed tensor");
  Spec s2;
  s2.tensors[0].tensor_flags = kMegaTensorCompressed;
  s2.tensors[0].dir_flags |= kMegaDirHasTensorFlags;
  EXPECT_DATA_LOSS(s2.Build(), "flagged COMPRESSED but codec is NONE");
}

TEST(MegaMalformedTest, UnknownChecksumType) {
  Spec s;
  s.tensors[0].checksum_type = static_cast<MegaChecksumType>(3);
  EXPECT_DATA_LOSS(s.Build(), "unknown checksum type 3");
}

TEST(MegaMalformedTest, UnknownDTypeAndStorageFormat) {
  Spec s;
  ByteWriter w;
  std::string b = s.Build();
  size_t at = b.find("F32");
  ASSERT_NE(at, std::string::npos);
  b.replace(at, 3, "F33");
  EXPECT_DATA_LOSS(b, "unknown dtype 'F33'");
  Spec s2;
  s2.tensors[0].storage_format = MegaStorageFormat::kChunkedRawDense;
  s2.tensors[0].dir_flags |= kMegaDirHasStorageFormat;
  std::string b2 = s2.Build();
  at = b2.find("chunked_raw_dense");
  b2.replace(at, 17, "chunked_raw_dunce");
  EXPECT_DATA_LOSS(b2, "unknown storage_format 'chunked_raw_dunce'");
}

TEST(MegaMalformedTest, StoredSizeMismatchAndShuffle) {
  Spec s;
  s.tensors[0].stored_nbytes = 20;
  s.tensors[0].dir_flags |= kMegaDirHasStoredNbytes;
  EXPECT_DATA_LOSS(s.Build(), "uncompressed raw_dense tensor stores 20 bytes");
  Spec s2;
  s2.tensors[0].tensor_flags = kMegaTensorByteShuffled;
  s2.tensors[0].shuffle_elem_size = 5;
  s2.tensors[0].dir_flags |= kMegaDirHasTensorFlags | kMegaDirHasShuffleElemSize;
  EXPECT_DATA_LOSS(s2.Build(), "shuffle_elem_size 5");
  s2.tensors[0].shuffle_elem_size = 0;
  s2.tensors[0].dir_flags &= ~kMegaDirHasShuffleElemSize;
  EXPECT_DATA_LOSS(s2.Build(), "shuffle_elem_size 0");
}

TEST(MegaMalformedTest, ShapeOverflowAndHugeDims) {
  Spec s;
  s.tensors[0].shape = {1ll << 40, 1ll << 40};
  EXPECT_DATA_LOSS(s.Build(), "overflows the logical size");
  std::string b = Spec().Build();
  // First dim word of tensor 'a' (stored innermost first: 3 then 2).
  size_t at =
      b.find(std::string("\x01\x00\x00\x00"
                         "a",
                         5));
  ASSERT_NE(at, std::string::npos);
  size_t dims = at + 5 + 4 + 4;
  std::memset(b.data() + dims, 0xFF, 8);
  EXPECT_DATA_LOSS(b, "is too large");
}

TEST(MegaMalformedTest, BadChecksumNamesTensor) {
  std::string b = Spec().Build();
  auto r0 = OpenBytes(kName, b);
  ASSERT_TRUE(r0.ok());
  const uint64_t a_at = (*r0)->tensors()[0].file_offset;
  const uint64_t b_at = (*r0)->tensors()[1].file_offset;
  std::string bad = b;
  bad[a_at + 3] ^= 1;
  bad[b_at] ^= 1;
  auto r = OpenBytes(kName, bad);
  ASSERT_TRUE(r.ok());  // checksums are checked on read, not on open
  Status s = (*r)->VerifyTensor("a");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(s.message().starts_with(kName)) << s.ToString();
  EXPECT_NE(s.message().find("tensor 'a': CRC32 mismatch"), std::string::npos) << s.ToString();
  s = (*r)->VerifyTensor("b");
  EXPECT_NE(s.message().find("tensor 'b': SHA256 mismatch"), std::string::npos) << s.ToString();
  auto dst = Tensor::Empty(DType::kF32, {2, 3});
  s = (*r)->ReadTensor("a", *dst);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("tensor 'a'"), std::string::npos);
  EXPECT_EQ((*r)->VerifyAll().code(), StatusCode::kDataLoss);
  // MappedTensor verifies too.
  MegaReaderOptions mo;
  auto rm = MegaReader::Open(NewMemoryFile(kName, bad, /*mapped=*/true), mo);
  EXPECT_EQ((*rm)->MappedTensor("a").status().code(), StatusCode::kDataLoss);
  // With verification off the bytes are returned as stored.
  MegaReaderOptions no;
  no.verify_checksums = false;
  auto r2 = OpenBytes(kName, bad, no);
  EXPECT_TRUE((*r2)->ReadTensor("a", *dst).ok());
}

TEST(MegaMalformedTest, CorruptZstdPayload) {
  MegaWriterOptions o;
  o.compression = MegaCodec::kZstd;
  o.checksum = MegaChecksumType::kNone;
  MegaWriter w(o);
  Tensor t = mega_test::MakeTensor(DType::kF32, {256}, 1, true);
  ASSERT_TRUE(w.AddTensor("z", t).ok());
  std::string b = mega_test::WriteToMemory(w);
  auto r0 = OpenBytes(kName, b);
  ASSERT_TRUE(r0.ok());
  const MegaTensorInfo& z = (*r0)->tensors()[0];
  ASSERT_TRUE(z.compressed());
  std::string bad = b;
  for (uint64_t i = 6; i < z.stored_nbytes; ++i) bad[z.file_offset + i] = static_cast<char>(0xA5);
  auto r = OpenBytes(kName, bad);
  ASSERT_TRUE(r.ok());
  Status s = (*r)->VerifyTensor("z");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("tensor 'z'"), std::string::npos) << s.ToString();
  auto dst = Tensor::Empty(DType::kF32, {256});
  s = (*r)->ReadTensor("z", *dst);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
}

TEST(MegaMalformedTest, ZstdDecodesToWrongSize) {
  // A valid zstd frame of 1024 bytes declared as a 2048-byte tensor.
  MegaWriterOptions o;
  o.compression = MegaCodec::kZstd;
  o.profile = MegaProfile::kBare;
  o.alignment = 32;
  MegaWriter w(o);
  ASSERT_TRUE(w.AddTensor("z", mega_test::MakeTensor(DType::kF32, {256}, 1, true)).ok());
  MemoryWritableFile out("x");
  auto res = w.Finish(out);
  ASSERT_TRUE(res.ok());
  MegaTensorInfo t = res->tensors[0];
  t.shape = {512};
  t.logical_nbytes = 2048;
  t.checksum_type = MegaChecksumType::kNone;
  t.dir_flags = mega_internal::DirFlagsFor(t);
  std::string payload = out.contents().substr(res->header_length);
  MegaMetadata md;
  std::string b = mega_internal::EncodeHeader(md, {t}, {}, {}, 32) + payload;
  auto r = OpenBytes(kName, b);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Status s = (*r)->VerifyTensor("z");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("decodes to 1024 bytes, logical size is 2048"), std::string::npos)
      << s.ToString();
  auto dst = Tensor::Empty(DType::kF32, {512});
  EXPECT_EQ((*r)->ReadTensor("z", *dst).code(), StatusCode::kDataLoss);
}

TEST(MegaMalformedTest, ImpossibleCompressionRatio) {
  Spec s;
  s.tensors[0].shape = {1ll << 40};
  s.tensors[0].logical_nbytes = 4ull << 40;
  s.tensors[0].stored_nbytes = 24;
  s.tensors[0].tensor_flags = kMegaTensorCompressed;
  s.tensors[0].codec = MegaCodec::kZstd;
  s.tensors[0].dir_flags = mega_internal::DirFlagsFor(s.tensors[0]);
  EXPECT_DATA_LOSS(s.Build(), "cannot be decoded from 24 zstd bytes");
}

// ---- huge lengths ----------------------------------------------------------------

std::string HeaderStart(uint64_t tensors, uint64_t kvs) {
  ByteWriter w;
  w.U32(kMegaMagic);
  w.U32(1);
  w.U64(tensors);
  w.U64(kvs);
  return w.data();
}

TEST(MegaMalformedTest, HugeLengthsAreRejectedWithoutAllocating) {
  {
    ByteWriter w;
    w.Bytes(HeaderStart(0, 1));
    w.U64(1ull << 60);  // key length
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "metadata key length 1152921504606846976 exceeds");
  }
  {
    ByteWriter w;
    w.Bytes(HeaderStart(0, 1));
    w.String("k");
    w.U32(static_cast<uint32_t>(MetaType::kString));
    w.U64(1ull << 60);
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "metadata string value length");
  }
  for (MetaType elem : {MetaType::kUint64, MetaType::kString, MetaType::kArray}) {
    ByteWriter w;
    w.Bytes(HeaderStart(0, 1));
    w.String("k");
    w.U32(static_cast<uint32_t>(MetaType::kArray));
    w.U32(static_cast<uint32_t>(elem));
    w.U64(1ull << 60);
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "metadata array of 1152921504606846976");
  }
  {
    ByteWriter w;
    w.Bytes(HeaderStart(0, 1ull << 60));
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "claims 1152921504606846976 metadata entries");
  }
  {
    ByteWriter w;
    w.Bytes(HeaderStart(1ull << 60, 0));
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "tensor_count 1152921504606846976");
  }
  {
    ByteWriter w;
    w.Bytes(HeaderStart(1, 0));
    w.U32(0xFFFFFFFF);  // name length
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "tensor name length 4294967295 exceeds");
  }
  {
    ByteWriter w;
    w.Bytes(HeaderStart(1, 0));
    w.CompactString("t");
    w.U32(0);
    w.U32(0xFFFFFFFF);  // n_dims
    w.Zeros(100);
    EXPECT_DATA_LOSS(w.data(), "n_dims 4294967295 exceeds the header");
  }
  {
    Spec s;
    s.md.Set("mega.chunk_directory.count", MetaValue::U64(1ull << 60));
    s.md.Set("mega.chunk_directory.format", MetaValue::String("v1"));
    EXPECT_DATA_LOSS(s.Build(), "records do not fit in the header");
  }
}

// ---- alignment and header size ----------------------------------------------------

TEST(MegaMalformedTest, AlignmentZero) {
  Spec s;
  s.md.Set("general.alignment", MetaValue::U32(0));
  EXPECT_DATA_LOSS(s.Build(), "general.alignment is 0");
}

TEST(MegaMalformedTest, AlignmentNotAnInteger) {
  Spec s;
  s.md.Set("general.alignment", MetaValue::String("32"));
  EXPECT_DATA_LOSS(s.Build(), "general.alignment must be an unsigned integer");
  s.md.Set("general.alignment", MetaValue::I32(-32));
  EXPECT_DATA_LOSS(s.Build(), "general.alignment must be an unsigned integer");
}

TEST(MegaMalformedTest, HeaderDoesNotFit) {
  Spec s;
  std::string b = s.Build();
  s.md.Set("general.alignment", MetaValue::U32(1 << 20));  // same header bytes, bigger alignment
  std::string h = mega_internal::EncodeHeader(s.md, s.tensors, {}, {}, 32);
  EXPECT_DATA_LOSS(h + s.payload, "the header does not fit");
  s.md.Set("general.alignment", MetaValue::U64(1ull << 63));
  h = mega_internal::EncodeHeader(s.md, s.tensors, {}, {}, 32);
  EXPECT_DATA_LOSS(h + s.payload, "the header does not fit");
}

TEST(MegaMalformedTest, UnsupportedTensorInfoFormat) {
  Spec s;
  s.md.Set("mega.tensor_info.format", MetaValue::String("compact"));
  EXPECT_DATA_LOSS(s.Build(), "unsupported mega.tensor_info.format");
}

// ---- chunks -----------------------------------------------------------------------

// Tensor "c" (I16 [20] = 40 bytes) in chunks; payload holds the chunk bytes.
struct ChunkSpec : Spec {
  ChunkSpec(std::vector<std::pair<uint64_t, uint64_t>> pieces) {  // (logical_offset, size)
    tensors.clear();
    payload.clear();
    MegaTensorInfo t = Raw("c", DType::kI16, {20}, 0);
    t.storage_format = MegaStorageFormat::kChunkedRawDense;
    uint32_t id = 0;
    for (auto [off, size] : pieces) {
      MegaChunkInfo c;
      c.tensor_id = 0;
      c.chunk_id = id++;
      c.logical_offset = off;
      c.logical_size = size;
      c.payload_offset = payload.size();
      c.stored_size = size;
      c.checksum_type = MegaChecksumType::kCrc32;
      std::string bytes(size, static_cast<char>('a' + id));
      c.checksum = mega_internal::ChecksumOf(MegaChecksumType::kCrc32, AsBytes(bytes));
      payload += bytes;
      t.chunks.push_back(c);
    }
    t.dir_flags = mega_internal::DirFlagsFor(t);
    tensors.push_back(t);
    md.Set("mega.chunk_directory.count", MetaValue::UInt(pieces.size()));
    md.Set("mega.chunk_directory.format", MetaValue::String("v1"));
  }
};

TEST(MegaMalformedTest, ChunkBaselineParses) {
  ChunkSpec s({{0, 16}, {16, 16}, {32, 8}});
  auto r = OpenBytes(kName, s.Build());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->tensors()[0].chunks.size(), 3u);
  EXPECT_TRUE((*r)->VerifyAll().ok());
  // Chunks are sorted by logical offset whatever their record order.
  ChunkSpec rev({{0, 16}, {16, 16}, {32, 8}});
  std::reverse(rev.tensors[0].chunks.begin(), rev.tensors[0].chunks.end());
  auto r2 = OpenBytes(kName, rev.Build());
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ((*r2)->tensors()[0].chunks[0].logical_offset, 0u);
  EXPECT_EQ((*r2)->tensors()[0].chunks[0].chunk_id, 0u);
}

TEST(MegaMalformedTest, ChunkTilingGap) {
  EXPECT_DATA_LOSS(ChunkSpec({{0, 16}, {20, 20}}).Build(), "expected 16 (gap)");
}

TEST(MegaMalformedTest, ChunkTilingOverlap) {
  EXPECT_DATA_LOSS(ChunkSpec({{0, 16}, {10, 30}}).Build(), "expected 16 (overlap)");
}

TEST(MegaMalformedTest, ChunksDoNotCoverTensor) {
  EXPECT_DATA_LOSS(ChunkSpec({{0, 16}, {16, 16}}).Build(),
                   "chunks cover 32 bytes, logical size is 40");
  EXPECT_DATA_LOSS(ChunkSpec({}).Build(), "chunks cover 0 bytes");
}

TEST(MegaMalformedTest, ChunkRecordErrors) {
  ExpectViolations({
      {"tensor_id 9 out of range",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[0].tensor_id = 9; },
                         Pieces{{0, 40}})},
      {"duplicate (tensor_id, chunk_id)",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[1].chunk_id = 0; },
                         Pieces{{0, 20}, {20, 20}})},
      {"zero logical_size or stored_size",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[0].stored_size = 0; },
                         Pieces{{0, 40}})},
      {"uncompressed chunk stores 30 bytes",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[0].stored_size = 30; },
                         Pieces{{0, 40}})},
      {"unknown codec 2",
       Broken<ChunkSpec>(
           [](ChunkSpec& s) { s.tensors[0].chunks[0].codec = static_cast<MegaCodec>(2); },
           Pieces{{0, 40}})},
      {"unknown flags bits 8",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[0].flags = 8; }, Pieces{{0, 40}})},
      {"COMPRESSED flag and codec ZSTD disagree",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[0].codec = MegaCodec::kZstd; },
                         Pieces{{0, 40}})},
      {"BYTE_SHUFFLED but the tensor's shuffle_elem_size 0",
       Broken<ChunkSpec>(
           [](ChunkSpec& s) { s.tensors[0].chunks[0].flags = kMegaTensorByteShuffled; },
           Pieces{{0, 40}})},
      {"unknown checksum type 5", Broken<ChunkSpec>(
                                      [](ChunkSpec& s) {
                                        s.tensors[0].chunks[0].checksum_type =
                                            static_cast<MegaChecksumType>(5);
                                      },
                                      Pieces{{0, 40}})},
  });
  {
    ChunkSpec s({{0, 40}});
    std::string b = s.Build();
    // reserved u32 sits at byte 52 of the 88-byte record, which ends the records.
    size_t rec = b.size() - s.payload.size();
    auto r = OpenBytes(kName, b);
    ASSERT_TRUE(r.ok());
    rec = (*r)->header_length();
    // Find the record: search backwards from the aligned end for the checksum.
    const MegaChunkInfo& c = (*r)->tensors()[0].chunks[0];
    size_t at = b.rfind(std::string(reinterpret_cast<const char*>(c.checksum.data()), 32), rec);
    ASSERT_NE(at, std::string::npos);
    b[at - 4] = 1;
    EXPECT_DATA_LOSS(b, "reserved field is 1");
  }
  {
    // A chunk record for a raw_dense tensor.
    Spec s;
    MegaChunkInfo c;
    c.tensor_id = 0;
    c.logical_size = 24;
    c.stored_size = 24;
    s.tensors[0].chunks.push_back(c);
    s.md.Set("mega.chunk_directory.count", MetaValue::U32(1));
    s.md.Set("mega.chunk_directory.format", MetaValue::String("v1"));
    EXPECT_DATA_LOSS(s.Build(), "chunk record for a raw_dense tensor");
  }
}

TEST(MegaMalformedTest, ChunkRangeChecks) {
  ExpectViolations({
      {"overlaps tensor 'c' chunk 0",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[1].payload_offset = 10; },
                         Pieces{{0, 20}, {20, 20}})},
      {"tensor 'c' chunk 1: payload range [30, +20) exceeds",
       Broken<ChunkSpec>([](ChunkSpec& s) { s.tensors[0].chunks[1].payload_offset = 30; },
                         Pieces{{0, 20}, {20, 20}})},
      {"overlaps", Broken<ChunkSpec>(
                       [](ChunkSpec& s) {
                         s.tensors.push_back(
                             Raw("raw", DType::kU8, {8}, 36));  // overlaps chunk 1's [20, 40)
                         s.payload += std::string(8, 'x');
                       },
                       Pieces{{0, 20}, {20, 20}})},
  });
}

TEST(MegaMalformedTest, ChunkDirectoryKeys) {
  ChunkSpec s({{0, 40}});
  MegaMetadata md;
  for (const MetaEntry& e : s.md.entries()) {
    if (e.key != "mega.chunk_directory.format") (void)md.Add(e.key, e.value);
  }
  s.md = md;
  EXPECT_DATA_LOSS(s.Build(), "present without 'mega.chunk_directory.format'");
  s.md.Set("mega.chunk_directory.format", MetaValue::String("v2"));
  EXPECT_DATA_LOSS(s.Build(), "expected \"v1\"");
  s.md.Set("mega.chunk_directory.format", MetaValue::String("v1"));
  s.md.Set("mega.chunk_directory.count", MetaValue::String("1"));
  EXPECT_DATA_LOSS(s.Build(), "must be a non-negative integer");
}

TEST(MegaMalformedTest, ChunkChecksumMismatchNamesChunk) {
  ChunkSpec s({{0, 16}, {16, 24}});
  std::string b = s.Build();
  b[b.size() - 1] ^= 1;  // last byte of chunk 1
  auto r = OpenBytes(kName, b);
  ASSERT_TRUE(r.ok());
  Status st = (*r)->VerifyTensor("c");
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("tensor 'c' chunk 1 (logical [16, 40)): CRC32 mismatch"),
            std::string::npos)
      << st.ToString();
  // Reading only chunk 0's bytes still works; touching chunk 1 fails.
  std::vector<std::byte> part(16);
  EXPECT_TRUE((*r)->ReadRange("c", 0, part).ok());
  EXPECT_EQ((*r)->ReadRange("c", 10, part).code(), StatusCode::kDataLoss);
}

// ---- segments and MoE --------------------------------------------------------------

struct TableSpec : Spec {
  TableSpec() {
    // Two segments over layers 0..2 (tensor 0 in [0, 24), tensor 1 in [24, 28)) and two
    // experts (tensor 1's outside any segment).
    segments = {
        {.segment_id = 1,
         .layer_start = 0,
         .layer_end = 2,
         .payload_offset = 0,
         .payload_size = 24,
         .first_tensor_id = 0,
         .tensor_count = 1},
        {.segment_id = 2,
         .layer_start = 0,
         .layer_end = 2,
         .payload_offset = 24,
         .payload_size = 4,
         .first_tensor_id = 1,
         .tensor_count = 1},
    };
    moe = {
        {.tensor_id = 0, .expert_id = 3, .segment_id = 1},
        {.tensor_id = 1, .expert_id = 1, .segment_id = kMegaNoSegment},
    };
    md.Set("mega.segment_directory.count", MetaValue::U32(2));
    md.Set("mega.segment_directory.format", MetaValue::String("v1"));
    md.Set("mega.moe.expert_table.count", MetaValue::U32(2));
    md.Set("mega.moe.expert_table.format", MetaValue::String("v1"));
    md.Set("mega.moe.n_experts", MetaValue::U32(4));
  }
};

TEST(MegaMalformedTest, TablesBaselineParses) {
  auto r = OpenBytes(kName, TableSpec().Build());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->segments().size(), 2u);
  EXPECT_EQ((*r)->moe_experts().size(), 2u);
  EXPECT_EQ((*r)->moe_experts()[0].expert_id, 3u);
}

TEST(MegaMalformedTest, SegmentViolations) {
  ExpectViolations({
      {"duplicate segment 1",
       Broken<TableSpec>([](TableSpec& s) { s.segments[1].segment_id = 1; })},
      {"segment 1: layer range 5..2 is reversed",
       Broken<TableSpec>([](TableSpec& s) { s.segments[0].layer_start = 5; })},
      {"expert range 3..1 is reversed", Broken<TableSpec>([](TableSpec& s) {
         s.segments[0].expert_start = 3;
         s.segments[0].expert_end = 1;
       })},
      {"segment 2: tensors [1, +2) exceed",
       Broken<TableSpec>([](TableSpec& s) { s.segments[1].tensor_count = 2; })},
      {"segment 2: payload range [24, +5) exceeds the payload size 28",
       Broken<TableSpec>([](TableSpec& s) { s.segments[1].payload_size = 5; })},
      {"segment 2: reserved field is non-zero",
       Broken<TableSpec>([](TableSpec& s) { s.segments[1].reserved = 1; })},
  });
}

TEST(MegaMalformedTest, MoeViolations) {
  ExpectViolations({
      {"duplicate tensor_id 0 ('a')",
       Broken<TableSpec>([](TableSpec& s) { s.moe[1].tensor_id = 0; })},
      {"tensor_id 7 out of range", Broken<TableSpec>([](TableSpec& s) { s.moe[1].tensor_id = 7; })},
      {"expert_id 4 >= mega.moe.n_experts 4",
       Broken<TableSpec>([](TableSpec& s) { s.moe[0].expert_id = 4; })},
      {"unknown segment_id 9", Broken<TableSpec>([](TableSpec& s) { s.moe[0].segment_id = 9; })},
      {"MoE expert record 0: reserved field is non-zero",
       Broken<TableSpec>([](TableSpec& s) { s.moe[0].reserved = 3; })},
  });
}

// ---- footer overlay ---------------------------------------------------------------

struct OverlaySpec {
  std::string base = Spec().Build();
  MegaMetadata entries;
  uint64_t generation = 1;
  std::optional<uint64_t> base_size, overlay_offset, overlay_size;
  bool corrupt_sha = false;
  OverlaySpec() { (void)entries.Add("sig", MetaValue::String("abc")); }
  std::string Build(std::string overlay = {}) const {
    if (overlay.empty()) overlay = mega_internal::EncodeOverlay(entries);
    Sha256Digest sha = Sha256Of(AsBytes(overlay));
    if (corrupt_sha) sha[0] ^= 1;
    return base + overlay +
           mega_internal::EncodeTrailer(generation, overlay_offset.value_or(base.size()),
                                        overlay_size.value_or(overlay.size()),
                                        base_size.value_or(base.size()), sha);
  }
};

TEST(MegaMalformedTest, OverlayBaselineParses) {
  auto r = OpenBytes(kName, OverlaySpec().Build());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE((*r)->footer_overlay().present);
  EXPECT_EQ(*(*r)->metadata().GetString("sig"), "abc");
}

TEST(MegaMalformedTest, OverlayBadSha) {
  OverlaySpec s;
  s.corrupt_sha = true;
  EXPECT_DATA_LOSS(s.Build(), "footer overlay: SHA-256 mismatch");
}

TEST(MegaMalformedTest, OverlayBadRanges) {
  ExpectViolations({
      {"does not end at the trailer",
       Broken<OverlaySpec>([](OverlaySpec& s) { s.overlay_offset = s.base.size() - 1; })},
      {"does not end at the trailer",
       Broken<OverlaySpec>([](OverlaySpec& s) { s.overlay_size = UINT64_MAX; })},
      {"is past the overlay offset",
       Broken<OverlaySpec>([](OverlaySpec& s) { s.base_size = s.base.size() + 1; })},
      {"tensor 'b': payload range", Broken<OverlaySpec>([](OverlaySpec& s) {
         s.base_size = s.base.size() - 2;  // cuts tensor 'b'
       })},
      {"generation 0", Broken<OverlaySpec>([](OverlaySpec& s) { s.generation = 0; })},
  });
}

TEST(MegaMalformedTest, OverlayStructuralKey) {
  OverlaySpec s;
  (void)s.entries.Add("mega.chunk_directory.count", MetaValue::U32(0));
  EXPECT_DATA_LOSS(s.Build(), "overlay sets structural key 'mega.chunk_directory.count'");
  OverlaySpec s2;
  (void)s2.entries.Add("general.alignment", MetaValue::U32(32));
  EXPECT_DATA_LOSS(s2.Build(), "structural key 'general.alignment'");
}

TEST(MegaMalformedTest, OverlayBadContent) {
  OverlaySpec s;
  std::string ov = mega_internal::EncodeOverlay(s.entries);
  std::string bad_magic = ov;
  bad_magic[0] = 'X';
  EXPECT_DATA_LOSS(s.Build(bad_magic), "overlay does not start with the footer magic");
  EXPECT_DATA_LOSS(s.Build(ov + "junk"), "4 bytes after the last overlay entry");
  ByteWriter dup;
  dup.U32(kMegaFooterMagic);
  dup.U64(2);
  MetaCodec::EncodeEntry("k", MetaValue::U8(1), dup);
  MetaCodec::EncodeEntry("k", MetaValue::U8(1), dup);
  EXPECT_DATA_LOSS(s.Build(dup.data()), "footer overlay has duplicate key 'k'");
  ByteWriter tiny;
  tiny.U32(kMegaFooterMagic);
  EXPECT_DATA_LOSS(s.Build(tiny.data()), "below the 12-byte minimum");
}

TEST(MegaMalformedTest, ErrorsNameTheFileFromDisk) {
  mega_test::TempDir dir;
  std::string b = Spec().Build();
  b[0] = 0;
  mega_test::WriteBytes(dir.File("disk.mega"), b);
  for (bool mmap : {false, true}) {
    MegaReaderOptions o;
    o.use_mmap = mmap;
    auto r = MegaReader::OpenFile(dir.File("disk.mega"), o);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(r.status().message().starts_with(dir.File("disk.mega"))) << r.status().ToString();
  }
  EXPECT_EQ(MegaReader::OpenFile(dir.File("missing.mega")).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace megackpt::format
