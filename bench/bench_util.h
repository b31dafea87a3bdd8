// Shared measurement helpers for the benchmark programs (`megackpt bench ...`).
//
// Method (docs/architecture.md, performance model): measure the machine's limit and the
// library the same way — same process, same memory setup, same size — drop the
// first repetition, report min/median/max of the rest. Throughput is decimal
// GB/s (1e9 bytes per second).
#ifndef MEGACKPT_BENCH_BENCH_UTIL_H_
#define MEGACKPT_BENCH_BENCH_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/test_files.h"
#include "megackpt/core/status.h"
#include "megackpt/dcp/checkpoint.h"

namespace megackpt::bench {

struct Summary {
  double min = 0, median = 0, max = 0;
  int runs = 0;
};

// min/median/max of `values` (median of an even count = mean of the middle two).
Summary Summarize(std::vector<double> values);

// Runs `fn` warmup + reps times; returns the seconds of the last `reps` runs.
// `setup` (optional) runs before every run, outside the timed region. Stops at
// the first error.
Result<std::vector<double>> TimeRuns(int warmup, int reps, const std::function<Status()>& fn,
                                     const std::function<void()>& setup = nullptr);

// Untimed preparation of every measured write, limits and ours alike: waits
// for this process's background frees (fs::FinishBackgroundFrees), removes
// `path` (a file or a folder) and writes back all dirty pages (sync(2)), so each
// timed write starts from the same state — an empty target and no dirty data
// from earlier runs that would throttle it (the kernel's dirty-page limits are
// ~10-20% of RAM, about the size of two 2 GiB runs) — then SettleDevice, then
// PrimeFreeMemory(`path`.prime, `bytes`, mark taken right after the removal)
// with the bytes the timed write writes (or, unprimed, FreshWriteIdleSeconds of
// sleep).
void PrepareFreshWrite(const std::string& path, uint64_t bytes);

// The same preparation for a write over the previous one (`bench dcp` / `bench
// mega` --over-previous: a save into the folder that holds the last save, as in
// a training loop that saves to one path): `path` is kept; first waits until
// the space of files removed earlier as garbage is freed
// (fs::FinishBackgroundFrees: the last save's garbage, freed off its caller's
// path), then sync(2), SettleDevice and PrimeFreeMemory as PrepareFreshWrite.
void PrepareWriteOverPrevious(const std::string& path, uint64_t bytes);

// Free page reporting (docs/benchmarks.md, "Page-cache writes on a VM with free
// page reporting"): on a VM whose balloon reports free memory to the host, a
// reporting pass runs about 2 s after memory is freed (a 2 GiB removal, say),
// hands what is free then to the host, and every page the guest takes from that
// memory afterwards costs a host page fault (0.1-0.5 GB/s instead of 6-10). A
// timed write that a pass overlaps runs in that mode from then on.
struct ReportingMark {
  double seconds = 0;  // NowSeconds() when taken
  long passes = -1;    // the kernel's count of reporting passes then; -1: not exposed
};
// Taken right after a preparation frees the previous run's memory.
ReportingMark MarkFreedMemory();
// True when the VM's balloon reports free pages (virtio_balloon feature 5).
bool FreePageReportingOn();

// The last step of a fresh write's preparation: writes `bytes` through the page
// cache to the file `scratch`; then, when free page reporting is on, waits
// (holding those pages) for the reporting pass armed by the memory freed before
// `mark` — until the kernel's pass count moves, or, where the kernel does not
// expose it, until 2.3 s after `mark`; at most 3 s after it — and only then
// removes the file. So the timed write that follows at once gets `bytes` of
// page-cache pages that were in use a moment ago, and no pass is due while it
// runs (the next one is armed by this removal, ~2 s later). Without the wait
// the pass armed by the removal of the old files fell into the prime or the
// timed write in about one run in three, which decided that run's mode. Writes
// below 64 MiB skip the wait. Best effort (errors ignored); skipped when
// `bytes` is 0 or MEGACKPT_BENCH_NO_PRIME is set in the environment (to
// measure the unprimed machine). MEGACKPT_BENCH_TRACE_PREP=1 prints a line per
// preparation to stderr: when the scratch was written and released after the
// mark, the pass count, and the kernel's dirty-page limits and free memory.
void PrimeFreeMemory(const std::string& scratch, uint64_t bytes, const ReportingMark& mark);
// What the preparations of this process waited for so far (PrimeFreeMemory):
// "fresh_write_reporting" in the JSON of bench dcp / mega.
struct ReportingWaits {
  int waits = 0;        // preparations that waited for a pass
  int passes_seen = 0;  // ... and saw the pass count move (the rest timed out)
  double seconds = 0;   // total time waited
};
ReportingWaits FreshWriteReportingWaits();
// False when MEGACKPT_BENCH_NO_PRIME is set (PrimeFreeMemory does nothing);
// `bench dcp` / `bench mega` report it as "fresh_writes_primed" and in their
// table's first line.
bool FreshWritesPrimed();
// MEGACKPT_BENCH_IDLE_SECONDS=S (with MEGACKPT_BENCH_NO_PRIME): every fresh
// write's preparation ends with S seconds of sleep, as in a training loop that
// saves every few minutes, by which time memory freed since the last save has
// gone back to the host (docs/benchmarks.md, "Direct-I/O durable writes").
// 0 when unset or primed; "idle_seconds" in the JSON of bench dcp / mega.
double FreshWriteIdleSeconds();
// The table's first-line note on the state of fresh writes: empty when primed
// with buffered durable saves, else e.g. " (MEGACKPT_BENCH_NO_PRIME: fresh
// writes not primed, 3 s idle before each) (durable saves: direct I/O)".
std::string FreshWriteNote(bool direct_io);
// The table's first-line note of --over-previous: " (every save over the
// previous one, in its folder)" or "".
const char* OverPreviousNote(bool over_previous);

// Waits (at most ~1 s) until the block device holding `path` has no request in
// flight and its discard count has stopped moving: freeing the previous run's
// blocks (online discard, journal commit) must not overlap the timed run.
// Returns at once where /sys/dev/block is not readable.
void SettleDevice(const std::string& path);

// Converts seconds to GB/s for `bytes` bytes.
std::vector<double> ToGbps(const std::vector<double>& seconds, uint64_t bytes);

double NowSeconds();

// Single-thread machine limits, for the single-stream paths (cas); the
// other benches use the parallel ceilings below. Measured through PlainIo at
// parallelism 1 (best over its I/O sizes), with the same repetitions:
// memcpy between two pre-faulted buffers of `bytes` (single thread).
Result<Summary> MemcpyGbps(uint64_t bytes, int warmup, int reps);
// Writing `bytes` from a pre-faulted buffer to a new file at `path` with large
// writes, optionally followed by fdatasync (durable); PrepareFreshWrite before
// every run. The file (`path`.0) is removed after.
Result<Summary> FileWriteGbps(const std::string& path, uint64_t bytes, bool sync, int warmup,
                              int reps);
// Reading a cached file of `bytes` (`path`.read) into a reused, pre-faulted
// buffer with pread.
Result<Summary> FileReadGbps(const std::string& path, uint64_t bytes, int warmup, int reps);

// ---- Parallel ceilings ------------------------------------------------------
//
// The machine's limits measured with the same parallelism as the path they are
// compared with: the best (highest median) over 1, 2 and N plain writers/readers,
// N = ranks x I/O threads of the measured path, and over a few I/O sizes
// (CeilingIoSizes), over the same total size. A limit is the best plain I/O can
// do: the library's 1 MiB pwrites/preads into pre-faulted memory beat 64 MiB
// ones on some machines, so both (and sizes between) are tried.
//  - kPageCacheWrite: W threads each write bytes/W from a pre-faulted buffer to
//    its own new file (pwrites of 1 or 64 MiB); PrepareFreshWrite before every run.
//  - kDurableWrite: the same with 1 MiB pwrites, each writer fdatasyncs its file
//    at the end and, like the library's durable save paths (fs and MEGA
//    storage), starts writeback of every finished writeback unit (8 or 32 MiB)
//    with sync_file_range(SYNC_FILE_RANGE_WRITE), so the device works while the
//    next bytes are copied. Without the hint the plain writer leaves all
//    writeback to fdatasync and is not a limit for paths that overlap it.
//  - kColdRead: the same as kWarmRead from the device: before each run,
//    untimed, the read file's pages are dropped from the page cache
//    (fdatasync + posix_fadvise(DONTNEED)); 1 or 8 MiB preads. The limit of a
//    path that reads data that is not cached (mega:// xorbs written O_DIRECT).
//  - kWarmRead: W threads pread one cached file of `bytes` into a reused,
//    pre-faulted buffer (preads of 1, 4 or 64 MiB). Like the library's readers
//    (dcp/filesystem.cc, kReadUnit), the threads take work units of
//    max(kReadWorkUnit, pread size) from a shared counter, so a thread slowed
//    by the machine does not hold the others up (static byte ranges per
//    thread would make the limit lower than the library's reads).
//  - kMemcpy: W threads each copy bytes/W between two pre-faulted buffers,
//    with memcpy or with streaming stores (core StreamingCopy).
//  - kChecksummedWrite: not a limit of the machine but of any writer that
//    checksums every byte on it: kPageCacheWrite's writers in pwrites of core
//    kCrcWritePiece, each piece's block CRC-32s (core BlockCrc32s, blocks of
//    PlainIo::set_crc_block) computed into a reused table right before its
//    pwrite, as the library's writers do; the table is not written. A no-sync
//    save over it is what the framework costs beyond its checksums (format,
//    planning, whole-item CRCs, tables); the goal stays against kPageCacheWrite.
// Separate files for writers: buffered writes to one ext4 file serialize on the
// inode lock, so W files is what W plain writers can do. The configurations run
// interleaved (round r runs every configuration once), so a slow phase of the
// machine (journal, host) hits all of them alike.
// The library's durable save paths start writeback every core kWritebackUnit
// (core/file.h); the ceiling tries it and 8 MiB.
// The library's readers hand out contiguous reads in work units of 32 MiB
// (kReadUnit in dcp/filesystem.cc); the warm-read ceiling does the same.
constexpr uint64_t kReadWorkUnit = 32ull << 20;

enum class CeilingKind {
  kPageCacheWrite,
  kDurableWrite,
  kWarmRead,
  kMemcpy,
  kColdRead,
  kChecksummedWrite,
};
constexpr int kCeilingKinds = 6;

// "page-cache write", "write + fdatasync", "warm read", "memcpy",
// "checksummed page-cache write".
const char* CeilingName(CeilingKind kind);

// True for the kinds that write files (page-cache, durable, checksummed write).
bool WritesFiles(CeilingKind kind);

// {1, 2, n} without duplicates, ascending (n <= 0 counts as 1).
std::vector<int> CeilingParallelisms(int n);

// The I/O sizes a ceiling of `kind` tries: the pwrite size (page-cache write,
// checksummed write), the writeback unit (durable write), the pread size (warm
// read); {0} for memcpy.
std::vector<uint64_t> CeilingIoSizes(CeilingKind kind);
// What the I/O size of `kind` is, as a JSON key part: "pwrite_bytes",
// "writeback_bytes", "pread_bytes"; "" for memcpy.
const char* CeilingIoName(CeilingKind kind);

// One measured configuration of a ceiling.
struct CeilingConfig {
  int parallelism = 1;
  uint64_t io_bytes = 0;  // CeilingIoSizes; 0: the default size
  // kMemcpy: copy with core StreamingCopy (non-temporal stores, what the async
  // save's staging uses) instead of memcpy; on this VM it is up to 2x faster.
  bool streaming = false;
  // kWarmRead: map each io_bytes window of the file (mmap, MADV_POPULATE_READ,
  // memcpy, munmap) instead of pread: the verified readers' mapped read
  // (core/file.h), which beats pread on a page cache of large folios.
  bool mapped = false;
  // kDurableWrite: O_DIRECT pwrites of io_bytes straight from the source (the
  // page cache bypassed; a tail under 4 KiB buffered), then fdatasync. On a VM
  // whose free memory has gone back to the host, new page-cache pages cost a
  // host fault each and O_DIRECT writers beat buffered ones by 2x or more
  // (docs/benchmarks.md, "Priming the free memory").
  bool direct = false;
};
// CeilingParallelisms(n) x CeilingIoSizes(kind) (x memcpy / streaming stores
// for kMemcpy, x pread / mapped copy for kWarmRead).
std::vector<CeilingConfig> CeilingConfigs(CeilingKind kind, int n);

// The pages of the memory a bench saves from and loads into (its state, and the
// ceilings' source and destination): kHuge, transparent huge pages (core
// AllocateBuffer: 2 MiB pages where the kernel has them), or kSmall, 4 KiB
// pages (MADV_NOHUGEPAGE), as a framework's tensors get where THP is "madvise"
// (torch's and numpy's CPU allocations). Page-cache writes and reads copy
// from/to this memory; on a VM the page size changes what a copy costs
// (docs/benchmarks.md, "Saves from 4 KiB pages").
enum class StatePages { kHuge, kSmall };
// "huge" / "4k": the CLI's --state-pages values and the JSON's state_pages.
const char* StatePagesName(StatePages pages);

// The plain I/O the ceilings time: owns (or borrows) a pre-faulted source and
// destination buffer of `bytes` and the files `prefix`.0, .1, ... (write) and
// `prefix`.read (read). Removes its files on destruction.
class PlainIo {
 public:
  // Allocates and pre-faults both buffers of `pages` (source filled with random
  // bytes; the destination on first use).
  static Result<std::unique_ptr<PlainIo>> Create(std::string prefix, uint64_t bytes,
                                                 StatePages pages = StatePages::kHuge);
  // Borrows the caller's buffers (each at least `bytes`), which must outlive this.
  PlainIo(std::string prefix, uint64_t bytes, const std::byte* src, std::byte* dst);
  ~PlainIo();
  PlainIo(const PlainIo&) = delete;
  PlainIo& operator=(const PlainIo&) = delete;

