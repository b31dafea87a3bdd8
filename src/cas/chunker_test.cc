// Known-answer and streaming-invariance tests of the Gear chunker.
#include "megackpt/cas/chunker.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>

namespace megackpt::cas {
namespace {

// The generator described by vectors.json's "splitmix64_note".
std::string SplitMix64Bytes(uint64_t seed, size_t n) {
  std::string out;
  out.reserve(n + 8);
  uint64_t s = seed;
  while (out.size() < n) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((z >> (8 * i)) & 0xFF));
  }
  out.resize(n);
  return out;
}

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

nlohmann::json LoadVectors() {
  std::ifstream in(std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/xet/vectors.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// Builds a test input from a vectors.json key such as
// "splitmix64_seed0_len1000000" or "constant_byte59_len1000000".
std::string InputFor(const std::string& key) {
  size_t len_pos = key.rfind("_len");
  size_t n = std::stoull(key.substr(len_pos + 4));
  if (key.rfind("splitmix64_seed", 0) == 0) {
    uint64_t seed = std::stoull(key.substr(15, len_pos - 15));
    return SplitMix64Bytes(seed, n);
  }
  if (key.rfind("constant_byte", 0) == 0) {
    int b = std::stoi(key.substr(13, len_pos - 13));
    return std::string(n, static_cast<char>(b));
  }
  ADD_FAILURE() << "unknown vector input " << key;
  return {};
}

TEST(ChunkerTest, GearTableMatchesSpecFile) {
  std::ifstream in(std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/xet/gear_table.txt");
  ASSERT_TRUE(in.good());
  std::string tok;
  size_t i = 0;
  while (in >> tok) {
    ASSERT_LT(i, 256u);
    EXPECT_EQ(kGearTable[i], std::stoull(tok, nullptr, 16)) << "entry " << i;
    ++i;
  }
  EXPECT_EQ(i, 256u);
}

TEST(ChunkerTest, BoundariesMatchKnownAnswers) {
  nlohmann::json v = LoadVectors();
  int cases = 0;
  for (const auto& [key, ends] : v["chunk_boundaries_end_offsets"].items()) {
    std::string data = InputFor(key);
    std::vector<uint64_t> want = ends.get<std::vector<uint64_t>>();
    EXPECT_EQ(ChunkBoundaries(Bytes(data)), want) << key;
    ++cases;
  }
  EXPECT_GE(cases, 2);
}

std::vector<uint64_t> StreamedBoundaries(const std::string& data, size_t feed) {
  Chunker c;
  std::vector<uint64_t> ends;
  for (size_t off = 0; off < data.size(); off += feed) {
    c.Feed(Bytes(data).subspan(off, std::min(feed, data.size() - off)), &ends);
  }
  if (auto last = c.Finish()) ends.push_back(*last);
  return ends;
}

TEST(ChunkerTest, StreamingInvariance) {
  std::string data = SplitMix64Bytes(0, 1000000);
  std::vector<uint64_t> want = ChunkBoundaries(Bytes(data));
  for (size_t feed : {size_t{1}, size_t{7}, size_t{1} << 20, size_t{65536}, size_t{8127}}) {
    EXPECT_EQ(StreamedBoundaries(data, feed), want) << "feed size " << feed;
  }
  // Random feed sizes.
  std::mt19937_64 rng(7);
  Chunker c;
  std::vector<uint64_t> ends;
  for (size_t off = 0; off < data.size();) {
    size_t n = std::min<size_t>(rng() % 300000, data.size() - off);
    c.Feed(Bytes(data).subspan(off, n), &ends);
    off += n;
  }
  if (auto last = c.Finish()) ends.push_back(*last);
  EXPECT_EQ(ends, want);
}

// Without the skip-ahead, hashing every byte from the chunk start, the same
// boundaries come out (the skip is an optimisation only).
TEST(ChunkerTest, SkipAheadEqualsFullHashing) {
  std::string data = SplitMix64Bytes(42, 3 << 20);
  std::vector<uint64_t> slow;
  uint64_t h = 0, start = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    h = (h << 1) + kGearTable[static_cast<uint8_t>(data[i])];
    uint64_t size = i + 1 - start;
    if (size < kMinChunkSize) continue;
    if (size >= kMaxChunkSize || (h & kChunkMask) == 0) {
      slow.push_back(i + 1);
      start = i + 1;
      h = 0;
    }
  }
  if (start < data.size()) slow.push_back(data.size());
  EXPECT_EQ(ChunkBoundaries(Bytes(data)), slow);
}

TEST(ChunkerTest, SizesRespectLimits) {
  std::string data = SplitMix64Bytes(3, 8 << 20);
  auto ends = ChunkBoundaries(Bytes(data));
  uint64_t prev = 0;
  for (size_t i = 0; i < ends.size(); ++i) {
    uint64_t size = ends[i] - prev;
    EXPECT_LE(size, kMaxChunkSize);
    if (i + 1 < ends.size()) {
      EXPECT_GE(size, kMinChunkSize);
    }
    prev = ends[i];
  }
  EXPECT_EQ(prev, data.size());
  // Mean chunk size near the target (min 8 KiB + geometric tail of 64 KiB).
  double mean = static_cast<double>(data.size()) / ends.size();
  EXPECT_GT(mean, 40000);
  EXPECT_LT(mean, 100000);
}

TEST(ChunkerTest, SmallAndEmptyInputs) {
  EXPECT_TRUE(ChunkBoundaries({}).empty());
  std::string small(100, 'a');
  EXPECT_EQ(ChunkBoundaries(Bytes(small)), std::vector<uint64_t>{100});
  Chunker c;
  EXPECT_FALSE(c.Finish().has_value());
}

TEST(ChunkerTest, FindChunkLength) {
  std::string data = SplitMix64Bytes(0, 1000000);
  auto ends = ChunkBoundaries(Bytes(data));
  EXPECT_EQ(FindChunkLength(Bytes(data), false), ends[0]);
  EXPECT_EQ(FindChunkLength(Bytes(data).first(1000), false), 0u);
  EXPECT_EQ(FindChunkLength(Bytes(data).first(1000), true), 1000u);
  std::string constant(300000, 'x');
  EXPECT_EQ(FindChunkLength(Bytes(constant), false), kMaxChunkSize);
}

// Inserting bytes early in a stream only changes the chunks near the edit
// (the property dedup relies on).
TEST(ChunkerTest, EditsAreLocal) {
  std::string data = SplitMix64Bytes(9, 4 << 20);
  std::string edited = data;
  edited.insert(1 << 20, "hello world");
  auto a = ChunkBoundaries(Bytes(data));
  auto b = ChunkBoundaries(Bytes(edited));
  size_t shared = 0;
  std::set<uint64_t> bs(b.begin(), b.end());
  for (uint64_t e : a) {
    if (e > (1 << 20) + 200000 && bs.count(e + 11)) ++shared;
  }
  size_t after = 0;
  for (uint64_t e : a) after += e > (1 << 20) + 200000;
  EXPECT_GE(shared + 1, after);
}

}  // namespace
}  // namespace megackpt::cas
