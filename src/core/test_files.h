// Files for tests (header-only; tests only, never linked into a production
// layer): the temp folder every test uses, the in-place byte edit the
// corruption tests make, and the page-cache residency direct-I/O tests check.
#ifndef MEGACKPT_SRC_CORE_TEST_FILES_H_
#define MEGACKPT_SRC_CORE_TEST_FILES_H_

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace megackpt::test_util {

// A fresh "<prefix>-XXXXXX" folder under the system temp dir ($TMPDIR, else
// /tmp), removed with its contents at destruction.
class TempDir {
 public:
  // Throws std::runtime_error (a failed test) when the folder cannot be made.
  explicit TempDir(const std::string& prefix = "megackpt-test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The folder itself.
  const std::string& path() const { return path_; }
  // `name` inside the folder.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// XORs the byte at `offset` of `path` with `mask` in place (the file keeps its
// size). Throws std::runtime_error when the byte cannot be read or written.
inline void XorFileByte(const std::string& path, uint64_t offset, uint8_t mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ mask);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
  f.flush();
  if (!f) throw std::runtime_error("cannot edit byte " + std::to_string(offset) + " of " + path);
}

// The fraction of `path`'s pages the page cache holds now (mincore over a
// read-only mapping, which faults nothing in): about 1 right after a buffered
// write, about 0 after a direct-I/O one. 0 for an empty file. Throws
// std::runtime_error when the file cannot be opened, mapped or queried.
inline double PageCacheResidentFraction(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return 0;
  }
  const size_t len = static_cast<size_t>(st.st_size);
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) throw std::runtime_error("mmap " + path + ": " + std::strerror(errno));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((len + page - 1) / page);
  const int rc = ::mincore(m, len, in.data());
  const int err = errno;
  ::munmap(m, len);
  if (rc != 0) throw std::runtime_error("mincore " + path + ": " + std::strerror(err));
  size_t resident = 0;
  for (unsigned char v : in) resident += v & 1;
  return static_cast<double>(resident) / static_cast<double>(in.size());
}

}  // namespace megackpt::test_util

#endif  // MEGACKPT_SRC_CORE_TEST_FILES_H_
