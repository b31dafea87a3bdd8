// A rank leaves the job early; the others must get an error in bounded time.
// A plain-main MPI program (tests/cmake/mpi.cmake registers one ctest per scenario):
//
//   dist_mpi_early_exit return   the last rank returns from main() (MPI_Finalize via
//                                atexit) without joining the second Barrier. It stays
//                                alive inside MPI_Finalize, so the launcher does not
//                                interfere: the others must get DeadlineExceeded
//                                after the 1 s timeout, then everyone finalizes and
//                                the job exits 0. Deterministic.
//   dist_mpi_early_exit kill     the last rank SIGKILLs itself. With OpenMPI's default
//                                policy mpirun kills the whole job within about a
//                                second; the survivors use a 20 s timeout so the
//                                launcher is what ends them ("exited on signal 9").
//   dist_mpi_early_exit kill-recovery
//                                as kill, for `mpirun --enable-recovery` (the launcher
//                                keeps survivors alive): they must get
//                                DeadlineExceeded after the 1 s timeout.
//   dist_mpi_early_exit exit-recovery
//                                the last rank _exit(0)s without MPI_Finalize under
//                                --enable-recovery: survivors get DeadlineExceeded,
//                                then MPI_Finalize would wait forever for the dead
//                                rank; megackpt's finalize watchdog ends them.
//
// Each survivor prints "rank R: PASS ..." or "rank R: FAIL ..." and exits 0 / 1.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>

#include "megackpt/dist/process_group.h"

namespace {

using Clock = std::chrono::steady_clock;

int Run(const std::string& mode) {
  const bool launcher_kills = mode == "kill";
  megackpt::dist::ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(launcher_kills ? 20000 : 1000);
  auto group = megackpt::dist::NewMpiProcessGroup(options);
  if (!group.ok()) {
    std::printf("FAIL: %s\n", group.status().ToString().c_str());
    return 1;
  }
  megackpt::dist::ProcessGroup& g = **group;
  const int me = g.rank();
  const int last = g.world_size() - 1;
  if (g.world_size() < 2) {
    std::printf("rank %d: FAIL: needs at least 2 ranks\n", me);
    return 1;
  }
  if (megackpt::Status s = g.Barrier(); !s.ok()) {
    std::printf("rank %d: FAIL: first barrier: %s\n", me, s.ToString().c_str());
    return 1;
  }
  if (me == last) {
    std::fflush(stdout);
    if (mode == "return") return 0;
    if (mode == "kill" || mode == "kill-recovery") raise(SIGKILL);
    if (mode == "exit-recovery") _exit(0);
    std::printf("rank %d: FAIL: unknown mode '%s'\n", me, mode.c_str());
    return 1;
  }
  const auto start = Clock::now();
  const megackpt::Status s = g.Barrier();
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  const double bound = options.timeout.count() / 1000.0 + 2.0;
  const bool pass = s.code() == megackpt::StatusCode::kDeadlineExceeded && waited < bound;
  std::printf("rank %d: %s: second barrier after %.2f s (bound %.1f s): %s\n", me,
              pass ? "PASS" : "FAIL", waited, bound, s.ToString().c_str());
  std::fflush(stdout);
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s return|kill|kill-recovery|exit-recovery\n", argv[0]);
    return 2;
  }
  return Run(argv[1]);
}
