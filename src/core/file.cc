#include "megackpt/core/file.h"

#include "megackpt/core/checksum.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

namespace megackpt::inline core {

Status RandomAccessFile::ReadExactlyAt(uint64_t offset, std::span<std::byte> dst) const {
  size_t done = 0;
  while (done < dst.size()) {
    MEGA_ASSIGN_OR_RETURN(size_t n, ReadAt(offset + done, dst.subspan(done)));
    if (n == 0) {
      return OutOfRangeError(name() + ": read of [" + std::to_string(offset) + ", " +
                             std::to_string(offset + dst.size()) + ") past end of file (size " +
                             std::to_string(size()) + ")");
    }
    done += n;
  }
  return Status::OK();
}

Result<uint32_t> RandomAccessFile::ReadExactlyAtWithCrc32(uint64_t offset, std::span<std::byte> dst,
                                                          uint32_t crc) const {
  for (uint64_t p = 0; p < dst.size(); p += kCrcHotPiece) {
    std::span<std::byte> piece = dst.subspan(p, std::min<uint64_t>(kCrcHotPiece, dst.size() - p));
    MEGA_RETURN_IF_ERROR(ReadExactlyAt(offset + p, piece));
    crc = Crc32Extend(crc, piece);
  }
  return crc;
}

namespace {

// The mapped reads of OpenLocalFile's files (file.h): the smallest read that
// maps, the window, and the populate speed below which the file goes back to pread.
constexpr uint64_t kMappedReadMin = 4ull << 20;
constexpr uint64_t kMappedReadWindow = 8ull << 20;
constexpr double kMappedPopulateMinBytesPerSecond = 32e9;

double MonotonicSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string name, int fd, uint64_t size, void* map)
      : name_(std::move(name)), fd_(fd), size_(size), map_(map) {}
  ~PosixRandomAccessFile() override {
    if (map_) munmap(map_, size_);
    close(fd_);
  }
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return size_; }
  const std::byte* mapped_data() const override { return static_cast<const std::byte*>(map_); }

  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    return PreadFull(fd_, dst.data(), dst.size(), offset, name_);
  }

  Result<uint32_t> ReadExactlyAtWithCrc32(uint64_t offset, std::span<std::byte> dst,
                                          uint32_t crc) const override {
    uint64_t done = 0;
    if (dst.size() >= kMappedReadMin && offset <= size_ && dst.size() <= size_ - offset) {
      done = CopyMapped(offset, dst, &crc);
    }
    if (done == dst.size()) return crc;
    return RandomAccessFile::ReadExactlyAtWithCrc32(offset + done, dst.subspan(done), crc);
  }

 private:
  // Copies a prefix of [offset, offset + dst.size()) into dst one mapped
  // window at a time (CopyMappedRange), extending *crc over it; returns the
  // bytes done (all, or less where a window could not be mapped or populated,
  // or the file went back to pread). REQUIRES: the range lies inside the file.
  uint64_t CopyMapped(uint64_t offset, std::span<std::byte> dst, uint32_t* crc) const {
    uint64_t done = 0;
    while (done < dst.size() && !prefer_pread_.load(std::memory_order_relaxed)) {
      const uint64_t n = std::min<uint64_t>(kMappedReadWindow, dst.size() - done);
      double populate = 0;
      Status s = CopyMappedRange(fd_, offset + done, dst.subspan(done, n), name_, crc, &populate);
      if (!s.ok()) {  // unreadable (pread reports it), or not mappable here
        if (s.code() == StatusCode::kInvalidArgument) {
          prefer_pread_.store(true, std::memory_order_relaxed);
        }
        break;
      }
      done += n;
      // Judged on whole windows only: a short one is mostly the calls' fixed cost.
      if (n == kMappedReadWindow &&
          populate > static_cast<double>(n) / kMappedPopulateMinBytesPerSecond) {
        prefer_pread_.store(true, std::memory_order_relaxed);
      }
    }
    return done;
  }

  std::string name_;
  int fd_;
  uint64_t size_;
  void* map_;
  // Set when mapping costs more than pread on this file's pages (file.h).
  mutable std::atomic<bool> prefer_pread_{false};
};

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string name, int fd) : name_(std::move(name)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) close(fd_);
  }
  const std::string& name() const override { return name_; }
  bool supports_write_at() const override { return true; }
  uint64_t size() const override { return end_.load(); }

  Status Append(std::span<const std::byte> data) override {
    uint64_t off = end_.load();
    return WriteAt(off, data);
  }

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    if (fd_ < 0) return FailedPreconditionError(name_ + ": write after close");
    MEGA_RETURN_IF_ERROR(PwriteFull(fd_, data.data(), data.size(), offset, name_));
    uint64_t new_end = offset + data.size();
    uint64_t cur = end_.load();
    while (new_end > cur && !end_.compare_exchange_weak(cur, new_end)) {
    }
    return Status::OK();
  }

  Status Sync() override {
    if (fd_ < 0) return FailedPreconditionError(name_ + ": sync after close");
    if (fdatasync(fd_) != 0) return ErrnoToStatus(name_ + ": fdatasync", errno);
    return Status::OK();
  }

  void StartWriteback(uint64_t offset, uint64_t length) override {
    // Linux-only call; any failure (e.g. EINVAL on a file system without it)
    // only means the later fdatasync does all the work.
    if (fd_ >= 0 && length > 0) {
      (void)sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                            SYNC_FILE_RANGE_WRITE);
    }
  }

  Status Close() override {
    if (fd_ < 0) return Status::OK();
    int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) return ErrnoToStatus(name_ + ": close", errno);
    return Status::OK();
  }

 private:
  std::string name_;
  int fd_;
  std::atomic<uint64_t> end_{0};
};

}  // namespace

