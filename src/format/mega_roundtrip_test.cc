// Writer -> reader round trips: dtypes, shapes, metadata, checksums,
// compression, chunking, overlays, strided sources, sinks, partial reads.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "format/mega_internal.h"
#include "format/mega_test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/memory_file.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {
namespace {

using mega_test::MakeTensor;
using mega_test::OpenBytes;
using mega_test::TempDir;
using mega_test::WriteToMemory;

const DType kAllDTypes[] = {
    DType::kBool, DType::kU8,      DType::kI8,      DType::kI16,     DType::kU16,  DType::kI32,
    DType::kU32,  DType::kI64,     DType::kU64,     DType::kF16,     DType::kBF16, DType::kF32,
    DType::kF64,  DType::kF8_E5M2, DType::kF8_E4M3, DType::kF8_E8M0, DType::kF4};

// `tensors` written in that order by a MegaWriter with options `o`; the bytes.
std::string WriteTensors(const MegaWriterOptions& o,
                         const std::vector<std::pair<std::string, Tensor>>& tensors) {
  MegaWriter w(o);
  for (const auto& [name, t] : tensors) EXPECT_TRUE(w.AddTensor(name, t).ok()) << name;
  return WriteToMemory(w);
}

// Every tensor of `want` is in the file with the same dtype/shape/bytes.
void ExpectTensors(const MegaReader& r, const std::vector<std::pair<std::string, Tensor>>& want) {
  ASSERT_EQ(r.tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const auto& [name, t] = want[i];
    SCOPED_TRACE(name);
    const MegaTensorInfo& info = r.tensors()[i];
    EXPECT_EQ(info.name, name);
    EXPECT_EQ(info.dtype, t.dtype());
    EXPECT_EQ(info.shape, t.shape());
    auto loaded = r.LoadTensor(name);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    EXPECT_TRUE(TensorBytesEqual(*loaded, t));
    EXPECT_TRUE(r.VerifyTensor(name).ok());
  }
}

// `tensors` written with options `o` (the bytes in *bytes) and opened again;
// when it opens, checked with ExpectTensors.
Result<std::unique_ptr<MegaReader>> RoundTrip(
    const MegaWriterOptions& o, const std::vector<std::pair<std::string, Tensor>>& tensors,
    std::string* bytes) {
  *bytes = WriteTensors(o, tensors);
  auto r = OpenBytes("rt.mega", *bytes);
  if (r.ok()) ExpectTensors(**r, tensors);
  return r;
}

TEST(MegaRoundTripTest, EveryDTypeAndShapeTensorPlayProfile) {
  TempDir dir;
  std::vector<std::pair<std::string, Tensor>> tensors;
  int seed = 0;
  for (DType d : kAllDTypes) {
    std::string n(DTypeName(d));
    tensors.push_back({n + ".2d", MakeTensor(d, {3, 5}, ++seed)});
    tensors.push_back({n + ".0d", MakeTensor(d, {}, ++seed)});
    tensors.push_back({n + ".empty", MakeTensor(d, {4, 0, 2}, ++seed)});
  }
  tensors.push_back({"f4.odd", MakeTensor(DType::kF4, {7}, 99)});  // 4 bytes, half-filled last
  MegaWriter w;
  for (auto& [n, t] : tensors) ASSERT_TRUE(w.AddTensor(n, t).ok());
  auto res = w.WriteFile(dir.File("x.mega"));
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  auto r = MegaReader::OpenFile(dir.File("x.mega"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ExpectTensors(**r, tensors);
  EXPECT_EQ((*r)->alignment(), 4096u);
  EXPECT_EQ((*r)->header_length() % 4096, 0u);
  EXPECT_EQ(res->header_length, (*r)->header_length());
  EXPECT_EQ(res->file_size, (*r)->file_size());
  // Per-tensor info returned by the writer matches what the reader parses.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const MegaTensorInfo& a = res->tensors[i];
    const MegaTensorInfo& b = (*r)->tensors()[i];
    EXPECT_EQ(a.file_offset, b.file_offset);
    EXPECT_EQ(a.payload_offset, b.payload_offset);
    EXPECT_EQ(a.stored_nbytes, b.stored_nbytes);
    EXPECT_EQ(a.checksum, b.checksum);
    EXPECT_EQ(a.dir_flags, b.dir_flags);
    EXPECT_EQ(b.checksum_type, MegaChecksumType::kCrc32);
    EXPECT_EQ(b.dir_flags, kMegaDirHasChecksum);
  }
  // TensorPlay profile keys, in order.
  const auto& e = (*r)->metadata().entries();
  std::vector<std::string> keys;
  for (const auto& x : e) keys.push_back(x.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"general.architecture", "general.alignment",
                                            "mega.tensor_info.format", "tensorplay.container",
                                            "tensorplay.byteorder", "tensorplay.tensor_devices",
                                            "tensorplay.checksum", "tensorplay.tensor_checksums"}));
  const MegaMetadata& md = (*r)->metadata();
  EXPECT_EQ(*md.GetString("general.architecture"), "tensorplay");
  EXPECT_EQ(md.Find("general.alignment")->type(), MetaType::kUint32);
  EXPECT_EQ(*md.GetUint64("general.alignment"), 4096u);
  EXPECT_EQ(*md.GetString("mega.tensor_info.format"), "self_describing");
  EXPECT_EQ(*md.GetString("tensorplay.container"), "dict");
  EXPECT_EQ(*md.GetString("tensorplay.byteorder"), "little");
  EXPECT_EQ(*md.GetString("tensorplay.checksum"), "crc32");
  auto devices = nlohmann::json::parse(std::string(*md.GetString("tensorplay.tensor_devices")));
  auto sums = nlohmann::json::parse(std::string(*md.GetString("tensorplay.tensor_checksums")));
  ASSERT_EQ(devices.size(), tensors.size());
  ASSERT_EQ(sums.size(), tensors.size());
  for (const MegaTensorInfo& t : (*r)->tensors()) {
    EXPECT_EQ(devices.at(t.name), "cpu");
    EXPECT_EQ(sums.at(t.name), t.checksum_hex());
    EXPECT_EQ(t.checksum_hex().size(), 8u);
  }
  // Python json.dumps separators.
  EXPECT_TRUE(md.GetString("tensorplay.tensor_devices")->starts_with("{\"BOOL.2d\": \"cpu\", "));
}

