#include "megackpt/core/file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bitset>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "megackpt/core/checksum.h"

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

// Direct I/O's unit: file offsets, lengths and memory addresses of O_DIRECT
// writes are multiples of it (4 KiB satisfies 512 B and 4 KiB devices alike).
constexpr uint64_t kDirectBlock = 4096;
// The bounce buffer of a writer thread whose source is not aligned like the file.
constexpr uint64_t kDirectBounceBytes = kDirectWritePiece;

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<std::byte, FreeDeleter>;

AlignedBytes AllocateAligned(uint64_t n) {
  return AlignedBytes(static_cast<std::byte*>(std::aligned_alloc(kDirectBlock, n)));
}

// The direct-I/O side of a PosixWritableFile (WritableFile::UseDirectIo): whole
// blocks go to the device at once; blocks a write covers only in part wait in
// `partial_` until they are whole (then written) or until Flush. Thread-safe for
// writes of disjoint ranges, as WriteAt.
class DirectBlocks {
 public:
  DirectBlocks(int fd, const std::string& name) : fd_(fd), name_(name) {}

  Status Write(uint64_t offset, std::span<const std::byte> data) {
    const uint64_t end = offset + data.size();
    const uint64_t body_begin = (offset + kDirectBlock - 1) / kDirectBlock * kDirectBlock;
    const uint64_t body_end = end / kDirectBlock * kDirectBlock;
    if (body_begin >= body_end) {  // no whole block: one or two partial ones
      for (uint64_t at = offset; at < end;) {
        const uint64_t block_end = std::min(end, (at / kDirectBlock + 1) * kDirectBlock);
        MEGA_RETURN_IF_ERROR(Merge(at, data.subspan(at - offset, block_end - at)));
        at = block_end;
      }
      return Status::OK();
    }
    if (offset < body_begin) MEGA_RETURN_IF_ERROR(Merge(offset, data.first(body_begin - offset)));
    MEGA_RETURN_IF_ERROR(
        WriteBlocks(body_begin, data.data() + (body_begin - offset), body_end - body_begin));
    if (body_end < end) MEGA_RETURN_IF_ERROR(Merge(body_end, data.subspan(body_end - offset)));
    return Status::OK();
  }

