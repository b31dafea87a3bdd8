// Helpers shared by the cas unit tests.
#ifndef MEGACKPT_SRC_CAS_TEST_UTIL_H_
#define MEGACKPT_SRC_CAS_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include <gtest/gtest.h>

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

inline std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// A unique temp folder removed at destruction.
class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string tmpl = ::testing::TempDir() + "megackpt-cas-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~ScopedTempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace megackpt::cas::testing

#endif  // MEGACKPT_SRC_CAS_TEST_UTIL_H_
