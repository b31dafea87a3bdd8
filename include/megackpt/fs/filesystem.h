// The filesystem seam: every checkpoint reader/writer reaches storage through a
// FileSystem, so the same code saves to a local folder and to `mega://` paths.
//
// Two implementations: LocalFileSystem (POSIX: pread/pwrite, mmap, fsync,
// atomic rename) and the mega:// filesystem (src/fs, backed by the hub: embedded
// in-process store or remote HTTP client). Paths are full paths or URIs; a
// FileSystem is obtained for a path with FileSystemForPath.
//
// Visibility and durability rules every implementation follows:
//  - A file opened with OpenForWrite becomes visible at its path only after
//    Close() returns OK (local: written in place; callers who need atomic
//    replacement write a unique name and Rename, or use WriteAtomically).
//  - For mega:// repo paths, writes are staged and become visible all at once when
//    the Transaction they belong to commits (one hub commit). Buckets have no
//    history: each closed file is visible at once, last writer wins.
#ifndef MEGACKPT_FS_FILESYSTEM_H_
#define MEGACKPT_FS_FILESYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"

namespace megackpt::fs {

struct FileInfo {
  std::string path;  // full path or URI
  uint64_t size = 0;
  bool is_directory = false;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // "local" or "mega".
  virtual std::string_view scheme() const = 0;

  // Opens an existing file for random-access reads (ranges are fetched on
  // demand; nothing is downloaded or read up front). NotFound when missing.
  virtual Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& path) = 0;

  // Creates/truncates a file for writing. Parent folders are created as needed.
  virtual Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) = 0;

  // Writes a whole small file so that readers see the old or the new content,
  // never a mix (local: temp + fsync + rename + folder fsync).
  virtual Status WriteAtomically(const std::string& path, std::string_view data,
                                 bool sync = true) = 0;

  // Reads a whole file. ResourceExhausted above max_size.
  virtual Result<std::string> ReadWhole(const std::string& path,
                                        uint64_t max_size = 1ull << 32);

  virtual Result<bool> Exists(const std::string& path) = 0;
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // Direct children of a folder, sorted by path. NotFound when the folder is missing.
  virtual Result<std::vector<FileInfo>> List(const std::string& dir) = 0;
  // Removes a file. NotFound when missing.
  virtual Status Remove(const std::string& path) = 0;
  // Removes an empty folder. NotFound when missing; FailedPrecondition when it
  // still has children. The default, for stores whose folders exist only
  // through the files below them (mega://), checks that nothing is left.
  virtual Status RemoveDirectory(const std::string& dir);
  // Makes `new_path` a second name of the existing file `existing` (a hard
  // link: the file's data lives until its last name is removed). AlreadyExists
  // when `new_path` exists. Unimplemented (the default) where the store has no
  // links (mega://).
  virtual Status Link(const std::string& existing, const std::string& new_path);
  virtual Status CreateDirectories(const std::string& dir) = 0;
  // Atomically renames (replacing `to`). Unimplemented where the store has no rename.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes creations/renames inside `dir` durable (local: fsync of the folder).
  virtual Status SyncDirectory(const std::string& dir) = 0;
};

// The POSIX filesystem. Shared and stateless.
std::shared_ptr<FileSystem> LocalFileSystem();

// LocalFileSystem for plain paths; the mega:// filesystem for "mega://..." (may
// fail with InvalidArgument naming the bad part of the URI, or FailedPrecondition
// when the mega:// support is not available).
Result<std::shared_ptr<FileSystem>> FileSystemForPath(std::string_view path);

// Joins with exactly one '/': JoinPath("a/", "b") == "a/b"; works for URIs.
std::string JoinPath(std::string_view base, std::string_view name);

}  // namespace megackpt::fs

#endif  // MEGACKPT_FS_FILESYSTEM_H_
