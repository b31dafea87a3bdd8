// Test helpers: a FileSystem wrapper that counts bytes read and injects faults.
// Header-only; used by the dcp unit and integration tests.
#ifndef MEGACKPT_SRC_DCP_TEST_FS_H_
#define MEGACKPT_SRC_DCP_TEST_FS_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "megackpt/core/file.h"  // BaseName
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp::testing {

class InstrumentedFileSystem : public fs::FileSystem {
 public:
  explicit InstrumentedFileSystem(std::shared_ptr<fs::FileSystem> base = fs::LocalFileSystem())
      : base_(std::move(base)) {}

  // Bytes read through OpenForRead files whose path contains `data_marker`
  // (default: data files).
  std::atomic<uint64_t> data_bytes_read{0};
  std::atomic<uint64_t> read_calls{0};
  std::string data_marker = ".distcp";
  // How many distinct threads have read at least `bytes` of data files.
  size_t ThreadsThatRead(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [id, read] : bytes_by_thread_) n += read >= bytes;
    return n;
  }
  // In order: "create NAME" (OpenForWrite), "write NAME" (the first
  // Append/WriteAt of that file), "syncdir NAME" (SyncDirectory), "lookup
  // NAME" (Exists); NAME is the base name.
  std::vector<std::string> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // Fault injection: return an error from the matching operation.
  std::function<bool(const std::string& path)> fail_open_for_write;
  std::function<bool(const std::string& path)> fail_write_atomically;
  // Overrides the base's FileSystemCapabilities::cached_name_lookups.
  std::optional<bool> cached_name_lookups;

  std::string_view scheme() const override { return base_->scheme(); }
  // Transactions run the in-place protocol over this wrapper (BeginTransaction
  // is not forwarded), so the injected faults reach the commit.
  fs::FileSystemCapabilities capabilities() const override {
    fs::FileSystemCapabilities c = base_->capabilities();
    c.isolated_transactions = false;
    if (cached_name_lookups) c.cached_name_lookups = *cached_name_lookups;
    return c;
  }

  Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(auto f, base_->OpenForRead(path));
    if (path.find(data_marker) == std::string::npos) return f;
    return std::unique_ptr<RandomAccessFile>(new CountingFile(std::move(f), this));
  }
  Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    if (fail_open_for_write && fail_open_for_write(path)) {
      return IOError(path + ": injected write failure");
    }
    MEGA_ASSIGN_OR_RETURN(auto f, base_->OpenForWrite(path));
    Record("create", path);
    return std::unique_ptr<WritableFile>(new RecordingFile(std::move(f), this));
  }
  Status WriteAtomically(const std::string& path, std::string_view data, bool sync) override {
    if (fail_write_atomically && fail_write_atomically(path)) {
      return IOError(path + ": injected commit failure");
    }
    return base_->WriteAtomically(path, data, sync);
  }
  Result<bool> Exists(const std::string& path) override {
    Record("lookup", path);
    return base_->Exists(path);
  }
  Result<fs::FileInfo> Stat(const std::string& path) override { return base_->Stat(path); }
  Result<std::vector<fs::FileInfo>> List(const std::string& dir) override {
    return base_->List(dir);
  }
  Status Remove(const std::string& path) override { return base_->Remove(path); }
  Status CreateDirectories(const std::string& dir) override {
    return base_->CreateDirectories(dir);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status SyncDirectory(const std::string& dir) override {
    Record("syncdir", dir);
    return base_->SyncDirectory(dir);
  }

 private:
  void Record(const char* what, const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::string(what) + " " + BaseName(path));
  }

  // Records the first write of a file; forwards everything.
  class RecordingFile : public WritableFile {
   public:
    RecordingFile(std::unique_ptr<WritableFile> f, InstrumentedFileSystem* fs)
        : f_(std::move(f)), fs_(fs) {}
    const std::string& name() const override { return f_->name(); }
    Status Append(std::span<const std::byte> data) override {
      First();
      return f_->Append(data);
    }
    bool supports_write_at() const override { return f_->supports_write_at(); }
    Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
      First();
      return f_->WriteAt(offset, data);
    }
    uint64_t size() const override { return f_->size(); }
    Status Sync() override { return f_->Sync(); }
    void StartWriteback(uint64_t offset, uint64_t length) override {
      f_->StartWriteback(offset, length);
    }
    bool UseDirectIo() override { return f_->UseDirectIo(); }
    bool direct_io() const override { return f_->direct_io(); }
    Status Close() override { return f_->Close(); }

   private:
    void First() {
      if (!wrote_.exchange(true)) fs_->Record("write", f_->name());
    }
    std::unique_ptr<WritableFile> f_;
    InstrumentedFileSystem* fs_;
    std::atomic<bool> wrote_{false};
  };

  class CountingFile : public RandomAccessFile {
   public:
    CountingFile(std::unique_ptr<RandomAccessFile> f, InstrumentedFileSystem* fs)
        : f_(std::move(f)), fs_(fs) {}
    const std::string& name() const override { return f_->name(); }
    uint64_t size() const override { return f_->size(); }
    Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
      auto n = f_->ReadAt(offset, dst);
      if (n.ok()) {
        fs_->data_bytes_read += *n;
        fs_->read_calls += 1;
        std::lock_guard<std::mutex> lock(fs_->mu_);
        fs_->bytes_by_thread_[std::this_thread::get_id()] += *n;
      }
      return n;
    }

   private:
    std::unique_ptr<RandomAccessFile> f_;
    InstrumentedFileSystem* fs_;
  };

  std::shared_ptr<fs::FileSystem> base_;
  std::mutex mu_;
  std::map<std::thread::id, uint64_t> bytes_by_thread_;
  std::vector<std::string> events_;
};

// For InstrumentedFileSystem::Events() of one save into the folder named
// `folder` (base name): every file ending in `suffix` is created before the
// first of them is written, and the folder is synced in between
// (WriteOutNewEntries in checkpoint_folder.h). Empty when so, else what is not.
inline std::string CheckEntriesWrittenOutBeforeData(const std::vector<std::string>& events,
                                                    const std::string& folder,
                                                    const std::string& suffix) {
  auto is = [&](const std::string& e, const std::string& what) {
    return e.rfind(what + " ", 0) == 0 && e.size() >= suffix.size() &&
           e.compare(e.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  long last_create = -1, first_write = -1;
  for (size_t i = 0; i < events.size(); ++i) {
    if (is(events[i], "create")) last_create = static_cast<long>(i);
    if (first_write < 0 && is(events[i], "write")) first_write = static_cast<long>(i);
  }
  std::string log;
  for (const std::string& e : events) log += "\n  " + e;
  if (last_create < 0 || first_write < 0)
    return "no " + suffix + " file was created and written:" + log;
  if (last_create > first_write)
    return "a " + suffix + " file is created after another one is written:" + log;
  for (long i = last_create + 1; i < first_write; ++i) {
    if (events[static_cast<size_t>(i)] == "syncdir " + folder) return "";
  }
  return "the folder " + folder +
         " is not synced between the last create and the first write:" + log;
}

}  // namespace megackpt::dcp::testing

#endif  // MEGACKPT_SRC_DCP_TEST_FS_H_
