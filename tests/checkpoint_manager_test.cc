// CheckpointManager: step folders, `latest`, retention, LatestValid past damaged
// steps, async saves that never overlap, crash recovery (a child saving in a
// loop is SIGKILLed at random instants; every time, the newest valid step is a
// complete step, bit-exact), multi-rank saves and resharded loads.
#include "megackpt/dcp/checkpoint_manager.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "core/test_files.h"
#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/diff.h"
#include "megackpt/dcp/filesystem.h"

namespace megackpt::dcp {
namespace {

using testing::TempDir;
namespace stdfs = std::filesystem;

constexpr int64_t kRows = 64;
constexpr int64_t kCols = 1024;

uint32_t Value(int64_t step, uint32_t salt, uint64_t i) {
  uint64_t z = (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull) ^
               (salt * 0xBF58476D1CE4E5B9ull) ^ (i * 0x94D049BB133111EBull);
  z ^= z >> 31;
  z *= 0xD6E8FEB86659FD93ull;
  return static_cast<uint32_t>(z ^ (z >> 32));
}

// The state of `step`: what a training loop would hold at that step. Each
// tensor's content is a pure function of (step, name, position). With
// world > 1: this rank's rows of "model.w" (row-sharded), the rest replicated.
struct StepState {
  std::vector<std::shared_ptr<std::vector<uint32_t>>> buffers;
  StateDict sd;
};

StepState MakeStepState(int64_t step, int world = 1, int rank = 0, bool fill = true) {
  StepState st;
  auto make = [&](uint32_t salt, Shape shape, int64_t row0) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    auto buf = std::make_shared<std::vector<uint32_t>>(n, 0xCDCDCDCDu);
    const uint64_t row = shape.size() == 2 ? static_cast<uint64_t>(shape[1]) : 0;
    for (uint64_t i = 0; fill && i < n; ++i) (*buf)[i] = Value(step, salt, i + row0 * row);
    st.buffers.push_back(buf);
    return Tensor::FromBlob(buf->data(), DType::kU32, std::move(shape)).value();
  };
  const int64_t rows = kRows / world;
  ShardedTensor w;
  w.dtype = DType::kU32;
  w.global_shape = {kRows, kCols};
  w.shards.push_back({{rank * rows, 0}, make(1, {rows, kCols}, rank * rows)});
  StateDict model;
  model.Set("w", StateValue(std::move(w)));
  model.Set("b", StateValue(make(2, {kCols}, 0)));
  st.sd.Set("model", StateValue(std::move(model)));
  st.sd.Set("step",
            StateValue::Bytes(fill ? "step=" + std::to_string(step) : std::string(16, '?')));
  return st;
}

// Compares a loaded state with MakeStepState(step, ...) element by element.
::testing::AssertionResult SameAsStep(StepState& loaded, int64_t step, int world = 1,
                                      int rank = 0) {
  StepState want = MakeStepState(step, world, rank);
  for (size_t b = 0; b < want.buffers.size(); ++b) {
    if (*want.buffers[b] != *loaded.buffers[b]) {
      return ::testing::AssertionFailure() << "tensor " << b << " differs from step " << step;
    }
  }
  const StateValue* s = loaded.sd.Find("step");
  if (!s || s->bytes() != "step=" + std::to_string(step)) {
    return ::testing::AssertionFailure() << "bytes value differs from step " << step;
  }
  return ::testing::AssertionSuccess();
}

std::vector<int64_t> CompleteSteps(const CheckpointManager& m) {
  std::vector<int64_t> out;
  const std::vector<StepInfo> steps = m.Steps().value();
  for (const StepInfo& s : steps) {
    if (s.complete) out.push_back(s.step);
  }
  return out;
}

std::vector<std::string> DataFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : stdfs::directory_iterator(dir)) {
    if (e.path().extension() == ".distcp") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void FlipByte(const std::string& file, uint64_t offset) {
  ::megackpt::test_util::XorFileByte(file, offset, 0x20);
}

// ---- names and retention (pure) --------------------------------------------------

TEST(StepFolderNameTest, ZeroPaddedAndParsed) {
  EXPECT_EQ(StepFolderName(100), "step-000000100");
  EXPECT_EQ(StepFolderName(7, 4), "step-0007");
  EXPECT_EQ(StepFolderName(123456, 3), "step-123456");
  EXPECT_EQ(ParseStepFolderName("step-000000100"), 100);
  EXPECT_EQ(ParseStepFolderName("step-5"), 5);
  EXPECT_EQ(ParseStepFolderName("step-"), std::nullopt);
  EXPECT_EQ(ParseStepFolderName("step-12a"), std::nullopt);
  EXPECT_EQ(ParseStepFolderName("step-99999999999999999999"), std::nullopt);
  EXPECT_EQ(ParseStepFolderName("latest"), std::nullopt);
}

TEST(RetentionTest, KeepsEverythingByDefault) {
  std::vector<int64_t> steps = {1, 2, 3};
  EXPECT_EQ(StepsToKeep(steps, {std::nullopt, std::nullopt, std::nullopt}, {}), steps);
}

TEST(RetentionTest, KeepLast) {
  RetentionPolicy p;
  p.keep_last = 2;
  std::vector<std::optional<double>> none(5);
  EXPECT_EQ(StepsToKeep({10, 20, 30, 40, 50}, none, p), (std::vector<int64_t>{40, 50}));
  p.keep_last = 9;
  EXPECT_EQ(StepsToKeep({10, 20}, {std::nullopt, std::nullopt}, p), (std::vector<int64_t>{10, 20}));
}

TEST(RetentionTest, KeepEveryMthPlusLast) {
  RetentionPolicy p;
  p.keep_last = 1;
  p.keep_every = 100;
  std::vector<int64_t> steps = {50, 100, 150, 200, 250, 270};
  std::vector<std::optional<double>> none(steps.size());
  EXPECT_EQ(StepsToKeep(steps, none, p), (std::vector<int64_t>{100, 200, 270}));
}

TEST(RetentionTest, KeepBestByMetricLowerOrHigher) {
  RetentionPolicy p;
  p.keep_best = 2;
  std::vector<int64_t> steps = {1, 2, 3, 4, 5};
  std::vector<std::optional<double>> loss = {0.9, 0.3, std::nullopt, 0.5, 0.7};
  // Newest (5) always; best two losses: 2 (0.3) and 4 (0.5).
  EXPECT_EQ(StepsToKeep(steps, loss, p), (std::vector<int64_t>{2, 4, 5}));
  p.best_is_max = true;  // accuracy: 1 (0.9) and 5 (0.7)
  EXPECT_EQ(StepsToKeep(steps, loss, p), (std::vector<int64_t>{1, 5}));
  // Ties go to the newer step.
  p.best_is_max = false;
  p.keep_best = 1;
  EXPECT_EQ(StepsToKeep({1, 2, 3}, {0.5, 0.5, 0.9}, p), (std::vector<int64_t>{2, 3}));
}

TEST(RetentionTest, RulesCombine) {
  RetentionPolicy p;
  p.keep_last = 1;
  p.keep_every = 4;
  p.keep_best = 1;
  std::vector<int64_t> steps = {1, 2, 3, 4, 5, 6, 7};
  std::vector<std::optional<double>> loss = {5, 4, 0.1, 3, 2, 1, 6};
  EXPECT_EQ(StepsToKeep(steps, loss, p), (std::vector<int64_t>{3, 4, 7}));
}

// ---- the manager --------------------------------------------------------------

CheckpointManagerOptions FastOptions() {
  CheckpointManagerOptions o;
  o.storage_options.sync = false;  // atomic, not power-loss durable: enough for tests
  return o;
}

TEST(CheckpointManagerTest, SaveStepsLatestAndLoad) {
  TempDir tmp("ckpt-mgr");
  auto m = CheckpointManager::Open(tmp.path("run"), FastOptions());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->Latest().value(), std::nullopt);
  for (int64_t step : {10, 20, 30}) {
    StepState st = MakeStepState(step);
    ASSERT_TRUE((*m)->Save(step, st.sd).ok());
  }
  EXPECT_TRUE(stdfs::is_directory(tmp.path("run/step-000000020")));
  EXPECT_EQ(CompleteSteps(**m), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ((*m)->Latest().value(), 30);
  std::string latest;
  std::getline(std::ifstream(tmp.path("run/latest")), latest);
  EXPECT_NE(latest.find("\"step\":30"), std::string::npos) << latest;

  StepState into = MakeStepState(0, 1, 0, /*fill=*/false);
  auto loaded = (*m)->Load(into.sd);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->step, 30);
  EXPECT_TRUE(loaded->skipped.empty());
  EXPECT_TRUE(SameAsStep(into, 30));

  StepState older = MakeStepState(0, 1, 0, false);
  ASSERT_EQ((*m)->Load(older.sd, 10).value().step, 10);
  EXPECT_TRUE(SameAsStep(older, 10));

  // A complete step is not replaced unless asked.
  StepState again = MakeStepState(31);
  Status s = (*m)->Save(20, again.sd);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.ToString();
  StepSaveOptions ow;
  ow.overwrite = true;
  ASSERT_TRUE((*m)->Save(20, again.sd, ow).ok());
  StepState back = MakeStepState(0, 1, 0, false);
  ASSERT_TRUE((*m)->Load(back.sd, 20).ok());
  EXPECT_TRUE(SameAsStep(back, 31));
  EXPECT_EQ((*m)->Latest().value(), 30);  // an older step number does not move `latest`
  EXPECT_EQ((*m)->Save(-1, again.sd).code(), StatusCode::kInvalidArgument);
}

