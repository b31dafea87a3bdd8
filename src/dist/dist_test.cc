// Tests of the wire encodings, the single-process backend and the threads backend.
// The MPI backend is tested under mpirun by tests/dist_mpi_collectives.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dist/test_util.h"
#include "dist/wire.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dist {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using dist_test::Blob;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---------------------------------------------------------------- wire

TEST(DistWire, StatusRoundTripsEveryCode) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kIOError); ++c) {
    const Status s(static_cast<StatusCode>(c),
                   c == 0 ? "" : "message \xff\x00 of code " + std::to_string(c));
    Status back = InternalError("not set");
    ASSERT_TRUE(dist::DecodeStatus(dist::EncodeStatus(s), &back).ok());
    EXPECT_EQ(back, s);
  }
}

TEST(DistWire, StatusDecodeRejectsMalformed) {
  Status out;
  EXPECT_EQ(dist::DecodeStatus("", &out).code(), StatusCode::kDataLoss);
  EXPECT_EQ(dist::DecodeStatus(std::string("\x01\x00\x05", 3), &out).code(),
            StatusCode::kDataLoss);  // truncated header
  std::string bad_version = dist::EncodeStatus(NotFoundError("x"));
  bad_version[0] = 2;
  EXPECT_THAT(dist::DecodeStatus(bad_version, &out).message(), HasSubstr("version 2"));
  std::string bad_code = dist::EncodeStatus(NotFoundError("x"));
  bad_code[2] = 99;
  EXPECT_THAT(dist::DecodeStatus(bad_code, &out).message(), HasSubstr("unknown status code"));
  std::string ok_with_message = dist::EncodeStatus(Status::OK()) + "junk";
  EXPECT_EQ(dist::DecodeStatus(ok_with_message, &out).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(out.ok()) << "a failed decode must leave the output alone";
}

TEST(DistWire, BlobListRoundTrips) {
  for (const std::vector<std::string>& blobs :
       {std::vector<std::string>{}, std::vector<std::string>{""},
        std::vector<std::string>{"a", "", std::string(1000, 'x'), Blob(3, 70000)}}) {
    Result<std::vector<std::string>> back = dist::UnpackBlobs(dist::PackBlobs(blobs));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, blobs);
  }
}

TEST(DistWire, BlobListRejectsMalformed) {
  const std::string good = dist::PackBlobs({"abc", "de"});
  EXPECT_EQ(dist::UnpackBlobs("").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(dist::UnpackBlobs(good.substr(0, good.size() - 1)).status().code(),
            StatusCode::kDataLoss);
  EXPECT_THAT(dist::UnpackBlobs(good + "z").status().message(), HasSubstr("trailing"));
  std::string huge_count = good;
  huge_count[7] = 0x7f;  // count ~ 2^62
  EXPECT_THAT(dist::UnpackBlobs(huge_count).status().message(), HasSubstr("count"));
  std::string huge_len = good;
  huge_len[8 + 7] = 0x7f;  // first length ~ 2^62
  EXPECT_THAT(dist::UnpackBlobs(huge_len).status().message(), HasSubstr("exceeds"));
}

TEST(DistWire, CombineTakesLowestFailingRank) {
  EXPECT_TRUE(dist::CombineRankStatuses({Status::OK(), Status::OK()}).ok());
  const Status s = dist::CombineRankStatuses(
      {Status::OK(), Status::OK(), NotFoundError("key 'w' missing"), DataLossError("other")});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "rank 2: key 'w' missing");
}

TEST(DistWire, CombineKeepsARankAlreadyNamed) {
  // Combined once already: the rank named stays, whichever rank passes it on.
  EXPECT_EQ(dist::CombineRankStatuses({IOError("rank 3: disk full"), Status::OK()}).message(),
            "rank 3: disk full");
  // Not a rank prefix: prefixed as usual.
  for (const char* m : {"ranking: off", "rank : x", "rank 2x: y", "rank 12"}) {
    EXPECT_EQ(dist::CombineRankStatuses({Status::OK(), InternalError(m)}).message(),
              std::string("rank 1: ") + m);
  }
}

// ---------------------------------------------------------------- single

TEST(SingleProcessGroup, CollectivesAreLocalCopies) {
  std::unique_ptr<ProcessGroup> g = NewSingleProcessGroup();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->world_size(), 1);
  EXPECT_EQ(g->backend(), "single");
  EXPECT_TRUE(g->Barrier().ok());
  const std::string big = Blob(0, 3 << 20);
  auto gathered = g->Gather(big, 0);
  ASSERT_TRUE(gathered.ok());
  EXPECT_EQ(*gathered, std::vector<std::string>{big});
  auto scattered = g->Scatter({"only"}, 0);
  ASSERT_TRUE(scattered.ok());
  EXPECT_EQ(*scattered, "only");
  auto bcast = g->Broadcast("", 0);
  ASSERT_TRUE(bcast.ok());
  EXPECT_EQ(*bcast, "");
  auto all = g->AllGather("x");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::vector<std::string>{"x"});
  EXPECT_TRUE(g->AllReduceStatus(Status::OK()).ok());
  const Status combined = g->AllReduceStatus(IOError("disk full"));
  EXPECT_EQ(combined.code(), StatusCode::kIOError);
  EXPECT_EQ(combined.message(), "rank 0: disk full");
}

