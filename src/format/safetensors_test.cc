#include "megackpt/format/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/test_tensors.h"
#include "format/mega_test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"

namespace megackpt::format {
namespace {

using ::testing::HasSubstr;

using TempFolder = mega_test::TempDir;

// A tensor of `dtype`/`shape` whose bytes are a function of `seed`.
Tensor Filled(DType dtype, Shape shape, int seed) {
  Tensor t = *Tensor::Empty(dtype, std::move(shape));
  auto bytes = t.Bytes();
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((i * 131 + seed * 17 + 7) & 0xff);
  return t;
}

std::string Sha(std::span<const std::byte> b) {
  auto d = Sha256Of(b);
  return ToHex(d);
}

std::string Le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// length + header text + data.
std::string Craft(const std::string& header, const std::string& data = "") {
  return Le64(header.size()) + header + data;
}

std::span<const std::byte> Span(const std::string& s) { return AsBytes(s); }

std::string WriteString(const std::string& path, const std::string& bytes) {
  EXPECT_TRUE(WriteLocalFileAtomically(path, bytes, false).ok());
  return path;
}

std::string ReadString(const std::string& path) { return *ReadLocalFile(path); }

std::vector<std::pair<std::string, Tensor>> EveryDType() {
  auto out = test_util::OneOfEveryDType("t.", {3, 4}, Filled);
  out.emplace_back("scalar", Filled(DType::kF64, {}, 99));
  out.emplace_back("empty", Filled(DType::kF32, {0, 5}, 98));
  out.emplace_back("empty.f4", Filled(DType::kF4, {0}, 97));
  return out;
}

// ---- round trips -------------------------------------------------------------

TEST(SafetensorsTest, RoundTripEveryDTypeScalarAndEmpty) {
  TempFolder dir;
  auto tensors = EveryDType();
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "ünïcode ✓"}};
  const std::string path = dir.File("all.safetensors");
  ASSERT_TRUE(SaveSafetensorsFile(path, tensors, meta).ok());

