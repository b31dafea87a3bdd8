// Fixtures shared by the dcp unit tests (src/dcp/*_test.cc) and the dcp
// integration tests (tests/dcp_*.cc, tests/mega_storage_*.cc): temp and MPI
// shared folders, group options, synthetic save/load of one rank, a throwing
// planner, folder listings, direct-I/O checks. Header-only; tests only.
#ifndef MEGACKPT_SRC_DCP_TEST_UTIL_H_
#define MEGACKPT_SRC_DCP_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/test_files.h"
#include "dcp/synthetic.h"
#include "megackpt/core/file.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dcp/planner.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dcp::testing {

// A fresh folder under the system temp dir ("<prefix>-XXXXXX"), removed with
// its contents; path() names a subfolder ("ckpt" by default).
class TempDir : public test_util::TempDir {
 public:
  explicit TempDir(const std::string& prefix = "dcp-test") : test_util::TempDir(prefix) {}
  std::string path(const std::string& sub = "ckpt") const { return File(sub); }
};

// An MPI group (a fresh duplicate of MPI_COMM_WORLD) with `timeout`; null (and
// a test failure) when it cannot be created.
inline std::unique_ptr<dist::ProcessGroup> NewMpiGroupForTest(
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  dist::ProcessGroupOptions o;
  o.timeout = timeout;
  auto g = dist::NewMpiProcessGroup(o);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(*g) : nullptr;
}

// A folder all ranks of `g` share ("<prefix>-XXXXXX", created by rank 0 and
// broadcast), removed by rank 0 after a barrier at the end.
class SharedDir {
 public:
  SharedDir(dist::ProcessGroup& g, const std::string& prefix) : g_(g) {
    std::string p;
    if (g.rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
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
  dist::ProcessGroup& g_;
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

// Group options for tests (RunThreadRanks, MPI groups): a collective timeout
// of `timeout`.
inline dist::ProcessGroupOptions TestGroupOptions(
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  dist::ProcessGroupOptions o;
  o.timeout = timeout;
  return o;
}

// The first non-OK status of per-rank results (index = rank); OK when all are.
inline Status FirstError(const std::vector<Status>& statuses) {
  for (const Status& s : statuses) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

// RunThreadRanks(world, fn) with TestGroupOptions(timeout): the first rank's
// error, OK when every rank succeeded.
inline Status RunThreadRanksForTest(int world, const std::function<Status(dist::ProcessGroup&)>& fn,
                                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  return FirstError(RunThreadRanks(world, fn, TestGroupOptions(timeout)));
}

// One rank's part of a synthetic save: builds this rank's state of `spec`
// (layout `variant`, filled with the spec's content) and saves it through
// `writer`, collectively over `group` (null: a lone process, world 1).
inline Status SaveSyntheticRank(const synthetic::Spec& spec, StorageWriter& writer,
                                dist::ProcessGroup* group, int variant = 0) {
  const int world = group ? group->world_size() : 1;
  const int rank = group ? group->rank() : 0;
  MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, world, rank, variant, true));
  return Save(sd, writer, group);
}

// One rank's part of a synthetic load: builds this rank's empty state of
// `spec` at layout `variant`, loads it through `reader` (collectively over
// `group`; null: a lone process, world 1) and verifies every byte.
inline Status LoadAndVerifySyntheticRank(const synthetic::Spec& spec, StorageReader& reader,
                                         dist::ProcessGroup* group, int variant) {
  const int world = group ? group->world_size() : 1;
  const int rank = group ? group->rank() : 0;
  MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, world, rank, variant, false));
  MEGA_RETURN_IF_ERROR(Load(sd, reader, group));
  return synthetic::VerifyRankState(spec, sd);
}

// An fqn_to_index_mapping spreading the entries of `spec` round-robin over
// files 1..buckets.
inline FqnToIndexMapping RoundRobinMapping(const synthetic::Spec& spec, int buckets) {
  FqnToIndexMapping m;
  int i = 0;
  for (const auto& e : spec.entries) m[e.fqn] = 1 + (i++ % buckets);
  return m;
}

// The names of the entries of folder `dir`, sorted.
inline std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The names in `dir` ending in `ext` (and longer than it), sorted.
inline std::vector<std::string> ShardsIn(const std::string& dir, const std::string& ext = ".mega") {
  std::vector<std::string> out;
  for (const auto& f : FilesIn(dir)) {
    if (f.size() > ext.size() && f.ends_with(ext)) out.push_back(f);
  }
  return out;
}

// Whether the file system of the existing folder `dir` takes direct I/O (a
// probe file written through WritableFile::UseDirectIo, then removed). Tests
// of direct_io saves skip where it does not (tmpfs): there the saves are
// buffered by design.
inline bool DirectIoWorksIn(const std::string& dir) {
  const std::string probe = dir + "/direct-io-probe";
  bool ok = false;
  if (auto f = CreateLocalFile(probe); f.ok()) ok = (*f)->UseDirectIo() && (*f)->Close().ok();
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  return ok;
}

// Checks that the files ending in `ext` in folder `direct` (saved with
// direct_io) went around the page cache: none has more than 5% of its pages
// cached. And, to show the check sees the difference, that those in
// `buffered` (the same state saved buffered, or "" for none) all have more
// than 95% cached. Call it right after the saves, before anything reads the
// files. Does nothing where the file system refuses direct I/O.
inline void ExpectSavedAroundThePageCache(const std::string& direct, const std::string& buffered,
                                          const std::string& ext) {
  if (!DirectIoWorksIn(direct)) return;  // the probe is removed before the check
  ASSERT_FALSE(ShardsIn(direct, ext).empty()) << "no " << ext << " files in " << direct;
  for (const auto& name : ShardsIn(direct, ext)) {
    EXPECT_LT(test_util::PageCacheResidentFraction(direct + "/" + name), 0.05)
        << direct << "/" << name << ": a direct-I/O save left its pages in the page cache";
  }
  if (buffered.empty()) return;
  for (const auto& name : ShardsIn(buffered, ext)) {
    EXPECT_GT(test_util::PageCacheResidentFraction(buffered + "/" + name), 0.95)
        << buffered << "/" << name << ": a buffered save's pages are not in the page cache";
  }
}

}  // namespace megackpt::dcp::testing

#endif  // MEGACKPT_SRC_DCP_TEST_UTIL_H_
