// Unit tests of the MEGA storage backend internals: shard entries codec, file
// naming, and the block CRC tables its shards carry and its loads check. (The shard writer is format::MegaEncoder: src/format/mega_encoder_test.cc.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>

#include "dcp/mega_storage_shard.h"
#include "format/mega_internal.h"
#include "megackpt/core/checksum.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/core/file.h"
#include "megackpt/format/mega.h"

namespace megackpt::dcp::mega_storage {
namespace {

namespace stdfs = std::filesystem;

// The block CRC tables of shard tensors (BlockCrc32s, folded inline for small
// blocks) agree with one core Crc32 per block, for every block size the encoder
// uses (64 B .. 64 KiB), short last blocks and unaligned starts.
TEST(BlockCrcTest, MatchesOneCrc32PerBlock) {
  std::mt19937_64 rng(11);
  std::vector<std::byte> data((256u << 10) + 64);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  // Known answers (zlib.crc32): bytes 0, 1, ..., n-1 as one block, and a
  // short block ("123456789").
  std::vector<std::byte> ramp(128);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<std::byte>(i);
  uint32_t one = 0;
  format::mega_internal::BlockCrc32s(std::span<const std::byte>(ramp), 128, &one);
  EXPECT_EQ(one, 0x24650d57u);
  format::mega_internal::BlockCrc32s(std::span<const std::byte>(ramp).first(64), 64, &one);
  EXPECT_EQ(one, 0x100ece8cu);
  format::mega_internal::BlockCrc32s(AsBytes("123456789"), 64, &one);
  EXPECT_EQ(one, 0xCBF43926u);
  for (uint64_t block : {64u, 128u, 256u, 512u, 1024u, 65536u}) {
    for (size_t start : {0u, 1u, 7u}) {
      for (uint64_t size : {block, 3 * block, 3 * block + 16, 5 * block + 1, uint64_t{100u << 10}}) {
        std::span<const std::byte> bytes(data.data() + start, size);
        std::vector<uint32_t> got((size + block - 1) / block + 1, 0xdeadbeef);
        format::mega_internal::BlockCrc32s(bytes, block, got.data());
        for (size_t j = 0; j * block < size; ++j) {
          const uint64_t len = std::min<uint64_t>(block, size - j * block);
          ASSERT_EQ(got[j], Crc32(bytes.subspan(j * block, len)))
              << "block " << block << " start " << start << " size " << size << " entry " << j;
        }
        EXPECT_EQ(got.back(), 0xdeadbeefu) << "wrote past the table";
      }
    }
  }
  // One flipped bit changes exactly its block's entry.
  std::vector<uint32_t> before(8), after(8);
  std::span<const std::byte> bytes(data.data(), 8 * 128);
  format::mega_internal::BlockCrc32s(bytes, 128, before.data());
  data[3 * 128 + 77] ^= std::byte{0x10};
  format::mega_internal::BlockCrc32s(bytes, 128, after.data());
  for (size_t j = 0; j < 8; ++j) EXPECT_EQ(before[j] != after[j], j == 3) << j;
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