TEST(MegaRoundTripTest, EveryMetadataTypeBareProfile) {
  MegaWriterOptions o;
  o.profile = MegaProfile::kBare;
  o.alignment = 32;
  MegaWriter w(o);
  std::vector<std::pair<std::string, MetaValue>> values = {
      {"a.u8", MetaValue::U8(200)},
      {"a.i8", MetaValue::I8(-100)},
      {"a.u16", MetaValue::U16(60000)},
      {"a.i16", MetaValue::I16(-30000)},
      {"a.u32", MetaValue::U32(4000000000u)},
      {"a.i32", MetaValue::I32(-2000000000)},
      {"a.u64", MetaValue::U64(1ull << 63)},
      {"a.i64", MetaValue::I64(-(1ll << 62))},
      {"a.f32", MetaValue::F32(1.25f)},
      {"a.f64", MetaValue::F64(-0.1)},
      {"a.bool", MetaValue::Bool(true)},
      {"a.str", MetaValue::String("ünïcode")},
      {"a.arr.str", MetaValue::StringArray({"x", "yy"})},
      {"a.arr.u32", MetaValue::U32Array(std::vector<uint32_t>{7, 8})},
      {"a.arr.nested",
       *MetaValue::Array(MetaType::kArray, {MetaValue::I64Array(std::vector<int64_t>{-1})})},
  };
  for (auto& [k, v] : values) ASSERT_TRUE(w.AddMetadata(k, v).ok());
  ASSERT_TRUE(w.AddTensor("t", MakeTensor(DType::kF32, {2}, 1)).ok());
  std::string bytes = WriteToMemory(w);
  auto r = OpenBytes("meta.mega", bytes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& e = (*r)->metadata().entries();
  ASSERT_EQ(e.size(), values.size());  // alignment 32 is the default: not added
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(e[i].key, values[i].first);
    EXPECT_TRUE(e[i].value == values[i].second) << values[i].first;
  }
  EXPECT_EQ((*r)->alignment(), 32u);
}

TEST(MegaRoundTripTest, BareProfileAppendsNonDefaultAlignment) {
  MegaWriterOptions o;
  o.profile = MegaProfile::kBare;
  o.alignment = 128;
  MegaWriter w(o);
  ASSERT_TRUE(w.AddMetadata("k", MetaValue::U8(1)).ok());
  ASSERT_TRUE(w.AddTensor("t", MakeTensor(DType::kU8, {3}, 1)).ok());
  auto r = OpenBytes("a.mega", WriteToMemory(w));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->metadata().entries().back().key, "general.alignment");
  EXPECT_EQ((*r)->alignment(), 128u);
  EXPECT_EQ((*r)->header_length() % 128, 0u);
}