TEST(SingleProcessGroup, BadRootBreaksTheGroup) {
  std::unique_ptr<ProcessGroup> g = NewSingleProcessGroup();
  EXPECT_EQ(g->Broadcast("x", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g->Barrier().code(), StatusCode::kAborted);
  std::unique_ptr<ProcessGroup> h = NewSingleProcessGroup();
  EXPECT_EQ(h->Scatter({"a", "b"}, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h->AllGather("x").status().code(), StatusCode::kAborted);
}

// ---------------------------------------------------------------- threads

ProcessGroupOptions Timeout(milliseconds ms) {
  ProcessGroupOptions o;
  o.timeout = ms;
  return o;
}

void ExpectAllOk(const std::vector<Status>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
  }
}

class ThreadGroupSizes : public ::testing::TestWithParam<int> {};

// Every collective, every root, blob sizes from empty to multi-MiB; each rank checks
// exactly what it received.
TEST_P(ThreadGroupSizes, AllCollectivesDeliverExactBytes) {
  const int n = GetParam();
  const std::vector<size_t> sizes = {0, 1, 4093, size_t{3} << 20};
  std::vector<Status> results = RunThreadRanks(n, [&](ProcessGroup& g) -> Status {
    if (g.world_size() != n || g.backend() != "threads") return InternalError("bad group");
    const int me = g.rank();
    int salt = 0;
    for (size_t size : sizes) {
      for (int root = 0; root < n; ++root) {
        ++salt;
        MEGA_RETURN_IF_ERROR(g.Barrier());
        // Gather
        MEGA_ASSIGN_OR_RETURN(auto gathered, g.Gather(Blob(me, size, salt), root));
        if (me == root) {
          if (gathered.size() != static_cast<size_t>(n)) return InternalError("gather size");
          for (int r = 0; r < n; ++r) {
            if (gathered[r] != Blob(r, size, salt)) return InternalError("gather content");
          }
        } else if (!gathered.empty()) {
          return InternalError("non-root received gather output");
        }
        // Scatter (non-roots pass junk, which must be ignored)
        std::vector<std::string> parts;
        if (me == root) {
          for (int r = 0; r < n; ++r) parts.push_back(Blob(r, size + r, salt));
        } else {
          parts = {"ignored"};
        }
        MEGA_ASSIGN_OR_RETURN(std::string part, g.Scatter(std::move(parts), root));
        if (part != Blob(me, size + me, salt)) return InternalError("scatter content");
        // Broadcast
        MEGA_ASSIGN_OR_RETURN(std::string b,
                              g.Broadcast(me == root ? Blob(root, size, -salt) : "junk", root));
        if (b != Blob(root, size, -salt)) return InternalError("broadcast content");
      }
      MEGA_ASSIGN_OR_RETURN(auto all, g.AllGather(Blob(me, size + 3 * me, salt)));
      if (all.size() != static_cast<size_t>(n)) return InternalError("allgather size");
      for (int r = 0; r < n; ++r) {
        if (all[r] != Blob(r, size + 3 * r, salt)) return InternalError("allgather content");
      }
    }
    return Status::OK();
  });
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  ExpectAllOk(results);
}

// A combined status passed on to a second AllReduceStatus (a collective
// operation inside another one) keeps the rank that failed: rank 1's error,
// combined once, comes out of the second round as "rank 1: ...", not as
// "rank 0: rank 1: ..." (rank 0 holds it too, and is the lowest).
TEST(ThreadProcessGroup, AllReduceStatusPassedOnKeepsTheRankThatFailed) {
  for (int n : {2, 3}) {
    std::vector<Status> twice(n);
    std::vector<Status> results = RunThreadRanks(n, [&](ProcessGroup& g) -> Status {
      const Status once = g.AllReduceStatus(
          g.rank() == 1 ? IOError("ckpt/model-00002.mega: disk full") : Status::OK());
      twice[g.rank()] = g.AllReduceStatus(once);
      return Status::OK();
    });
    ExpectAllOk(results);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(twice[r].code(), StatusCode::kIOError) << "world " << n << ", rank " << r;
      EXPECT_EQ(twice[r].message(), "rank 1: ckpt/model-00002.mega: disk full")
          << "world " << n << ", rank " << r;
    }
  }
}

