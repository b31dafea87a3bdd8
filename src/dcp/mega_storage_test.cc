// Unit tests of the MEGA storage backend internals: the streaming shard writer
// (byte-identical to MegaWriter), shard entries codec and file naming.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>

#include "dcp/mega_storage_shard.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/core/file.h"
#include "megackpt/format/mega.h"

namespace megackpt::dcp::mega_storage {
namespace {

namespace stdfs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "mega-storage-unit-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    stdfs::remove_all(path_, ec);
  }
  std::string path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

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

format::MegaMetadata UserMetadata() {
  format::MegaMetadata md;
  EXPECT_TRUE(md.Add("tensorplay.dcp.version", format::MetaValue::U32(1)).ok());
  EXPECT_TRUE(md.Add("tensorplay.dcp.entries", format::MetaValue::String("{\"x\": 1}")).ok());
  return md;
}

void ExpectSameBytesAsMegaWriter(format::MegaChecksumType checksum, uint64_t tensor_alignment,
                                 bool reverse_order, int threads) {
  TempDir dir;
  auto tensors = SampleTensors();
  // Reference: MegaWriter, TensorPlay profile.
  format::MegaWriterOptions wo;
  wo.checksum = checksum;
  wo.tensor_alignment = tensor_alignment;
  format::MegaWriter ref(wo);
  const format::MegaMetadata user = UserMetadata();
  for (const format::MetaEntry& e : user.entries()) ASSERT_TRUE(ref.AddMetadata(e.key, e.value).ok());
  for (const auto& c : tensors) ASSERT_TRUE(ref.AddTensor(c.name, c.tensor).ok());
  ASSERT_TRUE(ref.WriteFile(dir.path("ref.mega"), false).ok());

  std::vector<ShardTensorSpec> specs;
  for (const auto& c : tensors) specs.push_back({c.name, c.tensor.dtype(), c.tensor.shape()});
  ShardWriterOptions so;
  so.checksum = checksum;
  so.tensor_alignment = tensor_alignment;
  auto file = CreateLocalFile(dir.path("ours.mega"));
  ASSERT_TRUE(file.ok());
  auto w = ShardFileWriter::Create(std::move(*file), specs, UserMetadata(), so);
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
        if (!(*w)->WriteTensor(order[k], tensors[order[k]].tensor).ok()) ++failures;
      }
    });
  }
  for (auto& t : pool) t.join();
  ASSERT_EQ(failures.load(), 0);
  EXPECT_FALSE((*w)->WriteTensor(0, tensors[0].tensor).ok()) << "second write must be refused";
  ASSERT_TRUE((*w)->Finish(false).ok());
  EXPECT_EQ(ReadAll(dir.path("ours.mega")), ReadAll(dir.path("ref.mega")));
  // And it parses and verifies.
  auto reader = format::MegaReader::OpenFile(dir.path("ours.mega"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->VerifyAll().ok());
}

TEST(ShardFileWriterTest, SameBytesAsMegaWriterCrc32) {
  ExpectSameBytesAsMegaWriter(format::MegaChecksumType::kCrc32, 64, false, 1);
}
TEST(ShardFileWriterTest, SameBytesAsMegaWriterAnyOrderAnyThreads) {
  ExpectSameBytesAsMegaWriter(format::MegaChecksumType::kCrc32, 64, true, 3);
}
TEST(ShardFileWriterTest, SameBytesAsMegaWriterPackedSha256) {
  ExpectSameBytesAsMegaWriter(format::MegaChecksumType::kSha256, 1, true, 2);
}
TEST(ShardFileWriterTest, SameBytesAsMegaWriterNoChecksum) {
  ExpectSameBytesAsMegaWriter(format::MegaChecksumType::kNone, 4096, false, 2);
}