  // Writes every partial block (its missing bytes as they are: zeros, or the
  // file's earlier bytes); they stay pending, for bytes still to come.
  Status Flush() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [block, p] : partial_) {
      MEGA_RETURN_IF_ERROR(
          PwriteFull(fd_, p.bytes.get(), kDirectBlock, block * kDirectBlock, name_));
      NoteWritten(block * kDirectBlock + kDirectBlock);
    }
    return Status::OK();
  }

 private:
  struct Partial {
    AlignedBytes bytes;
    std::bitset<kDirectBlock> covered;  // bytes written into this block so far
  };

  // [offset, offset + n) whole blocks from p (any alignment).
  Status WriteBlocks(uint64_t offset, const std::byte* p, uint64_t n) {
    if (reinterpret_cast<uintptr_t>(p) % kDirectBlock == 0) {
      MEGA_RETURN_IF_ERROR(PwriteFull(fd_, p, n, offset, name_));
    } else {
      thread_local AlignedBytes bounce;
      if (!bounce) bounce = AllocateAligned(kDirectBounceBytes);
      if (!bounce)
        return ResourceExhaustedError(name_ + ": no memory for a direct-I/O bounce buffer");
      for (uint64_t done = 0; done < n;) {
        const uint64_t len = std::min(kDirectBounceBytes, n - done);
        std::memcpy(bounce.get(), p + done, len);
        MEGA_RETURN_IF_ERROR(PwriteFull(fd_, bounce.get(), len, offset + done, name_));
        done += len;
      }
    }
    NoteWritten(offset + n);
    return Status::OK();
  }

  // Bytes inside one block, at file offset `offset`.
  Status Merge(uint64_t offset, std::span<const std::byte> bytes) {
    const uint64_t block = offset / kDirectBlock;
    const uint64_t in = offset % kDirectBlock;
    std::unique_lock<std::mutex> lock(mu_);
    auto it = partial_.find(block);
    if (it == partial_.end()) {
      Partial p{AllocateAligned(kDirectBlock), {}};
      if (!p.bytes) return ResourceExhaustedError(name_ + ": no memory for a direct-I/O block");
      std::memset(p.bytes.get(), 0, kDirectBlock);
      // Below the written end the block may hold earlier bytes (a rewrite, or
      // a block written whole before): start from them. A hole reads as zeros.
      if (block * kDirectBlock < written_end_.load()) {
        MEGA_RETURN_IF_ERROR(
            PreadFull(fd_, p.bytes.get(), kDirectBlock, block * kDirectBlock, name_).status());
      }
      it = partial_.emplace(block, std::move(p)).first;
    }
    std::memcpy(it->second.bytes.get() + in, bytes.data(), bytes.size());
    for (uint64_t i = in; i < in + bytes.size(); ++i) it->second.covered.set(i);
    if (!it->second.covered.all()) return Status::OK();
    Partial whole = std::move(it->second);  // complete: write it now, outside the lock
    partial_.erase(it);
    lock.unlock();
    return WriteBlocks(block * kDirectBlock, whole.bytes.get(), kDirectBlock);
  }

  void NoteWritten(uint64_t end) {
    uint64_t cur = written_end_.load();
    while (end > cur && !written_end_.compare_exchange_weak(cur, end)) {
    }
  }

  const int fd_;
  const std::string& name_;
  std::mutex mu_;
  std::map<uint64_t, Partial> partial_;   // by block index
  std::atomic<uint64_t> written_end_{0};  // end of the blocks written to the file
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
    if (direct_) {
      MEGA_RETURN_IF_ERROR(direct_->Write(offset, data));
    } else {
      MEGA_RETURN_IF_ERROR(PwriteFull(fd_, data.data(), data.size(), offset, name_));
    }
    uint64_t new_end = offset + data.size();
    uint64_t cur = end_.load();
    while (new_end > cur && !end_.compare_exchange_weak(cur, new_end)) {
    }
    return Status::OK();
  }

  Status Sync() override {
    if (fd_ < 0) return FailedPreconditionError(name_ + ": sync after close");
    MEGA_RETURN_IF_ERROR(FinishDirect());
    if (fdatasync(fd_) != 0) return ErrnoToStatus(name_ + ": fdatasync", errno);
    return Status::OK();
  }

  void StartWriteback(uint64_t offset, uint64_t length) override {
    // Linux-only call; any failure (e.g. EINVAL on a file system without it)
    // only means the later fdatasync does all the work.
    if (fd_ >= 0 && !direct_ && length > 0) {
      (void)sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(length),
                            SYNC_FILE_RANGE_WRITE);
    }
  }

  bool UseDirectIo() override {
    if (direct_) return true;
    if (fd_ < 0 || end_.load() != 0) return false;
    const int flags = fcntl(fd_, F_GETFL);
    if (flags < 0 || fcntl(fd_, F_SETFL, flags | O_DIRECT) != 0) return false;
    // Some file systems take the flag and refuse the writes: try one block.
    AlignedBytes zero = AllocateAligned(kDirectBlock);
    bool ok = zero != nullptr;
    if (ok) {
      std::memset(zero.get(), 0, kDirectBlock);
      ok = pwrite(fd_, zero.get(), kDirectBlock, 0) == static_cast<ssize_t>(kDirectBlock);
    }
    if (ftruncate(fd_, 0) != 0) ok = false;
    if (!ok) {
      (void)fcntl(fd_, F_SETFL, flags);
      return false;
    }
    direct_ = std::make_unique<DirectBlocks>(fd_, name_);
    return true;
  }
  bool direct_io() const override { return direct_ != nullptr; }

  Status Close() override {
    if (fd_ < 0) return Status::OK();
    Status s = FinishDirect();
    int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0 && s.ok()) s = ErrnoToStatus(name_ + ": close", errno);
    return s;
  }

 private:
  // Direct I/O: the partial blocks to the file, then its exact size (the last
  // block went out padded).
  Status FinishDirect() {
    if (!direct_) return Status::OK();
    MEGA_RETURN_IF_ERROR(direct_->Flush());
    if (ftruncate(fd_, static_cast<off_t>(end_.load())) != 0) {
      return ErrnoToStatus(name_ + ": ftruncate to " + std::to_string(end_.load()), errno);
    }
    return Status::OK();
  }

  std::string name_;
  int fd_;
  std::atomic<uint64_t> end_{0};
  std::unique_ptr<DirectBlocks> direct_;  // set by UseDirectIo
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
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "not a regular file";
    return InvalidArgumentError(path + ": is " + kind +
                                ", not a regular file; refusing to read it");
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
  // Read access too: UseDirectIo's partial blocks may start from bytes already in the file.
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
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
Result<size_t> PositionedLoop(Call call, size_t n, uint64_t offset, std::string_view what,
                              const char* op, size_t max_call) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = call(done, std::min(n - done, max_call));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(std::string(what) + ": " + op + " at " + std::to_string(offset + done),
                           errno);
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
      [&](size_t done, size_t len) {
        return ::pread(fd, p + done, len, static_cast<off_t>(offset + done));
      },
      n, offset, what, "pread", max_call);
}

