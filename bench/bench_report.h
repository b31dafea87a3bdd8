// What the state benchmarks (`megackpt bench dcp|incremental|reshard|...`)
// share besides measuring: their common options and how a finished run is
// reported.
#ifndef MEGACKPT_BENCH_BENCH_REPORT_H_
#define MEGACKPT_BENCH_BENCH_REPORT_H_

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "bench_util.h"  // TempDir
#include "megackpt/core/status.h"

namespace megackpt::bench {

// The options of a benchmark of a state of `size` bytes (the CLI binds them
// to --size, --reps, --threads, --dir, --json).
struct StateBenchOptions {
  uint64_t size = 2ull << 30;  // state bytes
  int reps = 5;                // measured repetitions after one dropped warm-up
  int threads = 2;             // I/O threads per rank
  bool json = false;
  std::string dir;  // empty: a temp folder under $TMPDIR or /tmp
};

// The folder of a run's checkpoints: `dir` when given, else a fresh temp
// folder "<prefix>-XXXXXX" (bench_util.h TempDir) that *holder owns.
std::string BenchDir(const std::string& dir, const std::string& prefix,
                     std::unique_ptr<TempDir>* holder);

// Reports the run of `megackpt bench NAME`, as the CLI reports a command: a
// failed `s` as "megackpt: error: bench NAME: CODE: message" on stderr and, with
// `json`, as {"error": {"code", "message"}} on stdout (returns 1); otherwise
// `out` as JSON (indent 2) when `json`, else `table`, on stdout (returns 0).
// stdout is flushed before it returns.
int PrintBenchResult(std::string_view name, const Status& s, const nlohmann::json& out,
                     const std::string& table, bool json);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_BENCH_REPORT_H_