  uint64_t bytes() const { return bytes_; }
  // Untimed preparation of a write by up to `writers` writers: removes every
  // write file that may exist, then sync(2), SettleDevice and PrimeFreeMemory
  // of `bytes` (as PrepareFreshWrite).
  void PrepareWrite(int writers = 0);
  // Removes the write files of up to `writers` writers and of every earlier
  // write (untimed clean-up after the last write).
  void RemoveWriteFiles(int writers = 0);
  // Writers files of bytes/writers each, in parallel; fdatasync each when durable.
  // `io_bytes`: the pwrite size (page cache) or the writeback unit (durable);
  // 0: 64 MiB pwrites, resp. kWritebackUnit.
  // `direct` (durable only): CeilingConfig::direct, io_bytes the pwrite size.
  // `crc_block` > 0 (page cache only, kChecksummedWrite): each pwrite's block
  // CRC-32s of that block size are computed right before it.
  Status Write(int writers, bool durable, uint64_t io_bytes = 0, bool direct = false,
               uint64_t crc_block = 0);
  // The CRC block size of the kChecksummedWrite runs: the one the library's
  // writers pick for the bench's state (default 256 B, that of 4 KiB rows).
  // REQUIRES: a multiple of 64.
  void set_crc_block(uint64_t bytes) { crc_block_ = bytes; }
  // Creates the read file (once; later calls return at once).
  Status EnsureReadFile();
  // `readers` threads pread byte ranges of the read file into the destination,
  // with preads of `pread_bytes` (0: 64 MiB); `mapped`: copy them from mapped
  // windows of that size instead (CeilingConfig::mapped).
  // REQUIRES: EnsureReadFile() succeeded.
  Status Read(int readers, uint64_t pread_bytes = 0, bool mapped = false);
  // Writes back and drops the read file's cached pages (kColdRead's
  // preparation). REQUIRES: EnsureReadFile() succeeded.
  Status DropReadFileCache();
  // `threads` threads copy byte ranges of the source into the destination.
  Status Memcpy(int threads, bool streaming = false);
  // Allocates the pre-faulted destination of Read and Memcpy if it has none
  // yet: Create leaves it to the first read or memcpy (TimeOnce does it before
  // its clock starts), so write rows do not run with `bytes` more memory held
  // than they need (less free memory lowers the kernel's dirty-page limits,
  // and a 2 GiB no-sync write then meets background writeback).
  Status EnsureDestination();
  // One untimed-preparation + timed run of `kind` in `config`: seconds.
  Result<double> TimeOnce(CeilingKind kind, const CeilingConfig& config);
  // The timed part alone (the caller prepares).
  Status Run(CeilingKind kind, const CeilingConfig& config);

