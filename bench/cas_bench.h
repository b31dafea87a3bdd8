// `megackpt bench cas`: chunking, hashing, compression, upload and download
// throughput of the CAS engine next to memcpy and page-cache limits measured in
// the same run; optionally the dedup scenario at checkpoint scale.
#ifndef MEGACKPT_BENCH_CAS_BENCH_H_
#define MEGACKPT_BENCH_CAS_BENCH_H_

#include <cstdint>
#include <string>

#include "megackpt/core/status.h"

namespace megackpt::bench {

struct CasBenchOptions {
  uint64_t size = 256ull << 20;  // bytes of the test file
  int warmup = 1;
  int reps = 5;
  std::string dir;  // temp folder for files and stores ("" = $TMPDIR)
  bool json = false;
  bool sync = false;        // fsync xorbs in the put measurement
  uint64_t dedup_size = 0;  // > 0: also run the dedup scenario at this size
};

// Runs the benchmark and returns the table (or JSON) to print.
Result<std::string> RunCasBench(const CasBenchOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_CAS_BENCH_H_
