// `megackpt bench hub`: checkpoint save/load through mega:// (embedded hub and
// a megahub on loopback) next to a local path and the page-cache limits
// measured in the same run, plus the second version (10% of files changed):
// bytes uploaded and time.
#ifndef MEGACKPT_BENCH_HUB_BENCH_H_
#define MEGACKPT_BENCH_HUB_BENCH_H_

#include <cstdint>
#include <string>

#include "megackpt/status.h"

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

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_HUB_BENCH_H_
