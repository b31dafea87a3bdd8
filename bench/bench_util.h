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

// Machine limits, measured with the same repetitions:
// memcpy between two pre-faulted buffers of `bytes` (single thread).
Result<Summary> MemcpyGbps(uint64_t bytes, int warmup, int reps);
// Writing `bytes` from a pre-faulted buffer to a new file at `path` with large
// writes, optionally followed by fdatasync (durable); PrepareFreshWrite before
// every run. The file is removed after.
Result<Summary> FileWriteGbps(const std::string& path, uint64_t bytes, bool sync, int warmup,
                              int reps);
// Reading a cached file of `bytes` into a reused, pre-faulted buffer with pread.
Result<Summary> FileReadGbps(const std::string& path, uint64_t bytes, int warmup, int reps);

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

// Formats a table row: name, then "min / median / max" and an optional ratio.
std::string FormatRow(const std::string& name, const Summary& s, double ratio_to = 0);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_BENCH_UTIL_H_
