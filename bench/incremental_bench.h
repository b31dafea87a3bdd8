// `megackpt bench incremental` (bench/incremental_bench.cc).
#ifndef MEGACKPT_BENCH_INCREMENTAL_BENCH_H_
#define MEGACKPT_BENCH_INCREMENTAL_BENCH_H_

#include <string>

#include "bench_report.h"

namespace megackpt::bench {

struct IncrementalBenchOptions : StateBenchOptions {
  double changed = 0.1;  // fraction of the tensors changed between the two saves
  int world_size = 1;    // threads backend
};

// Prints a table (or one JSON object). Returns the exit code.
int RunIncrementalBench(const IncrementalBenchOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_INCREMENTAL_BENCH_H_
