// Shared measurement helpers for the benchmark programs (`megackpt bench ...`).
//
// Method (DESIGN.md, performance model): measure the machine's limit and the
// library the same way — same process, same memory setup, same size — drop the
// first repetition, report min/median/max of the rest. Throughput is decimal
// GB/s (1e9 bytes per second).
#ifndef MEGACKPT_BENCH_BENCH_UTIL_H_
#define MEGACKPT_BENCH_BENCH_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "megackpt/core/status.h"

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

// Untimed preparation of every measured write, limits and ours alike: removes
// `path` (a file or a folder) and writes back all dirty pages (sync(2)), so each
// timed write starts from the same state — an empty target and no dirty data
// from earlier runs that would throttle it (the kernel's dirty-page limits are
// ~10-20% of RAM, about the size of two 2 GiB runs).
void PrepareFreshWrite(const std::string& path);

// Converts seconds to GB/s for `bytes` bytes.
std::vector<double> ToGbps(const std::vector<double>& seconds, uint64_t bytes);

double NowSeconds();

// Single-thread machine limits, for the single-stream paths (cas, hub); the
// DCP benches use the parallel ceilings below. Measured through PlainIo at
// parallelism 1, with the same repetitions:
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
// compared with: the best (highest median) of 1, 2 and N plain writers/readers,
// N = ranks x I/O threads of the measured path, over the same total size.
//  - kPageCacheWrite: W threads each write bytes/W from a pre-faulted buffer to
//    its own new file (64 MiB pwrites); PrepareFreshWrite before every run.
//  - kDurableWrite: the same, each writer fdatasyncs its file at the end and,
//    like the library's durable save paths (fs and MEGA storage), starts
//    writeback of every finished kDurableWritebackUnit with
//    sync_file_range(SYNC_FILE_RANGE_WRITE) (pwrites of that size), so the
//    device works while the next bytes are copied. Without the hint the plain
//    writer leaves all writeback to fdatasync and is not a limit for paths
//    that overlap it (they measured up to 1.2x "the ceiling").
//  - kWarmRead: W threads pread byte ranges of one cached file of `bytes` into a
//    reused, pre-faulted buffer.
//  - kMemcpy: W threads each copy bytes/W between two pre-faulted buffers.
// Separate files for writers: buffered writes to one ext4 file serialize on the
// inode lock, so W files is what W plain writers can do.
// Writeback unit of the durable ceiling: the 32 MiB of the library's durable
// save paths (kWritebackUnit in dcp/filesystem.cc and dcp/mega_storage.cc).
constexpr uint64_t kDurableWritebackUnit = 32ull << 20;

enum class CeilingKind { kPageCacheWrite, kDurableWrite, kWarmRead, kMemcpy };

// "page-cache write", "write + fdatasync", "warm read", "memcpy".
const char* CeilingName(CeilingKind kind);

// {1, 2, n} without duplicates, ascending (n <= 0 counts as 1).
std::vector<int> CeilingParallelisms(int n);

// The plain I/O the ceilings time: owns (or borrows) a pre-faulted source and
// destination buffer of `bytes` and the files `prefix`.0, .1, ... (write) and
// `prefix`.read (read). Removes its files on destruction.
class PlainIo {
 public:
  // Allocates and pre-faults both buffers (source filled with random bytes).
  static Result<std::unique_ptr<PlainIo>> Create(std::string prefix, uint64_t bytes);
  // Borrows the caller's buffers (each at least `bytes`), which must outlive this.
  PlainIo(std::string prefix, uint64_t bytes, const std::byte* src, std::byte* dst);
  ~PlainIo();
  PlainIo(const PlainIo&) = delete;
  PlainIo& operator=(const PlainIo&) = delete;

  uint64_t bytes() const { return bytes_; }
  // Untimed preparation of a write by up to `writers` writers: removes every
  // write file that may exist, then sync(2) (as PrepareFreshWrite).
  void PrepareWrite(int writers = 0);
  // Writers files of bytes/writers each, in parallel; fdatasync each when durable.
  Status Write(int writers, bool durable);
  // Creates the read file (once; later calls return at once).
  Status EnsureReadFile();
  // `readers` threads pread byte ranges of the read file into the destination.
  // REQUIRES: EnsureReadFile() succeeded.
  Status Read(int readers);
  // `threads` threads copy byte ranges of the source into the destination.
  Status Memcpy(int threads);
  // One untimed-preparation + timed run of `kind` at `parallelism`: seconds.
  Result<double> TimeOnce(CeilingKind kind, int parallelism);

