// Fixtures shared by the dcp unit tests (src/dcp/*_test.cc) and the dcp
// integration tests (tests/dcp_*.cc, tests/mega_storage_*.cc). Header-only;
// tests only.
#ifndef MEGACKPT_SRC_DCP_TEST_UTIL_H_
#define MEGACKPT_SRC_DCP_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "megackpt/dcp/planner.h"
#include "megackpt/process_group.h"

namespace megackpt::dcp::testing {

// A fresh folder under the system temp dir ("<prefix>-XXXXXX"), removed with
// its contents.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "dcp-test") {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path(const std::string& sub = "ckpt") const { return path_ + "/" + sub; }

 private:
  std::string path_;
};

// An MPI group (a fresh duplicate of MPI_COMM_WORLD) with `timeout`; null (and
// a test failure) when it cannot be created.
inline std::unique_ptr<ProcessGroup> NewMpiGroupForTest(
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  ProcessGroupOptions o;
  o.timeout = timeout;
  auto g = NewMpiProcessGroup(o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(*g) : nullptr;
}

// A folder all ranks of `g` share ("<prefix>-XXXXXX", created by rank 0 and
// broadcast), removed by rank 0 after a barrier at the end.
class SharedDir {
 public:
  SharedDir(ProcessGroup& g, const std::string& prefix) : g_(g) {
    std::string p;
    if (g.rank() == 0) {
      std::string tmpl =
          (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
      p = mkdtemp(tmpl.data());
    }
    path_ = g.Broadcast(p, 0).value();
  }
  ~SharedDir() {
    g_.Barrier().IgnoreError();
    if (g_.rank() == 0) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  std::string path(const std::string& sub) const { return path_ + "/" + sub; }

 private:
  ProcessGroup& g_;
  std::string path_;
};

// The default save planner, except that ResolveData throws
// std::runtime_error(message) when `throws` (an exception escaping a planner
// must become an error on every rank).
class ThrowingSavePlanner : public SavePlanner {
 public:
  ThrowingSavePlanner(bool throws, std::string message)
      : inner_(NewDefaultSavePlanner()), throws_(throws), message_(std::move(message)) {}
  Status SetUp(const StateDict& sd, const std::optional<StorageMeta>& m, bool c) override {
    return inner_->SetUp(sd, m, c);
  }
  Result<SavePlan> CreateLocalPlan() override { return inner_->CreateLocalPlan(); }
  Result<GlobalSavePlan> CreateGlobalPlan(std::vector<SavePlan> p) override {
    return inner_->CreateGlobalPlan(std::move(p));
  }
  Result<SavePlan> FinishPlan(SavePlan p) override { return inner_->FinishPlan(std::move(p)); }
  Result<ResolvedData> ResolveData(const WriteItem& item) override {
    if (throws_) throw std::runtime_error(message_);
    return inner_->ResolveData(item);
  }

 private:
  std::unique_ptr<SavePlanner> inner_;
  bool throws_;
  std::string message_;
};

}  // namespace megackpt::dcp::testing

#endif  // MEGACKPT_SRC_DCP_TEST_UTIL_H_
