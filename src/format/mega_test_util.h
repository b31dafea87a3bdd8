// Helpers shared by the MEGA unit tests (header-only; tests only).
#ifndef MEGACKPT_FORMAT_MEGA_TEST_UTIL_H_
#define MEGACKPT_FORMAT_MEGA_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"
#include "megackpt/format/mega.h"
#include "megackpt/core/memory_file.h"
#include "megackpt/core/tensor.h"

namespace megackpt::mega_test {

// A fresh folder under the gtest temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "megatest.XXXXXX";
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Deterministic pseudo-random bytes.
inline void FillPattern(std::span<std::byte> out, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x >> 24);
  }
}

// A contiguous tensor filled with FillPattern(seed) (or a compressible ramp).
inline Tensor MakeTensor(DType dtype, Shape shape, uint64_t seed, bool compressible = false) {
  auto t = Tensor::Empty(dtype, std::move(shape), /*zero=*/true);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  auto bytes = t->Bytes();
  if (compressible) {
    // Slowly varying values: compress well, better still after byte shuffle.
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<std::byte>(((i / 64) * 7 + seed) & 0xFF);
    }
  } else {
    FillPattern(bytes, seed);
  }
  return *t;
}

inline std::string FileBytes(const std::string& path) {
  auto r = ReadLocalFile(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  auto f = CreateLocalFile(path);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(AsBytes(bytes)).ok());
  ASSERT_TRUE((*f)->Close().ok());
}

// Opens `bytes` as an in-memory MEGA file named `name`.
inline Result<std::unique_ptr<format::MegaReader>> OpenBytes(const std::string& name, std::string bytes,
                                                     format::MegaReaderOptions options = {}) {
  return format::MegaReader::Open(NewMemoryFile(name, std::move(bytes), /*mapped=*/false), options);
}

// Writes with `writer` into memory (positioned or sequential sink).
inline std::string WriteToMemory(format::MegaWriter& writer, bool sequential = false) {
  MemoryWritableFile out("mem.mega", !sequential);
  auto r = writer.Finish(out);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return out.contents();
}

}  // namespace megackpt::mega_test

#endif  // MEGACKPT_FORMAT_MEGA_TEST_UTIL_H_
