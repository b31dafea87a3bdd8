#include "bench_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"
#include "megackpt/core/tensor.h"
#include "megackpt/fs/filesystem.h"  // FinishBackgroundFrees

namespace megackpt::bench {

Summary Summarize(std::vector<double> v) {
  Summary s;
  s.runs = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<std::vector<double>> TimeRuns(int warmup, int reps, const std::function<Status()>& fn,
                                     const std::function<void()>& setup) {
  std::vector<double> out;
  for (int i = 0; i < warmup + reps; ++i) {
    if (setup) setup();
    double t0 = NowSeconds();
    MEGA_RETURN_IF_ERROR(fn());
    double dt = NowSeconds() - t0;
    if (i >= warmup) out.push_back(dt);
  }
  return out;
}

static void FinishFreshWritePreparation(const std::string& scratch, uint64_t bytes,
                                        const ReportingMark& mark);

// Both preparations: the frees of earlier garbage end, `path` is removed or
// kept, then sync, settle and prime.
static void PrepareTimedWrite(const std::string& path, uint64_t bytes, bool keep_path) {
  fs::FinishBackgroundFrees();  // no earlier save's garbage is still being freed
  std::error_code ec;
  if (!keep_path) std::filesystem::remove_all(path, ec);
  const ReportingMark mark = MarkFreedMemory();
  sync();
  SettleDevice(path);
  FinishFreshWritePreparation(path + ".prime", bytes, mark);
}

void PrepareFreshWrite(const std::string& path, uint64_t bytes) {
  PrepareTimedWrite(path, bytes, /*keep_path=*/false);
}

void PrepareWriteOverPrevious(const std::string& path, uint64_t bytes) {
  PrepareTimedWrite(path, bytes, /*keep_path=*/true);
}

bool FreshWritesPrimed() { return std::getenv("MEGACKPT_BENCH_NO_PRIME") == nullptr; }

double FreshWriteIdleSeconds() {
  const char* s = std::getenv("MEGACKPT_BENCH_IDLE_SECONDS");
  if (FreshWritesPrimed() || s == nullptr) return 0;
  return std::max(0.0, std::atof(s));
}

std::string FreshWriteNote(bool direct_io) {
  std::string note;
  if (!FreshWritesPrimed()) {
    char idle[64] = "";
    if (FreshWriteIdleSeconds() > 0)
      std::snprintf(idle, sizeof idle, ", %g s idle before each", FreshWriteIdleSeconds());
    note += std::string(" (MEGACKPT_BENCH_NO_PRIME: fresh writes not primed") + idle + ")";
  }
  if (direct_io) note += " (durable saves: direct I/O)";
  return note;
}

const char* OverPreviousNote(bool over_previous) {
  return over_previous ? " (every save over the previous one, in its folder)" : "";
}

// The end of every fresh write's preparation: prime, or idle (see above).
static void FinishFreshWritePreparation(const std::string& scratch, uint64_t bytes,
                                        const ReportingMark& mark) {
  PrimeFreeMemory(scratch, bytes, mark);
  if (const double idle = FreshWriteIdleSeconds(); idle > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(idle));
  }
}

namespace {

// The reporting counters of this VM's kernel (absent upstream, where only
// page_reporting_order is a parameter).
constexpr char kReportingPasses[] = "/sys/module/page_reporting/parameters/passes";
// When the pass after a free comes (measured: 2.0-2.05 s, ~0.13 s long) and
// how long a preparation waits for it at most.
constexpr double kReportingDelay = 2.3;
constexpr double kReportingWaitCap = 3.0;
// Smaller timed writes skip the wait: a pass cannot cost them much.
constexpr uint64_t kReportingWaitMinBytes = 64ull << 20;

long ReadReportingPasses() {
  std::ifstream f(kReportingPasses);
  long v = -1;
  if (!(f >> v)) return -1;
  return v;
}

std::mutex g_waits_mu;
ReportingWaits g_waits;

// Holds the primed pages until the pass armed before `mark` has run.
void AwaitReportingPass(const ReportingMark& mark) {
  const double t0 = NowSeconds();
  bool seen = false;
  while (NowSeconds() - mark.seconds < kReportingWaitCap) {
    if (mark.passes >= 0) {
      const long now = ReadReportingPasses();
      if (now >= 0 && now != mark.passes) {
        seen = true;
        break;
      }
    } else if (NowSeconds() - mark.seconds >= kReportingDelay) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::lock_guard<std::mutex> lock(g_waits_mu);
  ++g_waits.waits;
  if (seen) ++g_waits.passes_seen;
  g_waits.seconds += NowSeconds() - t0;
}

}  // namespace

bool FreePageReportingOn() {
  static const bool on = [] {
    std::error_code ec;
    const std::filesystem::path drivers("/sys/bus/virtio/drivers/virtio_balloon");
    for (const auto& dev : std::filesystem::directory_iterator(drivers, ec)) {
      std::ifstream f(dev.path() / "features");
      std::string bits;
      if (f >> bits && bits.size() > 5 && bits[5] == '1')
        return true;  // VIRTIO_BALLOON_F_REPORTING
    }
    return false;
  }();
  return on;
}

ReportingMark MarkFreedMemory() {
  ReportingMark m;
  m.seconds = NowSeconds();
  if (FreePageReportingOn()) m.passes = ReadReportingPasses();
  return m;
}

ReportingWaits FreshWriteReportingWaits() {
  std::lock_guard<std::mutex> lock(g_waits_mu);
  return g_waits;
}

void PrimeFreeMemory(const std::string& scratch, uint64_t bytes, const ReportingMark& mark) {
  if (bytes == 0 || !FreshWritesPrimed()) return;
  constexpr uint64_t kChunk = 8ull << 20;
  static const std::vector<std::byte> zeros(kChunk);  // zero-filled (so faulted in) once
  int fd = open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  for (uint64_t off = 0; off < bytes;) {
    const ssize_t n =
        pwrite(fd, zeros.data(), std::min(kChunk, bytes - off), static_cast<off_t>(off));
    if (n <= 0) break;
    off += static_cast<uint64_t>(n);
  }
  close(fd);
  const double written = NowSeconds();
  if (bytes >= kReportingWaitMinBytes && FreePageReportingOn()) AwaitReportingPass(mark);
  if (std::getenv("MEGACKPT_BENCH_TRACE_PREP")) {
    std::ifstream vm("/proc/vmstat");
    std::string k;
    long x, th = 0, bg = 0, fr = 0;
    while (vm >> k >> x) {
      if (k == "nr_dirty_threshold") th = x;
      if (k == "nr_dirty_background_threshold") bg = x;
      if (k == "nr_free_pages") fr = x;
    }
    std::fprintf(stderr,
                 "prep: prime written %.3f s after the mark, released at %.3f s (passes %ld -> "
                 "%ld) dirty thresh %.2f bg %.2f free %.2f GiB\n",
                 written - mark.seconds, NowSeconds() - mark.seconds, mark.passes,
                 ReadReportingPasses(), th / 262144.0, bg / 262144.0, fr / 262144.0);
  }
  unlink(scratch.c_str());
}

namespace {

// /sys/dev/block/MAJ:MIN/stat of the device holding `path` (or its nearest
// existing parent); empty when there is none.
std::string DeviceStatPath(const std::string& path) {
  std::filesystem::path p = std::filesystem::absolute(path);
  struct stat st {};
  while (::stat(p.c_str(), &st) != 0) {
    if (!p.has_parent_path() || p.parent_path() == p) return "";
    p = p.parent_path();
  }
  const std::string dev = "/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" +
                          std::to_string(minor(st.st_dev)) + "/stat";
  return access(dev.c_str(), R_OK) == 0 ? dev : "";
}

// {requests in flight, discarded sectors} (block/stat.rst fields 9 and 14).
std::pair<uint64_t, uint64_t> DeviceActivity(const std::string& stat_path) {
  std::ifstream in(stat_path);
  std::vector<uint64_t> f;
  uint64_t v;
  while (in >> v) f.push_back(v);
  return {f.size() > 8 ? f[8] : 0, f.size() > 13 ? f[13] : 0};
}

}  // namespace

void SettleDevice(const std::string& path) {
  const std::string stat_path = DeviceStatPath(path);
  if (stat_path.empty()) return;
  // Quiet = nothing in flight and no new discards over 3 polls 10 ms apart.
  auto last = DeviceActivity(stat_path);
  int quiet = 0;
  for (int i = 0; i < 100 && quiet < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const auto now = DeviceActivity(stat_path);
    quiet = now.first == 0 && now.second == last.second ? quiet + 1 : 0;
    last = now;
  }
}

std::vector<double> ToGbps(const std::vector<double>& seconds, uint64_t bytes) {
  std::vector<double> out;
  for (double s : seconds) out.push_back(s > 0 ? bytes / s / 1e9 : 0);
  return out;
}

namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kLargeIo = 64 * kMiB;   // the default pwrite/pread size
std::atomic<uint32_t> g_checksum_sink{0};  // WriteAll's CRCs (kChecksummedWrite) end here

// pwrites of `block` bytes of [p, p + n) at offset 0. With `writeback_unit`
// > 0, durable writers start writeback of every finished unit
// (sync_file_range(WRITE), as the library's durable save paths do) so the
// device works while the next bytes are copied and the final fdatasync has
// less left. With `crc_block` > 0 (kChecksummedWrite), each pwrite's block
// CRC-32s (core BlockCrc32s) go into a reused table right before it.
Status WriteAll(int fd, const std::byte* p, uint64_t n, const std::string& path, uint64_t block,
                uint64_t writeback_unit = 0, uint64_t crc_block = 0) {
  std::vector<uint32_t> table(crc_block ? (block + crc_block - 1) / crc_block : 0);
  uint32_t seen = 0;  // every table feeds the sink: the CRCs are used
  uint64_t off = 0, written_back = 0;
  while (off < n) {
    const size_t len = static_cast<size_t>(std::min(block, n - off));
    if (crc_block) {
      BlockCrc32s({p + off, len}, crc_block, table.data());
      seen ^= table[0];
    }
    MEGA_RETURN_IF_ERROR(PwriteFull(fd, p + off, len, off, path, len));
    off += len;
    if (writeback_unit > 0 && off - written_back >= writeback_unit) {
      // A hint: failure only leaves all the work to fdatasync.
      (void)sync_file_range(fd, static_cast<off_t>(written_back),
                            static_cast<off_t>(off - written_back), SYNC_FILE_RANGE_WRITE);
      written_back = off;
    }
  }
  g_checksum_sink.fetch_xor(seen, std::memory_order_relaxed);
  return Status::OK();
}

}  // namespace

// ---- Parallel ceilings ------------------------------------------------------

const char* CeilingName(CeilingKind kind) {
  switch (kind) {
    case CeilingKind::kPageCacheWrite:
      return "page-cache write";
    case CeilingKind::kDurableWrite:
      return "write + fdatasync";
    case CeilingKind::kWarmRead:
      return "warm read";
    case CeilingKind::kColdRead:
      return "device read (cold)";
    case CeilingKind::kMemcpy:
      return "memcpy";
    case CeilingKind::kChecksummedWrite:
      return "checksummed page-cache write";
  }
  return "?";
}

bool WritesFiles(CeilingKind kind) {
  return kind == CeilingKind::kPageCacheWrite || kind == CeilingKind::kDurableWrite ||
         kind == CeilingKind::kChecksummedWrite;
}

std::vector<int> CeilingParallelisms(int n) {
  std::vector<int> out = {1, 2, std::max(1, n)};
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<uint64_t> CeilingIoSizes(CeilingKind kind) {
  switch (kind) {
    case CeilingKind::kPageCacheWrite:
      return {kMiB, kLargeIo};
    case CeilingKind::kDurableWrite:
      return {8 * kMiB, kWritebackUnit};
    case CeilingKind::kWarmRead:
      return {kMiB, 4 * kMiB, kLargeIo};
    case CeilingKind::kColdRead:
      return {kMiB, 8 * kMiB};
    case CeilingKind::kMemcpy:
      return {0};
    case CeilingKind::kChecksummedWrite:
      return {kCrcWritePiece};  // the library's writers' pieces
  }
  return {0};
}

const char* CeilingIoName(CeilingKind kind) {
  switch (kind) {
    case CeilingKind::kPageCacheWrite:
    case CeilingKind::kChecksummedWrite:
      return "pwrite_bytes";
    case CeilingKind::kDurableWrite:
      return "writeback_bytes";
    case CeilingKind::kWarmRead:
    case CeilingKind::kColdRead:
      return "pread_bytes";
    case CeilingKind::kMemcpy:
      return "";
  }
  return "";
}

std::vector<CeilingConfig> CeilingConfigs(CeilingKind kind, int n) {
  std::vector<CeilingConfig> out;
  for (int p : CeilingParallelisms(n)) {
    for (uint64_t io : CeilingIoSizes(kind)) {
      out.push_back({p, io});
      if (kind == CeilingKind::kMemcpy) out.push_back({p, io, true});
      if (kind == CeilingKind::kWarmRead) out.push_back({p, io, false, true});
    }
    if (kind == CeilingKind::kDurableWrite)
      out.push_back({p, kDirectWritePiece, false, false, true});
  }
  return out;
}

std::string IoSizeText(uint64_t bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  return std::to_string(bytes) + " B";
}

namespace {

// Byte range [begin, end) of part i of n, 4 KiB aligned (the last takes the rest).
std::pair<uint64_t, uint64_t> PartRange(uint64_t bytes, int i, int n) {
  const uint64_t part = bytes / static_cast<uint64_t>(n) / 4096 * 4096;
  const uint64_t begin = part * static_cast<uint64_t>(i);
  return {begin, i == n - 1 ? bytes : begin + part};
}

// CeilingConfig::direct: [p, p + n) to a new file at `path` through core's
// direct-I/O writer (WritableFile::UseDirectIo, as durable saves with
// direct_io): pwrites of `piece` bytes straight from `p` (page-aligned:
// PlainIo's buffers are, and PartRange's starts are 4 KiB multiples), the
// partial last block at the fdatasync.
Status WriteDirect(const std::string& path, const std::byte* p, uint64_t n, uint64_t piece) {
  MEGA_ASSIGN_OR_RETURN(auto file, CreateLocalFile(path));
  if (!file->UseDirectIo())
    return FailedPreconditionError(path + ": the file system refuses O_DIRECT");
  for (uint64_t off = 0; off < n; off += piece) {
    MEGA_RETURN_IF_ERROR(file->WriteAt(off, {p + off, std::min(piece, n - off)}));
  }
  MEGA_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// Runs fn(i) on n threads (the caller runs i = 0); the first error wins.
Status RunParallel(int n, const std::function<Status(int)>& fn) {
  std::vector<Status> status(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back([&, i] { status[i] = fn(i); });
  status[0] = fn(0);
  for (auto& t : threads) t.join();
  for (const Status& s : status) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

Status PreadAll(int fd, std::byte* p, uint64_t n, uint64_t file_off, const std::string& path,
                uint64_t block) {
  MEGA_ASSIGN_OR_RETURN(size_t done, PreadFull(fd, p, n, file_off, path, block));
  if (done < n) return DataLossError(path + ": short read at " + std::to_string(file_off + done));
  return Status::OK();
}

// Copies file bytes [file_off, file_off + n) into p a `window` at a time
// through core CopyMappedRange (mmap, MADV_POPULATE_READ, memcpy, munmap).
Status CopyMapped(int fd, std::byte* p, uint64_t n, uint64_t file_off, const std::string& path,
                  uint64_t window) {
  for (uint64_t done = 0; done < n;) {
    const uint64_t len = std::min(window, n - done);
    MEGA_RETURN_IF_ERROR(CopyMappedRange(fd, file_off + done, {p + done, len}, path));
    done += len;
  }
  return Status::OK();
}

}  // namespace

const char* StatePagesName(StatePages pages) { return pages == StatePages::kSmall ? "4k" : "huge"; }

Result<std::shared_ptr<std::byte>> AllocatePageAligned(uint64_t bytes, StatePages pages) {
  constexpr uint64_t kPage = 4096;
  if (pages == StatePages::kSmall) {
    const uint64_t len = (std::max<uint64_t>(bytes, 1) + kPage - 1) / kPage * kPage;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ErrnoToStatus("mmap of " + std::to_string(len) + " bytes", errno);
    (void)madvise(p, len, MADV_NOHUGEPAGE);  // a hint: without THP every page is small anyway
    std::memset(p, 0, len);                  // pre-faulted, as AllocateBuffer(.., true)
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [len](std::byte* q) { munmap(q, len); });
  }
  // Large buffers come from mmap, already on a page: no extra page (which would
  // cost a whole huge page) unless the allocator's alignment falls short.
  MEGA_ASSIGN_OR_RETURN(auto exact, AllocateBuffer(std::max<uint64_t>(bytes, 1), true));
  if (reinterpret_cast<uintptr_t>(exact.get()) % kPage == 0) return exact;
  exact.reset();
  MEGA_ASSIGN_OR_RETURN(auto raw, AllocateBuffer(std::max<uint64_t>(bytes, 1) + kPage, true));
  const uintptr_t at = reinterpret_cast<uintptr_t>(raw.get());
  std::byte* aligned = raw.get() + ((kPage - at % kPage) % kPage);
  return std::shared_ptr<std::byte>(raw, aligned);  // shares raw's ownership
}

Result<std::unique_ptr<PlainIo>> PlainIo::Create(std::string prefix, uint64_t bytes,
                                                 StatePages pages) {
  MEGA_ASSIGN_OR_RETURN(auto src, AllocatePageAligned(bytes, pages));
  FillRandom(src.get(), bytes, 2);
  // The destination comes with the first read or memcpy (EnsureDestination).
  auto io = std::make_unique<PlainIo>(std::move(prefix), bytes, src.get(), nullptr);
  io->own_src_ = std::move(src);
  io->pages_ = pages;
  return io;
}

Status PlainIo::EnsureDestination() {
  if (dst_ != nullptr) return Status::OK();
  MEGA_ASSIGN_OR_RETURN(own_dst_, AllocatePageAligned(bytes_, pages_));
  dst_ = own_dst_.get();
  return Status::OK();
}

PlainIo::PlainIo(std::string prefix, uint64_t bytes, const std::byte* src, std::byte* dst)
    : prefix_(std::move(prefix)), bytes_(bytes), src_(src), dst_(dst) {}

PlainIo::~PlainIo() {
  for (int i = 0; i < max_files_; ++i) unlink(WritePath(i).c_str());
  if (read_file_) unlink((prefix_ + ".read").c_str());
}

void PlainIo::PrepareWrite(int writers) {
  RemoveWriteFiles(writers);
  const ReportingMark mark = MarkFreedMemory();
  sync();
  SettleDevice(prefix_);
  FinishFreshWritePreparation(prefix_ + ".prime", bytes_, mark);
}

void PlainIo::RemoveWriteFiles(int writers) {
  max_files_ = std::max(max_files_, writers);
  for (int i = 0; i < max_files_; ++i) unlink(WritePath(i).c_str());
}

Status PlainIo::Write(int writers, bool durable, uint64_t io_bytes, bool direct,
                      uint64_t crc_block) {
  writers = std::max(1, writers);
  max_files_ = std::max(max_files_, writers);
  return RunParallel(writers, [&](int i) -> Status {
    const auto [begin, end] = PartRange(bytes_, i, writers);
    const std::string path = WritePath(i);
    if (durable && direct)
      return WriteDirect(path, src_ + begin, end - begin, io_bytes ? io_bytes : kDirectWritePiece);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(path + ": create", errno);
    // Durable: the library's pwrites (core kCrcWritePiece), writeback every
    // io_bytes; page cache: pwrites of io_bytes.
    Status s = durable ? WriteAll(fd, src_ + begin, end - begin, path, kCrcWritePiece,
                                  io_bytes ? io_bytes : kWritebackUnit)
                       : WriteAll(fd, src_ + begin, end - begin, path,
                                  io_bytes ? io_bytes : kLargeIo, 0, crc_block);
    if (s.ok() && durable && fdatasync(fd) != 0) s = ErrnoToStatus(path + ": fdatasync", errno);
    close(fd);
    return s;
  });
}

Status PlainIo::EnsureReadFile() {
  if (read_file_) return Status::OK();
  const std::string path = prefix_ + ".read";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(path + ": create", errno);
  read_file_ = true;
  Status s = WriteAll(fd, src_, bytes_, path, kLargeIo);
  close(fd);
  return s;
}

Status PlainIo::DropReadFileCache() {
  MEGA_RETURN_IF_ERROR(EnsureDestination());  // untimed when TimeOnce runs it
  const std::string path = prefix_ + ".read";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(path + ": open", errno);
  Status s;
  if (fdatasync(fd) != 0) s = ErrnoToStatus(path + ": fdatasync", errno);
  if (s.ok()) {
    const int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (e != 0) s = ErrnoToStatus(path + ": posix_fadvise(DONTNEED)", e);
  }
  close(fd);
  return s;
}

Status PlainIo::Read(int readers, uint64_t pread_bytes, bool mapped) {
  readers = std::max(1, readers);
  MEGA_RETURN_IF_ERROR(EnsureDestination());  // untimed when TimeOnce runs it
  const std::string path = prefix_ + ".read";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(path + ": open", errno);
  const uint64_t piece = pread_bytes ? pread_bytes : kLargeIo;
  const uint64_t unit = std::max(kReadWorkUnit, piece);
  std::atomic<uint64_t> next{0};
  Status s = RunParallel(readers, [&](int) -> Status {
    for (;;) {
      const uint64_t begin = next.fetch_add(unit);
      if (begin >= bytes_) return Status::OK();
      const uint64_t end = std::min(bytes_, begin + unit);
      MEGA_RETURN_IF_ERROR(mapped ? CopyMapped(fd, dst_ + begin, end - begin, begin, path, piece)
                                  : PreadAll(fd, dst_ + begin, end - begin, begin, path, piece));
    }
  });
  close(fd);
  return s;
}

Status PlainIo::Memcpy(int threads, bool streaming) {
  MEGA_RETURN_IF_ERROR(EnsureDestination());  // untimed when TimeOnce runs it
  threads = std::max(1, threads);
  return RunParallel(threads, [&](int i) -> Status {
    const auto [begin, end] = PartRange(bytes_, i, threads);
    if (streaming) {
      StreamingCopy(dst_ + begin, src_ + begin, end - begin);
    } else {
      std::memcpy(dst_ + begin, src_ + begin, end - begin);
    }
    return Status::OK();
  });
}

Status PlainIo::Run(CeilingKind kind, const CeilingConfig& c) {
  switch (kind) {
    case CeilingKind::kPageCacheWrite:
      return Write(c.parallelism, false, c.io_bytes);
    case CeilingKind::kDurableWrite:
      return Write(c.parallelism, true, c.io_bytes, c.direct);
    case CeilingKind::kWarmRead:
    case CeilingKind::kColdRead:
      return Read(c.parallelism, c.io_bytes, c.mapped);
    case CeilingKind::kMemcpy:
      return Memcpy(c.parallelism, c.streaming);
    case CeilingKind::kChecksummedWrite:
      return Write(c.parallelism, false, c.io_bytes, false, crc_block_);
  }
  return Status::OK();
}

Result<double> PlainIo::TimeOnce(CeilingKind kind, const CeilingConfig& config) {
  const bool write = WritesFiles(kind);
  if (write) PrepareWrite(config.parallelism);
  if (!write) MEGA_RETURN_IF_ERROR(EnsureDestination());
  if (kind == CeilingKind::kWarmRead) MEGA_RETURN_IF_ERROR(EnsureReadFile());
  if (kind == CeilingKind::kColdRead) {
    MEGA_RETURN_IF_ERROR(EnsureReadFile());
    MEGA_RETURN_IF_ERROR(DropReadFileCache());
  }
  const double t0 = NowSeconds();
  MEGA_RETURN_IF_ERROR(Run(kind, config));
  return NowSeconds() - t0;
}

Ceiling CeilingFromSeconds(CeilingKind kind, const std::vector<CeilingConfig>& configs,
                           const std::vector<std::vector<double>>& secs, uint64_t bytes) {
  Ceiling c;
  c.kind = kind;
  for (size_t i = 0; i < configs.size() && i < secs.size(); ++i) {
    const CeilingConfig& cfg = configs[i];
    const Summary s = Summarize(ToGbps(secs[i], bytes));
    c.by_config.emplace_back(cfg, s);
    if (c.by_config.size() == 1 || s.median > c.best.median) {
      c.best = s;
      c.best_by_round = ToGbps(secs[i], bytes);
      c.best_parallelism = cfg.parallelism;
      c.best_io_bytes = cfg.io_bytes;
      c.best_streaming = cfg.streaming;
      c.best_mapped = cfg.mapped;
      c.best_direct = cfg.direct;
    }
    auto p = std::find_if(c.by_parallelism.begin(), c.by_parallelism.end(),
                          [&](const auto& e) { return e.first == cfg.parallelism; });
    if (p == c.by_parallelism.end()) {
      c.by_parallelism.emplace_back(cfg.parallelism, s);
    } else if (s.median > p->second.median) {
      p->second = s;
    }
  }
  return c;
}

// Round r of a kind runs every configuration once, in an order rotated by r,
// so no configuration always follows the same neighbour and a slow phase of
// the machine hits all of them alike.
Status CeilingRounds::Round(CeilingKind kind) {
  Kind& k = kinds_[static_cast<int>(kind)];
  if (k.configs.empty()) {
    k.configs = CeilingConfigs(kind, n_);
    k.secs.resize(k.configs.size());
  }
  const int r = k.rounds++;
  for (size_t j = 0; j < k.configs.size(); ++j) {
    const size_t i = (j + static_cast<size_t>(r)) % k.configs.size();
    MEGA_ASSIGN_OR_RETURN(double dt, io_.TimeOnce(kind, k.configs[i]));
    if (r >= warmup_) k.secs[i].push_back(dt);
  }
  return Status::OK();
}

Status CeilingRounds::WriteRound(CeilingKind kind, const std::string& checkpoint,
                                 bool keep_checkpoint) {
  std::error_code ec;
  if (!keep_checkpoint) std::filesystem::remove_all(checkpoint, ec);
  MEGA_RETURN_IF_ERROR(Round(kind));
  io_.RemoveWriteFiles();
  return Status::OK();
}

SaveLoadCeilings CeilingRounds::GetAll() const {
  SaveLoadCeilings c;
  c.durable = Get(CeilingKind::kDurableWrite);
  c.pagecache_write = Get(CeilingKind::kPageCacheWrite);
  c.warm_read = Get(CeilingKind::kWarmRead);
  c.memcpy = Get(CeilingKind::kMemcpy);
  c.checksummed_write = Get(CeilingKind::kChecksummedWrite);
  return c;
}

Ceiling CeilingRounds::Get(CeilingKind kind) const {
  const Kind& k = kinds_[static_cast<int>(kind)];
  if (k.configs.empty()) {
    Ceiling c;
    c.kind = kind;
    return c;
  }
  return CeilingFromSeconds(kind, k.configs, k.secs, io_.bytes());
}

namespace {

// One thread, for the single-stream paths (cas).
Result<Summary> OneThread(const std::string& path, uint64_t bytes, CeilingKind kind, int warmup,
                          int reps) {
  MEGA_ASSIGN_OR_RETURN(auto io, PlainIo::Create(path, bytes));
  MEGA_ASSIGN_OR_RETURN(Ceiling c, MeasureCeiling(*io, kind, 1, warmup, reps));
  return c.best;
}

}  // namespace

Result<Ceiling> MeasureCeiling(PlainIo& io, CeilingKind kind, int n, int warmup, int reps) {
  CeilingRounds rounds(io, n, warmup);
  for (int r = 0; r < warmup + reps; ++r) MEGA_RETURN_IF_ERROR(rounds.Round(kind));
  if (WritesFiles(kind)) io.RemoveWriteFiles();
  return rounds.Get(kind);
}

Result<Summary> MemcpyGbps(uint64_t bytes, int warmup, int reps) {
  // Memcpy touches no file: the prefix is never used.
  return OneThread("", bytes, CeilingKind::kMemcpy, warmup, reps);
}

Result<Summary> FileWriteGbps(const std::string& path, uint64_t bytes, bool sync, int warmup,
                              int reps) {
  return OneThread(path, bytes, sync ? CeilingKind::kDurableWrite : CeilingKind::kPageCacheWrite,
                   warmup, reps);
}

Result<Summary> FileReadGbps(const std::string& path, uint64_t bytes, int warmup, int reps) {
  return OneThread(path, bytes, CeilingKind::kWarmRead, warmup, reps);
}

void PutCeiling(nlohmann::json* out, const std::string& key, const Ceiling& c) {
  PutSummary(out, key, c.best);
  const std::string stem =
      key.size() > 5 && key.ends_with("_gbps") ? key.substr(0, key.size() - 5) : key;
  (*out)[stem + "_parallelism"] = c.best_parallelism;
  const std::string io_name = CeilingIoName(c.kind);
  if (!io_name.empty()) (*out)[stem + "_" + io_name] = c.best_io_bytes;
  if (c.kind == CeilingKind::kMemcpy) (*out)[stem + "_streaming"] = c.best_streaming;
  if (c.kind == CeilingKind::kWarmRead) (*out)[stem + "_mapped"] = c.best_mapped;
  if (c.kind == CeilingKind::kDurableWrite) (*out)[stem + "_direct"] = c.best_direct;
  nlohmann::json by = nlohmann::json::object();
  for (const auto& [p, s] : c.by_parallelism) by[std::to_string(p)] = s.median;
  (*out)[stem + "_gbps_by_parallelism"] = by;
  // The best configuration's GB/s per round, in order: what the paired ratios
  // divide each repetition by.
  (*out)[stem + "_gbps_by_round"] = c.best_by_round;
  // Every configuration's median: "P/io_bytes[/mapped|/direct]", and for
  // memcpy "P/memcpy" and "P/streaming" (the staging copy's kind).
  if (!io_name.empty() || c.kind == CeilingKind::kMemcpy) {
    nlohmann::json by_config = nlohmann::json::object();
    for (const auto& [cfg, s] : c.by_config) {
      by_config[std::to_string(cfg.parallelism) + "/" +
                (c.kind == CeilingKind::kMemcpy ? (cfg.streaming ? "streaming" : "memcpy")
                                                : std::to_string(cfg.io_bytes)) +
                (cfg.mapped ? "/mapped" : "") + (cfg.direct ? "/direct" : "")] = s.median;
    }
    (*out)[stem + "_gbps_by_config"] = by_config;
  }
}

void PutRatio(nlohmann::json* out, const std::string& ratio_key, double ratio) {
  (*out)[ratio_key] = ratio;
  if (ratio > kCeilingSlack) {
    (*out)[ratio_key + "_ceiling_too_low"] = true;
    if (!out->contains("ceiling_too_low")) (*out)["ceiling_too_low"] = nlohmann::json::array();
    (*out)["ceiling_too_low"].push_back(ratio_key);
  }
}

void PutPairedRatio(nlohmann::json* out, const std::string& ratio_key, const Summary& paired) {
  if (paired.runs == 0) return;
  (*out)[ratio_key + "_paired"] = paired.median;
  (*out)[ratio_key + "_paired_min"] = paired.min;
  (*out)[ratio_key + "_paired_max"] = paired.max;
}

void PutSummary(nlohmann::json* out, const std::string& key, const Summary& s) {
  (*out)[key] = s.median;
  (*out)[key + "_min"] = s.min;
  (*out)[key + "_max"] = s.max;
}

Status TimeSaveRow(int warmup, int reps, const std::function<Status()>& before,
                   const std::function<Result<std::pair<double, double>>()>& save,
                   std::vector<double>* seconds, std::vector<double>* commits) {
  for (int i = 0; i < warmup + reps; ++i) {
    MEGA_RETURN_IF_ERROR(before());
    MEGA_ASSIGN_OR_RETURN(auto timed, save());
    if (i < warmup) continue;
    seconds->push_back(timed.first);
    commits->push_back(timed.second);
  }
  return Status::OK();
}

Status TimeLoadRows(int warmup, int reps, const std::function<Status()>& before,
                    const std::function<Result<double>(bool verified)>& load,
                    std::vector<double>* verified, std::vector<double>* unverified) {
  for (int i = 0; i < warmup + reps; ++i) {
    MEGA_RETURN_IF_ERROR(before());
    // The settling load, untimed: the checkpoint's pages and the destinations
    // were idle while the round read its own file (header).
    MEGA_RETURN_IF_ERROR(load(true).status());
    const bool verified_first = i % 2 == 1;
    MEGA_ASSIGN_OR_RETURN(double first, load(verified_first));
    MEGA_ASSIGN_OR_RETURN(double second, load(!verified_first));
    if (i < warmup) continue;
    verified->push_back(verified_first ? first : second);
    unverified->push_back(verified_first ? second : first);
  }
  return Status::OK();
}

SaveLoadRows SaveLoadRowsFrom(const SaveLoadSeconds& secs, uint64_t bytes,
                              const SaveLoadCeilings& c) {
  SaveLoadRows r;
  const std::vector<double> save = ToGbps(secs.save, bytes),
                            nosync = ToGbps(secs.save_nosync, bytes);
  const std::vector<double> load = ToGbps(secs.load, bytes),
                            unverified = ToGbps(secs.load_unverified, bytes);
  r.save = Summarize(save);
  r.save_nosync = Summarize(nosync);
  r.load = Summarize(load);
  r.load_unverified = Summarize(unverified);
  r.save_by_rep = save;
  r.save_nosync_by_rep = nosync;
  r.load_by_rep = load;
  r.load_unverified_by_rep = unverified;
  r.save_paired = PairedRatio(save, c.durable);
  r.nosync_paired = PairedRatio(nosync, c.pagecache_write);
  r.load_paired = PairedRatio(load, c.warm_read);
  r.unverified_paired = PairedRatio(unverified, c.warm_read);
  r.nosync_checksummed_paired = PairedRatio(nosync, c.checksummed_write);
  r.save_commit = Summarize(secs.save_commit);
  r.nosync_commit = Summarize(secs.save_nosync_commit);
  return r;
}

double CommitAfterLastWrite(const std::vector<dcp::SaveStats>& ranks) {
  const dcp::SaveStats* last = nullptr;
  for (const dcp::SaveStats& s : ranks) {
    if (!last || s.plan_seconds + s.write_seconds > last->plan_seconds + last->write_seconds)
      last = &s;
  }
  return last ? last->commit_seconds : 0;
}

std::string CommitRow(const std::string& label, const Summary& seconds) {
  char row[160];
  std::snprintf(row, sizeof row, "  %-32s %8.1f %8.1f %8.1f   ms, after the last rank's data",
                label.c_str(), seconds.min * 1e3, seconds.median * 1e3, seconds.max * 1e3);
  return row;
}

void PutSaveLoadRows(nlohmann::json* out, const SaveLoadRows& r, const SaveLoadCeilings& c,
                     int parallelism) {
  (*out)["fresh_writes_primed"] = FreshWritesPrimed();
  (*out)["idle_seconds"] = FreshWriteIdleSeconds();
  const ReportingWaits waits = FreshWriteReportingWaits();
  (*out)["fresh_write_reporting"] = {{"on", FreePageReportingOn()},
                                     {"waits", waits.waits},
                                     {"passes_seen", waits.passes_seen},
                                     {"seconds", waits.seconds}};
  PutSummary(out, "save_gbps", r.save);
  PutSummary(out, "save_nosync_gbps", r.save_nosync);
  PutSummary(out, "load_gbps", r.load);
  PutSummary(out, "load_unverified_gbps", r.load_unverified);
  (*out)["save_gbps_by_rep"] = r.save_by_rep;
  (*out)["save_nosync_gbps_by_rep"] = r.save_nosync_by_rep;
  (*out)["load_gbps_by_rep"] = r.load_by_rep;
  (*out)["load_unverified_gbps_by_rep"] = r.load_unverified_by_rep;
  if (r.save_commit.runs > 0) PutSummary(out, "save_commit_seconds", r.save_commit);
  if (r.nosync_commit.runs > 0) PutSummary(out, "save_nosync_commit_seconds", r.nosync_commit);
  PutSaveLoadCeilings(out, c);
  (*out)["ceiling_parallelism"] = parallelism;
  auto ratio = [](const Summary& ours, const Ceiling& limit) {
    return limit.best.median > 0 ? ours.median / limit.best.median : 0.0;
  };
  PutRatio(out, "save_vs_durable_write", ratio(r.save, c.durable));
  PutRatio(out, "save_nosync_vs_pagecache_write", ratio(r.save_nosync, c.pagecache_write));
  PutRatio(out, "load_vs_pagecache_read", ratio(r.load, c.warm_read));
  PutRatio(out, "load_unverified_vs_pagecache_read", ratio(r.load_unverified, c.warm_read));
  PutPairedRatio(out, "save_vs_durable_write", r.save_paired);
  PutPairedRatio(out, "save_nosync_vs_pagecache_write", r.nosync_paired);
  PutPairedRatio(out, "load_vs_pagecache_read", r.load_paired);
  PutPairedRatio(out, "load_unverified_vs_pagecache_read", r.unverified_paired);
  if (!c.checksummed_write.by_parallelism.empty()) {
    PutRatio(out, "save_nosync_vs_checksummed_write", ratio(r.save_nosync, c.checksummed_write));
    PutPairedRatio(out, "save_nosync_vs_checksummed_write", r.nosync_checksummed_paired);
  }
  (*out)["load_verified_vs_unverified"] =
      r.load_unverified.median > 0 ? r.load.median / r.load_unverified.median : 0;
}

void PutSaveLoadCeilings(nlohmann::json* out, const SaveLoadCeilings& c) {
  PutCeiling(out, "durable_write_gbps", c.durable);
  PutCeiling(out, "pagecache_write_gbps", c.pagecache_write);
  PutCeiling(out, "pagecache_read_gbps", c.warm_read);
  if (!c.memcpy.by_parallelism.empty()) PutCeiling(out, "memcpy_gbps", c.memcpy);
  if (!c.checksummed_write.by_parallelism.empty()) {
    PutCeiling(out, "checksummed_write_gbps", c.checksummed_write);
  }
}

std::string ConfigText(const CeilingConfig& c) {
  std::string out = std::to_string(c.parallelism) + " thr";
  if (c.io_bytes > 0) out += ", " + IoSizeText(c.io_bytes);
  if (c.streaming) out += ", streaming stores";
  if (c.mapped) out += ", mapped copy";
  if (c.direct) out += ", O_DIRECT";
  return out;
}

std::string BestConfigText(const Ceiling& c) {
  return ConfigText(
      {c.best_parallelism, c.best_io_bytes, c.best_streaming, c.best_mapped, c.best_direct});
}

namespace {
// "preads", "writeback units", "pwrites": what the I/O size of `kind` is.
const char* IoUnitName(CeilingKind kind) {
  return kind == CeilingKind::kWarmRead || kind == CeilingKind::kColdRead ? "preads"
         : kind == CeilingKind::kDurableWrite                             ? "writeback units"
                                                                          : "pwrites";
}
}  // namespace

std::string CeilingRow(const std::string& label, const Ceiling& c) {
  std::string row = FormatRow(label + " (" + std::to_string(c.best_parallelism) + " thr)", c.best);
  if (c.best_io_bytes > 0) {
    const char* unit = c.best_mapped   ? "mapped windows"
                       : c.best_direct ? "O_DIRECT pwrites"
                                       : IoUnitName(c.kind);
    row += "   " + IoSizeText(c.best_io_bytes) + " " + unit;
  }
  if (c.kind == CeilingKind::kMemcpy) row += c.best_streaming ? "   streaming stores" : "   memcpy";
  return row;
}

std::string DescribeCeiling(const Ceiling& c) {
  std::string out = std::string(CeilingName(c.kind)) + ": best of";
  for (size_t i = 0; i < c.by_parallelism.size(); ++i) {
    out += (i ? "/" : " ") + std::to_string(c.by_parallelism[i].first);
  }
  out += " threads";
  const std::vector<uint64_t> sizes = CeilingIoSizes(c.kind);
  if (sizes.size() > 1 || sizes[0] > 0) {
    out += " x";
    for (size_t i = 0; i < sizes.size(); ++i) {
      out += (i ? "/" : " ") + std::to_string(sizes[i] >> 20);
    }
    out += std::string(" MiB ") + IoUnitName(c.kind);
  }
  if (c.kind == CeilingKind::kMemcpy) out += " x memcpy/streaming stores";
  if (c.kind == CeilingKind::kWarmRead) out += " x pread/mapped copy";
  if (c.kind == CeilingKind::kDurableWrite) out += ", and O_DIRECT 2 MiB pwrites";
  out += " is " + BestConfigText(c) + " (";
  char buf[64];
  for (size_t i = 0; i < c.by_parallelism.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%d: %.2f", i ? ", " : "", c.by_parallelism[i].first,
                  c.by_parallelism[i].second.median);
    out += buf;
  }
  if (c.kind == CeilingKind::kMemcpy) {
    // Both copies, so a staging copy (streaming stores) can be read against its
    // own kind on the ceiling's buffers.
    out += " GB/s; streaming stores";
    for (const auto& [cfg, s] : c.by_config) {
      if (!cfg.streaming) continue;
      std::snprintf(buf, sizeof buf, " %d: %.2f", cfg.parallelism, s.median);
      out += buf;
    }
  }
  return out + " GB/s)";
}

namespace {
uint64_t ReadStatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0) return std::strtoull(line.c_str() + klen + 1, nullptr, 10);
  }
  return 0;
}
}  // namespace