// CheckpointManagerOptions::storage_options.direct_io reaches the step writers
// of both storages, and of incremental saves: the steps' data files skip the
// page cache, and load back bit-exact.
TEST(CheckpointManagerTest, DirectIoStepsSkipThePageCache) {
  TempDir tmp("ckpt-dio");
  for (const char* storage : {"fs", "mega"}) {
    for (bool incremental : {false, true}) {
      if (incremental && std::string(storage) == "mega") continue;  // fs storage only
      SCOPED_TRACE(std::string(storage) + (incremental ? " incremental" : ""));
      const std::string root = tmp.path(std::string(storage) + (incremental ? "-inc" : ""));
      CheckpointManagerOptions o;
      o.storage = storage;
      o.storage_options.direct_io = true;  // with sync, the default
      o.incremental.enabled = incremental;
      auto m = CheckpointManager::Open(root, o);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      for (int64_t step : {1, 2}) {
        StepState st = MakeStepState(step);
        ASSERT_TRUE((*m)->Save(step, st.sd).ok());
        testing::ExpectSavedAroundThePageCache(
            (*m)->StepPath(step), "", std::string(storage) == "mega" ? ".mega" : ".distcp");
      }
      StepState into = MakeStepState(0, 1, 0, /*fill=*/false);
      auto loaded = (*m)->Load(into.sd);
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      EXPECT_EQ(loaded->step, 2);
      EXPECT_TRUE(SameAsStep(into, 2));
    }
  }
}

