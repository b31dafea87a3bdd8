// Helpers shared by the cas unit tests.
#ifndef MEGACKPT_SRC_CAS_TEST_UTIL_H_
#define MEGACKPT_SRC_CAS_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>

#include "core/test_files.h"

namespace megackpt::cas::testing {

// splitmix64 bytes (the generator of spec/xet/vectors.json).
inline std::string RandomBytes(uint64_t seed, size_t n) {
  std::string out(n + 8, '\0');
  uint64_t s = seed;
  for (size_t i = 0; i < n; i += 8) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (int k = 0; k < 8; ++k) out[i + k] = static_cast<char>(z >> (8 * k));
  }
  out.resize(n);
  return out;
}

// Float-like data: `n` bytes of normal float32 values of standard deviation
// `stddev` (compressible with BG4); deterministic in `seed`.
inline std::string FloatBytes(uint32_t seed, size_t n, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, stddev);
  std::string out(n, '\0');
  for (size_t i = 0; i + 4 <= n; i += 4) {
    float f = dist(rng);
    std::memcpy(out.data() + i, &f, 4);
  }
  return out;
}

inline std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// A unique temp folder removed at destruction.
class ScopedTempDir : public test_util::TempDir {
 public:
  ScopedTempDir() : test_util::TempDir("megackpt-cas") {}
};

}  // namespace megackpt::cas::testing

#endif  // MEGACKPT_SRC_CAS_TEST_UTIL_H_