 private:
  std::string WritePath(int i) const { return prefix_ + "." + std::to_string(i); }
  std::string prefix_;
  uint64_t bytes_;
  StatePages pages_ = StatePages::kHuge;  // of the buffers Create and EnsureDestination make
  std::shared_ptr<std::byte> own_src_, own_dst_;
  const std::byte* src_;
  std::byte* dst_;
  int max_files_ = 0;  // write files that may exist
  bool read_file_ = false;
  uint64_t crc_block_ = 256;
};

struct Ceiling {
  CeilingKind kind = CeilingKind::kMemcpy;
  Summary best;  // GB/s of the configuration with the highest median
  int best_parallelism = 1;
  uint64_t best_io_bytes = 0;                           // its I/O size (CeilingIoSizes)
  bool best_streaming = false;                          // kMemcpy: its copy is StreamingCopy
  bool best_mapped = false;                             // kWarmRead: it copies from mapped windows
  bool best_direct = false;                             // kDurableWrite: it writes with O_DIRECT
  std::vector<std::pair<int, Summary>> by_parallelism;  // for each of 1, 2, N: its best I/O size
  std::vector<std::pair<CeilingConfig, Summary>> by_config;  // every configuration measured
  // GB/s of the winning configuration in each kept round, in round order: the
  // limit right before each repetition of an interleaved row (PairedRatio).
  std::vector<double> best_by_round;
};

// Per-repetition ratios ours[i] / limit.best_by_round[i] (GB/s), for a row
// whose i-th kept repetition ran right after the limit's i-th kept round;
// min/median/max. On a VM whose page-cache speed jumps between modes
// (docs/benchmarks.md), a repetition and the round just before it mostly share
// a mode, so this is steadier than the ratio of the two medians. Empty (runs
// 0) when either side has no values; extra values on either side are ignored.
Summary PairedRatio(const std::vector<double>& ours_gbps, const Ceiling& limit);

// Rounds of ceiling measurements that a bench interleaves with its own rows,
// so a row and its limit see the same machine state (a ceiling measured minutes
// later is not a limit: the machine drifts). Each Round(kind) runs every
// configuration of CeilingConfigs(kind, n) once, in an order rotated by the
// round's index; the first `warmup` rounds of each kind are dropped.
// Typical use, per repetition of a row: Round(kind), then the row itself.
// The ceilings of a checkpoint save/load bench (bench dcp, bench mega), each
// gathered by CeilingRounds interleaved with the bench's rows; memcpy is empty
// when the bench does not measure it.
// checksummed_write is a reference, not a limit of the machine (kChecksummedWrite).
struct SaveLoadCeilings {
  Ceiling durable, pagecache_write, warm_read, memcpy, checksummed_write;
};

class CeilingRounds {
 public:
  // `io` must outlive this.
  CeilingRounds(PlainIo& io, int n, int warmup) : io_(io), n_(n), warmup_(warmup) {}
  PlainIo& io() { return io_; }
  // One round of `kind`; stops at the first error.
  Status Round(CeilingKind kind);
  // A write round (page-cache write or write + fsync) next to a save into
  // `checkpoint`: each starts without the other's files, as ours and the
  // ceiling's fresh writes do. Removes `checkpoint` (kept with
  // `keep_checkpoint`: the saves write over the previous one, and the plain
  // writers write their new files next to it), runs Round(kind), then drops
  // the ceiling's files (PlainIo::RemoveWriteFiles).
  Status WriteRound(CeilingKind kind, const std::string& checkpoint, bool keep_checkpoint = false);
  // The ceiling of `kind` over the rounds run so far (empty when none).
  Ceiling Get(CeilingKind kind) const;
  // Get of every kind.
  SaveLoadCeilings GetAll() const;