  for (bool mmap : {true, false}) {
    auto reader = SafetensorsReader::Open(path, {.mmap = mmap});
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_EQ((*reader)->metadata(), meta);
    EXPECT_EQ((*reader)->tensors().size(), tensors.size());
    EXPECT_EQ((*reader)->header().data_offset() % 8, 0u);
    for (const auto& [name, t] : tensors) {
      SCOPED_TRACE(name);
      const SafetensorsTensorInfo* info = (*reader)->Find(name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(info->dtype, t.dtype());
      EXPECT_EQ(info->shape, t.shape());
      EXPECT_EQ(info->nbytes(), t.nbytes());
      // Read into caller memory.
      Tensor dst = *Tensor::Empty(t.dtype(), t.shape(), /*zero=*/true);
      ASSERT_TRUE((*reader)->ReadTensor(name, dst).ok());
      EXPECT_TRUE(TensorBytesEqual(t, dst));
      auto loaded = (*reader)->Load(name);
      ASSERT_TRUE(loaded.ok());
      EXPECT_TRUE(TensorBytesEqual(t, *loaded));
      if (mmap) {
        auto view = (*reader)->View(name);
        ASSERT_TRUE(view.ok()) << view.status().ToString();
        EXPECT_TRUE(TensorBytesEqual(t, *view));
      } else {
        EXPECT_EQ((*reader)->View(name).status().code(), StatusCode::kFailedPrecondition);
      }
    }
  }
}

TEST(SafetensorsTest, ReferenceOrderAlignsEveryTensor) {
  TempFolder dir;
  auto tensors = EveryDType();
  const std::string path = dir.File("order.safetensors");
  ASSERT_TRUE(SaveSafetensorsFile(path, tensors).ok());
  auto reader = *SafetensorsReader::Open(path);
  const auto& ts = reader->tensors();
  for (size_t i = 1; i < ts.size(); ++i) {
    int r0 = SafetensorsDTypeRank(ts[i - 1].dtype), r1 = SafetensorsDTypeRank(ts[i].dtype);
    EXPECT_TRUE(r0 > r1 || (r0 == r1 && ts[i - 1].name < ts[i].name))
        << ts[i - 1].name << " before " << ts[i].name;
  }
  EXPECT_EQ(ts.front().dtype, DType::kU64);
  for (const auto& t : ts) {
    int size = std::max(1, DTypeSize(t.dtype));
    EXPECT_EQ((reader->header().data_offset() + t.data_begin) % size, 0u) << t.name;
  }
  // The header length is padded with spaces to a multiple of 8.
  std::string bytes = ReadString(path);
  uint64_t n = reader->header().header_bytes;
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
}

TEST(SafetensorsTest, AsGivenOrderKeepsCallerOrder) {
  TempFolder dir;
  std::vector<std::pair<std::string, Tensor>> tensors = {{"z", Filled(DType::kU8, {3}, 1)},
                                                         {"a", Filled(DType::kF64, {2}, 2)}};
  const std::string path = dir.File("given.safetensors");
  ASSERT_TRUE(SaveSafetensorsFile(path, tensors, {}, {.order = SafetensorsOrder::kAsGiven}).ok());
  auto reader = *SafetensorsReader::Open(path);
  ASSERT_EQ(reader->tensors().size(), 2u);
  EXPECT_EQ(reader->tensors()[0].name, "z");
  EXPECT_EQ(reader->tensors()[1].name, "a");
  EXPECT_TRUE(TensorBytesEqual(*reader->Load("a"), tensors[1].second));
}

// Known answers: the reference implementation's own serialization test vectors.
TEST(SafetensorsTest, MatchesReferenceSerializationBytes) {
  {
    std::vector<float> v = {0, 1, 2, 3, 4, 5};
    Tensor t = *Tensor::FromBlob(v.data(), DType::kF32, {1, 2, 3});
    TempFolder dir;
    const std::string path = dir.File("attn.safetensors");
    std::vector<std::pair<std::string, Tensor>> ts = {{"attn.0", t}};
    ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
    const std::string header =
        R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
    ASSERT_EQ(header.size(), 64u);  // already a multiple of 8: no padding
    std::string data(reinterpret_cast<const char*>(v.data()), 24);
    EXPECT_EQ(ReadString(path), Craft(header, data));
  }
  {
    std::vector<float> v = {0, 1, 2, 3, 4, 5};
    Tensor t = *Tensor::FromBlob(v.data(), DType::kF32, {1, 1, 2, 3});
    TempFolder dir;
    const std::string path = dir.File("attn0.safetensors");
    std::vector<std::pair<std::string, Tensor>> ts = {{"attn0", t}};
    ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
    std::string header = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
    header += std::string(7, ' ');  // 65 -> 72
    std::string data(reinterpret_cast<const char*>(v.data()), 24);
    EXPECT_EQ(ReadString(path), Craft(header, data));
  }
  {
    TempFolder dir;
    const std::string path = dir.File("empty.safetensors");
    ASSERT_TRUE(SaveSafetensorsFile(path, {}).ok());
    EXPECT_EQ(ReadString(path), Craft("{}      "));
    ASSERT_TRUE(SaveSafetensorsFile(path, {}, {{"framework", "pt"}}).ok());
    EXPECT_EQ(ReadString(path),
              Craft(R"({"__metadata__":{"framework":"pt"}})" + std::string(5, ' ')));
    auto reader = SafetensorsReader::Open(path);
    ASSERT_TRUE(reader.ok());
    EXPECT_TRUE((*reader)->tensors().empty());
  }
}

TEST(SafetensorsTest, ReadRangeReadsExactBytesAndChecksBounds) {
  TempFolder dir;
  Tensor t = Filled(DType::kI32, {10, 10}, 5);
  const std::string path = dir.File("range.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {{"w", t}};
  ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
  auto reader = *SafetensorsReader::Open(path, {.mmap = false});
  std::vector<std::byte> buf(40);
  ASSERT_TRUE(reader->ReadRange("w", 100, buf).ok());
  EXPECT_EQ(std::memcmp(buf.data(), t.Bytes().data() + 100, 40), 0);
  ASSERT_TRUE(reader->ReadRange("w", 360, buf).ok());
  Status s = reader->ReadRange("w", 361, buf);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
  EXPECT_EQ(reader->ReadRange("w", UINT64_MAX, buf).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(reader->ReadRange("nope", 0, buf).code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, ReadIntoStridedDestination) {
  TempFolder dir;
  Tensor t = Filled(DType::kF32, {6, 7}, 3);
  const std::string path = dir.File("strided.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {{"w", t}};
  ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
  auto reader = *SafetensorsReader::Open(path);
  Tensor big = *Tensor::Empty(DType::kF32, {6, 9}, true);
  Tensor dst = *big.Narrow(1, 1, 7);
  ASSERT_FALSE(dst.is_contiguous());
  ASSERT_TRUE(reader->ReadTensor("w", dst).ok());
  EXPECT_TRUE(TensorBytesEqual(t, dst));
  // Columns outside the view stay untouched.
  auto* p = static_cast<float*>(big.data());
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_EQ(p[8], 0.0f);
  // Wrong shape / dtype.
  EXPECT_EQ(reader->ReadTensor("w", *Tensor::Empty(DType::kF32, {7, 6})).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(reader->ReadTensor("w", *Tensor::Empty(DType::kI32, {6, 7})).code(),
            StatusCode::kInvalidArgument);
}

TEST(SafetensorsTest, ReadIntoStridedDestinationLargerThanStaging) {
  // Rows bigger than the 16 MiB staging buffer exercise the row-splitting path.
  TempFolder dir;
  const int64_t cols = (SafetensorsReader::kStagingBytes / 4) + 1000;
  Tensor t = Filled(DType::kF32, {2, cols}, 4);
  const std::string path = dir.File("big.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {{"w", t}};
  ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
  auto reader = *SafetensorsReader::Open(path, {.mmap = false});
  Tensor big = *Tensor::Empty(DType::kF32, {2, cols + 3}, true);
  Tensor dst = *big.Narrow(1, 2, cols);
  ASSERT_TRUE(reader->ReadTensor("w", dst).ok());
  EXPECT_TRUE(TensorBytesEqual(t, dst));
}

// ReadTensors with a pool: a large contiguous destination is read in block
// items spread over the threads; strided and small ones whole; errors name the
// tensor.
TEST(SafetensorsTest, ReadTensorsSplitsLargeTensorsOverThePool) {
  TempFolder dir;
  Tensor big = Filled(DType::kF32, {1000, 37}, 6);  // 148000 bytes: 37 items of 4000
  Tensor small = Filled(DType::kI16, {3, 5}, 7);
  Tensor strided_src = Filled(DType::kU8, {4, 6}, 8);
  const std::string path = dir.File("many.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"big", big}, {"small", small}, {"s", strided_src}};
  ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
  auto reader = *SafetensorsReader::Open(path, {.mmap = false});
  ThreadPool pool(3);
  Tensor big_dst = *Tensor::Empty(DType::kF32, {1000, 37}, true);
  Tensor small_dst = *Tensor::Empty(DType::kI16, {3, 5}, true);
  Tensor wide = *Tensor::Empty(DType::kU8, {4, 9}, true);
  Tensor strided_dst = *wide.Narrow(1, 2, 6);
  std::vector<SafetensorsReadRequest> reqs = {
      {"big", big_dst}, {"small", small_dst}, {"s", strided_dst}};
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    std::memset(big_dst.data(), 0, big_dst.nbytes());
    ASSERT_TRUE(reader->ReadTensors(reqs, p, 4000).ok());
    EXPECT_TRUE(TensorBytesEqual(big, big_dst));
    EXPECT_TRUE(TensorBytesEqual(small, small_dst));
    EXPECT_TRUE(TensorBytesEqual(strided_src, strided_dst));
  }
  // A block that does not divide the tensor: the last item is shorter.
  std::memset(big_dst.data(), 0, big_dst.nbytes());
  ASSERT_TRUE(reader->ReadTensors(std::span(reqs).first(1), &pool, 4096 * 3).ok());
  EXPECT_TRUE(TensorBytesEqual(big, big_dst));
  // Wrong shape and unknown names fail as ReadTensor does.
  std::vector<SafetensorsReadRequest> bad = {{"big", *Tensor::Empty(DType::kF32, {37, 1000})}};
  EXPECT_EQ(reader->ReadTensors(bad, &pool, 4000).code(), StatusCode::kInvalidArgument);
  bad = {{"nope", big_dst}};
  Status s = reader->ReadTensors(bad, &pool, 4000);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("'nope'"));
}

TEST(SafetensorsTest, WritesStridedSourceTensor) {
  TempFolder dir;
  Tensor big = Filled(DType::kI16, {5, 8}, 8);
  Tensor view = *big.Narrow(1, 3, 4);
  ASSERT_FALSE(view.is_contiguous());
  const std::string path = dir.File("strided_src.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {{"v", view}};
  ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
  auto reader = *SafetensorsReader::Open(path);
  EXPECT_TRUE(TensorBytesEqual(*reader->Load("v"), view));
}

TEST(SafetensorsTest, ViewOutlivesReaderAndPointsIntoMapping) {
  TempFolder dir;
  Tensor t = Filled(DType::kU8, {100}, 1);
  const std::string path = dir.File("view.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts = {{"a", t}};
  ASSERT_TRUE(SaveSafetensorsFile(path, ts).ok());
  Tensor view;
  {
    auto reader = *SafetensorsReader::Open(path);
    view = *reader->View("a");
    EXPECT_EQ(static_cast<const std::byte*>(view.data()),
              reader->file()->mapped_data() + reader->header().data_offset());
    EXPECT_EQ(reader->View("b").status().code(), StatusCode::kNotFound);
  }
  EXPECT_TRUE(TensorBytesEqual(view, t));  // the mapping is still alive
}

TEST(SafetensorsTest, StreamingWriterWithAppendData) {
  TempFolder dir;
  const std::string path = dir.File("stream.safetensors");
  Tensor a = Filled(DType::kF32, {4, 4}, 1);
  Tensor b = Filled(DType::kU8, {10}, 2);
  auto out = *CreateLocalFile(path);
  auto w = SafetensorsWriter::Start(
      out.get(), {{"a", DType::kF32, {4, 4}}, {"b", DType::kU8, {10}}, {"c", DType::kU8, {0}}}, {});
  ASSERT_TRUE(w.ok());
  ASSERT_EQ((*w)->layout()[0].name, "a");
  // "a" in two pieces, then "b" through WriteTensor.
  ASSERT_TRUE((*w)->AppendData(a.Bytes().subspan(0, 10)).ok());
  EXPECT_EQ((*w)->Finish().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*w)->AppendData(a.Bytes().subspan(10)).ok());
  EXPECT_EQ((*w)->WriteTensor(a).code(), StatusCode::kInvalidArgument);  // b expected
  ASSERT_TRUE((*w)->WriteTensor(b).ok());
  ASSERT_TRUE((*w)->WriteTensor(*Tensor::Empty(DType::kU8, {0})).ok());
  EXPECT_EQ((*w)->WriteTensor(b).code(), StatusCode::kInvalidArgument);  // nothing left
  EXPECT_EQ((*w)->AppendData(b.Bytes()).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ((*w)->file_size(), out->size());
  ASSERT_TRUE(out->Close().ok());
  auto reader = *SafetensorsReader::Open(path);
  EXPECT_TRUE(TensorBytesEqual(*reader->Load("a"), a));
  EXPECT_TRUE(TensorBytesEqual(*reader->Load("b"), b));
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  TempFolder dir;
  auto out = *CreateLocalFile(dir.File("bad.safetensors"));
  auto check = [&](std::vector<SafetensorsTensorSpec> specs, std::string want,
                   std::map<std::string, std::string> meta = {}) {
    auto w = SafetensorsWriter::Start(out.get(), std::move(specs), meta);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(w.status().message(), HasSubstr(want));
    EXPECT_THAT(w.status().message(), HasSubstr("bad.safetensors"));
  };
  check({{"x", DType::kU8, {1}}, {"x", DType::kU8, {2}}}, "duplicate tensor name 'x'");
  check({{"__metadata__", DType::kU8, {1}}}, "reserved");
  check({{"f4", DType::kF4, {3}}}, "odd element count");
  check({{"neg", DType::kU8, {-1}}}, "'neg'");
  check({{std::string("bad\xff", 4), DType::kU8, {1}}}, "UTF-8");
  check({}, "UTF-8", {{"k", std::string("\xc3", 1)}});
  EXPECT_EQ(out->size(), 0u);  // nothing written on failure
  // Undefined tensor through the convenience API.
  std::vector<std::pair<std::string, Tensor>> ts = {{"u", Tensor()}};
  EXPECT_EQ(WriteSafetensors(out.get(), ts).code(), StatusCode::kInvalidArgument);
  // The sink must be empty: the header goes at offset 0.
  ASSERT_TRUE(out->Append(AsBytes("x")).ok());
  EXPECT_EQ(SafetensorsWriter::Start(out.get(), {{"a", DType::kU8, {1}}}, {}).status().code(),
            StatusCode::kFailedPrecondition);
}

// ---- hostile input: one test per error ---------------------------------------

struct MalformedCase {
  const char* name;
  std::string bytes;
  StatusCode code;
  const char* want;  // substring of the message (besides the file name)
};

void PrintTo(const MalformedCase& c, std::ostream* os) { *os << c.name; }

std::vector<MalformedCase> MalformedCases() {
  const std::string ok_entry = R"("t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})";
  auto one = [](const std::string& entry, const std::string& data) {
    return Craft("{" + entry + "}", data);
  };
  // Unknown entry fields are skipped, but not to any depth.
  std::string deep = R"({"t":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":)" +
                     std::string(200, '[') + std::string(200, ']') + "}}";
  return {
      {"ShorterThanLengthField", std::string("\x05\x00\x00", 3), StatusCode::kDataLoss,
       "shorter than the 8-byte header length"},
      {"HeaderLengthAboveCap", Le64(kSafetensorsMaxHeaderBytes + 1) + "{}",
       StatusCode::kResourceExhausted, "exceeds the 100000000-byte limit"},
      {"HugeLyingHeaderLength", Le64(UINT64_MAX) + "{}", StatusCode::kResourceExhausted, "exceeds"},
      {"HeaderLengthPastEnd", Le64(50) + "{}", StatusCode::kDataLoss, "past the end"},
      {"HeaderNotStartingWithBrace", Craft(" {}"), StatusCode::kDataLoss, "start with '{'"},
      {"EmptyHeader", Craft(""), StatusCode::kDataLoss, "start with '{'"},
      {"InvalidJson", Craft("{\"t\":{\"dtype\":"), StatusCode::kDataLoss, "not valid JSON"},
      {"TrailingGarbage", Craft("{} x"), StatusCode::kDataLoss, "not valid JSON"},
      {"InvalidUtf8", Craft("{\"\xff\":1}"), StatusCode::kDataLoss, "not valid JSON"},
      {"DuplicateTensorName", Craft("{" + ok_entry + "," + ok_entry + "}", "ab"),
       StatusCode::kDataLoss, "duplicate key 't'"},
      {"DuplicateMetadataKey", Craft(R"({"__metadata__":{"a":"1","a":"2"}})"),
       StatusCode::kDataLoss, "duplicate key 'a'"},
      {"DuplicateFieldInEntry",
       one(R"("t":{"dtype":"U8","dtype":"U8","shape":[2],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "duplicate key 'dtype'"},
      {"MetadataNotObject", Craft(R"({"__metadata__":["a"]})"), StatusCode::kDataLoss,
       "\"__metadata__\" is not a JSON object"},
      {"MetadataValueNotString", Craft(R"({"__metadata__":{"k":1}})"), StatusCode::kDataLoss,
       "key 'k' is not a string"},
      {"EntryNotObject", one(R"("t":5)", ""), StatusCode::kDataLoss, "'t': entry is not"},
      {"MissingDtype", one(R"("t":{"shape":[2],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': missing \"dtype\""},
      {"DtypeNotString", one(R"("t":{"dtype":3,"shape":[2],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': \"dtype\" is not a string"},
      {"UnknownDtype",
       one(R"("t":{"dtype":"C64","shape":[2],"data_offsets":[0,16]})", std::string(16, 'x')),
       StatusCode::kDataLoss, "'t': unsupported dtype 'C64'"},
      {"MissingShape", one(R"("t":{"dtype":"U8","data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': missing \"shape\""},
      {"ShapeNotArray", one(R"("t":{"dtype":"U8","shape":2,"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': \"shape\" is not an array"},
      {"NegativeDimension", one(R"("t":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': shape dimension 0"},
      {"FractionalDimension", one(R"("t":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': shape dimension 0"},
      {"DimensionAbove2To63",
       one(R"("t":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': shape dimension 0"},
      {"ShapeOverflow",
       one(R"("t":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': shape [4294967296, 4294967296] overflows"},
      {"ByteSizeOverflow",
       one(R"("t":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': byte size of shape"},
      {"MissingOffsets", one(R"("t":{"dtype":"U8","shape":[2]})", "ab"), StatusCode::kDataLoss,
       "'t': missing \"data_offsets\""},
      {"OffsetsWrongArity", one(R"("t":{"dtype":"U8","shape":[2],"data_offsets":[0,1,2]})", "ab"),
       StatusCode::kDataLoss, "'t': \"data_offsets\" is not an array [begin, end]"},
      {"NegativeOffset", one(R"("t":{"dtype":"U8","shape":[2],"data_offsets":[-1,1]})", "ab"),
       StatusCode::kDataLoss, "'t': \"data_offsets\" are not non-negative integers"},
      {"EndBeforeBegin", one(R"("t":{"dtype":"U8","shape":[0],"data_offsets":[2,0]})", "ab"),
       StatusCode::kDataLoss, "'t': data_offsets [2, 0) end before they begin"},
      {"SizeMismatch", one(R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': data_offsets [0, 2) hold 2 bytes but F32 [2] needs 8"},
      {"F4OddElementCount", one(R"("t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': F4 tensor of shape [3] has an odd element count"},
      {"OffsetsPastDataBuffer", one(R"("t":{"dtype":"U8","shape":[4],"data_offsets":[0,4]})", "ab"),
       StatusCode::kDataLoss, "'t': data_offsets [0, 4) exceed the data buffer of 2 bytes"},
      {"HugeOffsetsPastDataBuffer",
       one(R"("t":{"dtype":"U8","shape":[2],"data_offsets":[18446744073709551614,18446744073709551616]})",
           "ab"),
       StatusCode::kDataLoss, "'t'"},
      {"GapBetweenTensors",
       Craft(
           R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
           "abc"),
       StatusCode::kDataLoss, "'b': data_offsets begin at 2 leaving a gap [1, 2)"},
      {"GapAtStart", one(R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]})", "ab"),
       StatusCode::kDataLoss, "'t': data_offsets begin at 1 leaving a gap [0, 1)"},
      {"OverlappingTensors",
       Craft(
           R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
           "abc"),
       StatusCode::kDataLoss, "'b': data_offsets [1, 3) overlap tensor 'a' ending at 2"},
      {"SameRangeTwice",
       Craft(
           R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
           "ab"),
       StatusCode::kDataLoss, "overlap tensor"},
      {"TrailingBytesNotCovered", one(ok_entry, "abcd"), StatusCode::kDataLoss,
       "data buffer of 4 bytes is not fully covered: tensors end at 2"},
      {"DataWithoutTensors", Craft("{}", "x"), StatusCode::kDataLoss,
       "data buffer of 1 bytes is not fully covered"},
      {"DeeplyNestedJson", Craft(deep), StatusCode::kDataLoss, "nesting deeper than"},
      {"EntryIsArray", one(R"("t":[1,2])", ""), StatusCode::kDataLoss, "'t': entry is not"},
      {"DtypeIsObject", one(R"("t":{"dtype":{},"shape":[2],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': \"dtype\" is not a string"},
      {"NestedShape", one(R"("t":{"dtype":"U8","shape":[[2]],"data_offsets":[0,2]})", "ab"),
       StatusCode::kDataLoss, "'t': shape dimension 0"},
      {"OffsetsTooFew", one(R"("t":{"dtype":"U8","shape":[0],"data_offsets":[0]})", ""),
       StatusCode::kDataLoss, "'t': \"data_offsets\" is not an array [begin, end]"},
      {"OffsetsNotArray", one(R"("t":{"dtype":"U8","shape":[0],"data_offsets":{}})", ""),
       StatusCode::kDataLoss, "'t': \"data_offsets\" is not an array [begin, end]"},
      {"DuplicateMetadataObject", Craft(R"({"__metadata__":{},"__metadata__":{}})"),
       StatusCode::kDataLoss, "duplicate key '__metadata__'"},
      {"MetadataValueIsObject", Craft(R"({"__metadata__":{"k":{"a":"b"}}})"), StatusCode::kDataLoss,
       "key 'k' is not a string"},
  };
}

class SafetensorsMalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(SafetensorsMalformedTest, InMemory) {
  const MalformedCase& c = GetParam();
  auto r = ParseSafetensors("mem.safetensors", Span(c.bytes));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("mem.safetensors"));
  EXPECT_THAT(r.status().message(), HasSubstr(c.want));
}

TEST_P(SafetensorsMalformedTest, FromFileWithAndWithoutMmap) {
  const MalformedCase& c = GetParam();
  TempFolder dir;
  const std::string path = WriteString(dir.File("bad.safetensors"), c.bytes);
  for (bool mmap : {true, false}) {
    auto r = SafetensorsReader::Open(path, {.mmap = mmap});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(path));
    EXPECT_THAT(r.status().message(), HasSubstr(c.want));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsMalformedTest, ::testing::ValuesIn(MalformedCases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SafetensorsTest, AcceptsUnalignedDataAndTrailingSpaces) {
  // 61-byte header: the data buffer starts at file offset 69 (odd).
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  header += std::string(61 - header.size(), ' ');
  float v[2] = {1.5f, -2.0f};
  std::string bytes = Craft(header, std::string(reinterpret_cast<const char*>(v), 8));
  TempFolder dir;
  const std::string path = WriteString(dir.File("unaligned.safetensors"), bytes);
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->header().data_offset(), 69u);
  Tensor t = *(*reader)->Load("w");
  EXPECT_EQ(static_cast<float*>(t.data())[0], 1.5f);
  Tensor view = *(*reader)->View("w");
  float first;
  std::memcpy(&first, view.data(), 4);
  EXPECT_EQ(first, 1.5f);
}

TEST(SafetensorsTest, ToleratesUnknownEntryFieldsAndAnyEntryOrder) {
  std::string header =
      R"({"b":{"shape":[1],"data_offsets":[2,3],"dtype":"U8","extra":{"x":1}},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  auto r = ParseSafetensors("x.safetensors", Span(Craft(header, "abc")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->tensors[0].name, "a");
  EXPECT_EQ(r->tensors[1].name, "b");
}

TEST(SafetensorsTest, ZeroSizeTensorsShareOffsets) {
  std::string header =
      R"({"e1":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"e0":{"dtype":"U8","shape":[0,9],"data_offsets":[0,0]}})";
  auto r = ParseSafetensors("z.safetensors", Span(Craft(header, "ab")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), 3u);
}

// ---- golden files made by an independent writer (tests/testdata/safetensors) --

TEST(SafetensorsGoldenTest, ParsesPythonWrittenFiles) {
  const std::string folder = std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/safetensors/";
  auto expect = nlohmann::json::parse(*ReadLocalFile(folder + "golden.expect.json"));
  ASSERT_EQ(expect.size(), 2u);
  for (auto& [file, want] : expect.items()) {
    SCOPED_TRACE(file);
    for (bool mmap : {true, false}) {
      auto reader = SafetensorsReader::Open(folder + file, {.mmap = mmap});
      ASSERT_TRUE(reader.ok()) << reader.status().ToString();
      EXPECT_EQ((*reader)->header().header_bytes, want["header_bytes"].get<uint64_t>());
      EXPECT_EQ((*reader)->metadata(),
                (want["metadata"].get<std::map<std::string, std::string>>()));
      ASSERT_EQ((*reader)->tensors().size(), want["tensors"].size());
      // The expectation lists tensors in data order, as our reader does.
      for (size_t i = 0; i < want["tensors"].size(); ++i) {
        const auto& w = want["tensors"][i];
        const auto& got = (*reader)->tensors()[i];
        EXPECT_EQ(got.name, w["name"].get<std::string>());
        EXPECT_EQ(DTypeName(got.dtype), w["dtype"].get<std::string>());
        EXPECT_EQ(got.shape, w["shape"].get<Shape>());
        EXPECT_EQ(got.data_begin, w["data_offsets"][0].get<uint64_t>());
        EXPECT_EQ(got.data_end, w["data_offsets"][1].get<uint64_t>());
        Tensor t = *(*reader)->Load(got.name);
        EXPECT_EQ(Sha(t.Bytes()), w["sha256"].get<std::string>()) << got.name;
      }
    }
  }
}

TEST(SafetensorsGoldenTest, RewritingReferenceGoldenReproducesItByteForByte) {
  const std::string folder = std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/safetensors/";
  auto reader = *SafetensorsReader::Open(folder + "reference.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& info : reader->tensors())
    tensors.emplace_back(info.name, *reader->View(info.name));
  // Hand them over in a scrambled order: the reference order is restored.
  std::reverse(tensors.begin(), tensors.end());
  TempFolder dir;
  const std::string path = dir.File("rewritten.safetensors");
  ASSERT_TRUE(SaveSafetensorsFile(path, tensors, reader->metadata()).ok());
  EXPECT_EQ(Sha(AsBytes(ReadString(path))),
            Sha(AsBytes(ReadString(folder + "reference.safetensors"))));
}

// ---- our files read by an independent Python reader ----------------------------

bool PythonHasNumpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

std::string RunCapture(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(SafetensorsInteropTest, IndependentPythonReaderReadsOurFiles) {
  if (!PythonHasNumpy()) GTEST_SKIP() << "/usr/bin/python3 has no numpy";
  const std::string script =
      std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/safetensors/read_safetensors.py";
  TempFolder dir;
  auto tensors = EveryDType();
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"k", "v \"quoted\""}};
  for (auto order : {SafetensorsOrder::kReference, SafetensorsOrder::kAsGiven}) {
    const std::string path = dir.File("ours.safetensors");
    ASSERT_TRUE(SaveSafetensorsFile(path, tensors, meta, {.order = order}).ok());
    int status = 0;
    std::string out = RunCapture("/usr/bin/python3 " + script + " " + path, &status);
    ASSERT_EQ(status, 0) << out;
    auto doc = nlohmann::json::parse(out);
    EXPECT_EQ(doc["metadata"].get<decltype(meta)>(), meta);
    ASSERT_EQ(doc["tensors"].size(), tensors.size());
    for (const auto& [name, t] : tensors) {
      const auto& e = doc["tensors"][name];
      EXPECT_EQ(e["dtype"].get<std::string>(), DTypeName(t.dtype())) << name;
      EXPECT_EQ(e["shape"].get<Shape>(), t.shape()) << name;
      EXPECT_EQ(e["sha256"].get<std::string>(), Sha(t.Bytes())) << name;
    }
  }
  // And the script does reject a broken file (the check can fail).
  const std::string bad = WriteString(dir.File("bad.safetensors"), Craft("{}", "x"));
  int status = 0;
  RunCapture("/usr/bin/python3 " + script + " " + bad + " 2>/dev/null", &status);
  EXPECT_NE(status, 0);
}

}  // namespace
}  // namespace megackpt::format