Result<std::unique_ptr<RandomAccessFile>> OpenLocalFile(const std::string& path, bool map) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer
  // (forever, for a FIFO planted in a checkpoint folder). It is cleared again
  // once fstat has shown a regular file.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoToStatus(path + ": open", errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(path + ": fstat", err);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return InvalidArgumentError(path + ": is a directory");
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    const char* kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    return InvalidArgumentError(path + ": is " + kind + ", not a regular file; refusing to read it");
  }
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    int err = errno;
    close(fd);
    return ErrnoToStatus(path + ": fcntl", err);
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  void* m = nullptr;
  if (map && size > 0) {
    m = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      close(fd);
      return ErrnoToStatus(path + ": mmap", err);
    }
  }
  return std::unique_ptr<RandomAccessFile>(new PosixRandomAccessFile(path, fd, size, m));
}

Result<std::unique_ptr<WritableFile>> CreateLocalFile(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(path + ": create", errno);
  return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
}

Result<std::string> ReadAll(const RandomAccessFile& file, uint64_t max_size) {
  if (file.size() > max_size) {
    return ResourceExhaustedError(file.name() + ": file of " + std::to_string(file.size()) +
                                  " bytes exceeds limit " + std::to_string(max_size));
  }
  std::string out(file.size(), '\0');
  MEGA_RETURN_IF_ERROR(
      file.ReadExactlyAt(0, std::as_writable_bytes(std::span<char>(out.data(), out.size()))));
  return out;
}

Result<std::string> ReadLocalFile(const std::string& path, uint64_t max_size) {
  MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(path, false));
  return ReadAll(*file, max_size);
}

