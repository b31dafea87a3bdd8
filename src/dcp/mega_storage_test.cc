// Unit tests of the MEGA storage backend internals: shard entries codec and
// file naming. (The shard writer is format::MegaEncoder: src/format/mega_encoder_test.cc.)
#include "megackpt/dcp/mega_storage.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "dcp/mega_storage_shard.h"
#include "megackpt/core/file.h"
#include "megackpt/format/mega.h"

namespace megackpt::dcp::mega_storage {
namespace {

namespace stdfs = std::filesystem;

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
                          "{\"w\": {\"kind\": \"tensor\", \"dtype\": \"F99\", \"global_shape\": "
                          "[1], \"offsets\": [0]}}",
                          "{\"w\": {\"kind\": \"tensor\", \"dtype\": \"F32\", \"global_shape\": "
                          "[1, 2], \"offsets\": [0]}}",
                          "{\"w\": {\"kind\": \"tensor\", \"dtype\": \"F32\", \"global_shape\": "
                          "[-1], \"offsets\": [0]}}"}) {
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
  EXPECT_EQ(ShardFileName(".mega", 1, 1, "0123456789ab", 2),
            "model-rank2-0123456789ab-00001-of-00001.mega");
  for (std::string n :
       {"model.mega", "model-00002-of-00012.mega", "model-00001-of-00003.safetensors",
        "model-0123456789ab.mega", "model-0123456789ab-00003-of-00004.mega"}) {
    int tag = 7;
    EXPECT_TRUE(IsShardFileName(n, &tag)) << n;
    EXPECT_EQ(tag, -1) << n;
  }
  int tag = -1;
  EXPECT_TRUE(IsShardFileName("model-rank2-0123456789ab-00001-of-00001.mega", &tag));
  EXPECT_EQ(tag, 2);
  for (std::string n : {"model.mega.index.json", ".metadata", "other.mega", "model-1-of-2.mega",
                        "model-00001-of-00002.mega.tmp", "model-XYZ.mega",
                        "model.safetensors.index.json", "__0_0.distcp"}) {
    EXPECT_FALSE(IsShardFileName(n)) << n;
  }
  EXPECT_NE(NewSaveId(), NewSaveId());
  EXPECT_EQ(NewSaveId().size(), 12u);
}

}  // namespace
}  // namespace megackpt::dcp::mega_storage
