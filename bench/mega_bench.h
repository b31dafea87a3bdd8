// `megackpt bench mega` (bench/mega_bench.cc): MegaStorageWriter/Reader next to
// the machine's limits; bench/torch_peer.py prints torch's numbers for the same state.
#ifndef MEGACKPT_BENCH_MEGA_BENCH_H_
#define MEGACKPT_BENCH_MEGA_BENCH_H_

#include <cstdint>
#include <string>

#include "bench_util.h"  // StatePages

namespace megackpt::bench {

struct MegaBenchOptions {
  uint64_t size = 2ull << 30;            // state bytes
  int world_size = 1;                    // ranks (threads backend; MPI takes mpirun's size)
  std::string backend = "threads";       // "threads" or "mpi" (run under mpirun)
  int reps = 5;                          // measured repetitions after one dropped warm-up
  int threads = 2;                       // I/O threads per rank
  int tensors = 16;                      // F32 tensors of size/tensors bytes, row-sharded
  bool direct_io = false;                // durable saves: MegaStorageWriterOptions::direct_io
  StatePages pages = StatePages::kHuge;  // of the state and the ceilings' buffers
  bool over_previous = false;  // every save writes over the previous one (--over-previous)
  bool json = false;
  std::string dir;  // empty: a temp folder under $TMPDIR or /tmp
};

// Runs the benchmark, prints a table or one JSON object; returns the exit code
// (0 ok, 1 failure).
int RunMegaBench(const MegaBenchOptions& options);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_MEGA_BENCH_H_
