// `megackpt bench reshard` (bench/reshard_bench.cc): loads with verification
// on (the default) and off, at the save's world size and resharded to another
// one, for fs and MEGA storage, with the bytes each load read.
#ifndef MEGACKPT_BENCH_RESHARD_BENCH_H_
#define MEGACKPT_BENCH_RESHARD_BENCH_H_

#include <string>

#include "bench_report.h"

namespace megackpt::bench {

struct ReshardBenchOptions : StateBenchOptions {
  int save_world = 2;            // ranks that save (threads backend)
  int load_world = 3;            // ranks of the resharded load
  std::string storage = "both";  // "fs", "mega" or "both"
};

// Prints a table (or one JSON object). Returns the exit code.
int RunReshardBench(const ReshardBenchOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_RESHARD_BENCH_H_