TEST(MegaRoundTripTest, ChecksumTypes) {
  for (MegaChecksumType ck :
       {MegaChecksumType::kNone, MegaChecksumType::kCrc32, MegaChecksumType::kSha256}) {
    SCOPED_TRACE(std::string(MegaChecksumTypeName(ck)));
    MegaWriterOptions o;
    o.checksum = ck;
    Tensor a = MakeTensor(DType::kF32, {33, 7}, 5);
    Tensor b = MakeTensor(DType::kU8, {3}, 6);
    std::string bytes;
    auto r = RoundTrip(o, {{"a", a}, {"b", b}}, &bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const MegaTensorInfo& t : (*r)->tensors()) {
      EXPECT_EQ(t.checksum_type, ck);
      auto stored = AsBytes(bytes).subspan(t.file_offset, t.stored_nbytes);
      EXPECT_EQ(t.checksum, mega_internal::ChecksumOf(ck, stored));
      EXPECT_EQ(t.dir_flags, ck == MegaChecksumType::kNone ? 0u : kMegaDirHasChecksum);
    }
    auto sums = nlohmann::json::parse(
        std::string(*(*r)->metadata().GetString("tensorplay.tensor_checksums")));
    EXPECT_EQ(sums.size(), ck == MegaChecksumType::kNone ? 0u : 2u);
    EXPECT_EQ(*(*r)->metadata().GetString("tensorplay.checksum"),
              ck == MegaChecksumType::kNone    ? "none"
              : ck == MegaChecksumType::kCrc32 ? "crc32"
                                               : "sha256");
  }
}

