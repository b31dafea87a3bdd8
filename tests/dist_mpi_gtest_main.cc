// main() for gtest programs launched by mpirun (tests/cmake/mpi.cmake).
//
// - MPI is initialized through NewMpiProcessGroup() (which also finalizes it at
//   exit), so test bodies just create their own groups.
// - Rank 0 prints the usual gtest output; other ranks print only their failures,
//   each line tagged "[rank R]", so a 4-rank log stays readable.
// - At the end the ranks combine their results with AllReduceStatus(): every rank
//   exits non-zero when any rank had a failing test, and rank 0 names the ranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "megackpt/dist/process_group.h"

namespace {

// Prints failed assertions and failed tests of a non-zero rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  megackpt::dist::ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(30);
  auto group = megackpt::dist::NewMpiProcessGroup(options);
  if (!group.ok()) {
    std::fprintf(stderr, "cannot start MPI: %s\n", group.status().ToString().c_str());
    return 1;
  }
  const int rank = (*group)->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  const int failed = ::testing::UnitTest::GetInstance()->failed_test_count();
  megackpt::Status local =
      rc == 0 ? megackpt::Status::OK()
              : megackpt::InternalError(std::to_string(failed) + " test(s) failed");
  megackpt::Status all = (*group)->AllReduceStatus(local);
  if (rank == 0) {
    std::printf("[mpi] world_size=%d combined result: %s\n", (*group)->world_size(),
                all.ToString().c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return all.ok() && rc == 0 ? 0 : 1;
}
