// Fault injection for MegaStorageWriter's commit protocol (seed defect 8): a
// child process saves a checkpoint over an existing one at the same path and is
// killed with SIGKILL (a) at every filesystem step of the save (shard creation,
// folder sync, index write, the .metadata temp write and rename, each cleanup
// removal) and (b) at many random instants spanning the save. After every kill
// the path must load, bit for bit, as the previous checkpoint or the new one,
// both through .metadata and through the index alone (an index-only consumer);
// never a mix, never an error.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <random>

#include "core/test_files.h"
#include "dcp/synthetic.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;

constexpr int kWorld = 2;
constexpr uint64_t kStateBytes = 4ull << 20;

// Counts filesystem steps and SIGKILLs the process at step `kill_at` (0: never).
// WriteAtomically is spelled out (temp file, sync, rename, folder sync) so a kill
// can also land between its steps.
class KillingFs : public fs::FileSystem {
 public:
  explicit KillingFs(int kill_at) : base_(fs::LocalFileSystem()), kill_at_(kill_at) {}
  int steps() const { return steps_.load(); }

  std::string_view scheme() const override { return base_->scheme(); }
  fs::FileSystemCapabilities capabilities() const override { return base_->capabilities(); }
  Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& p) override {
    return base_->OpenForRead(p);
  }
  Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& p) override {
    Step();
    return base_->OpenForWrite(p);
  }
  Status WriteAtomically(const std::string& p, std::string_view data, bool sync) override {
    Step();
    const std::string tmp = p + ".tmp." + std::to_string(getpid()) + ".k";
    {
      MEGA_ASSIGN_OR_RETURN(auto f, base_->OpenForWrite(tmp));
      MEGA_RETURN_IF_ERROR(
          f->Append(std::as_bytes(std::span<const char>(data.data(), data.size()))));
      if (sync) MEGA_RETURN_IF_ERROR(f->Sync());
      MEGA_RETURN_IF_ERROR(f->Close());
    }
    Step();
    MEGA_RETURN_IF_ERROR(base_->Rename(tmp, p));
    Step();
    if (sync) MEGA_RETURN_IF_ERROR(base_->SyncDirectory(stdfs::path(p).parent_path().string()));
    return Status::OK();
  }
  Result<bool> Exists(const std::string& p) override { return base_->Exists(p); }
  Result<fs::FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Result<std::vector<fs::FileInfo>> List(const std::string& d) override { return base_->List(d); }
  Status Remove(const std::string& p) override {
    Step();
    return base_->Remove(p);
  }
  Status CreateDirectories(const std::string& d) override { return base_->CreateDirectories(d); }
  Status Rename(const std::string& a, const std::string& b) override {
    Step();
    return base_->Rename(a, b);
  }
  Status SyncDirectory(const std::string& d) override {
    Step();
    return base_->SyncDirectory(d);
  }

 private:
  void Step() {
    if (++steps_ == kill_at_) raise(SIGKILL);
  }
  std::shared_ptr<fs::FileSystem> base_;
  int kill_at_;
  std::atomic<int> steps_{0};
};

FqnToIndexMapping Mapping(const synthetic::Spec& spec) {
  FqnToIndexMapping m;
  int i = 0;
  for (const auto& e : spec.entries) m[e.fqn] = 1 + (i++ % 3);
  return m;
}

Status SaveSpec(const synthetic::Spec& spec, const std::string& dir,
                std::shared_ptr<fs::FileSystem> fs) {
  auto results = dist::RunThreadRanks(kWorld, [&](dist::ProcessGroup& g) -> Status {
    MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, kWorld, g.rank(), 0, true));
    MegaStorageWriterOptions o;
    o.fs = fs;
    MegaStorageWriter writer(dir, Mapping(spec), o);
    return Save(sd, writer, &g);
  });
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Loads `path` as `spec` (world 1) and checks every byte.
Status LoadsAs(const synthetic::Spec& spec, const std::string& path) {
  MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, 1, 0, 0, false));
  MegaStorageReader reader(path);
  MEGA_RETURN_IF_ERROR(Load(sd, reader));
  return synthetic::VerifyRankState(spec, sd);
}

// The threads of this process (entries of /proc/self/task), once joined
// threads have left the list (they may linger there for a moment): polls up to
// 2 s for a count of 1. -1 when /proc/self/task cannot be listed.
int SettledThreadCount() {
  int count = 0;
  for (int i = 0; i < 200; ++i) {
    std::error_code ec;
    count = 0;
    for (stdfs::directory_iterator it("/proc/self/task", ec), end; !ec && it != end;
         it.increment(ec))
      ++count;
    if (ec) return -1;
    if (count == 1) break;
    usleep(10 * 1000);
  }
  return count;
}