namespace {

// The loop of PreadFull / PwriteFull: `call(done, len)` is one pread/pwrite of
// len bytes at offset + done; stops at n bytes or a 0 return (end of file).
template <typename Call>
Result<size_t> PositionedLoop(Call call, size_t n, uint64_t offset, std::string_view what, const char* op,
                              size_t max_call) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = call(done, std::min(n - done, max_call));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(std::string(what) + ": " + op + " at " + std::to_string(offset + done), errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

}  // namespace

Result<size_t> PreadFull(int fd, void* dst, size_t n, uint64_t offset, std::string_view what,
                         size_t max_call) {
  auto* p = static_cast<std::byte*>(dst);
  return PositionedLoop(
      [&](size_t done, size_t len) { return ::pread(fd, p + done, len, static_cast<off_t>(offset + done)); }, n,
      offset, what, "pread", max_call);
}

Status PwriteFull(int fd, const void* src, size_t n, uint64_t offset, std::string_view what,
                  size_t max_call) {
  const auto* p = static_cast<const std::byte*>(src);
  MEGA_ASSIGN_OR_RETURN(
      size_t done,
      PositionedLoop(
          [&](size_t done, size_t len) { return ::pwrite(fd, p + done, len, static_cast<off_t>(offset + done)); },
          n, offset, what, "pwrite", max_call));
  if (done < n) {
    return IOError(std::string(what) + ": pwrite at " + std::to_string(offset + done) + " wrote nothing");
  }
  return Status::OK();
}

Status CopyMappedRange(int fd, uint64_t offset, std::span<std::byte> dst, std::string_view what,
                       uint32_t* crc, double* populate_seconds) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (dst.empty()) return Status::OK();
  const uint64_t map_at = offset / page * page;
  const size_t map_len = static_cast<size_t>(offset + dst.size() - map_at);
  void* m = mmap(nullptr, map_len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(map_at));
  if (m == MAP_FAILED) return ErrnoToStatus(std::string(what) + ": mmap", errno);
  const double t0 = MonotonicSeconds();
  if (madvise(m, map_len, MADV_POPULATE_READ) != 0) {
    const int err = errno;
    munmap(m, map_len);
    return ErrnoToStatus(std::string(what) + ": madvise(MADV_POPULATE_READ)", err);
  }
  if (populate_seconds) *populate_seconds = MonotonicSeconds() - t0;
  const std::span<const std::byte> src(static_cast<const std::byte*>(m) + (offset - map_at), dst.size());
  if (crc) {
    *crc = CopyWithCrc32(*crc, dst, src);
  } else {
    std::memcpy(dst.data(), src.data(), src.size());
  }
  munmap(m, map_len);
  return Status::OK();
}

Status SyncDirectory(const std::string& dir) {
  int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(dir + ": open directory", errno);
  int rc = fsync(fd);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(dir + ": fsync directory", err);
  return Status::OK();
}

Status CreateDirectories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(dir + ": create directories", ec.value());
  return Status::OK();
}

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path, bool sync) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter.fetch_add(1));
  MEGA_ASSIGN_OR_RETURN(auto f, CreateLocalFile(tmp));
  return std::unique_ptr<AtomicFileWriter>(new AtomicFileWriter(path, std::move(tmp), std::move(f), sync));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (committed_) return;
  if (file_) (void)file_->Close();
  unlink(tmp_.c_str());
}

Status AtomicFileWriter::Commit() {
  Status s = sync_ ? file_->Sync() : Status::OK();
  Status c = file_->Close();
  file_.reset();
  if (s.ok()) s = c;
  MEGA_RETURN_IF_ERROR(s);
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    return ErrnoToStatus(path_ + ": rename from temp file", errno);
  }
  committed_ = true;
  if (sync_) {
    const std::string dir = std::filesystem::path(path_).parent_path().string();
    MEGA_RETURN_IF_ERROR(SyncDirectory(dir.empty() ? "." : dir));
  }
  return Status::OK();
}

Status WriteLocalFileAtomically(const std::string& path, std::string_view data, bool sync) {
  MEGA_ASSIGN_OR_RETURN(auto w, AtomicFileWriter::Create(path, sync));
  MEGA_RETURN_IF_ERROR(w->Append(std::as_bytes(std::span<const char>(data.data(), data.size()))));
  return w->Commit();
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string ParentOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace megackpt::core
