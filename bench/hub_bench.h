// `megackpt bench hub`: checkpoint save/load through mega:// (embedded hub and
// a megahub on loopback) next to a local path and the page-cache limits
// measured in the same run, plus the second version (10% of files changed):
// bytes uploaded and time.
#ifndef MEGACKPT_BENCH_HUB_BENCH_H_
#define MEGACKPT_BENCH_HUB_BENCH_H_

#include <cstdint>
#include <string>

#include "megackpt/core/status.h"

namespace megackpt::bench {

struct HubBenchOptions {
  uint64_t bytes = 256ull << 20;  // checkpoint size (20 files)
  int warmup = 1;
  int reps = 5;
  std::string megahub;  // path of the megahub binary ("" = skip the remote rows)
  bool json = false;
};

// Runs the benchmark and returns the table (or JSON) to print.
Result<std::string> RunHubBench(const HubBenchOptions& options);

struct HubLoadOptions {
  int clients = 16;
  double seconds = 15;               // bounded duration
  uint64_t file_bytes = 256 * 1024;  // per push (new content each round)
  std::string megahub;               // path of the megahub binary (required)
  bool json = false;
};

// `megackpt bench hub-load`: starts a megahub on loopback, runs `clients`
// threads that each push a file (one commit) and pull it back in a loop for
// `seconds`, and reports operations/s, MB/s, errors (must be 0) and the
// server's peak RSS. Fails when any operation failed.
Result<std::string> RunHubLoad(const HubLoadOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_HUB_BENCH_H_
