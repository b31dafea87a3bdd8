// The bench harness's row timing (bench/bench_util.h): which repetitions are
// kept and in what order the two load rows run after each ceiling round.
#include "bench_util.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace megackpt::bench {
namespace {

TEST(TimeLoadRows, TakesTurnsAfterEachRoundAndDropsTheWarmUp) {
  std::vector<std::string> events;
  double next = 1;
  std::vector<double> verified, unverified;
  ASSERT_TRUE(TimeLoadRows(
                  1, 4,
                  [&] {
                    events.push_back("round");
                    return Status::OK();
                  },
                  [&](bool v) -> Result<double> {
                    events.push_back(v ? "verified" : "unverified");
                    return (v ? 100 : 0) + next++;
                  },
                  &verified, &unverified)
                  .ok());
  const std::vector<std::string> want = {
      "round", "unverified", "verified",    // warm-up (repetition 0), dropped
      "round", "verified",   "unverified",  // 1
      "round", "unverified", "verified",    // 2
      "round", "verified",   "unverified",  // 3
      "round", "unverified", "verified"};   // 4
  EXPECT_EQ(events, want);
  // Seconds 1, 2 went to the warm-up; each row keeps its own calls' values.
  EXPECT_EQ(verified, (std::vector<double>{103, 106, 107, 110}));
  EXPECT_EQ(unverified, (std::vector<double>{4, 5, 8, 9}));
}

TEST(TimeLoadRows, StopsAtTheFirstError) {
  int loads = 0;
  std::vector<double> verified, unverified;
  Status s = TimeLoadRows(
      0, 3, [] { return Status::OK(); },
      [&](bool) -> Result<double> {
        if (++loads == 3) return IOError("load 3 failed");
        return 1.0;
      },
      &verified, &unverified);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.ToString().find("load 3 failed"), std::string::npos);
  EXPECT_EQ(loads, 3);
  EXPECT_EQ(verified.size(), 1u);  // repetition 0 only
  EXPECT_EQ(unverified.size(), 1u);

  Status round_error = TimeLoadRows(
      0, 2, [] { return InternalError("round failed"); },
      [&](bool) -> Result<double> { return 1.0; }, &verified, &unverified);
  EXPECT_EQ(round_error.code(), StatusCode::kInternal);
  EXPECT_EQ(verified.size(), 1u);
}

}  // namespace
}  // namespace megackpt::bench
