// Byte-level file interfaces and their local POSIX implementations.
//
// Formats (MEGA, safetensors, index JSON) and the CAS read and write through
// these interfaces, so the same code serves local files and remote objects
// (the fs layer adapts `mega://` objects to them).
#ifndef MEGACKPT_CORE_FILE_H_
#define MEGACKPT_CORE_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "megackpt/core/checksum.h"  // kCrcWritePiece
#include "megackpt/core/status.h"

namespace megackpt::inline core {

// Random-access reads of an immutable byte sequence. Thread-safe: several
// threads may call ReadAt concurrently.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;

  // A name for error messages (the path or URI).
  virtual const std::string& name() const = 0;

  // Total size in bytes.
  virtual uint64_t size() const = 0;

  // Reads up to dst.size() bytes starting at `offset`; returns the count read,
  // which is short only at end of file. IOError on OS failure.
  virtual Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const = 0;

  // Reads exactly dst.size() bytes or returns OutOfRange naming the file and range.
  Status ReadExactlyAt(uint64_t offset, std::span<std::byte> dst) const;

  // ReadExactlyAt that also returns Crc32Extend(crc, the bytes read): the one
  // read-and-checksum step of the verified readers (fs and MEGA). The default
  // reads kCrcHotPiece pieces and checksums each right after its read, while
  // it is still in cache. Local files (OpenLocalFile) read large ranges through
  // a mapping instead, copying and checksumming in one pass (CopyWithCrc32).
  // Errors as ReadExactlyAt; on error dst holds unspecified bytes.
  virtual Result<uint32_t> ReadExactlyAtWithCrc32(uint64_t offset, std::span<std::byte> dst,
                                                  uint32_t crc = 0) const;

  // The whole file mapped in memory, or nullptr when this file is not mapped.
  // Valid as long as this object lives.
  virtual const std::byte* mapped_data() const { return nullptr; }
};

// A file being written. Not thread-safe unless stated: WriteAt may be called
// from several threads on disjoint ranges when supports_write_at().
class WritableFile {
 public:
  virtual ~WritableFile() = default;

  virtual const std::string& name() const = 0;

  // Appends at the current end (the end = max byte written so far).
  virtual Status Append(std::span<const std::byte> data) = 0;

  // True when WriteAt works (local files); false for sequential sinks such as
  // an upload stream.
  virtual bool supports_write_at() const { return false; }

  // Writes at an absolute offset (may extend the file). Thread-safe for
  // disjoint ranges. Unimplemented when !supports_write_at().
  virtual Status WriteAt(uint64_t offset, std::span<const std::byte> data) {
    (void)offset;
    (void)data;
    return UnimplementedError(name() + ": positioned writes are not supported");
  }

  // Bytes written so far (the current end).
  virtual uint64_t size() const = 0;

  // Makes written data durable (fsync for local files).
  virtual Status Sync() = 0;

  // A hint: start writing bytes [offset, offset + length) back to storage now,
  // without waiting for it, so that a later Sync() has less left to do (local
  // files: sync_file_range(SYNC_FILE_RANGE_WRITE)). Not a durability guarantee;
  // only Sync() is. Errors are not reported: a hint that cannot be taken is
  // dropped. Default: nothing.
  virtual void StartWriteback(uint64_t offset, uint64_t length) {
    (void)offset;
    (void)length;
  }

  // A hint for durable writers, given right after the file is created and
  // before the first write: send the bytes straight to the device with direct
  // I/O (O_DIRECT) instead of through the page cache. Returns true when taken.
  // Worth it where new page-cache pages are slow to come by (a VM whose free
  // memory goes back to the host: docs/benchmarks.md, "Direct-I/O durable
  // writes"); the price is that a read right after the save comes from the
  // device. Local files (CreateLocalFile) take it when the file system accepts
  // O_DIRECT (not tmpfs) and nothing is written yet. Then: whole 4 KiB blocks
  // of a write go to the device at once, from the caller's memory when its
  // address and the file offset agree modulo 4 KiB, else through a per-thread
  // 2 MiB aligned bounce buffer; bytes of blocks a write covers only in part
  // are gathered in memory until their block is whole, and written (padded)
  // at Sync() or Close(), which then set the exact size. So the file holds all
  // its bytes only after Sync() or Close(); StartWriteback does nothing.
  // Default: not taken.
  virtual bool UseDirectIo() { return false; }
  // True once UseDirectIo has been taken.
  virtual bool direct_io() const { return false; }

