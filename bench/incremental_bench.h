// `megackpt bench incremental` (bench/incremental_bench.cc).
#ifndef MEGACKPT_BENCH_INCREMENTAL_BENCH_H_
#define MEGACKPT_BENCH_INCREMENTAL_BENCH_H_

#include <cstdint>
#include <string>

namespace megackpt::bench {

struct IncrementalBenchOptions {
  uint64_t size = 2ull << 30;  // state bytes
  double changed = 0.1;        // fraction of the tensors changed between the two saves
  int world_size = 1;          // threads backend
  int reps = 5;
  int threads = 2;             // I/O threads per rank
  bool json = false;
  std::string dir;             // empty: a temp folder under $TMPDIR or /tmp
};

// Prints a table (or one JSON object). Returns the exit code.
int RunIncrementalBench(const IncrementalBenchOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_INCREMENTAL_BENCH_H_
