// The bench harness's row timing (bench/bench_util.h): which repetitions are
// kept and in what order the two load rows run after each ceiling round.
#include "bench_util.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace megackpt::bench {
namespace {

TEST(TimeLoadRows, SettlesThenTakesTurnsAfterEachRoundAndDropsTheWarmUp) {
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
  // After each round one untimed verified load (the settling load), then the
  // two timed loads in turns.
  const std::vector<std::string> want = {
      "round", "verified", "unverified", "verified",    // warm-up (repetition 0), dropped
      "round", "verified", "verified",   "unverified",  // 1
      "round", "verified", "unverified", "verified",    // 2
      "round", "verified", "verified",   "unverified",  // 3
      "round", "verified", "unverified", "verified"};   // 4
  EXPECT_EQ(events, want);
  // Calls 1-3 went to the warm-up and every settling load's value is dropped;
  // each row keeps its own timed calls' values.
  EXPECT_EQ(verified, (std::vector<double>{105, 109, 111, 115}));
  EXPECT_EQ(unverified, (std::vector<double>{6, 8, 12, 14}));
}

TEST(TimeLoadRows, StopsAtTheFirstError) {
  int loads = 0;
  std::vector<double> verified, unverified;
  Status s = TimeLoadRows(
      0, 3, [] { return Status::OK(); },
      [&](bool) -> Result<double> {
        if (++loads == 5) return IOError("load 5 failed");
        return 1.0;
      },
      &verified, &unverified);
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.ToString().find("load 5 failed"), std::string::npos);
  EXPECT_EQ(loads, 5);
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
