// Helpers shared by the MEGA unit tests (header-only; tests only).
#ifndef MEGACKPT_FORMAT_MEGA_TEST_UTIL_H_
#define MEGACKPT_FORMAT_MEGA_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/test_files.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"
#include "megackpt/core/memory_file.h"
#include "megackpt/core/tensor.h"
#include "megackpt/format/mega.h"

namespace megackpt::mega_test {

using ::megackpt::test_util::TempDir;

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
inline Result<std::unique_ptr<format::MegaReader>> OpenBytes(
    const std::string& name, std::string bytes, format::MegaReaderOptions options = {}) {
  return format::MegaReader::Open(NewMemoryFile(name, std::move(bytes), /*mapped=*/false), options);
}

// Adds every tensor of `r` to `w` in directory order, loaded into *keep (which
// must outlive w.Finish); with `same_checksums` each with the checksum type
// `r` stored it with. Fatal failure when a tensor does not load or add.
inline void AddTensorsOf(const format::MegaReader& r, format::MegaWriter& w,
                         std::vector<Tensor>* keep, bool same_checksums = false) {
  for (const format::MegaTensorInfo& t : r.tensors()) {
    auto loaded = r.LoadTensor(t.name);
    ASSERT_TRUE(loaded.ok()) << t.name << ": " << loaded.status().ToString();
    keep->push_back(*loaded);
    format::MegaTensorWriteOptions to;
    if (same_checksums) to.checksum = t.checksum_type;
    ASSERT_TRUE(w.AddTensor(t.name, keep->back(), to).ok()) << t.name;
  }
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
