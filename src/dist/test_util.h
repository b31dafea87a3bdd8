// Helpers shared by the dist unit tests (src/dist/dist_test.cc) and the MPI
// tests (tests/dist_mpi_collectives.cc). Header-only; tests only.
#ifndef MEGACKPT_SRC_DIST_TEST_UTIL_H_
#define MEGACKPT_SRC_DIST_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace megackpt::dist_test {

// A deterministic blob of `size` bytes that differs per (rank, size, salt).
inline std::string Blob(int rank, size_t size, int salt = 0) {
  std::string s(size, '\0');
  uint32_t x = 0x9e3779b9u * static_cast<uint32_t>(rank + 1) + 7919u * static_cast<uint32_t>(salt) +
               static_cast<uint32_t>(size);
  for (size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    s[i] = static_cast<char>(x >> 24);
  }
  return s;
}

}  // namespace megackpt::dist_test

#endif  // MEGACKPT_SRC_DIST_TEST_UTIL_H_