TEST(CheckpointManagerTest, RetentionKeepLastEveryAndBest) {
  TempDir tmp("ckpt-ret");
  CheckpointManagerOptions o = FastOptions();
  o.retention.keep_last = 2;
  o.retention.keep_every = 4;
  o.retention.keep_best = 1;
  auto m = CheckpointManager::Open(tmp.path("run"), o).value();
  const double loss[] = {0, 0.9, 0.8, 0.2, 0.7, 0.6, 0.5, 0.4, 0.3, 0.45};
  for (int64_t step = 1; step <= 9; ++step) {
    StepState st = MakeStepState(step);
    StepSaveOptions so;
    so.metric = loss[step];
    ASSERT_TRUE(m->Save(step, st.sd, so).ok());
  }
  // last two: 8, 9; every 4th: 4, 8; best loss: 3 (0.2).
  EXPECT_EQ(CompleteSteps(*m), (std::vector<int64_t>{3, 4, 8, 9}));
  const std::vector<StepInfo> steps = m->Steps().value();
  for (const StepInfo& s : steps) {
    ASSERT_TRUE(s.metric.has_value());
    EXPECT_DOUBLE_EQ(*s.metric, loss[s.step]);
  }
  // Deleted folders are gone entirely.
  EXPECT_FALSE(stdfs::exists(tmp.path("run/step-000000005")));
  // gc with a stricter policy.
  RetentionPolicy strict;
  strict.keep_last = 1;
  EXPECT_EQ(m->GarbageCollect(strict).value(), (std::vector<int64_t>{3, 4, 8}));
  EXPECT_EQ(CompleteSteps(*m), (std::vector<int64_t>{9}));
  EXPECT_EQ(m->Latest().value(), 9);
}