  // Finishes the file. After Close, only the destructor may be called.
  virtual Status Close() = 0;
};

// The writers' piece on a file that took UseDirectIo (and the size of its
// bounce buffer): each O_DIRECT pwrite waits for the device, so large pieces
// keep the device busy. Equal to the page-cache writes' kCrcWritePiece, which
// is 2 MiB for reasons of the page cache and CPU caches instead.
inline constexpr uint64_t kDirectWritePiece = 2ull << 20;

// The piece size the writers (fs and MEGA) pwrite `file` in, with
// NextWritePiece: kDirectWritePiece with direct I/O, else kCrcWritePiece.
inline uint64_t WritePieceFor(const WritableFile& file) {
  return file.direct_io() ? kDirectWritePiece : kCrcWritePiece;
}

// How often the durable writers (fs and MEGA storage) call
// WritableFile::StartWriteback: once every kWritebackUnit bytes written, so the
// device works on one unit while the next is copied and the final Sync has
// little left. The bench's write + fdatasync ceiling does the same (and tries
// 8 MiB besides).
inline constexpr uint64_t kWritebackUnit = 32ull << 20;

// Opens a local file for reading with pread. With `mmap`, the file is also
// mapped read-only (mapped_data() non-null; empty files are never mapped).
// ReadExactlyAtWithCrc32 of 4 MiB or more maps the range an 8 MiB window at a
// time instead of calling pread: mmap, MADV_POPULATE_READ (a page that
// cannot be read fails the populate, and the
// range then goes through pread, which reports the error; no SIGBUS), one
// fused copy + CRC pass, munmap. On a page cache of large folios (Linux 6.x;
// files written or read ahead in large pieces) that is one pass over the
// bytes at memory speed, against pread's in-kernel copy plus a CRC pass (on
// the bench VM, two threads: 32 vs 23 GB/s; docs/benchmarks.md). Where
// populating a whole window runs slower than 32 GB/s (a page cache of
// 4 KiB pages, or bytes still on disk), page-table set-up costs more than it
// saves, and the file goes back to pread for good. The one hazard a mapping
// adds: another process truncating the file between a window's populate and
// its copy raises SIGBUS (checkpoint files are written once and replaced by
// rename, never truncated in place).
// Only regular files open: a directory, FIFO, socket or device is
// InvalidArgument, and is refused without blocking (the open uses O_NONBLOCK
// until fstat has shown a regular file).
Result<std::unique_ptr<RandomAccessFile>> OpenLocalFile(const std::string& path, bool mmap = false);

// Creates (or truncates) a local file for writing.
Result<std::unique_ptr<WritableFile>> CreateLocalFile(const std::string& path);

// Reads all of `file`. ResourceExhausted when it is larger than `max_size`.
Result<std::string> ReadAll(const RandomAccessFile& file, uint64_t max_size = 1ull << 32);

// Reads a whole local file. `max_size` guards against huge files
// (ResourceExhausted beyond it).
Result<std::string> ReadLocalFile(const std::string& path, uint64_t max_size = 1ull << 32);

// Writes `data` to `path` atomically. Readers see the old or the new content,
// never a mix, and no temp file is left behind on any error. The bytes go to
// an unnamed file of the folder (O_TMPFILE), made durable when `sync`
// (fdatasync), then linked in under `path` (linkat), or when `path` exists,
// under a temp name (PATH.tmp.<pid>.<n>) renamed over it; when `sync`, the
// folder is fsynced last. Where unnamed files are not available (file system,
// kernel, or no /proc), a named temp file takes their place (AtomicFileWriter).
// Why unnamed first: linking a new name reads no folder block when the name's
// absence is in the kernel's name cache, and on ext4 without a journal the
// folder's block may be queued for writeback behind gigabytes of data, which
// made a no-sync checkpoint's commit wait 50-90 ms for it (docs/benchmarks.md,
// "The commit's create waited for the folder's block"); a create or rename of
// a temp name reads it.
// Without `sync`, an existing regular file at `path` is swapped with the temp
// name (renameat2 RENAME_EXCHANGE; a plain rename where the file system or
// kernel lacks it) and then unlinked under it: a rename over a file makes ext4
// (auto_da_alloc) start writing the new file inside the rename, behind the
// writeback of all that was written before (docs/benchmarks.md, "The rename
// over the previous index flushed the new one"). A folder at `path` fails the
// write either way.
Status WriteLocalFileAtomically(const std::string& path, std::string_view data, bool sync = true);

