// LocalFileSystem: the POSIX implementation of the filesystem seam.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "fs/background_free.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::fs {

Result<std::string> FileSystem::ReadWhole(const std::string& path, uint64_t max_size) {
  MEGA_ASSIGN_OR_RETURN(auto file, OpenForRead(path));
  return ReadAll(*file, max_size);
}

Status FileSystem::RemoveDirectory(const std::string& dir) {
  MEGA_ASSIGN_OR_RETURN(auto children, List(dir));
  if (!children.empty()) {
    return FailedPreconditionError(dir + ": remove folder: it still holds " +
                                   children.front().path);
  }
  return Status::OK();
}

void FileSystem::RemoveGarbage(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) Remove(path).IgnoreError();
}

Status FileSystem::Link(const std::string& existing, const std::string& new_path) {
  return UnimplementedError("link " + existing + " -> " + new_path + ": the " +
                            std::string(scheme()) + " filesystem has no hard links");
}

std::string JoinPath(std::string_view base, std::string_view name) {
  std::string out(base);
  while (!out.empty() && out.back() == '/' && !out.ends_with("://")) out.pop_back();
  while (!name.empty() && name.front() == '/') name.remove_prefix(1);
  if (out.empty()) return std::string(name);
  if (name.empty()) return out;
  out += '/';
  out += name;
  return out;
}

namespace {

class PosixFileSystem final : public FileSystem {
 public:
  std::string_view scheme() const override { return "local"; }

  FileSystemCapabilities capabilities() const override {
    FileSystemCapabilities c;
    c.positioned_writes = true;
    c.isolated_transactions = false;  // the in-place protocol (transaction.cc)
    c.atomic_rename = true;
    c.hard_links = true;
    c.cached_name_lookups = true;  // the kernel's dentry cache
    return c;
  }

  Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& path) override {
    return OpenLocalFile(path, false);
  }

  Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    std::filesystem::path p(path);
    if (p.has_parent_path()) MEGA_RETURN_IF_ERROR(megackpt::CreateDirectories(p.parent_path()));
    return CreateLocalFile(path);
  }

  Status WriteAtomically(const std::string& path, std::string_view data, bool sync) override {
    std::filesystem::path p(path);
    if (p.has_parent_path()) MEGA_RETURN_IF_ERROR(megackpt::CreateDirectories(p.parent_path()));
    // The file replaced (a commit record) is freed on the background thread.
    return internal::ReplaceFreeingInBackground(
        path, [&] { return WriteLocalFileAtomically(path, data, sync); });
  }

  Result<bool> Exists(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return ErrnoToStatus(path + ": stat", errno);
  }

  Result<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return ErrnoToStatus(path + ": stat", errno);
    return FileInfo{path, static_cast<uint64_t>(st.st_size), S_ISDIR(st.st_mode)};
  }

  Result<std::vector<FileInfo>> List(const std::string& dir) override {
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    if (ec) return ErrnoToStatus(dir + ": list", ec.value());
    std::vector<FileInfo> out;
    for (const auto& e : it) {
      FileInfo info;
      info.path = e.path().string();
      info.is_directory = e.is_directory(ec);
      if (!info.is_directory) {
        auto sz = e.file_size(ec);
        info.size = ec ? 0 : sz;
      }
      out.push_back(std::move(info));
    }
    std::sort(out.begin(), out.end(),
              [](const FileInfo& a, const FileInfo& b) { return a.path < b.path; });
    return out;
  }

  Status Remove(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return ErrnoToStatus(path + ": remove", errno);
    return Status::OK();
  }

  void RemoveGarbage(const std::vector<std::string>& paths) override {
    internal::UnlinkFreeingInBackground(paths);
  }

  Status RemoveDirectory(const std::string& dir) override {
    if (rmdir(dir.c_str()) != 0) {
      if (errno == ENOTEMPTY || errno == EEXIST) {
        return FailedPreconditionError(dir + ": remove folder: not empty");
      }
      return ErrnoToStatus(dir + ": remove folder", errno);
    }
    return Status::OK();
  }

  Status Link(const std::string& existing, const std::string& new_path) override {
    if (link(existing.c_str(), new_path.c_str()) != 0) {
      return ErrnoToStatus("link " + existing + " -> " + new_path, errno);
    }
    return Status::OK();
  }

  Status CreateDirectories(const std::string& dir) override {
    return megackpt::CreateDirectories(dir);
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoToStatus("rename " + from + " -> " + to, errno);
    }
    return Status::OK();
  }

  Status SyncDirectory(const std::string& dir) override { return megackpt::SyncDirectory(dir); }
};

}  // namespace

std::shared_ptr<FileSystem> LocalFileSystem() {
  static std::shared_ptr<FileSystem> fs = std::make_shared<PosixFileSystem>();
  return fs;
}

void FinishBackgroundFrees() { internal::FinishBackgroundFreesNow(); }

}  // namespace megackpt::fs