TEST(CheckpointManagerTest, DamagedNewestStepIsSkippedAndNamed) {
  TempDir tmp("ckpt-dmg");
  auto m = CheckpointManager::Open(tmp.path("run"), FastOptions()).value();
  for (int64_t step : {1, 2, 3}) {
    StepState st = MakeStepState(step);
    ASSERT_TRUE(m->Save(step, st.sd).ok());
  }
  auto files = DataFiles(m->StepPath(3));
  ASSERT_FALSE(files.empty());
  FlipByte(files[0], 100);
  // The structure is intact; only a full verification sees the flip.
  EXPECT_EQ(m->LatestValid(VerifyLevel::kStructure).value().step, 3);
  auto valid = m->LatestValid();
  ASSERT_TRUE(valid.ok()) << valid.status().ToString();
  EXPECT_EQ(valid->step, 2);
  ASSERT_EQ(valid->skipped.size(), 1u);
  EXPECT_EQ(valid->skipped[0].step, 3);
  EXPECT_EQ(valid->skipped[0].reason.code(), StatusCode::kDataLoss);
  EXPECT_NE(valid->skipped[0].reason.message().find(stdfs::path(files[0]).filename().string()),
            std::string::npos)
      << valid->skipped[0].reason.ToString();
  EXPECT_EQ(m->VerifyStep(3).code(), StatusCode::kDataLoss);
  // Load without a step falls back the same way and says so.
  StepState into = MakeStepState(0, 1, 0, false);
  auto loaded = m->Load(into.sd);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->step, 2);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_EQ(loaded->skipped[0].step, 3);
  EXPECT_TRUE(SameAsStep(into, 2));
  // An explicit step does not fall back.
  StepState explicit_into = MakeStepState(0, 1, 0, false);
  EXPECT_EQ(m->Load(explicit_into.sd, 3).status().code(), StatusCode::kDataLoss);
  // A missing data file: NotFound naming it.
  stdfs::remove(DataFiles(m->StepPath(2))[0]);
  auto v2 = m->LatestValid(VerifyLevel::kStructure);
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(v2->step, 3);  // structure-only still accepts 3
  auto v3 = m->LatestValid();
  ASSERT_TRUE(v3.ok());
  EXPECT_EQ(v3->step, 1);
  ASSERT_EQ(v3->skipped.size(), 2u);
  EXPECT_EQ(v3->skipped[1].reason.code(), StatusCode::kNotFound)
      << v3->skipped[1].reason.ToString();
  // Everything damaged: NotFound listing each step.
  FlipByte(DataFiles(m->StepPath(1))[0], 7);
  auto none = m->LatestValid();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("step 1:"), std::string::npos) << none.status().ToString();
  EXPECT_NE(none.status().message().find("step 3:"), std::string::npos);
}