// The streaming form of WriteLocalFileAtomically (the one temp-file + rename
// of the project): bytes appended go to a unique temp file next to `path`
// (PATH.tmp.<pid>.<n>); Commit() fsyncs it (when `sync`), renames it over
// `path` (swaps it in without `sync`, as above) and fsyncs the folder. Destroyed without a
// successful Commit, the temp file is removed and `path` is untouched. Not thread-safe.
class AtomicFileWriter {
 public:
  static Result<std::unique_ptr<AtomicFileWriter>> Create(const std::string& path,
                                                          bool sync = true);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status Append(std::span<const std::byte> data) { return file_->Append(data); }
  // REQUIRES: called at most once. Errors name the path.
  Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, std::unique_ptr<WritableFile> file, bool sync)
      : path_(std::move(path)), tmp_(std::move(tmp)), file_(std::move(file)), sync_(sync) {}
  std::string path_, tmp_;
  std::unique_ptr<WritableFile> file_;
  bool sync_;
  bool owns_temp_ = true;  // false once Commit hands the temp file to RenameOver
};

// Whole-range positioned I/O on a raw descriptor (the one pread/pwrite loop
// of the project): calls of at most `max_call` bytes each, EINTR retried.
// PreadFull returns the bytes read, fewer than n only at end of file;
// PwriteFull writes all n bytes (a pwrite that writes nothing: IOError).
// Errors: the errno's Status with the context "<what>: pread at <offset>"
// ("pwrite at"), the offset being that of the failed call.
inline constexpr size_t kMaxIoCall = size_t{1} << 30;
Result<size_t> PreadFull(int fd, void* dst, size_t n, uint64_t offset, std::string_view what,
                         size_t max_call = kMaxIoCall);
Status PwriteFull(int fd, const void* src, size_t n, uint64_t offset, std::string_view what,
                  size_t max_call = kMaxIoCall);

// Copies file bytes [offset, offset + dst.size()) of `fd` into dst through one
// read-only shared mapping (the one mapped-copy step of the project: the
// mapped reads of OpenLocalFile's files and the bench's mapped warm-read
// ceiling): mmap, MADV_POPULATE_READ, copy, munmap. With `crc` non-null the
// copy is CopyWithCrc32 extending *crc over the bytes, else memcpy. When
// `populate_seconds` is non-null it receives the time the populate took.
// REQUIRES: the range lies inside the file; callers keep it to a window of
// a few MiB (page tables are set up for all of it at once).
// Errors (nothing copied): the errno's Status, "<what>: mmap" or
// "<what>: madvise(MADV_POPULATE_READ)" — InvalidArgument (EINVAL) where the
// file cannot be mapped or the kernel has no MADV_POPULATE_READ, IOError and
// the like for a page that cannot be read. Never SIGBUS, except when another
// process truncates the file between the populate and the copy.
Status CopyMappedRange(int fd, uint64_t offset, std::span<std::byte> dst, std::string_view what,
                       uint32_t* crc = nullptr, double* populate_seconds = nullptr);

// fsync of a directory (makes renames and creations in it durable).
Status SyncDirectory(const std::string& dir);

// mkdir -p.
Status CreateDirectories(const std::string& dir);

// The last component of `path` ("ckpt/model.mega" -> "model.mega"; `path`
// itself when it has no '/').
std::string BaseName(const std::string& path);
// The folder holding `path`: "ckpt" for "ckpt/model.mega", "." without a '/',
// "/" for "/model.mega".
std::string ParentOf(const std::string& path);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_FILE_H_