 private:
  std::string WritePath(int i) const { return prefix_ + "." + std::to_string(i); }
  std::string prefix_;
  uint64_t bytes_;
  std::shared_ptr<std::byte> own_src_, own_dst_;
  const std::byte* src_;
  std::byte* dst_;
  int max_files_ = 0;  // write files that may exist
  bool read_file_ = false;
};

struct Ceiling {
  CeilingKind kind = CeilingKind::kMemcpy;
  Summary best;          // GB/s of the parallelism with the highest median
  int best_parallelism = 1;
  std::vector<std::pair<int, Summary>> by_parallelism;  // GB/s for each of 1, 2, N
};

// Measures `kind` at each of CeilingParallelisms(n): warmup + reps runs each,
// GB/s of io.bytes(); the best median wins.
Result<Ceiling> MeasureCeiling(PlainIo& io, CeilingKind kind, int n, int warmup, int reps);
// Builds a Ceiling from per-parallelism seconds gathered elsewhere (interleaved
// rounds): `secs[i]` belongs to parallelisms[i].
Ceiling CeilingFromSeconds(CeilingKind kind, const std::vector<int>& parallelisms,
                           const std::vector<std::vector<double>>& secs, uint64_t bytes);

// A ratio ours/ceiling above this means the ceiling is not a limit: the bench
// prints kCeilingTooLow next to it and sets "<key>_ceiling_too_low" in JSON.
constexpr double kCeilingSlack = 1.05;
constexpr const char* kCeilingTooLow = "  !! ceiling too low";

// JSON of a ceiling under `key` (e.g. "pagecache_write_gbps"): key, key_min,
// key_max = the best; key_writers = its parallelism; key_by_parallelism =
// {"1": median, "2": ..., "N": ...}.
void PutCeiling(nlohmann::json* out, const std::string& key, const Ceiling& c);
// out[ratio_key] = ratio; when ratio > kCeilingSlack also
// out[ratio_key + "_ceiling_too_low"] = true and ratio_key appended to the
// array out["ceiling_too_low"].
void PutRatio(nlohmann::json* out, const std::string& ratio_key, double ratio);

// The ceilings of a checkpoint save/load bench (bench dcp, bench mega), in
// this order: write + fdatasync, page-cache write, warm read, and (when
// `memcpy`) memcpy, each MeasureCeiling at parallelism n over `bytes`, in
// files `prefix`.*; every buffer is freed before returning.
struct SaveLoadCeilings {
  Ceiling durable, pagecache_write, warm_read, memcpy;
};
Result<SaveLoadCeilings> MeasureSaveLoadCeilings(const std::string& prefix, uint64_t bytes, int n,
                                                 int warmup, int reps, bool memcpy);
// Puts durable_write_gbps, pagecache_write_gbps, pagecache_read_gbps (and
// memcpy_gbps when measured) with PutCeiling.
void PutSaveLoadCeilings(nlohmann::json* out, const SaveLoadCeilings& c);
// Table rows of the ceilings: "ceiling: <name> (best: P thr)" and a footnote
// line per ceiling with DescribeCeiling.
std::string CeilingRow(const std::string& label, const Ceiling& c);

// "best of 1/2/4 threads: 2 (1: 5.20, 2: 7.10, 4: 6.90 GB/s)", a table footnote.
std::string DescribeCeiling(const Ceiling& c);

// Peak resident set size of this process in bytes (VmHWM), and a reset of the
// peak (writes 5 to /proc/self/clear_refs; returns false when not permitted).
uint64_t PeakRssBytes();
uint64_t CurrentRssBytes();
bool ResetPeakRss();

// Fills `n` bytes with deterministic pseudo-random data (splitmix64 of seed).
void FillRandom(void* data, size_t n, uint64_t seed);

// A temp folder under $TMPDIR (or /tmp) removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "megackpt-bench");
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Formats a table row: name, then "min / median / max" and an optional ratio
// (median / ratio_to); a ratio above kCeilingSlack gets kCeilingTooLow appended.
std::string FormatRow(const std::string& name, const Summary& s, double ratio_to = 0);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_BENCH_UTIL_H_