TEST_P(ThreadGroupSizes, AllReduceStatusGivesEveryRankTheLowestFailure) {
  const int n = GetParam();
  std::vector<Status> combined(n);
  std::vector<Status> results = RunThreadRanks(n, [&](ProcessGroup& g) -> Status {
    const int me = g.rank();
    // Round 1: all OK.
    Status s = g.AllReduceStatus(Status::OK());
    if (!s.ok()) return s;
    // Round 2: every rank >= 1 fails with its own code; rank 1 (lowest) wins.
    Status local = me >= 1 ? (me == 1 ? DataLossError("shard_1.bin: crc mismatch at offset 64")
                                      : NotFoundError("other"))
                           : Status::OK();
    combined[me] = g.AllReduceStatus(local);
    return Status::OK();
  });
  ExpectAllOk(results);
  for (int r = 0; r < n; ++r) {
    if (n == 1) {
      EXPECT_TRUE(combined[r].ok());
    } else {
      EXPECT_EQ(combined[r].code(), StatusCode::kDataLoss) << "rank " << r;
      EXPECT_EQ(combined[r].message(), "rank 1: shard_1.bin: crc mismatch at offset 64");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSize, ThreadGroupSizes, ::testing::Values(1, 2, 3, 4));

TEST(ThreadGroup, ManySmallCollectivesStayInStep) {
  // Fast ranks run ahead into the next generation while slow ones still depart.
  std::vector<Status> results = RunThreadRanks(4, [](ProcessGroup& g) -> Status {
    for (int i = 0; i < 500; ++i) {
      MEGA_ASSIGN_OR_RETURN(auto all, g.AllGather(std::to_string(i * 10 + g.rank())));
      for (int r = 0; r < 4; ++r) {
        if (all[r] != std::to_string(i * 10 + r))
          return InternalError("round " + std::to_string(i));
      }
      MEGA_ASSIGN_OR_RETURN(std::string b, g.Broadcast(std::to_string(i), i % 4));
      if (b != std::to_string(i)) return InternalError("broadcast round " + std::to_string(i));
    }
    return Status::OK();
  });
  ExpectAllOk(results);
}

TEST(ThreadGroup, RankErrorAbortsOthersPromptly) {
  const auto start = Clock::now();
  std::vector<Status> results = RunThreadRanks(
      4,
      [](ProcessGroup& g) -> Status {
        MEGA_RETURN_IF_ERROR(g.Barrier());
        if (g.rank() == 2) return IOError("shard_2.bin: write: No space left on device");
        // Rank 2 never arrives: the others must not wait for the 30 s deadline.
        MEGA_RETURN_IF_ERROR(g.Gather("plan", 0).status());
        return InternalError("gather unexpectedly succeeded");
      },
      Timeout(milliseconds(30000)));
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_EQ(results[2].code(), StatusCode::kIOError);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(results[r].code(), StatusCode::kAborted) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("rank 2 failed"));
    EXPECT_THAT(results[r].message(), HasSubstr("No space left on device"));
  }
}

TEST(ThreadGroup, ThrowingRankReportsInternalAndAbortsOthers) {
  const auto start = Clock::now();
  std::vector<Status> results = RunThreadRanks(
      3,
      [](ProcessGroup& g) -> Status {
        MEGA_RETURN_IF_ERROR(g.AllGather("x").status());
        if (g.rank() == 1) throw std::runtime_error("boom in writer");
        return g.Barrier();
      },
      Timeout(milliseconds(30000)));
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_EQ(results[1].code(), StatusCode::kInternal);
  EXPECT_THAT(results[1].message(), HasSubstr("boom in writer"));
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].code(), StatusCode::kAborted) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("rank 1 failed"));
    EXPECT_THAT(results[r].message(), HasSubstr("boom in writer"));
  }
}

TEST(ThreadGroup, StalledRankMakesOthersTimeOutWithinDeadline) {
  // Rank 3 stops calling collectives (sleeps well past the deadline); the others
  // wait at most the 500 ms timeout, all report DeadlineExceeded naming rank 3,
  // and the group stays broken afterwards, also for rank 3 once it wakes up.
  std::vector<double> waited(4, 0);
  std::vector<Status> later(4);
  std::vector<Status> results = RunThreadRanks(
      4,
      [&](ProcessGroup& g) -> Status {
        const int me = g.rank();
        MEGA_RETURN_IF_ERROR(g.Barrier());
        Status s;
        if (me == 3) {
          std::this_thread::sleep_for(milliseconds(1500));
        } else {
          const auto t = Clock::now();
          s = g.Broadcast("meta", 0).status();
          waited[me] = SecondsSince(t);
        }
        const auto t = Clock::now();
        later[me] = g.Barrier();
        if (SecondsSince(t) > 0.3) later[me] = InternalError("broken group was slow to fail");
        return s;
      },
      Timeout(milliseconds(500)));
  EXPECT_TRUE(results[3].ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].code(), StatusCode::kDeadlineExceeded) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("Broadcast #1"));
    EXPECT_THAT(results[r].message(), HasSubstr("waiting for rank(s) 3"));
    EXPECT_GE(waited[r], 0.3) << "rank " << r;
    EXPECT_LT(waited[r], 1.2) << "rank " << r;
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(later[r].code(), StatusCode::kAborted) << "rank " << r << ": " << later[r].ToString();
  }
}