TEST(ShardFileWriterTest, FinishBeforeAllWrittenFails) {
  TempDir dir;
  auto file = CreateLocalFile(dir.path("x.mega"));
  ASSERT_TRUE(file.ok());
  auto w = ShardFileWriter::Create(std::move(*file), {{"a", DType::kF32, {4}}, {"b", DType::kF32, {4}}},
                                   {}, {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->WriteTensor(0, Filled(DType::kF32, {4}, 1)).ok());
  EXPECT_EQ((*w)->Finish(false).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->WriteTensor(1, Filled(DType::kF32, {5}, 1)).code(), StatusCode::kInvalidArgument);
}

TEST(ShardFileWriterTest, RejectsDuplicateNames) {
  TempDir dir;
  auto file = CreateLocalFile(dir.path("x.mega"));
  ASSERT_TRUE(file.ok());
  auto w = ShardFileWriter::Create(std::move(*file), {{"a", DType::kF32, {4}}, {"a", DType::kF32, {4}}},
                                   {}, {});
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
}

TEST(ShardEntriesTest, RoundTrip) {
  std::map<std::string, ShardEntry> in;
  in["w"] = ShardEntry{false, DType::kBF16, {8, 4}, {4, 0}};
  in["opt.blob"] = ShardEntry{true, DType::kU8, {}, {}};
  in["scalar"] = ShardEntry{false, DType::kF32, {}, {}};
  auto out = DecodeShardEntries("f.mega", EncodeShardEntries(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 3u);
  EXPECT_EQ((*out)["w"].global_shape, (Shape{8, 4}));
  EXPECT_EQ((*out)["w"].offsets, (Shape{4, 0}));
  EXPECT_EQ((*out)["w"].dtype, DType::kBF16);
  EXPECT_TRUE((*out)["opt.blob"].is_bytes);
  EXPECT_TRUE((*out)["scalar"].offsets.empty());
}

TEST(ShardEntriesTest, MalformedIsDataLossNamingFile) {
  for (std::string bad : {"", "[]", "{\"w\": 3}", "{\"w\": {\"kind\": \"nope\"}}",
                          "{\"w\": {\"kind\": \"tensor\", \"dtype\": \"F99\", \"global_shape\": [1], \"offsets\": [0]}}",
                          "{\"w\": {\"kind\": \"tensor\", \"dtype\": \"F32\", \"global_shape\": [1, 2], \"offsets\": [0]}}",
                          "{\"w\": {\"kind\": \"tensor\", \"dtype\": \"F32\", \"global_shape\": [-1], \"offsets\": [0]}}"}) {
    auto r = DecodeShardEntries("shard.mega", bad);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << bad;
    EXPECT_NE(r.status().message().find("shard.mega"), std::string::npos) << r.status().ToString();
  }
}

TEST(ObjectPathsTest, RoundTrip) {
  std::map<std::string, ObjectPath> in;
  in["a.b.0"] = {PathKey{std::string("a")}, PathKey{std::string("b")}, PathKey{int64_t{0}}};
  auto out = DecodeObjectPaths("f", EncodeObjectPaths(in));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, in);
}

TEST(ShardNamingTest, NamesAndPattern) {
  EXPECT_EQ(ShardFileName(".mega", 1, 1, ""), "model.mega");
  EXPECT_EQ(ShardFileName(".mega", 2, 12, ""), "model-00002-of-00012.mega");
  EXPECT_EQ(ShardFileName(".safetensors", 1, 3, ""), "model-00001-of-00003.safetensors");
  EXPECT_EQ(ShardFileName(".mega", 1, 1, "0123456789ab"), "model-0123456789ab.mega");
  EXPECT_EQ(ShardFileName(".mega", 3, 4, "0123456789ab"), "model-0123456789ab-00003-of-00004.mega");
  EXPECT_EQ(ShardFileName(".mega", 1, 1, "0123456789ab", 2), "model-rank2-0123456789ab-00001-of-00001.mega");
  for (std::string n : {"model.mega", "model-00002-of-00012.mega", "model-00001-of-00003.safetensors",
                        "model-0123456789ab.mega", "model-0123456789ab-00003-of-00004.mega"}) {
    int tag = 7;
    EXPECT_TRUE(IsShardFileName(n, &tag)) << n;
    EXPECT_EQ(tag, -1) << n;
  }
  int tag = -1;
  EXPECT_TRUE(IsShardFileName("model-rank2-0123456789ab-00001-of-00001.mega", &tag));
  EXPECT_EQ(tag, 2);
  for (std::string n : {"model.mega.index.json", ".metadata", "other.mega", "model-1-of-2.mega",
                        "model-00001-of-00002.mega.tmp", "model-XYZ.mega", "model.safetensors.index.json",
                        "__0_0.distcp"}) {
    EXPECT_FALSE(IsShardFileName(n)) << n;
  }
  EXPECT_NE(NewSaveId(), NewSaveId());
  EXPECT_EQ(NewSaveId().size(), 12u);
}

}  // namespace
}  // namespace megackpt::dcp::mega_storage