Status PwriteFull(int fd, const void* src, size_t n, uint64_t offset, std::string_view what,
                  size_t max_call) {
  const auto* p = static_cast<const std::byte*>(src);
  MEGA_ASSIGN_OR_RETURN(size_t done, PositionedLoop(
                                         [&](size_t done, size_t len) {
                                           return ::pwrite(fd, p + done, len,
                                                           static_cast<off_t>(offset + done));
                                         },
                                         n, offset, what, "pwrite", max_call));
  if (done < n) {
    return IOError(std::string(what) + ": pwrite at " + std::to_string(offset + done) +
                   " wrote nothing");
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
  const std::span<const std::byte> src(static_cast<const std::byte*>(m) + (offset - map_at),
                                       dst.size());
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

namespace {

// PATH.tmp.<pid>.<n>: the temp name of an atomic write of `path`, unique in
// this process.
std::string AtomicTempName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter.fetch_add(1));
}

// Renames the finished temp file `tmp` over `path` (atomic on POSIX file
// systems). On failure the temp file is removed and the error names `path`.
// The one rename of the atomic writes (WriteThroughUnnamedFile,
// AtomicFileWriter::Commit).
//
// Without `sync`, an existing `path` is swapped with the temp file
// (renameat2 RENAME_EXCHANGE, as atomic for readers) and the old file then
// unlinked under the temp name. A plain rename over an existing file makes
// ext4 (auto_da_alloc) start writing the new file's delayed blocks inside the
// rename, and that write queues behind the device's writeback throttle: after
// a no-sync save of 2 GiB the index rename took 43-89 ms (perf: ext4_rename ->
// filemap_fdatawrite -> wbt_wait). The flush is a heuristic for writers that
// do not fsync; a no-sync write promises no durability across a power loss,
// and a durable one has fsynced the temp file already (nothing is flushed).
Status RenameOver(const std::string& tmp, const std::string& path, bool sync) {
  // Only a regular file is swapped: a folder at `path` must fail as rename fails.
  struct stat st {};
  if (!sync && lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    // `tmp` names the old file now. The new content is in place either way;
    // a failed unlink (unlikely: the name was just made) leaves the old bytes
    // under the temp name, like a crashed writer's temp file (a MEGA save's
    // commit removes those of its index and .metadata).
    unlink(tmp.c_str());
    return Status::OK();
  }
  // Durable, no file to swap with (ENOENT), or a file system or kernel
  // without RENAME_EXCHANGE (EINVAL, ENOSYS): the plain rename.
  if (rename(tmp.c_str(), path.c_str()) == 0) return Status::OK();
  const int err = errno;
  unlink(tmp.c_str());
  return ErrnoToStatus(path + ": rename from temp file", err);
}

// WriteLocalFileAtomically's first way: `data` into an unnamed file of the
// folder (O_TMPFILE), made durable when `sync`, then linked in under `path`
// (or, when `path` exists, under a temp name renamed over it). Returns
// nullopt when the unnamed file cannot be made or linked (a file system or
// kernel without O_TMPFILE, no /proc): the caller then takes the named temp
// file. Nothing is left behind on any error: an unnamed file that is never
// linked goes with its descriptor.
std::optional<Status> WriteThroughUnnamedFile(const std::string& path, std::string_view data,
                                              bool sync) {
  // Linking an unnamed file in goes through /proc/self/fd. Without it (a
  // chroot or container with no /proc) the named temp file is the only way,
  // and the data is written once, not first here and again there.
  static const bool proc_fd = access("/proc/self/fd", F_OK) == 0;
  if (!proc_fd) return std::nullopt;
  const std::string dir = ParentOf(path);
  const int fd = open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return std::nullopt;
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  MEGA_RETURN_IF_ERROR(PwriteFull(fd, data.data(), data.size(), 0, path));
  if (sync && fdatasync(fd) != 0) return ErrnoToStatus(path + ": fdatasync", errno);
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  if (linkat(AT_FDCWD, self.c_str(), AT_FDCWD, path.c_str(), AT_SYMLINK_FOLLOW) != 0) {
    if (errno != EEXIST) return std::nullopt;
    const std::string tmp = AtomicTempName(path);
    if (linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      return std::nullopt;
    }
    MEGA_RETURN_IF_ERROR(RenameOver(tmp, path, sync));
  }
  if (sync) MEGA_RETURN_IF_ERROR(SyncDirectory(dir));
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::Create(const std::string& path,
                                                                   bool sync) {
  std::string tmp = AtomicTempName(path);
  MEGA_ASSIGN_OR_RETURN(auto f, CreateLocalFile(tmp));
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(path, std::move(tmp), std::move(f), sync));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!owns_temp_) return;
  if (file_) (void)file_->Close();
  unlink(tmp_.c_str());
}

Status AtomicFileWriter::Commit() {
  Status s = sync_ ? file_->Sync() : Status::OK();
  Status c = file_->Close();
  file_.reset();
  if (s.ok()) s = c;
  MEGA_RETURN_IF_ERROR(s);
  owns_temp_ = false;  // RenameOver removes the temp file if it fails
  MEGA_RETURN_IF_ERROR(RenameOver(tmp_, path_, sync_));
  if (sync_) MEGA_RETURN_IF_ERROR(SyncDirectory(ParentOf(path_)));
  return Status::OK();
}

Status WriteLocalFileAtomically(const std::string& path, std::string_view data, bool sync) {
  if (std::optional<Status> s = WriteThroughUnnamedFile(path, data, sync)) return *s;
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

}  // namespace megackpt::inline core