TEST(ThreadGroup, RankReturningEarlyAbortsOthers) {
  const auto start = Clock::now();
  std::vector<Status> results = RunThreadRanks(
      3,
      [](ProcessGroup& g) -> Status {
        MEGA_RETURN_IF_ERROR(g.Barrier());
        if (g.rank() == 0) return Status::OK();  // skips the AllGather below
        return g.AllGather("x").status();
      },
      Timeout(milliseconds(30000)));
  EXPECT_LT(SecondsSince(start), 5.0);
  EXPECT_TRUE(results[0].ok());
  for (int r : {1, 2}) {
    EXPECT_EQ(results[r].code(), StatusCode::kAborted) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("rank 0 returned from its function"));
  }
}

TEST(ThreadGroup, CollectiveMismatchIsDetected) {
  std::vector<Status> results = RunThreadRanks(
      3,
      [](ProcessGroup& g) -> Status {
        MEGA_RETURN_IF_ERROR(g.Barrier());
        if (g.rank() == 1) return g.Broadcast("x", 0).status();
        return g.Gather("x", 0).status();
      },
      Timeout(milliseconds(30000)));
  int mismatches = 0;
  for (const Status& s : results) {
    EXPECT_FALSE(s.ok());
    if (s.code() == StatusCode::kFailedPrecondition) {
      ++mismatches;
      EXPECT_THAT(s.message(), HasSubstr("collective mismatch at #1"));
    } else {
      EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
      EXPECT_THAT(s.message(), HasSubstr("collective mismatch"));
    }
  }
  EXPECT_EQ(mismatches, 1);
}

TEST(ThreadGroup, RootMismatchIsDetected) {
  std::vector<Status> results = RunThreadRanks(
      2, [](ProcessGroup& g) { return g.Broadcast("x", g.rank()).status(); },
      Timeout(milliseconds(30000)));
  for (const Status& s : results) EXPECT_THAT(s.ToString(), HasSubstr("root"));
  EXPECT_FALSE(results[0].ok());
  EXPECT_FALSE(results[1].ok());
}

TEST(ThreadGroup, BadArgumentsFailEveryRank) {
  std::vector<Status> bad_root = RunThreadRanks(
      2, [](ProcessGroup& g) { return g.Gather("x", 2).status(); }, Timeout(milliseconds(30000)));
  for (const Status& s : bad_root) {
    EXPECT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kAborted)
        << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("root 2 out of range"));
  }
  std::vector<Status> bad_count = RunThreadRanks(
      3,
      [](ProcessGroup& g) {
        return g.Scatter({"a", "b"}, 1).status();
      },
      Timeout(milliseconds(30000)));
  EXPECT_EQ(bad_count[1].code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_count[1].message(), HasSubstr("2 blobs, expected world_size 3"));
  EXPECT_EQ(bad_count[0].code(), StatusCode::kAborted);
  EXPECT_EQ(bad_count[2].code(), StatusCode::kAborted);

  EXPECT_EQ(RunThreadRanks(0, [](ProcessGroup&) { return Status::OK(); })[0].code(),
            StatusCode::kInvalidArgument);
  std::vector<Status> zero_timeout = RunThreadRanks(
      2, [](ProcessGroup&) { return Status::OK(); }, Timeout(milliseconds(0)));
  EXPECT_EQ(zero_timeout[1].code(), StatusCode::kInvalidArgument);
}

TEST(ThreadGroup, AllReduceStatusAfterAPeerDiedIsAnError) {
  // Rank 0 fails before reaching AllReduceStatus; the others still get an error
  // (not OK, not a hang) that names rank 0.
  std::vector<Status> combined(3);
  std::vector<Status> results = RunThreadRanks(
      3,
      [&](ProcessGroup& g) -> Status {
        if (g.rank() == 0) return UnavailableError("hub: 503");
        combined[g.rank()] = g.AllReduceStatus(Status::OK());
        return Status::OK();
      },
      Timeout(milliseconds(30000)));
  EXPECT_EQ(results[0].code(), StatusCode::kUnavailable);
  for (int r : {1, 2}) {
    EXPECT_EQ(combined[r].code(), StatusCode::kAborted) << combined[r].ToString();
    EXPECT_THAT(combined[r].message(), HasSubstr("hub: 503"));
  }
}

}  // namespace
}  // namespace megackpt::dist
