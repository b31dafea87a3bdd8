// `megackpt bench dcp` (bench/dcp_bench.cc).
#ifndef MEGACKPT_BENCH_DCP_BENCH_H_
#define MEGACKPT_BENCH_DCP_BENCH_H_

#include <cstdint>
#include <string>

#include "bench_util.h"  // StatePages

namespace megackpt::bench {

struct DcpBenchOptions {
  uint64_t size = 2ull << 30;       // state bytes
  int world_size = 1;               // threads backend; MPI takes mpirun's size
  std::string backend = "threads";  // "threads" or "mpi"
  int reps = 5;
  bool json = false;
  std::string dir;                       // empty: a temp folder under $TMPDIR or /tmp
  int threads = 2;                       // I/O threads per rank
  bool direct_io = false;                // durable saves: FileSystemWriterOptions::direct_io
  StatePages pages = StatePages::kHuge;  // of the state and the ceilings' buffers
  bool over_previous = false;  // every save writes over the previous one (--over-previous)
};

// Runs the benchmark and prints a table (or JSON on rank 0). Returns the exit code.
int RunDcpBench(const DcpBenchOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_DCP_BENCH_H_