TEST(MegaRoundTripTest, ZstdWithAndWithoutShuffleAndMinRatio) {
  Tensor ramp = MakeTensor(DType::kF32, {64, 64}, 1, /*compressible=*/true);
  Tensor noise = MakeTensor(DType::kF32, {64, 64}, 2);
  Tensor bytes1 = MakeTensor(DType::kU8, {4096}, 3, true);
  for (bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle ? "shuffle" : "no shuffle");
    MegaWriterOptions o;
    o.compression = MegaCodec::kZstd;
    o.byte_shuffle = shuffle;
    std::string bytes;
    auto r = RoundTrip(o, {{"ramp", ramp}, {"noise", noise}, {"u8", bytes1}}, &bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const MegaTensorInfo* t = (*r)->Find("ramp");
    EXPECT_TRUE(t->compressed());
    EXPECT_EQ(t->codec, MegaCodec::kZstd);
    EXPECT_LT(t->stored_nbytes, t->logical_nbytes);
    EXPECT_EQ(t->byte_shuffled(), shuffle);
    EXPECT_EQ(t->shuffle_elem_size, shuffle ? 4u : 0u);
    EXPECT_EQ(t->dir_flags, kMegaDirHasStoredNbytes | kMegaDirHasTensorFlags | kMegaDirHasCodec |
                                kMegaDirHasChecksum | (shuffle ? kMegaDirHasShuffleElemSize : 0));
    // The checksum covers the stored (compressed) bytes.
    EXPECT_EQ(t->checksum,
              mega_internal::ChecksumOf(MegaChecksumType::kCrc32,
                                        AsBytes(bytes).subspan(t->file_offset, t->stored_nbytes)));
    // Incompressible: raw, no flags.
    const MegaTensorInfo* n = (*r)->Find("noise");
    EXPECT_FALSE(n->compressed());
    EXPECT_EQ(n->tensor_flags, 0u);
    EXPECT_EQ(n->stored_nbytes, n->logical_nbytes);
    // 1-byte elements are never shuffled.
    EXPECT_FALSE((*r)->Find("u8")->byte_shuffled());
  }
  // min_ratio tiny: nothing pays off, everything stays raw.
  MegaWriterOptions o;
  o.compression = MegaCodec::kZstd;
  o.min_ratio = 0.0001;
  auto r = OpenBytes("z2.mega", WriteTensors(o, {{"ramp", ramp}}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE((*r)->Find("ramp")->compressed());
}

TEST(MegaRoundTripTest, ShuffleImprovesRatioOnFloats) {
  // Smooth floats: exponent bytes are nearly constant, which shuffling exposes.
  auto t = Tensor::Empty(DType::kF32, {1 << 14});
  auto* f = static_cast<float*>(t->data());
  for (int i = 0; i < (1 << 14); ++i) f[i] = 1.0f + i * 1e-4f;
  uint64_t sizes[2];
  for (int s = 0; s < 2; ++s) {
    MegaWriterOptions o;
    o.compression = MegaCodec::kZstd;
    o.byte_shuffle = s == 1;
    o.min_ratio = 10;
    auto r = OpenBytes("s.mega", WriteTensors(o, {{"f", *t}}));
    ASSERT_TRUE(r.ok());
    sizes[s] = (*r)->Find("f")->stored_nbytes;
    EXPECT_TRUE(TensorBytesEqual(*(*r)->LoadTensor("f"), *t));
  }
  EXPECT_LT(sizes[1], sizes[0]);
}

TEST(MegaRoundTripTest, ChunkedTensorsAllCodecs) {
  Tensor big = MakeTensor(DType::kF32, {40, 25}, 4, true);  // 4000 bytes
  Tensor noise = MakeTensor(DType::kI16, {1001}, 5);        // 2002 bytes
  Tensor small = MakeTensor(DType::kF64, {3}, 6);           // below chunk size: raw_dense
  for (MegaCodec codec : {MegaCodec::kNone, MegaCodec::kZstd}) {
    for (MegaChecksumType ck : {MegaChecksumType::kCrc32, MegaChecksumType::kSha256}) {
      SCOPED_TRACE(std::string(MegaCodecName(codec)) + "/" + std::string(MegaChecksumTypeName(ck)));
      MegaWriterOptions o;
      o.chunk_bytes = 1000;
      o.compression = codec;
      o.byte_shuffle = true;
      o.checksum = ck;
      std::string bytes;
      auto r = RoundTrip(o, {{"big", big}, {"noise", noise}, {"small", small}}, &bytes);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      const MegaTensorInfo* t = (*r)->Find("big");
      ASSERT_TRUE(t->chunked());
      ASSERT_EQ(t->chunks.size(), 4u);
      EXPECT_TRUE(t->dir_flags & kMegaDirHasStorageFormat);
      uint64_t expect = 0;
      for (size_t k = 0; k < t->chunks.size(); ++k) {
        const MegaChunkInfo& c = t->chunks[k];
        EXPECT_EQ(c.chunk_id, k);
        EXPECT_EQ(c.logical_offset, expect);
        expect += c.logical_size;
        EXPECT_EQ(c.checksum_type, ck);
        EXPECT_EQ(c.checksum, mega_internal::ChecksumOf(
                                  ck, AsBytes(bytes).subspan(c.file_offset, c.stored_size)));
        EXPECT_EQ((c.flags & kMegaTensorCompressed) != 0, codec == MegaCodec::kZstd);
      }
      EXPECT_EQ((*r)->Find("noise")->chunks.size(), 3u);  // 1000 + 1000 + 2
      EXPECT_FALSE((*r)->Find("small")->chunked());
      EXPECT_EQ(*(*r)->metadata().GetUint64("mega.chunk_directory.count"), 7u);
      EXPECT_EQ(*(*r)->metadata().GetString("mega.chunk_directory.format"), "v1");
      // Ranges across chunk boundaries decode only what they need.
      std::vector<std::byte> part(1500);
      ASSERT_TRUE((*r)->ReadRange("big", 900, part).ok());
      EXPECT_EQ(0, std::memcmp(part.data(), big.Bytes().data() + 900, part.size()));
    }
  }
}

TEST(MegaRoundTripTest, FooterOverlayTwoGenerations) {
  TempDir dir;
  const std::string path = dir.File("o.mega");
  Tensor t = MakeTensor(DType::kBF16, {10, 3}, 8);
  MegaWriter w;
  ASSERT_TRUE(w.AddMetadata("app.note", MetaValue::String("v0")).ok());
  ASSERT_TRUE(w.AddTensor("t", t).ok());
  auto res = w.WriteFile(path);
  ASSERT_TRUE(res.ok());
  const uint64_t base = res->file_size;

  MegaMetadata g1;
  ASSERT_TRUE(g1.Add("app.note", MetaValue::String("v1")).ok());
  ASSERT_TRUE(g1.Add("sig.a", MetaValue::String("aaaa")).ok());
  auto ov1 = AppendFooterOverlay(path, g1);
  ASSERT_TRUE(ov1.ok()) << ov1.status().ToString();
  EXPECT_EQ(ov1->generation, 1u);
  EXPECT_EQ(ov1->base_size, base);
  EXPECT_EQ(ov1->overlay_offset, base);

  MegaMetadata g2;
  ASSERT_TRUE(g2.Add("sig.b", MetaValue::U64(42)).ok());
  auto ov2 = AppendFooterOverlay(path, g2);
  ASSERT_TRUE(ov2.ok()) << ov2.status().ToString();
  EXPECT_EQ(ov2->generation, 2u);
  EXPECT_EQ(ov2->base_size, base);

  auto r = MegaReader::OpenFile(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const MegaFooterOverlayInfo& fo = (*r)->footer_overlay();
  EXPECT_TRUE(fo.present);
  EXPECT_EQ(fo.generation, 2u);
  EXPECT_EQ(fo.base_size, base);
  EXPECT_EQ((*r)->payload_end(), base);
  EXPECT_EQ(fo.metadata.size(), 3u);  // app.note, sig.a, sig.b: the last overlay is complete
  EXPECT_EQ(*(*r)->metadata().GetString("app.note"), "v1");
  EXPECT_EQ(*(*r)->header_metadata().GetString("app.note"), "v0");
  EXPECT_EQ(*(*r)->metadata().GetString("sig.a"), "aaaa");
  EXPECT_EQ(*(*r)->metadata().GetUint64("sig.b"), 42u);
  ExpectTensors(**r, {{"t", t}});

  MegaMetadata bad;
  ASSERT_TRUE(bad.Add("general.alignment", MetaValue::U32(8)).ok());
  EXPECT_EQ(AppendFooterOverlay(path, bad).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(AppendFooterOverlay(path, MegaMetadata()).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(MegaRoundTripTest, StridedSources) {
  Tensor base = MakeTensor(DType::kF32, {16, 24}, 10, true);
  auto narrow = base.Narrow(1, 3, 17);  // non-contiguous [16, 17]
  ASSERT_TRUE(narrow.ok());
  ASSERT_FALSE(narrow->is_contiguous());
  // Transposed view [24, 16].
  auto transposed = Tensor::FromBlobStrided(base.data(), DType::kF32, {24, 16}, {1, 24});
  ASSERT_TRUE(transposed.ok());
  auto dense_narrow = Tensor::Empty(DType::kF32, {16, 17});
  ASSERT_TRUE(CopyTensor(*narrow, *dense_narrow).ok());
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode);
    MegaWriterOptions o;
    o.io_block_size = 256;  // force several staged items per tensor
    if (mode >= 1) {
      o.compression = MegaCodec::kZstd;
      o.byte_shuffle = true;
      o.min_ratio = 10;
    }
    if (mode == 2) o.chunk_bytes = 400;
    std::string bytes;
    auto r = RoundTrip(o, {{"narrow", *narrow}, {"transposed", *transposed}}, &bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // Same bytes as writing the dense copies.
    MegaWriter w2(o);
    auto dense_t = Tensor::Empty(DType::kF32, {24, 16});
    ASSERT_TRUE(CopyTensor(*transposed, *dense_t).ok());
    ASSERT_TRUE(w2.AddTensor("narrow", *dense_narrow).ok());
    ASSERT_TRUE(w2.AddTensor("transposed", *dense_t).ok());
    EXPECT_EQ(WriteToMemory(w2), bytes);
  }
}

// Sequential and positioned sinks, serial and parallel, held and recompressed
// zstd output: all produce the same bytes.
TEST(MegaRoundTripTest, SinksAndParallelismGiveIdenticalBytes) {
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"big", MakeTensor(DType::kF32, {600, 1000}, 1)},  // 2.4 MB: direct writes
      {"ramp", MakeTensor(DType::kBF16, {700, 1000}, 2, true)},
      {"small", MakeTensor(DType::kI64, {5}, 3)},
      {"tiny", MakeTensor(DType::kBool, {1}, 4)},
      {"empty", MakeTensor(DType::kF16, {0}, 5)},
  };
  auto narrow = tensors[0].second.Narrow(1, 10, 900);
  tensors.push_back({"strided", *narrow});
  struct Config {
    MegaChecksumType ck;
    MegaCodec codec;
    uint64_t chunk;
    bool hashes;
    uint64_t tensor_alignment;
  };
  const Config configs[] = {
      {MegaChecksumType::kCrc32, MegaCodec::kNone, 0, false, 1},
      {MegaChecksumType::kSha256, MegaCodec::kNone, 0, false, 64},
      {MegaChecksumType::kCrc32, MegaCodec::kZstd, 0, false, 1},
      {MegaChecksumType::kCrc32, MegaCodec::kNone, 300000, true, 4096},
      {MegaChecksumType::kSha256, MegaCodec::kZstd, 500000, true, 1},
  };
  ThreadPool pool(2);
  for (const Config& c : configs) {
    SCOPED_TRACE(std::string(MegaChecksumTypeName(c.ck)) + " " +
                 std::string(MegaCodecName(c.codec)) + " chunk " + std::to_string(c.chunk));
    std::string first;
    for (int variant = 0; variant < 5; ++variant) {
      MegaWriterOptions o;
      o.checksum = c.ck;
      o.compression = c.codec;
      o.byte_shuffle = true;
      o.chunk_bytes = c.chunk;
      o.payload_hashes = c.hashes;
      o.tensor_alignment = c.tensor_alignment;
      o.io_block_size = 1 << 20;
      o.pool = &pool;
      o.max_parallel = variant % 2 == 0 ? 2 : 1;
      if (variant == 4) o.compression_buffer_limit = 0;  // recompress in the write pass
      MegaWriter w(o);
      for (auto& [n, t] : tensors) ASSERT_TRUE(w.AddTensor(n, t).ok());
      std::string bytes = WriteToMemory(w, /*sequential=*/variant >= 2 && variant != 4);
      if (variant == 0) {
        first = bytes;
        auto r = OpenBytes("p.mega", bytes);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        ExpectTensors(**r, tensors);
        for (const MegaTensorInfo& t : (*r)->tensors()) {
          EXPECT_EQ(t.payload_offset % c.tensor_alignment, 0u) << t.name;
        }
        if (c.hashes) {
          auto payload = AsBytes(bytes).subspan((*r)->header_length());
          EXPECT_EQ(*(*r)->metadata().GetUint64("mega.hash.payload.crc32"), Crc32(payload));
          EXPECT_EQ(*(*r)->metadata().GetString("mega.hash.payload.sha256"),
                    ToHex(Sha256Of(payload)));
        }
      } else {
        EXPECT_EQ(bytes.size(), first.size()) << "variant " << variant;
        EXPECT_TRUE(bytes == first) << "variant " << variant;
      }
    }
  }
}

TEST(MegaRoundTripTest, LargeWritesAreLarge) {
  Tensor big = MakeTensor(DType::kU8, {40 << 20}, 1);
  MegaWriterOptions o;
  o.max_parallel = 1;
  MegaWriter w(o);
  ASSERT_TRUE(w.AddTensor("big", big).ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(w.AddTensor("s" + std::to_string(i), MakeTensor(DType::kF32, {10}, i)).ok());
  }
  MemoryWritableFile out("big.mega");
  ASSERT_TRUE(w.Finish(out).ok());
  // 40 MiB in 16 MiB writes (3), the 100 small tensors coalesced (1), header (1).
  EXPECT_EQ(out.write_calls(), 5u);
}

TEST(MegaRoundTripTest, TrailerLookalikeIsPadded) {
  // A payload whose last 68 bytes start with "MGTF" would parse as a footer;
  // the writer pads the file so it does not.
  auto t = Tensor::Empty(DType::kU8, {100}, /*zero=*/true);
  std::memcpy(static_cast<char*>(t->data()) + 32, "MGTF", 4);
  for (bool sequential : {false, true}) {
    MegaWriterOptions o;
    o.profile = MegaProfile::kBare;
    o.alignment = 32;
    o.checksum = MegaChecksumType::kNone;
    MegaWriter w(o);
    ASSERT_TRUE(w.AddTensor("t", *t).ok());
    MemoryWritableFile out("pad.mega", !sequential);
    auto res = w.Finish(out);
    ASSERT_TRUE(res.ok());
    EXPECT_EQ(res->file_size, res->header_length + 100 + kMegaFooterTrailerSize);
    EXPECT_EQ(out.contents().size(), res->file_size);
    auto r = OpenBytes("pad.mega", out.contents());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ExpectTensors(**r, {{"t", *t}});
  }
}

TEST(MegaRoundTripTest, ReadIntoStridedDestinationAndRanges) {
  Tensor src = MakeTensor(DType::kI32, {8, 6}, 12);
  for (bool compress : {false, true}) {
    MegaWriterOptions o;
    if (compress) {
      o.compression = MegaCodec::kZstd;
      o.min_ratio = 10;
    }
    auto r = OpenBytes("d.mega", WriteTensors(o, {{"x", src}}));
    ASSERT_TRUE(r.ok());
    Tensor big = MakeTensor(DType::kI32, {8, 10}, 0);
    auto dst = big.Narrow(1, 2, 6);
    ASSERT_TRUE((*r)->ReadTensor("x", *dst).ok());
    EXPECT_TRUE(TensorBytesEqual(*dst, src));
    std::vector<std::byte> part(20);
    ASSERT_TRUE((*r)->ReadRange("x", 28, part).ok());
    EXPECT_EQ(0, std::memcmp(part.data(), src.Bytes().data() + 28, 20));
    EXPECT_EQ((*r)->ReadRange("x", 180, part).code(), StatusCode::kOutOfRange);
    auto wrong = Tensor::Empty(DType::kI32, {6, 8});
    EXPECT_EQ((*r)->ReadTensor("x", *wrong).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ((*r)->ReadTensor("nope", *wrong).code(), StatusCode::kNotFound);
  }
}

TEST(MegaRoundTripTest, ReadSliceMatchesNarrowedViews) {
  Tensor src = MakeTensor(DType::kF32, {6, 5, 4}, 13, true);
  struct Box {
    std::vector<int64_t> start, size;
  };
  const Box boxes[] = {{{0, 0, 0}, {6, 5, 4}}, {{2, 0, 0}, {3, 5, 4}}, {{1, 2, 0}, {4, 2, 4}},
                       {{0, 1, 1}, {6, 3, 2}}, {{5, 4, 3}, {1, 1, 1}}, {{0, 0, 0}, {0, 5, 4}}};
  for (int mode = 0; mode < 3; ++mode) {
    MegaWriterOptions o;
    if (mode >= 1) {
      o.compression = MegaCodec::kZstd;
      o.min_ratio = 10;
    }
    if (mode == 2) o.chunk_bytes = 100;
    auto r = OpenBytes("sl.mega", WriteTensors(o, {{"x", src}}));
    ASSERT_TRUE(r.ok());
    for (const Box& b : boxes) {
      Tensor want = src;
      for (int d = 0; d < 3; ++d) want = *want.Narrow(d, b.start[d], b.size[d]);
      auto got = Tensor::Empty(DType::kF32, b.size);
      ASSERT_TRUE((*r)->ReadSlice("x", b.start, *got).ok());
      EXPECT_TRUE(TensorBytesEqual(*got, want))
          << "mode " << mode << " start " << ShapeToString(b.start);
    }
    auto got = Tensor::Empty(DType::kF32, {2, 2, 2});
    EXPECT_EQ((*r)->ReadSlice("x", std::vector<int64_t>{5, 0, 0}, *got).code(),
              StatusCode::kOutOfRange);
  }
}

TEST(MegaRoundTripTest, MappedTensorOutlivesReader) {
  TempDir dir;
  Tensor src = MakeTensor(DType::kF64, {9, 9}, 14);
  MegaWriterOptions o;
  o.checksum = MegaChecksumType::kSha256;
  MegaWriter w(o);
  ASSERT_TRUE(w.AddTensor("x", src).ok());
  ASSERT_TRUE(
      w.AddTensor("z", MakeTensor(DType::kF32, {100}, 1, true), {.compression = MegaCodec::kZstd})
          .ok());
  ASSERT_TRUE(w.WriteFile(dir.File("m.mega")).ok());
  Tensor view;
  {
    MegaReaderOptions ro;
    ro.use_mmap = true;
    auto r = MegaReader::OpenFile(dir.File("m.mega"), ro);
    ASSERT_TRUE(r.ok());
    auto m = (*r)->MappedTensor("x");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    view = *m;
    EXPECT_EQ((*r)->MappedTensor("z").status().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(TensorBytesEqual(view, src));
  auto r = MegaReader::OpenFile(dir.File("m.mega"));
  EXPECT_EQ((*r)->MappedTensor("x").status().code(), StatusCode::kFailedPrecondition);
}

TEST(MegaRoundTripTest, ReadTensorsInParallel) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (int i = 0; i < 12; ++i) {
    tensors.push_back({"t" + std::to_string(i), MakeTensor(DType::kF32, {1000 + i * 500}, i)});
  }
  MegaWriter w;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MegaTensorWriteOptions to;  // mix checksums and storage formats
    if (i % 3 == 1) to.checksum = MegaChecksumType::kSha256;
    if (i % 4 == 2) to.chunk_bytes = 3000;
    if (i % 5 == 3) to.checksum = MegaChecksumType::kNone;
    ASSERT_TRUE(w.AddTensor(tensors[i].first, tensors[i].second, to).ok());
  }
  std::string bytes = WriteToMemory(w);
  MegaReaderOptions ro;
  ro.read_block_size = 4096;  // big tensors are split into many block items
  auto r = OpenBytes("par.mega", bytes, ro);
  ASSERT_TRUE(r.ok());
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::vector<MegaReadRequest> reqs;
    for (size_t i = 0; i < tensors.size(); ++i) {
      reqs.push_back({i, *Tensor::Empty(DType::kF32, tensors[i].second.shape())});
    }
    // One strided destination too: every other float of a wider buffer.
    const int64_t n0 = static_cast<int64_t>(tensors[0].second.numel());
    Tensor wide = MakeTensor(DType::kF32, {n0, 2}, 0);
    reqs[0].dst = *Tensor::FromBlobStrided(static_cast<float*>(wide.data()) + 1, DType::kF32, {n0},
                                           {2}, wide.owner());
    ASSERT_FALSE(reqs[0].dst.is_contiguous());
    ASSERT_TRUE((*r)->ReadTensors(reqs, p).ok());
    for (size_t i = 0; i < tensors.size(); ++i) {
      EXPECT_TRUE(TensorBytesEqual(reqs[i].dst, tensors[i].second)) << i;
    }
  }
  EXPECT_TRUE((*r)->VerifyAll(&pool).ok());
  // A flipped byte in the middle of a block-split CRC tensor is caught.
  const MegaTensorInfo* t0 = (*r)->Find("t9");
  ASSERT_EQ(t0->checksum_type, MegaChecksumType::kCrc32);
  std::string bad = bytes;
  bad[t0->file_offset + 10000] ^= 4;
  auto rb = OpenBytes("par.mega", bad, ro);
  std::vector<MegaReadRequest> one = {{9, *Tensor::Empty(DType::kF32, t0->shape)}};
  Status st = (*rb)->ReadTensors(one, &pool);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("tensor 't9': CRC32 mismatch"), std::string::npos) << st.ToString();
}

// Verified reads checksum pieces of at most 1 MiB right after each lands, also
// when read_block_size (a ReadTensors item) is larger: a flipped byte at either
// edge of every such piece, in every item, is caught by ReadTensors (pool and
// caller thread) and ReadTensor; the unflipped file reads back exactly.
TEST(MegaRoundTripTest, VerifiedReadsCatchAFlipInEveryPiece) {
  const int64_t n = (5 << 20) / 4 + 1000;  // 5 MiB + 4000 bytes of F32
  Tensor t = MakeTensor(DType::kF32, {n}, 3);
  MegaWriter w;
  ASSERT_TRUE(w.AddTensor("big", t).ok());
  const std::string bytes = WriteToMemory(w);
  MegaReaderOptions ro;
  ro.read_block_size = (5u << 20) / 2;  // items of 2.5 MiB: pieces of 1, 1 and 0.5 MiB
  ThreadPool pool(2);
  auto read_all = [&](const std::string& file) {
    std::vector<Status> out;
    auto r = OpenBytes("flip.mega", file, ro);
    EXPECT_TRUE(r.ok());
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::vector<MegaReadRequest> one = {{0, *Tensor::Empty(DType::kF32, {n})}};
      out.push_back((*r)->ReadTensors(one, p));
      if (out.back().ok()) {
        EXPECT_TRUE(TensorBytesEqual(one[0].dst, t));
      }
    }
    Tensor dst = *Tensor::Empty(DType::kF32, {n});
    out.push_back((*r)->ReadTensor(0, dst));
    if (out.back().ok()) {
      EXPECT_TRUE(TensorBytesEqual(dst, t));
    }
    return out;
  };
  for (const Status& s : read_all(bytes)) EXPECT_TRUE(s.ok()) << s.ToString();
  // A copy: the reader OpenBytes returns dies at the end of the statement.
  const MegaTensorInfo info = (*OpenBytes("flip.mega", bytes, ro))->tensors()[0];
  const uint64_t size = info.logical_nbytes, item = ro.read_block_size, piece = 1u << 20;
  std::vector<uint64_t> flips;
  for (uint64_t a = 0; a < size; a += item) {
    for (uint64_t p = a; p < std::min(a + item, size); p += piece) {
      const uint64_t e = std::min({p + piece, a + item, size});
      flips.push_back(p);
      flips.push_back(e - 1);
    }
  }
  ASSERT_EQ(flips.size(), 14u);  // 3 items of 3, 3 and 1 pieces
  for (uint64_t at : flips) {
    std::string bad = bytes;
    bad[info.file_offset + at] ^= 0x10;
    for (const Status& s : read_all(bad)) {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "flip at " << at << ": " << s.ToString();
      EXPECT_NE(s.message().find("tensor 'big'"), std::string::npos) << s.ToString();
    }
  }
}

TEST(MegaWriterTest, ArgumentErrors) {
  Tensor t = MakeTensor(DType::kF32, {2}, 1);
  {
    MegaWriterOptions o;
    o.alignment = 0;
    MegaWriter w(o);
    ASSERT_TRUE(w.AddTensor("t", t).ok());
    MemoryWritableFile out("a0.mega");
    auto r = w.Finish(out);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("a0.mega"), std::string::npos);
  }
  for (uint64_t bad : {uint64_t{1} << 31, uint64_t{0}}) {
    MegaWriterOptions o;
    o.tensor_alignment = bad;
    MegaWriter w(o);
    ASSERT_TRUE(w.AddTensor("t", t).ok());
    MemoryWritableFile out("ta.mega");
    EXPECT_EQ(w.Finish(out).status().code(), StatusCode::kInvalidArgument);
  }
  MegaWriter w;
  ASSERT_TRUE(w.AddTensor("t", t).ok());
  EXPECT_EQ(w.AddTensor("t", t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("", t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("u", Tensor()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("\xFF", t).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.AddMetadata("k", MetaValue::U8(1)).ok());
  EXPECT_EQ(w.AddMetadata("k", MetaValue::U8(1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddMetadata("general.architecture", MetaValue::String("x")).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddMetadata("mega.chunk_directory.count", MetaValue::U32(1)).code(),
            StatusCode::kInvalidArgument);
  MegaWriterOptions bare;
  bare.profile = MegaProfile::kBare;
  bare.alignment = 64;
  MegaWriter b(bare);
  EXPECT_EQ(b.AddMetadata("general.alignment", MetaValue::U32(32)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(b.AddMetadata("general.alignment", MetaValue::U64(64)).ok());
  MemoryWritableFile out("ok.mega");
  ASSERT_TRUE(w.Finish(out).ok());
  EXPECT_EQ(w.Finish(out).status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace megackpt::format
