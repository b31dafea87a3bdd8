// Known-answer tests of the Xet hashes (spec/xet/vectors.json) and BLAKE3.
#include "megackpt/cas/hash.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "megackpt/core/checksum.h"

namespace megackpt::cas {
namespace {

nlohmann::json LoadVectors() {
  std::ifstream in(std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/xet/vectors.json");
  EXPECT_TRUE(in.good()) << "missing tests/testdata/xet/vectors.json";
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

MerkleHash Hex(const std::string& s) {
  auto r = MerkleHash::FromHex(s);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : MerkleHash{};
}

TEST(MerkleHashTest, HexIsFourLittleEndianWords) {
  MerkleHash h;
  for (int i = 0; i < 32; ++i) h.bytes[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(h.ToHex(),
            "0706050403020100"
            "0f0e0d0c0b0a0908"
            "1716151413121110"
            "1f1e1d1c1b1a1918");
  EXPECT_EQ(Hex(h.ToHex()), h);
  EXPECT_EQ(Hex("0706050403020100"
                "0F0E0D0C0B0A0908"
                "1716151413121110"
                "1F1E1D1C1B1A1918"),
            h);
}

TEST(MerkleHashTest, FromHexRejectsBadText) {
  EXPECT_EQ(MerkleHash::FromHex("abc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MerkleHash::FromHex(std::string(63, '0') + "g").status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(MerkleHash::FromHex(std::string(64, '0'))->IsZero());
}

TEST(XetHashTest, MerkleAndFileHashesMatchVectors) {
  nlohmann::json v = LoadVectors();
  ASSERT_TRUE(v.contains("merkle"));
  int cases = 0, file_cases = 0;
  for (const auto& c : v["merkle"]) {
    std::vector<HashAndSize> leaves;
    for (const auto& ch : c["chunks"]) {
      leaves.push_back({Hex(ch[0].get<std::string>()), ch[1].get<uint64_t>()});
    }
    EXPECT_EQ(XorbHash(leaves).ToHex(), c["xorb_hash"].get<std::string>())
        << "with " << leaves.size() << " leaves";
    for (const auto& f : c["file_hashes"]) {
      MerkleHash salt = Hex(f["salt"].get<std::string>());
      EXPECT_EQ(FileHash(leaves, salt).ToHex(), f["file_hash"].get<std::string>())
          << leaves.size() << " leaves, salt " << salt.ToHex();
      ++file_cases;
    }
    ++cases;
  }
  EXPECT_EQ(cases, 6);
  EXPECT_EQ(file_cases, 18);
}

TEST(XetHashTest, EmptyAndSingleLeaf) {
  EXPECT_TRUE(AggregateHashes({}).IsZero());
  EXPECT_TRUE(FileHash({}).IsZero());
  MerkleHash h;
  h.bytes[5] = 7;
  HashAndSize leaf{h, 10};
  EXPECT_EQ(AggregateHashes(std::span(&leaf, 1)), h);
}

// The aggregation of many leaves is deterministic and depends on every leaf
// and every size (a multi-level tree).
TEST(XetHashTest, DeepTreeDependsOnEveryLeaf) {
  std::vector<HashAndSize> leaves;
  for (int i = 0; i < 1000; ++i) {
    std::string s = "leaf" + std::to_string(i);
    leaves.push_back({ChunkHash(AsBytes(s)), static_cast<uint64_t>(i + 1)});
  }
  MerkleHash root = AggregateHashes(leaves);
  EXPECT_EQ(AggregateHashes(leaves), root);
  auto changed = leaves;
  changed[777].size += 1;
  EXPECT_NE(AggregateHashes(changed), root);
  changed = leaves;
  changed[3].hash.bytes[0] ^= 1;
  EXPECT_NE(AggregateHashes(changed), root);
}

// The range verification hash is the keyed hash of the raw concatenated
// chunk hashes (checked against the single-call KeyedHash).
TEST(XetHashTest, RangeVerificationHash) {
  std::vector<MerkleHash> hs;
  std::string raw;
  for (int i = 0; i < 5; ++i) {
    hs.push_back(ChunkHash(AsBytes(std::string(i + 1, 'x'))));
    raw.append(reinterpret_cast<const char*>(hs.back().bytes.data()), 32);
  }
  EXPECT_EQ(RangeVerificationHash(hs), KeyedHash(kVerificationKey, AsBytes(raw)));
  EXPECT_NE(RangeVerificationHash(std::span(hs).first(4)), RangeVerificationHash(hs));
}

TEST(XetHashTest, GlobalDedupEligibility) {
  MerkleHash h;
  EXPECT_TRUE(IsGlobalDedupEligible(h));  // word 3 == 0
  h.bytes[24] = 1;
  EXPECT_FALSE(IsGlobalDedupEligible(h));
  h.bytes[24] = 0;
  h.bytes[25] = 4;  // word 3 = 1024
  EXPECT_TRUE(IsGlobalDedupEligible(h));
}

// BLAKE3's official test vectors (BLAKE3-team/BLAKE3 test_vectors/test_vectors.json;
// Debian's package does not ship the file, so the facts are quoted here): the
// input of length n is the bytes 0, 1, ..., 250, 0, 1, ... and the keyed-hash key
// is the ASCII string "whats the Elvish word for friend". Values are the first
// 32 bytes of each extended output, as plain hex.
std::string Blake3Input(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i % 251);
  return s;
}

std::string PlainHex(const MerkleHash& h) { return ToHex(h.bytes); }

TEST(Blake3Test, OfficialKeyedHashVectors) {
  MerkleHash key;
  const std::string key_text = "whats the Elvish word for friend";
  ASSERT_EQ(key_text.size(), 32u);
  std::memcpy(key.bytes.data(), key_text.data(), 32);
  const std::pair<size_t, const char*> cases[] = {
      {0, "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"},
      {1, "6d7878dfff2f485635d39013278ae14f1454b8c0a3a2d34bc1ab38228a80c95b"},
      {1023, "c951ecdf03288d0fcc96ee3413563d8a6d3589547f2c2fb36d9786470f1b9d6e"},
      {1024, "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4"},
      {1025, "357dc55de0c7e382c900fd6e320acc04146be01db6a8ce7210b7189bd664ea69"},
      {2048, "879cf1fa2ea0e79126cb1063617a05b6ad9d0b696d0d757cf053439f60a99dd1"},
      {3073, "68dede9bef00ba89e43f31a6825f4cf433389fedae75c04ee9f0cf16a427c95a"},
      {4097, "00df940cd36bb9fa7cbbc3556744e0dbc8191401afe70520ba292ee3ca80abbc"},
      {7169, "ed9b1a922c046fdb3d423ae34e143b05ca1bf28b710432857bf738bcedbfa511"},
      {8193, "954a2a75420c8d6547e3ba5b98d963e6fa6491addc8c023189cc519821b4a1f5"},
      {16384, "9e9fc4eb7cf081ea7c47d1807790ed211bfec56aa25bb7037784c13c4b707b0d"},
      {31744, "efa53b389ab67c593dba624d898d0f7353ab99e4ac9d42302ee64cbf9939a419"},
      {102400, "1c35d1a5811083fd7119f5d5d1ba027b4d01c0c6c49fb6ff2cf75393ea5db4a7"},
  };
  for (const auto& [n, want] : cases) {
    EXPECT_EQ(PlainHex(KeyedHash(key, AsBytes(Blake3Input(n)))), want) << "input_len " << n;
  }
}

}  // namespace
}  // namespace megackpt::cas
