// Typed metadata values, the metadata codec and the byte-level helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "format/mega_internal.h"
#include "format/mega_test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {
namespace {

using mega_internal::ByteSource;
using mega_internal::ByteWriter;

MetaValue Arr(MetaType t, std::vector<MetaValue> v) {
  auto a = MetaValue::Array(t, std::move(v));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return *a;
}

// Every value type with edge values.
std::vector<std::pair<std::string, MetaValue>> AllValues() {
  return {
      {"u8", MetaValue::U8(255)},
      {"i8", MetaValue::I8(-128)},
      {"u16", MetaValue::U16(65535)},
      {"i16", MetaValue::I16(-32768)},
      {"u32", MetaValue::U32(4294967295u)},
      {"i32", MetaValue::I32(std::numeric_limits<int32_t>::min())},
      {"u64", MetaValue::U64(std::numeric_limits<uint64_t>::max())},
      {"i64", MetaValue::I64(std::numeric_limits<int64_t>::min())},
      {"f32", MetaValue::F32(-1.5f)},
      {"f64", MetaValue::F64(3.141592653589793)},
      {"f64.nan", MetaValue::F64(std::nan(""))},
      {"bool.t", MetaValue::Bool(true)},
      {"bool.f", MetaValue::Bool(false)},
      {"str", MetaValue::String("héllo \"quoted\"")},
      {"str.empty", MetaValue::String("")},
      {"arr.u8", Arr(MetaType::kUint8, {MetaValue::U8(1), MetaValue::U8(2)})},
      {"arr.i8", Arr(MetaType::kInt8, {MetaValue::I8(-1)})},
      {"arr.u16", Arr(MetaType::kUint16, {MetaValue::U16(7)})},
      {"arr.i16", Arr(MetaType::kInt16, {MetaValue::I16(-7), MetaValue::I16(9)})},
      {"arr.u32", MetaValue::U32Array(std::vector<uint32_t>{1, 2, 3})},
      {"arr.i32", Arr(MetaType::kInt32, {MetaValue::I32(-5)})},
      {"arr.u64", MetaValue::U64Array(std::vector<uint64_t>{1ull << 40})},
      {"arr.i64", MetaValue::I64Array(std::vector<int64_t>{-(1ll << 40), 5})},
      {"arr.f32", Arr(MetaType::kFloat32, {MetaValue::F32(0.25f)})},
      {"arr.f64", MetaValue::F64Array(std::vector<double>{1.0, -2.0})},
      {"arr.bool", Arr(MetaType::kBool, {MetaValue::Bool(true), MetaValue::Bool(false)})},
      {"arr.str", MetaValue::StringArray({"a", "", "ccc"})},
      {"arr.empty", Arr(MetaType::kUint32, {})},
      {"arr.nested", Arr(MetaType::kArray, {MetaValue::U32Array(std::vector<uint32_t>{1}),
                                            MetaValue::StringArray({"x", "y"})})},
  };
}

TEST(MegaMetaTest, EveryValueTypeRoundTripsThroughTheCodec) {
  MegaMetadata md;
  for (auto& [k, v] : AllValues()) ASSERT_TRUE(md.Add(k, v).ok());
  ByteWriter w;
  MetaCodec::EncodeEntries(md, w);
  std::string bytes = w.data();
  ByteSource src("mem", AsBytes(bytes), 0);
  MegaMetadata back;
  ASSERT_TRUE(MetaCodec::DecodeEntries(src, md.size(), "test", &back).ok());
  EXPECT_EQ(src.remaining(), 0u);
  ASSERT_EQ(back.size(), md.size());
  for (size_t i = 0; i < md.size(); ++i) {
    EXPECT_EQ(back.entries()[i].key, md.entries()[i].key);
    EXPECT_EQ(back.entries()[i].value.type(), md.entries()[i].value.type());
    EXPECT_TRUE(back.entries()[i].value == md.entries()[i].value) << md.entries()[i].key;
  }
  // And re-encoding gives the same bytes.
  ByteWriter w2;
  MetaCodec::EncodeEntries(back, w2);
  EXPECT_EQ(w2.data(), bytes);
}

TEST(MegaMetaTest, AccessorsAndTypeChecks) {
  EXPECT_EQ(*MetaValue::I8(-3).AsInt64(), -3);
  EXPECT_FALSE(MetaValue::I8(-3).AsUint64().ok());
  EXPECT_EQ(*MetaValue::U64(1ull << 63).AsUint64(), 1ull << 63);
  EXPECT_FALSE(MetaValue::U64(1ull << 63).AsInt64().ok());
  EXPECT_DOUBLE_EQ(*MetaValue::F32(0.5f).AsDouble(), 0.5);
  EXPECT_EQ(*MetaValue::String("x").AsString(), "x");
  EXPECT_FALSE(MetaValue::U8(1).AsString().ok());
  EXPECT_FALSE(MetaValue::String("1").AsUint64().ok());
  EXPECT_EQ(MetaValue::UInt(5).type(), MetaType::kUint32);
  EXPECT_EQ(MetaValue::UInt(1ull << 32).type(), MetaType::kUint64);
  MetaValue a = MetaValue::I64Array(std::vector<int64_t>{-1, 2});
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(*a.element(0)->AsInt64(), -1);
  EXPECT_FALSE(a.element(2).ok());
  EXPECT_FALSE(MetaValue::Array(MetaType::kUint8, {MetaValue::U16(1)}).ok());
  EXPECT_FALSE(MetaValue::Array(static_cast<MetaType>(13), {}).ok());
  // Same value, different type tag: not equal.
  EXPECT_FALSE(MetaValue::U32(1) == MetaValue::U64(1));
  EXPECT_EQ(MetaValue::StringArray({"a", "b"}).ToJson(), "[\"a\",\"b\"]");
  EXPECT_EQ(MetaValue::F64(std::nan("")).ToJson(), "null");
  EXPECT_EQ(MetaValue::I16(-2).ToJson(), "-2");
}

TEST(MegaMetaTest, NestingDepthIsBounded) {
  MetaValue v = MetaValue::U32Array(std::vector<uint32_t>{1});
  for (int d = 1; d < mega_internal::kMaxArrayDepth; ++d) v = Arr(MetaType::kArray, {v});
  EXPECT_FALSE(MetaValue::Array(MetaType::kArray, {v}).ok());
  // The deepest value allowed decodes; one more level of nesting on disk is refused.
  ByteWriter w;
  MetaCodec::EncodeValue(v, w);
  ByteSource src("mem", AsBytes(w.data()), 0);
  EXPECT_TRUE(MetaCodec::DecodeValue(src, MetaType::kArray, 0).ok());
  ByteWriter deeper;
  deeper.U32(static_cast<uint32_t>(MetaType::kArray));
  deeper.U64(1);
  MetaCodec::EncodeValue(v, deeper);
  ByteSource src2("mem", AsBytes(deeper.data()), 0);
  auto r = MetaCodec::DecodeValue(src2, MetaType::kArray, 0);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
}

TEST(MegaMetaTest, MetadataKeepsOrderAndRejectsDuplicates) {
  MegaMetadata md;
  ASSERT_TRUE(md.Add("b", MetaValue::U8(1)).ok());
  ASSERT_TRUE(md.Add("a", MetaValue::U8(2)).ok());
  EXPECT_EQ(md.Add("b", MetaValue::U8(3)).code(), StatusCode::kInvalidArgument);
  md.Set("b", MetaValue::String("x"));
  md.Set("c", MetaValue::U8(4));
  ASSERT_EQ(md.size(), 3u);
  EXPECT_EQ(md.entries()[0].key, "b");
  EXPECT_EQ(*md.GetString("b"), "x");
  EXPECT_EQ(md.entries()[2].key, "c");
  EXPECT_EQ(md.GetUint64("zz").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(md.GetUint64("b").status().code(), StatusCode::kInvalidArgument);
}

TEST(MegaMetaTest, StructuralKeys) {
  for (const char* k :
       {"general.alignment", "mega.tensor_info.format", "mega.chunk_directory.count",
        "mega.chunk_directory.format", "mega.segment_directory.count",
        "mega.moe.expert_table.count", "mega.moe.n_experts"}) {
    EXPECT_TRUE(IsMegaStructuralKey(k)) << k;
  }
  for (const char* k :
       {"general.architecture", "mega.hash.payload.crc32", "tensorplay.checksum", "signature"}) {
    EXPECT_FALSE(IsMegaStructuralKey(k)) << k;
  }
}

TEST(MegaEncodingTest, Crc32CombineMatchesCrcOfConcatenation) {
  std::string data(100000, '\0');
  mega_test::FillPattern(std::as_writable_bytes(std::span<char>(data.data(), data.size())), 3);
  auto all = AsBytes(data);
  for (size_t split : {0ul, 1ul, 7ul, 4096ul, 65537ul, 99999ul, 100000ul}) {
    uint32_t a = Crc32(all.subspan(0, split));
    uint32_t b = Crc32(all.subspan(split));
    EXPECT_EQ(mega_internal::Crc32Combine(a, b, all.size() - split), Crc32(all)) << split;
  }
  EXPECT_EQ(Crc32(AsBytes("123456789")), 0xCBF43926u);
}

TEST(MegaEncodingTest, ByteShuffleRoundTrips) {
  std::vector<std::byte> plain(24), shuffled(24), back(24);
  for (int i = 0; i < 24; ++i) plain[i] = static_cast<std::byte>(i);
  mega_internal::ByteShuffle(plain.data(), shuffled.data(), 24, 4);
  // Element e byte b lands at b * 6 + e.
  EXPECT_EQ(shuffled[0], std::byte{0});
  EXPECT_EQ(shuffled[1], std::byte{4});
  EXPECT_EQ(shuffled[6], std::byte{1});
  mega_internal::ByteUnshuffle(shuffled.data(), back.data(), 24, 4);
  EXPECT_EQ(back, plain);
}

TEST(MegaEncodingTest, GatherAndScatterStridedBytes) {
  Tensor base = mega_test::MakeTensor(DType::kI16, {4, 6}, 9);
  auto col = base.Narrow(1, 1, 3);  // [4, 3], row stride 6
  ASSERT_TRUE(col.ok());
  auto dense = Tensor::Empty(DType::kI16, {4, 3});
  ASSERT_TRUE(CopyTensor(*col, *dense).ok());
  std::vector<std::byte> buf(24);
  for (uint64_t off : {0ul, 2ul, 6ul, 10ul}) {
    std::vector<std::byte> piece(24 - off);
    mega_internal::GatherBytes(*col, off, piece);
    EXPECT_EQ(0, std::memcmp(piece.data(), dense->Bytes().data() + off, piece.size())) << off;
  }
  Tensor target = mega_test::MakeTensor(DType::kI16, {4, 6}, 1);
  auto tcol = target.Narrow(1, 1, 3);
  mega_internal::ScatterBytes(*tcol, 0, dense->Bytes());
  EXPECT_TRUE(TensorBytesEqual(*tcol, *col));
}

TEST(MegaEncodingTest, PythonJsonQuoting) {
  using mega_internal::PyJsonQuote;
  EXPECT_EQ(PyJsonQuote("layers.0.w"), "\"layers.0.w\"");
  EXPECT_EQ(PyJsonQuote("a\"b\\c\n\t\x01"), "\"a\\\"b\\\\c\\n\\t\\u0001\"");
  EXPECT_EQ(PyJsonQuote("é"), "\"\\u00e9\"");
  EXPECT_EQ(PyJsonQuote("\xF0\x9F\x98\x80"), "\"\\ud83d\\ude00\"");  // U+1F600
  EXPECT_TRUE(mega_internal::IsValidUtf8("héllo"));
  EXPECT_FALSE(mega_internal::IsValidUtf8("\xC0\x80"));      // overlong
  EXPECT_FALSE(mega_internal::IsValidUtf8("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(mega_internal::IsValidUtf8("\xFF"));
}

TEST(MegaEncodingTest, ZstdDecodedSizeBound) {
  EXPECT_EQ(mega_internal::ZstdMaxDecodedSize(0), 128u << 10);
  EXPECT_GE(mega_internal::ZstdMaxDecodedSize(19), 16384u);
  EXPECT_EQ(mega_internal::ZstdMaxDecodedSize(UINT64_MAX), UINT64_MAX);
}

}  // namespace
}  // namespace megackpt::format