 private:
  struct Kind {
    std::vector<CeilingConfig> configs;
    std::vector<std::vector<double>> secs;
    int rounds = 0;
  };
  PlainIo& io_;
  int n_, warmup_;
  Kind kinds_[kCeilingKinds];
};

// Measures `kind` in each of CeilingConfigs(kind, n), interleaved: warmup +
// reps rounds, GB/s of io.bytes(); the best median wins.
Result<Ceiling> MeasureCeiling(PlainIo& io, CeilingKind kind, int n, int warmup, int reps);
// Builds a Ceiling from per-configuration seconds gathered elsewhere
// (interleaved rounds): `secs[i]` belongs to configs[i].
Ceiling CeilingFromSeconds(CeilingKind kind, const std::vector<CeilingConfig>& configs,
                           const std::vector<std::vector<double>>& secs, uint64_t bytes);

// A ratio ours/ceiling above this means the ceiling is not a limit: the bench
// prints kCeilingTooLow next to it and sets "<key>_ceiling_too_low" in JSON.
constexpr double kCeilingSlack = 1.05;
constexpr const char* kCeilingTooLow = "  !! ceiling too low";

// JSON of a ceiling under `key` (e.g. "pagecache_write_gbps", stem
// "pagecache_write"): key, key_min, key_max = the best; stem_parallelism = its
// parallelism; stem_<CeilingIoName> = its I/O size (not for memcpy);
// stem_gbps_by_parallelism = {"1": median, "2": ..., "N": ...} (each at its
// best I/O size); stem_gbps_by_config = {"P/IO_BYTES": median, ...}.
void PutCeiling(nlohmann::json* out, const std::string& key, const Ceiling& c);
// out[ratio_key] = ratio; when ratio > kCeilingSlack also
// out[ratio_key + "_ceiling_too_low"] = true and ratio_key appended to the
// array out["ceiling_too_low"].
void PutRatio(nlohmann::json* out, const std::string& ratio_key, double ratio);
// out[ratio_key + "_paired"] = paired.median, and _paired_min, _paired_max
// (PairedRatio); nothing when paired has no runs.
void PutPairedRatio(nlohmann::json* out, const std::string& ratio_key, const Summary& paired);

// out[key] = s.median, out[key + "_min"] = s.min, out[key + "_max"] = s.max.
void PutSummary(nlohmann::json* out, const std::string& key, const Summary& s);

// The four timed rows of a save/load bench (bench dcp, bench mega): seconds of
// each measured repetition, in order, each run right after its ceiling round;
// and for each save, its commit as the caller waits for it
// (CommitAfterLastWrite).
struct SaveLoadSeconds {
  std::vector<double> save, save_nosync, load, load_unverified;
  std::vector<double> save_commit, save_nosync_commit;
};
// One save row of bench dcp / bench mega: warmup + reps times `before()` (the
// row's ceiling round, untimed), then `save()` -> {seconds, commit seconds};
// the warm-up's are dropped, the rest appended to `seconds` and `commits`.
// Stops at the first error.
Status TimeSaveRow(int warmup, int reps, const std::function<Status()>& before,
                   const std::function<Result<std::pair<double, double>>()>& save,
                   std::vector<double>* seconds, std::vector<double>* commits);
// The two load rows of bench dcp / bench mega: warmup + reps times `before()`
// (the warm-read round, untimed), one untimed `load(true)`, then
// `load(verified)` once each way -> seconds, in turns: the verified load
// first in odd repetitions (the warm-up is repetition 0), the unverified one
// first in even ones. The untimed load is there because on this VM memory
// left alone for a second or more costs more at its next touch: a load after
// 3 s with neither the checkpoint's page cache nor the destinations touched
// (the round reads its own file into its own buffer) ran at 0.82-0.88 of the
// load right after it, and 0.98 once both were touched again. The ceiling's
// timed reads each follow reads of the same file into the same buffer, so
// the loads are timed with their memory as warm (docs/benchmarks.md, "The
// load right after the warm-read round" and "Memory left idle"). The
// warm-up's are dropped, the rest appended to `verified` and `unverified`.
// Stops at the first error.
Status TimeLoadRows(int warmup, int reps, const std::function<Status()>& before,
                    const std::function<Result<double>(bool verified)>& load,
                    std::vector<double>* verified, std::vector<double>* unverified);
// Those rows in GB/s, and each repetition over the ceiling round before it;
// the commits in seconds.
struct SaveLoadRows {
  Summary save, save_nosync, load, load_unverified;
  // The same rows' measured repetitions, in order (GB/s): the JSON's
  // <row>_gbps_by_rep, next to <ceiling>_gbps_by_round, so a bimodal row can be
  // told from a noisy one and each repetition read against its own round.
  std::vector<double> save_by_rep, save_nosync_by_rep, load_by_rep, load_unverified_by_rep;
  Summary save_paired, nosync_paired, load_paired, unverified_paired;
  Summary nosync_checksummed_paired;  // no-sync saves over the checksummed-write rounds
  Summary save_commit, nosync_commit;
};

// The commit of one save as its caller waits for it: the commit_seconds of the
// rank whose data was written last (largest plan_seconds + write_seconds), i.e.
// from the last rank's last data byte to the save's return. `ranks`: every
// rank's SaveStats of that save; 0 when empty.
double CommitAfterLastWrite(const std::vector<dcp::SaveStats>& ranks);
// "  <label>  min / median / max ms" for a row of such commits.
std::string CommitRow(const std::string& label, const Summary& seconds);
SaveLoadRows SaveLoadRowsFrom(const SaveLoadSeconds& secs, uint64_t bytes,
                              const SaveLoadCeilings& c);
// Puts the rows (save_gbps, save_nosync_gbps, load_gbps, load_unverified_gbps,
// save_commit_seconds, save_nosync_commit_seconds with PutSummary), the ceilings
// (PutSaveLoadCeilings), ceiling_parallelism, each row over its ceiling as a ratio of medians
// (PutRatio: save_vs_durable_write, save_nosync_vs_pagecache_write, load_vs_pagecache_read,
// load_unverified_vs_pagecache_read; with a checksummed-write reference also
// save_nosync_vs_checksummed_write) and per repetition (PutPairedRatio),
// load_verified_vs_unverified, and fresh_writes_primed (FreshWritesPrimed).
void PutSaveLoadRows(nlohmann::json* out, const SaveLoadRows& r, const SaveLoadCeilings& c,
                     int parallelism);

// Puts durable_write_gbps, pagecache_write_gbps, pagecache_read_gbps (and
// memcpy_gbps, checksummed_write_gbps when measured) with PutCeiling.
void PutSaveLoadCeilings(nlohmann::json* out, const SaveLoadCeilings& c);
// The table row of a ceiling: "<label> (P thr)" (the winning parallelism),
// FormatRow's columns, then the winning I/O size ("1 MiB preads").
std::string CeilingRow(const std::string& label, const Ceiling& c);

// "warm read: best of 1/2/4 threads x 1/4/64 MiB preads is 2 thr, 4 MiB
// (1: 5.20, 2: 7.10, 4: 6.90 GB/s)", a table footnote.
std::string DescribeCeiling(const Ceiling& c);
// "1 MiB", "64 MiB", "4096 B".
std::string IoSizeText(uint64_t bytes);
// "2 thr" or "2 thr, 4 MiB": a configuration, and a ceiling's winning one.
std::string ConfigText(const CeilingConfig& c);
std::string BestConfigText(const Ceiling& c);

// Peak resident set size of this process in bytes (VmHWM), and a reset of the
// peak (writes 5 to /proc/self/clear_refs; returns false when not permitted).
uint64_t PeakRssBytes();
uint64_t CurrentRssBytes();
bool ResetPeakRss();

// Fills `n` bytes with deterministic pseudo-random data (splitmix64 of seed).
void FillRandom(void* data, size_t n, uint64_t seed);

// A pre-faulted buffer of `bytes` (at least 1) of `pages` that starts on a
// 4 KiB page, as O_DIRECT writes from it need (CeilingConfig::direct): core
// AllocateBuffer gives small buffers only 64-byte alignment.
Result<std::shared_ptr<std::byte>> AllocatePageAligned(uint64_t bytes,
                                                       StatePages pages = StatePages::kHuge);

// The benches' temp folders: "<prefix>-XXXXXX" under $TMPDIR (or /tmp),
// removed with their contents on destruction (core/test_files.h).
using TempDir = test_util::TempDir;

// Formats a table row: name, then "min / median / max" and an optional ratio
// (median / ratio_to); a ratio above kCeilingSlack gets kCeilingTooLow appended.
// With `paired` (runs > 0), the per-repetition ratios follow: "[min med max]".
std::string FormatRow(const std::string& name, const Summary& s, double ratio_to = 0,
                      const Summary& paired = Summary{});

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_BENCH_UTIL_H_