uint64_t PeakRssBytes() { return ReadStatusKb("VmHWM") * 1024; }
uint64_t CurrentRssBytes() { return ReadStatusKb("VmRSS") * 1024; }

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

void FillRandom(void* data, size_t n, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(data);
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(s >> (8 * (i % 8)));
}

Summary PairedRatio(const std::vector<double>& ours_gbps, const Ceiling& limit) {
  std::vector<double> r;
  for (size_t i = 0; i < ours_gbps.size() && i < limit.best_by_round.size(); ++i) {
    if (limit.best_by_round[i] > 0) r.push_back(ours_gbps[i] / limit.best_by_round[i]);
  }
  return Summarize(std::move(r));
}

std::string FormatRow(const std::string& name, const Summary& s, double ratio_to,
                      const Summary& paired) {
  char buf[320];
  if (ratio_to > 0) {
    const double ratio = s.median / ratio_to;
    char per_rep[64] = "";
    if (paired.runs > 0) {
      std::snprintf(per_rep, sizeof per_rep, "  [%.2f %.2f %.2f]", paired.min, paired.median,
                    paired.max);
    }
    std::snprintf(buf, sizeof buf, "%-34s %8.3f %8.3f %8.3f   %6.2fx%s%s", name.c_str(), s.min,
                  s.median, s.max, ratio, per_rep, ratio > kCeilingSlack ? kCeilingTooLow : "");
  } else {
    std::snprintf(buf, sizeof buf, "%-34s %8.3f %8.3f %8.3f", name.c_str(), s.min, s.median, s.max);
  }
  return buf;
}

}  // namespace megackpt::bench
