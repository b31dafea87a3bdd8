// Files for tests (header-only; tests only, never linked into a production
// layer): the temp folder every test uses and the in-place byte edit the
// corruption tests make.
#ifndef MEGACKPT_SRC_CORE_TEST_FILES_H_
#define MEGACKPT_SRC_CORE_TEST_FILES_H_

#include <stdlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

namespace megackpt::test_util {

// A fresh "<prefix>-XXXXXX" folder under the system temp dir ($TMPDIR, else
// /tmp), removed with its contents at destruction.
class TempDir {
 public:
  // Throws std::runtime_error (a failed test) when the folder cannot be made.
  explicit TempDir(const std::string& prefix = "megackpt-test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
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

}  // namespace megackpt::test_util

#endif  // MEGACKPT_SRC_CORE_TEST_FILES_H_