TEST(CheckpointManagerTest, IncompleteStepsAreIgnoredAndRemovedOnOpen) {
  TempDir tmp("ckpt-inc");
  const std::string root = tmp.path("run");
  {
    auto m = CheckpointManager::Open(root, FastOptions()).value();
    for (int64_t step : {1, 2}) {
      StepState st = MakeStepState(step);
      ASSERT_TRUE(m->Save(step, st.sd).ok());
    }
    // A save cut short: its data files are there, its .metadata never was.
    stdfs::remove(m->StepPath(2) + "/.metadata");
  }
  CheckpointManagerOptions keep = FastOptions();
  keep.remove_incomplete = false;
  auto m = CheckpointManager::Open(root, keep).value();
  auto steps = m->Steps().value();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_FALSE(steps[1].complete);
  EXPECT_NE(steps[1].problem.find(".metadata missing"), std::string::npos) << steps[1].problem;
  EXPECT_EQ(m->Latest().value(), 1);
  EXPECT_EQ(m->LatestRecord().value(), 1);  // it named 2; Open made it name a complete step
  auto valid = m->LatestValid().value();
  EXPECT_EQ(valid.step, 1);
  ASSERT_EQ(valid.skipped.size(), 1u);
  EXPECT_EQ(valid.skipped[0].step, 2);
  StepState into = MakeStepState(0, 1, 0, false);
  EXPECT_EQ(m->Load(into.sd).value().step, 1);
  EXPECT_EQ(m->Load(into.sd, 2).status().code(), StatusCode::kNotFound);
  // Reopening with the default removes the incomplete folder; saving over it works.
  m = CheckpointManager::Open(root, FastOptions()).value();
  EXPECT_FALSE(stdfs::exists(root + "/step-000000002"));
  EXPECT_EQ(m->LatestRecord().value(), 1);
  StepState st = MakeStepState(2);
  ASSERT_TRUE(m->Save(2, st.sd).ok());
  EXPECT_EQ(m->Latest().value(), 2);
}

// A filesystem whose WriteAtomically of `latest` waits for a gate, logging the
// manager's record writes in order.
class GatedFileSystem : public testing::InstrumentedFileSystem {
 public:
  Status WriteAtomically(const std::string& path, std::string_view data, bool sync) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      log_.push_back(stdfs::path(path).parent_path().filename().string() + "/" +
                     stdfs::path(path).filename().string());
      if (path.ends_with("/latest")) cv_.wait(lock, [&] { return open_; });
    }
    return InstrumentedFileSystem::WriteAtomically(path, data, sync);
  }
  Status RemoveDirectory(const std::string& dir) override {
    return fs::LocalFileSystem()->RemoveDirectory(dir);
  }
  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    cv_.notify_all();
  }
  std::vector<std::string> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  std::vector<std::string> log_;
};

TEST(CheckpointManagerTest, AsyncSaveInFlightFailsClearlyUnderKFail) {
  TempDir tmp("ckpt-async");
  auto gated = std::make_shared<GatedFileSystem>();
  CheckpointManagerOptions o = FastOptions();
  o.fs = gated;
  o.in_flight = InFlightPolicy::kFail;
  auto m = CheckpointManager::Open(tmp.path("run"), o).value();
  gated->SetOpen(false);
  StepState one = MakeStepState(1);  // alive until staged
  auto first = m->AsyncSave(1, one.sd);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->staged.get().ok());
  EXPECT_TRUE(m->save_in_flight());
  StepState second = MakeStepState(2);
  Status s = m->Save(2, second.sd);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("step 1 is still in flight"), std::string::npos) << s.ToString();
  EXPECT_EQ(m->AsyncSave(2, second.sd).status().code(), StatusCode::kFailedPrecondition);
  gated->SetOpen(true);
  EXPECT_TRUE(first->done.get().ok());
  EXPECT_FALSE(m->save_in_flight());
  ASSERT_TRUE(m->Save(2, second.sd).ok());
  EXPECT_EQ(CompleteSteps(*m), (std::vector<int64_t>{1, 2}));
}