// Forks a child that saves `spec` over `dir`; it dies at step `kill_at` or when
// the parent kills it after `delay_seconds` (< 0: never). Returns the child's
// wait status, or -1 (after a test failure) when this process has other
// threads.
//
// A fork without exec is safe here because this process is single-threaded
// at every fork: every save and load joins its rank threads and destroys its
// own writer/reader pools before returning, and a local-folder save never
// starts ThreadPool::Default() (only the hub/CAS, MegaWriter with
// max_parallel > 1 and async saves use it). The child starts its threads (rank
// threads, the writer's pool) after the fork. The check below keeps it so: a
// fork of a multi-threaded process could copy a lock held by another thread
// and hang the child (the hub variant in mega_storage_hub_test.cc exec's its
// child for that reason).
int RunChildSave(const synthetic::Spec& spec, const std::string& dir, int kill_at,
                 double delay_seconds) {
  const int threads = SettledThreadCount();
  if (threads != 1) {
    ADD_FAILURE()
        << "this process has " << threads << " threads (-1: /proc/self/task unreadable) "
        << "before fork(); a child forked without exec could inherit a held lock and hang";
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    Status s = SaveSpec(spec, dir, std::make_shared<KillingFs>(kill_at));
    _exit(s.ok() ? 0 : 3);
  }
  if (delay_seconds >= 0) {
    timespec ts{static_cast<time_t>(delay_seconds),
                static_cast<long>((delay_seconds - static_cast<time_t>(delay_seconds)) * 1e9)};
    nanosleep(&ts, nullptr);
    kill(pid, SIGKILL);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.File("ckpt");
    // Same names, shapes and file layout, different bytes: the new save's plain
    // file names collide with the old checkpoint's, which is the hard case.
    specs_[0] = synthetic::MakeSpec(101, kStateBytes);
    specs_[1] = specs_[0];
    specs_[1].seed = 202;
    ASSERT_TRUE(SaveSpec(specs_[0], dir_, nullptr).ok());
    current_ = 0;
  }

  // After a kill: the folder loads as the current or the next checkpoint, through
  // .metadata and through the index; returns which one .metadata gave.
  void CheckOldOrNew(const std::string& what, int* new_count, int* old_count) {
    const int next = 1 - current_;
    Status as_old = LoadsAs(specs_[current_], dir_);
    Status as_new = as_old.ok() ? Status::OK() : LoadsAs(specs_[next], dir_);
    ASSERT_TRUE(as_old.ok() || as_new.ok())
        << what << ": neither the old nor the new checkpoint loads:\n  old: " << as_old.ToString()
        << "\n  new: " << as_new.ToString();
    const std::string index = dir_ + "/model.mega.index.json";
    Status idx_old = LoadsAs(specs_[current_], index);
    Status idx_new = idx_old.ok() ? Status::OK() : LoadsAs(specs_[next], index);
    EXPECT_TRUE(idx_old.ok() || idx_new.ok())
        << what << ": the index names neither checkpoint:\n  old: " << idx_old.ToString()
        << "\n  new: " << idx_new.ToString();
    if (as_old.ok()) {
      ++*old_count;
    } else {
      ++*new_count;
      current_ = next;
    }
  }

  test_util::TempDir tmp_{"mega-crash"};
  std::string dir_;
  synthetic::Spec specs_[2];
  int current_ = 0;
};

TEST_F(CrashTest, SeedDefect8_KillAtEveryFilesystemStep) {
  // Count the steps of one complete save (which also makes specs_[1] current).
  auto counter = std::make_shared<KillingFs>(0);
  ASSERT_TRUE(SaveSpec(specs_[1], dir_, counter).ok());
  current_ = 1;
  const int steps = counter->steps();
  ASSERT_GT(steps, 8);
  int old_count = 0, new_count = 0;
  for (int k = 1; k <= steps + 1; ++k) {
    const int next = 1 - current_;
    int status = RunChildSave(specs_[next], dir_, k, -1);
    ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
        << "child failed at step " << k;
    CheckOldOrNew("killed at step " + std::to_string(k) + " of " + std::to_string(steps),
                  &new_count, &old_count);
    if (HasFatalFailure()) return;
  }
  // Early kills keep the old checkpoint, late ones (after the commit) the new one.
  EXPECT_GT(old_count, 0);
  EXPECT_GT(new_count, 0);
  // Leftovers of killed saves do not accumulate: a clean save removes them.
  ASSERT_TRUE(SaveSpec(specs_[1 - current_], dir_, nullptr).ok());
  current_ = 1 - current_;
  for (const auto& e : stdfs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  }
  EXPECT_TRUE(LoadsAs(specs_[current_], dir_).ok());
}

TEST_F(CrashTest, SeedDefect8_KillAtRandomInstants) {
  // Time one full save in a child (fork + save + exit).
  const auto t0 = std::chrono::steady_clock::now();
  int status = RunChildSave(specs_[1], dir_, 0, -1);
  const double full = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  current_ = 1;
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<double> delay(0.0, full * 1.1);
  int old_count = 0, new_count = 0;
  constexpr int kIterations = 40;
  for (int i = 0; i < kIterations; ++i) {
    const double d = delay(rng);
    ASSERT_NE(RunChildSave(specs_[1 - current_], dir_, 0, d), -1);
    CheckOldOrNew("iteration " + std::to_string(i) + ", killed after " + std::to_string(d) +
                      " s of ~" + std::to_string(full) + " s",
                  &new_count, &old_count);
    if (HasFatalFailure()) return;
  }
  std::printf("[ info ] %d kills: %d left the previous checkpoint, %d the new one (save ~%.3f s)\n",
              kIterations, old_count, new_count, full);
  EXPECT_EQ(old_count + new_count, kIterations);
}

}  // namespace
}  // namespace megackpt::dcp