TEST(CheckpointManagerTest, AsyncSavesNeverOverlapUnderKWait) {
  TempDir tmp("ckpt-wait");
  auto gated = std::make_shared<GatedFileSystem>();
  CheckpointManagerOptions o = FastOptions();
  o.fs = gated;
  o.retention.keep_last = 2;
  auto m = CheckpointManager::Open(tmp.path("run"), o).value();
  gated->SetOpen(false);
  StepState one = MakeStepState(1), two = MakeStepState(2);
  auto first = m->AsyncSave(1, one.sd).value();
  std::atomic<bool> second_started{false};
  StepSaveHandle second;
  std::thread t([&] {
    second = m->AsyncSave(2, two.sd).value();
    second_started = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(second_started.load()) << "the second save started while the first was in flight";
  EXPECT_EQ(first.done.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  gated->SetOpen(true);
  t.join();
  EXPECT_EQ(first.done.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_TRUE(first.done.get().ok());
  EXPECT_TRUE(second.done.get().ok());
  for (int64_t step = 3; step <= 6; ++step) {
    StepState st = MakeStepState(step);
    auto h = m->AsyncSave(step, st.sd);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->staged.get().ok());
  }
  ASSERT_TRUE(m->WaitForPendingSave().ok());
  // The record writes of the saves come strictly one save after the other.
  std::vector<std::string> want;
  for (int64_t step = 1; step <= 6; ++step) {
    want.push_back(StepFolderName(step) + "/step.json");
    want.push_back("run/latest");
  }
  std::vector<std::string> got;
  for (const std::string& e : gated->log()) {
    if (e.ends_with("/step.json") || e.ends_with("/latest")) got.push_back(e);
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(CompleteSteps(*m), (std::vector<int64_t>{5, 6}));
  StepState into = MakeStepState(0, 1, 0, false);
  EXPECT_EQ(m->Load(into.sd).value().step, 6);
  EXPECT_TRUE(SameAsStep(into, 6));
}

TEST(CheckpointManagerTest, ThreadRanksSaveAndLoadResharded) {
  TempDir tmp("ckpt-threads");
  const std::string root = tmp.path("run");
  Status s = testing::RunThreadRanksForTest(2, [&](dist::ProcessGroup& g) -> Status {
    CheckpointManagerOptions o = FastOptions();
    o.group = &g;
    o.retention.keep_last = 2;
    MEGA_ASSIGN_OR_RETURN(auto m, CheckpointManager::Open(root, o));
    for (int64_t step = 1; step <= 3; ++step) {
      StepState st = MakeStepState(step, 2, g.rank());
      MEGA_RETURN_IF_ERROR(m->Save(step, st.sd));
    }
    StepState four = MakeStepState(4, 2, g.rank());
    auto h = m->AsyncSave(4, four.sd);
    MEGA_RETURN_IF_ERROR(h.status());
    return h->done.get();
  });
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int world : {1, 4}) {
    s = testing::RunThreadRanksForTest(world, [&](dist::ProcessGroup& g) -> Status {
      CheckpointManagerOptions o = FastOptions();
      o.group = &g;
      MEGA_ASSIGN_OR_RETURN(auto m, CheckpointManager::Open(root, o));
      StepState into = MakeStepState(0, world, g.rank(), false);
      MEGA_ASSIGN_OR_RETURN(ValidStep v, m->Load(into.sd));
      if (v.step != 4) return InternalError("loaded step " + std::to_string(v.step));
      auto same = SameAsStep(into, 4, world, g.rank());
      if (!same) return DataLossError(same.message());
      return Status::OK();
    });
    EXPECT_TRUE(s.ok()) << "world " << world << ": " << s.ToString();
  }
  auto m = CheckpointManager::Open(root, FastOptions()).value();
  EXPECT_EQ(CompleteSteps(*m), (std::vector<int64_t>{3, 4}));
}

// ---- diff ---------------------------------------------------------------------

TEST(DiffCheckpointsTest, AddedRemovedChangedBytesAndMaxAbsDiff) {
  TempDir tmp("ckpt-diff");
  std::vector<float> w(1000, 1.0f), w2 = w;
  w2[3] = 1.5f;
  w2[999] = -2.0f;                                                    // |1 - (-2)| = 3
  std::vector<uint16_t> h = {0x3C00, 0x4000}, h2 = {0x3C00, 0x4200};  // F16: 2 -> 3
  std::vector<int32_t> same = {1, 2, 3};
  std::vector<double> dt = {1.0};
  std::vector<float> dt2 = {1.0f};
  auto save = [&](const std::string& dir, StateDict sd) {
    auto writer = NewFileSystemWriter(dir, {.sync = false});
    ASSERT_TRUE(dcp::Save(sd, *writer).ok());
  };
  StateDict a, b;
  a.Set("w", Tensor::FromBlob(w.data(), DType::kF32, {10, 100}).value());
  b.Set("w", Tensor::FromBlob(w2.data(), DType::kF32, {10, 100}).value());
  a.Set("h", Tensor::FromBlob(h.data(), DType::kF16, {2}).value());
  b.Set("h", Tensor::FromBlob(h2.data(), DType::kF16, {2}).value());
  a.Set("same", Tensor::FromBlob(same.data(), DType::kI32, {3}).value());
  b.Set("same", Tensor::FromBlob(same.data(), DType::kI32, {3}).value());
  a.Set("dt", Tensor::FromBlob(dt.data(), DType::kF64, {1}).value());
  b.Set("dt", Tensor::FromBlob(dt2.data(), DType::kF32, {1}).value());
  a.Set("gone", StateValue::Bytes("x"));
  b.Set("new", StateValue::Bytes("yz"));
  a.Set("s", StateValue::Bytes("abcd"));
  b.Set("s", StateValue::Bytes("abXdef"));
  save(tmp.path("a"), a);
  save(tmp.path("b"), b);
  auto d = DiffCheckpoints(tmp.path("a"), tmp.path("b"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->added, (std::vector<std::string>{"new"}));
  EXPECT_EQ(d->removed, (std::vector<std::string>{"gone"}));
  EXPECT_EQ(d->unchanged, 1u);
  ASSERT_EQ(d->changed.size(), 4u);  // dt, h, s, w in fqn order
  EXPECT_EQ(d->changed[0].fqn, "dt");
  EXPECT_EQ(d->changed[0].what, "dtype");
  EXPECT_EQ(d->changed[1].fqn, "h");
  EXPECT_EQ(d->changed[1].changed_elements, 1u);
  EXPECT_EQ(d->changed[1].changed_bytes, 2u);
  EXPECT_EQ(d->changed[1].max_abs_diff, 1.0);
  EXPECT_EQ(d->changed[2].fqn, "s");
  EXPECT_EQ(d->changed[2].changed_bytes, 3u);  // 'c' -> 'X', and 2 more bytes
  EXPECT_FALSE(d->changed[2].max_abs_diff.has_value());
  EXPECT_EQ(d->changed[3].fqn, "w");
  EXPECT_EQ(d->changed[3].changed_elements, 2u);
  EXPECT_EQ(d->changed[3].changed_bytes, 8u);
  EXPECT_EQ(d->changed[3].max_abs_diff, 3.0);
  EXPECT_EQ(d->changed_bytes, 8u + 8u + 2u + 3u + 2u);  // dt (max 8, 4), h, s, w, new
  EXPECT_EQ(DiffCheckpoints(tmp.path("a"), tmp.path("missing")).status().code(),
            StatusCode::kNotFound);
}

// ---- kill -9 at random instants ------------------------------------------------

// The child: saves steps latest+1, latest+2, ... into the root in
// MEGACKPT_CKPT_CHILD_ROOT until killed. Durable saves (fsync), as in training.
TEST(CheckpointManagerChild, SaveLoop) {
  const char* root = getenv("MEGACKPT_CKPT_CHILD_ROOT");
  if (!root) GTEST_SKIP() << "run by CheckpointManagerCrashTest only";
  CheckpointManagerOptions o;
  o.retention.keep_last = 2;
  auto m = CheckpointManager::Open(root, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  int64_t step = (*m)->Latest().value().value_or(0);
  const bool async = getenv("MEGACKPT_CKPT_CHILD_ASYNC") != nullptr;
  for (int i = 0; i < 1000; ++i) {
    ++step;
    StepState st = MakeStepState(step);
    if (async) {
      auto h = (*m)->AsyncSave(step, st.sd);
      ASSERT_TRUE(h.ok());
      ASSERT_TRUE(h->staged.get().ok());
    } else {
      ASSERT_TRUE((*m)->Save(step, st.sd).ok());
    }
  }
}

TEST(CheckpointManagerCrashTest, KillAtRandomInstantsLeavesALoadableCompleteStep) {
  TempDir tmp("ckpt-kill");
  const std::string root = tmp.path("run");
  std::mt19937 rng(12345);
  const int kTrials = 30;
  int64_t last_seen = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const bool async = trial % 3 == 2;
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      setenv("MEGACKPT_CKPT_CHILD_ROOT", root.c_str(), 1);
      if (async) setenv("MEGACKPT_CKPT_CHILD_ASYNC", "1", 1);
      execl("/proc/self/exe", "checkpoint_manager_test",
            "--gtest_filter=CheckpointManagerChild.SaveLoop", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Kill somewhere between start-up and several saves in.
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 400));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status))
        << "trial " << trial << ": the child exited early (status " << status << ")";

    // Recovery: opening removes what the crash left half-written.
    auto m = CheckpointManager::Open(root, FastOptions());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const std::vector<StepInfo> steps = (*m)->Steps().value();
    for (const StepInfo& s : steps) {
      EXPECT_TRUE(s.complete) << "trial " << trial << ": " << s.folder << " " << s.problem;
    }
    auto latest = (*m)->Latest().value();
    auto valid = (*m)->LatestValid();
    if (!valid.ok()) {
      // Killed before the first step ever committed.
      EXPECT_EQ(latest, std::nullopt) << valid.status().ToString();
      EXPECT_EQ(last_seen, 0) << "trial " << trial << ": a committed step was lost";
      continue;
    }
    EXPECT_TRUE(valid->skipped.empty())
        << "trial " << trial << ": " << valid->skipped[0].reason.ToString();
    EXPECT_EQ(latest, valid->step);
    EXPECT_EQ((*m)->LatestRecord().value(), valid->step) << "Open rolls `latest` forward";
    EXPECT_GE(valid->step, last_seen) << "trial " << trial << ": went back in time";
    last_seen = valid->step;
    StepState into = MakeStepState(0, 1, 0, false);
    auto loaded = (*m)->Load(into.sd);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    ASSERT_EQ(loaded->step, valid->step);
    ASSERT_TRUE(SameAsStep(into, valid->step)) << "trial " << trial;
  }
  EXPECT_GT(last_seen, 0) << "no trial let the child commit a step";
  // Resume: the next save continues after the newest valid step.
  auto m = CheckpointManager::Open(root, FastOptions()).value();
  StepState next = MakeStepState(last_seen + 1);
  ASSERT_TRUE(m->Save(last_seen + 1, next.sd).ok());
  EXPECT_EQ(m->Latest().value(), last_seen + 1);
}

}  // namespace
}  // namespace megackpt::dcp
