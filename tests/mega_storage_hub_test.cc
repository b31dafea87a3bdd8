// MegaStorageWriter / MegaStorageReader over mega:// (docs/mega-storage.md,
// "mega://"), against the embedded hub store AND a real `megahub` started by
// the test on loopback: a multi-rank save is ONE commit, resharded loads are
// bit-identical, a re-save with 10% of the tensors changed uploads little and
// deletes the stale files of the old checkpoint in the same commit, abort /
// an error on one rank / a concurrent commit leave the branch alone, a pinned
// reader keeps its revision, buckets, slice reads, and the demo CLI.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "dcp/synthetic.h"
#include "dcp/test_fs.h"
#include "hub_test_server.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::dcp {
namespace {

using ::megackpt::testing::RunCommand;
using ::megackpt::testing::SharedHub;
using ::megackpt::testing::SharedHubServer;
using ::megackpt::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;

SharedHubServer* Server() { return &SharedHub("mshub-server"); }

dist::ProcessGroupOptions Quick() {
  dist::ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(60);
  return o;
}

Status AllOk(const std::vector<Status>& statuses) {
  for (const Status& s : statuses) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Forwards to a MegaStorageWriter; optional hooks inject failures.
class HookedWriter final : public StorageWriter {
 public:
  explicit HookedWriter(std::unique_ptr<MegaStorageWriter> inner) : inner_(std::move(inner)) {}
  std::function<Status(int rank)> after_write;  // error -> WriteData fails
  std::function<Status()> before_finish;        // error -> Finish fails (nothing committed)

  MegaStorageWriter& inner() { return *inner_; }
  Status Reset(std::string_view id) override { return inner_->Reset(id); }
  bool ValidateCheckpointId(std::string_view id) const override {
    return inner_->ValidateCheckpointId(id);
  }
  Status SetUpStorageWriter(const StorageSetUp& setup) override {
    rank_ = setup.rank;
    return inner_->SetUpStorageWriter(setup);
  }
  Result<SavePlan> PrepareLocalPlan(SavePlan plan) override {
    return inner_->PrepareLocalPlan(std::move(plan));
  }
  Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) override {
    return inner_->PrepareGlobalPlan(std::move(plans));
  }
  Result<std::vector<WriteResult>> WriteData(const SavePlan& plan, SavePlanner& planner) override {
    auto r = inner_->WriteData(plan, planner);
    if (r.ok() && after_write) MEGA_RETURN_IF_ERROR(after_write(rank_));
    return r;
  }
  Status Finish(const Metadata& md, const std::vector<std::vector<WriteResult>>& results) override {
    if (before_finish) MEGA_RETURN_IF_ERROR(before_finish());
    return inner_->Finish(md, results);
  }
  void Abort() override {
    ++aborts;
    inner_->Abort();
  }
  std::optional<StorageMeta> GetStorageMeta() const override { return inner_->GetStorageMeta(); }
  int aborts = 0;

 private:
  std::unique_ptr<MegaStorageWriter> inner_;
  int rank_ = 0;
};

// A small state of `count` F32 [rows, 256] tensors whose values depend on
// (tensor, version[tensor]); tensor i is sharded by rows over the ranks.
struct VersionedState {
  int count = 20;
  int64_t rows = 256;
  std::vector<int> version;
  VersionedState() : version(20, 0) {}

  float Value(int i, int64_t flat) const {
    uint64_t x = (static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull) ^
                 (static_cast<uint64_t>(flat) * 0xBF58476D1CE4E5B9ull) ^
                 (static_cast<uint64_t>(version[i]) * 0x94D049BB133111EBull);
    x ^= x >> 31;
    x *= 0xD6E8FEB86659FD39ull;
    x ^= x >> 29;
    return static_cast<float>(x & 0xFFFFFF) / 7.0f;
  }
  std::string Name(int i) const { return "layers." + std::to_string(i) + ".weight"; }

  // Rank `rank` of `world`: its row block of every tensor (filled or zero).
  Result<StateDict> Build(int world, int rank, bool fill) const {
    StateDict sd;
    for (int i = 0; i < count; ++i) {
      const int64_t per = (rows + world - 1) / world;
      const int64_t begin = std::min<int64_t>(rows, per * rank);
      const int64_t end = std::min<int64_t>(rows, begin + per);
      ShardedTensor st;
      st.dtype = DType::kF32;
      st.global_shape = {rows, 256};
      if (end > begin) {
        MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {end - begin, 256}));
        float* p = static_cast<float*>(t.data());
        for (int64_t k = 0; k < (end - begin) * 256; ++k)
          p[k] = fill ? Value(i, begin * 256 + k) : -1.0f;
        st.shards.push_back({{begin, 0}, t});
      }
      sd.Set(Name(i), StateValue(std::move(st)));
    }
    return sd;
  }

  Status Verify(StateDict& sd) const {
    for (int i = 0; i < count; ++i) {
      StateValue* v = sd.Find(Name(i));
      if (!v || !v->is_sharded()) return NotFoundError(Name(i));
      for (const Shard& s : v->sharded().shards) {
        const float* p = static_cast<const float*>(s.tensor.data());
        const int64_t n = s.tensor.shape()[0] * 256;
        for (int64_t k = 0; k < n; ++k) {
          if (p[k] != Value(i, s.offsets[0] * 256 + k)) {
            return DataLossError(Name(i) + " differs at element " +
                                 std::to_string(s.offsets[0] * 256 + k));
          }
        }
      }
    }
    return Status::OK();
  }

  uint64_t TotalBytes() const { return static_cast<uint64_t>(count) * rows * 256 * 4; }

  // This state with every tensor at version `v` (every tensor changed when v
  // differs from all of this state's versions).
  VersionedState AllAtVersion(int v) const {
    VersionedState out = *this;
    for (int& x : out.version) x = v;
    return out;
  }
};

// ---- The crash child of CrashBeforeTheCommitLeavesTheOldRevision ----------
// The saving child is this test binary exec'd again, not a bare fork(): a fork
// of this multi-threaded process (thread pools, HTTP client threads) would
// inherit their state, possibly a mutex held at the fork, without the threads,
// and could wait forever. main() (at the end of this file) runs RunCrashChild()
// instead of the tests when argv[1] is kCrashChildFlag.
constexpr char kCrashChildFlag[] = "--mega-storage-crash-child";

// What the child saves over the parent's VersionedState{}: every tensor changed.
VersionedState CrashChildState() { return VersionedState().AllAtVersion(9); }

// Starts `<this binary> kCrashChildFlag args...` (posix_spawn: no fork of
// this process's threads). Returns the child's pid.
Result<pid_t> SpawnCrashChild(const std::vector<std::string>& args) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return IOError(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
  self[n] = '\0';
  std::vector<std::string> all = {self, kCrashChildFlag};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, self, nullptr, nullptr, argv.data(), environ);
  if (rc != 0) return IOError(std::string("posix_spawn ") + self + ": " + std::strerror(rc));
  return pid;
}

// The child: argv = <binary> kCrashChildFlag remote|embedded <endpoint|store>
// <token> <mega:// path>. Saves CrashChildState() from 2 thread ranks and
// SIGKILLs itself in rank 0's Finish, before the commit. Returns (exit code)
// only when something went wrong, after saying what on stderr.
int RunCrashChild(int argc, char** argv) {
  if (argc != 6 || (std::strcmp(argv[2], "remote") != 0 && std::strcmp(argv[2], "embedded") != 0)) {
    std::fprintf(stderr,
                 "crash child: usage: %s %s remote|embedded <endpoint|store> <token> <path>\n",
                 argv[0], kCrashChildFlag);
    return 2;
  }
  const bool remote = std::strcmp(argv[2], "remote") == 0;
  const std::string where = argv[3], token = argv[4], path = argv[5];
  auto h = remote ? hub::OpenRemoteHub(where, token) : hub::OpenEmbeddedHub(where);
  if (!h.ok()) {
    std::fprintf(stderr, "crash child: cannot open the hub at %s: %s\n", where.c_str(),
                 h.status().ToString().c_str());
    return 3;
  }
  auto child_fs = hub::NewMegaFileSystem(*h);
  const VersionedState changed = CrashChildState();
  std::vector<Status> st = dist::RunThreadRanks(
      2,
      [&](dist::ProcessGroup& g) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd, changed.Build(2, g.rank(), true));
        MegaStorageWriterOptions o;
        o.fs = child_fs;
        HookedWriter w(std::make_unique<MegaStorageWriter>(path, std::nullopt, o));
        w.before_finish = []() -> Status {
          kill(getpid(), SIGKILL);
          return Status::OK();
        };
        return Save(sd, w, &g);
      },
      Quick());
  for (size_t r = 0; r < st.size(); ++r) {
    std::fprintf(
        stderr, "crash child: the save of %s returned instead of reaching the kill; rank %zu: %s\n",
        path.c_str(), r, st[r].ToString().c_str());
  }
  return 4;
}

class MegaStorageHubTest : public ::testing::TestWithParam<bool /*remote*/> {
 protected:
  void SetUp() override {
    static int counter = 0;
    repo_ = "org/ms" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    if (GetParam()) {
      ASSERT_TRUE(Server()->ok) << "could not start megahub";
      auto h = hub::OpenRemoteHub(Server()->server.endpoint(), Server()->token);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hub_ = *h;
    } else {
      auto h = hub::OpenEmbeddedHub(local_.path() + "/hub");
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hub_ = *h;
    }
    fs_ = hub::NewMegaFileSystem(hub_);
    // Created up front, so commit counts below count saves only (a new repo
    // starts with an initial commit).
    hub::RepoSpec spec;
    spec.ns = repo_.substr(0, repo_.find('/'));
    spec.name = repo_.substr(repo_.find('/') + 1);
    auto created = hub_->CreateRepo(spec, false);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
  }

  std::string Path(const std::string& sub = "ckpt/step-100") const {
    return "mega://" + repo_ + "@main/" + sub;
  }
  std::string Head() {
    auto h = hub_->ResolveRevision(repo_, "main");
    return h.ok() ? *h : "";
  }
  size_t Commits() {
    auto l = hub_->ListCommits(repo_, "main", 10000);
    return l.ok() ? l->size() : 0;
  }
  std::set<std::string> FilesAtHead(const std::string& prefix) {
    std::set<std::string> out;
    auto files = hub_->ListFiles(repo_, Head(), prefix);
    if (files.ok()) {
      for (const auto& f : *files) out.insert(f.path.substr(prefix.size()));
    }
    return out;
  }

  MegaStorageWriterOptions WriterOptions() const {
    MegaStorageWriterOptions o;
    o.fs = fs_;
    return o;
  }
  MegaStorageReaderOptions ReaderOptions() const {
    MegaStorageReaderOptions o;
    o.fs = fs_;
    return o;
  }

  Status SaveSynthetic(const synthetic::Spec& spec, const std::string& path, int world) {
    return AllOk(dist::RunThreadRanks(
        world,
        [&](dist::ProcessGroup& g) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd,
                                synthetic::BuildRankState(spec, world, g.rank(), 0, true));
          MegaStorageWriter writer(path, std::nullopt, WriterOptions());
          return Save(sd, writer, &g);
        },
        Quick()));
  }
  Status LoadSynthetic(const synthetic::Spec& spec, const std::string& path, int world,
                       int variant) {
    return AllOk(dist::RunThreadRanks(
        world,
        [&](dist::ProcessGroup& g) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd,
                                synthetic::BuildRankState(spec, world, g.rank(), variant, false));
          MegaStorageReader reader(path, ReaderOptions());
          MEGA_RETURN_IF_ERROR(Load(sd, reader, &g));
          return synthetic::VerifyRankState(spec, sd);
        },
        Quick()));
  }
  // Saves `state` from `world` ranks; sums the ranks' upload counters.
  Status SaveVersioned(const VersionedState& state, const std::string& path, int world,
                       uint64_t* written = nullptr, uint64_t* new_bytes = nullptr) {
    std::mutex mu;
    uint64_t w = 0, n = 0;
    Status s = AllOk(dist::RunThreadRanks(
        world,
        [&](dist::ProcessGroup& g) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd, state.Build(world, g.rank(), true));
          MegaStorageWriter writer(path, std::nullopt, WriterOptions());
          MEGA_RETURN_IF_ERROR(Save(sd, writer, &g));
          std::lock_guard<std::mutex> lock(mu);
          w += writer.hub_bytes_written();
          n += writer.hub_new_bytes();
          return Status::OK();
        },
        Quick()));
    if (written) *written = w;
    if (new_bytes) *new_bytes = n;
    return s;
  }
  Status LoadVersioned(const VersionedState& state, const std::string& path, int world) {
    return AllOk(dist::RunThreadRanks(
        world,
        [&](dist::ProcessGroup& g) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd, state.Build(world, g.rank(), false));
          MegaStorageReader reader(path, ReaderOptions());
          MEGA_RETURN_IF_ERROR(Load(sd, reader, &g));
          return state.Verify(sd);
        },
        Quick()));
  }

  TempDir local_{"mshub-local"};
  std::string repo_;
  std::shared_ptr<hub::HubConnection> hub_;
  std::shared_ptr<hub::MegaFileSystem> fs_;
};

TEST_P(MegaStorageHubTest, MultiRankSaveIsOneCommitAndReshardedLoadIsExact) {
  const synthetic::Spec spec = synthetic::MakeSpec(7, 3 << 20);
  for (int world : {2, 3}) {
    const std::string path = Path("ckpt/world" + std::to_string(world));
    const size_t before = Commits();
    ASSERT_TRUE(SaveSynthetic(spec, path, world).ok());
    EXPECT_EQ(Commits(), before + 1) << "a save of " << world << " ranks must be one commit";
    auto log = hub_->ListCommits(repo_, "main", 1);
    ASSERT_TRUE(log.ok());
    EXPECT_THAT(log->front().message, HasSubstr("ckpt/world" + std::to_string(world)));
    // Every file of the folder is the new checkpoint's.
    const std::set<std::string> files = FilesAtHead("ckpt/world" + std::to_string(world) + "/");
    EXPECT_TRUE(files.count(".metadata"));
    EXPECT_TRUE(files.count("model.mega.index.json"));
    // Resharded loads into other world sizes and layouts, bit-identical.
    for (int load_world : {1, world == 2 ? 3 : 2}) {
      Status s = LoadSynthetic(spec, path, load_world, 1);
      EXPECT_TRUE(s.ok()) << "save " << world << " load " << load_world << ": " << s.ToString();
    }
    EXPECT_TRUE(VerifyMegaCheckpoint(path, 2, fs_).ok());
  }
}

TEST_P(MegaStorageHubTest, ResaveWithTenPercentChangedUploadsLittleAndDropsStaleFiles) {
  VersionedState state;
  state.rows = 1024;  // 20 tensors of 1 MiB
  const std::string path = Path();
  // First save at world 3 (more shards), then world 2 over it.
  uint64_t written = 0, fresh = 0;
  ASSERT_TRUE(SaveVersioned(state, path, 3, &written, &fresh).ok());
  EXPECT_GE(written, state.TotalBytes());
  const std::set<std::string> first = FilesAtHead("ckpt/step-100/");
  ASSERT_TRUE(SaveVersioned(state, path, 2).ok());
  const size_t before = Commits();
  for (int i = 0; i < state.count; i += 10) state.version[i] = 1;  // 2 of 20 tensors
  const uint64_t server_before = [&] {
    if (!GetParam()) return uint64_t{0};
    auto st = hub::FetchServerStats(Server()->server.endpoint());
    return st.ok() ? json::parse(*st).value("xorb_bytes_received", uint64_t{0}) : uint64_t{0};
  }();
  ASSERT_TRUE(SaveVersioned(state, path, 2, &written, &fresh).ok());
  EXPECT_EQ(Commits(), before + 1);
  EXPECT_GE(written, state.TotalBytes());
  std::printf("re-save with 10%% of the tensors changed: uploaded %llu of %llu bytes (%.1f%%)\n",
              static_cast<unsigned long long>(fresh), static_cast<unsigned long long>(written),
              100.0 * static_cast<double>(fresh) / static_cast<double>(written));
  EXPECT_LE(fresh, state.TotalBytes() * 15 / 100) << "uploaded " << fresh << " of " << written;
  EXPECT_GT(fresh, state.TotalBytes() * 5 / 100) << "the changed tensors must travel";
  if (GetParam()) {
    auto st = hub::FetchServerStats(Server()->server.endpoint());
    ASSERT_TRUE(st.ok());
    const uint64_t received =
        json::parse(*st).value("xorb_bytes_received", uint64_t{0}) - server_before;
    EXPECT_LE(received, state.TotalBytes() * 15 / 100) << "server received " << received;
  }
  // The world-3 files are gone (deleted in the commit that replaced them).
  const std::set<std::string> now = FilesAtHead("ckpt/step-100/");
  MegaStorageReader reader(path, ReaderOptions());
  auto md = reader.ReadMetadata();
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  std::set<std::string> expected = {".metadata", "model.mega.index.json"};
  for (const auto& [key, info] : md->storage_data) expected.insert(info.relative_path);
  EXPECT_EQ(now, expected);
  EXPECT_NE(first, now);
  for (const auto& [key, info] : md->storage_data) EXPECT_TRUE(info.extra.empty());
  EXPECT_TRUE(LoadVersioned(state, path, 3).ok());
  EXPECT_TRUE(LoadVersioned(state, path, 1).ok());
}

TEST_P(MegaStorageHubTest, FailuresLeaveTheBranchUntouched) {
  VersionedState state;
  const std::string path = Path();
  ASSERT_TRUE(SaveVersioned(state, path, 2).ok());
  const std::string head = Head();
  const VersionedState changed = state.AllAtVersion(5);

  // (a) an error on rank 1 after it uploaded its shards; (b) a failure right
  // before the commit (the framework aborts every rank).
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<int> aborts(2, 0);
    std::vector<Status> st = dist::RunThreadRanks(
        2,
        [&](dist::ProcessGroup& g) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd, changed.Build(2, g.rank(), true));
          HookedWriter w(std::make_unique<MegaStorageWriter>(path, std::nullopt, WriterOptions()));
          if (mode == 0) {
            w.after_write = [](int rank) {
              return rank == 1 ? IOError("injected failure on rank 1") : Status::OK();
            };
          } else {
            w.before_finish = [] { return IOError("injected failure before the commit"); };
          }
          Status s = Save(sd, w, &g);
          aborts[g.rank()] = w.aborts;
          return s;
        },
        Quick());
    ASSERT_FALSE(st[0].ok()) << "mode " << mode;
    EXPECT_THAT(st[0].message(), HasSubstr("injected"));
    EXPECT_GE(aborts[0], 1);
    EXPECT_GE(aborts[1], 1);
    EXPECT_EQ(Head(), head) << "mode " << mode;
    EXPECT_TRUE(LoadVersioned(state, path, 2).ok()) << "mode " << mode;
  }

  // (c) an explicit Abort after the data was written.
  {
    auto sd = changed.Build(1, 0, true);
    ASSERT_TRUE(sd.ok());
    HookedWriter hooked(std::make_unique<MegaStorageWriter>(path, std::nullopt, WriterOptions()));
    hooked.before_finish = [&] {
      hooked.inner().Abort();
      return Status::OK();
    };
    Status s = Save(*sd, hooked);
    EXPECT_FALSE(s.ok()) << "Finish after Abort must not commit";
    EXPECT_EQ(Head(), head);
  }

  // (d) a concurrent commit lands on the branch between the plan and the commit.
  {
    auto sd = changed.Build(1, 0, true);
    ASSERT_TRUE(sd.ok());
    HookedWriter w(std::make_unique<MegaStorageWriter>(path, std::nullopt, WriterOptions()));
    std::string other;
    w.before_finish = [&]() -> Status {
      auto root = hub::ParseMegaUri("mega://" + repo_ + "@main");
      MEGA_RETURN_IF_ERROR(root.status());
      MEGA_ASSIGN_OR_RETURN(auto txn, hub::HubTransaction::Begin(hub_, *root));
      MEGA_RETURN_IF_ERROR(txn->Put("notes.txt", "concurrent"));
      MEGA_ASSIGN_OR_RETURN(auto c, txn->Commit());
      other = c.id;
      return Status::OK();
    };
    Status s = Save(*sd, w);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("conflict"));
    EXPECT_THAT(s.message(), HasSubstr("branch 'main'"));
    EXPECT_EQ(Head(), other);
    EXPECT_TRUE(LoadVersioned(state, path, 1).ok());
  }
}

TEST_P(MegaStorageHubTest, CrashBeforeTheCommitLeavesTheOldRevision) {
  VersionedState state;
  const std::string path = Path();
  Status saved = SaveVersioned(state, path, 2);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  const std::string head = Head();
  const VersionedState changed = CrashChildState();
  // A child process (this binary, exec'd: see RunCrashChild) saves `changed`
  // from 2 thread ranks over its own connection and is SIGKILLed (rank 0,
  // before its Finish) after every rank uploaded its shards.
  const std::string endpoint = GetParam() ? Server()->server.endpoint() : "";
  const std::string token = GetParam() ? Server()->token : "";
  const std::string store = local_.path() + "/hub";
  // Close this process's hub connection first, so that the child is the only
  // one using the embedded store while it saves.
  fs_.reset();
  hub_.reset();
  auto pid = SpawnCrashChild(
      {GetParam() ? "remote" : "embedded", GetParam() ? endpoint : store, token, path});
  ASSERT_TRUE(pid.ok()) << pid.status().ToString();
  // Bounded wait: a child that has not killed itself after 120 s is killed
  // here, and the test fails.
  int status = 0;
  pid_t waited = 0;
  for (int i = 0; i < 1200 && waited == 0; ++i) {
    waited = waitpid(*pid, &status, WNOHANG);
    if (waited == 0) usleep(100 * 1000);
  }
  if (waited == 0) {
    ADD_FAILURE() << "the saving child (pid " << *pid
                  << ") did not reach its SIGKILL within 120 s; killing it";
    kill(*pid, SIGKILL);
    waited = waitpid(*pid, &status, 0);
  }
  ASSERT_EQ(waited, *pid);
  ASSERT_TRUE(WIFSIGNALED(status))
      << "child exit " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
      << " (its stderr says why)";
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  {
    // Reopen (the embedded store was written by another process meanwhile).
    auto h = GetParam() ? hub::OpenRemoteHub(endpoint, token) : hub::OpenEmbeddedHub(store);
    ASSERT_TRUE(h.ok());
    hub_ = *h;
    fs_ = hub::NewMegaFileSystem(hub_);
  }
  EXPECT_EQ(Head(), head) << "a crash before the commit must leave the branch at the old revision";
  Status loaded = LoadVersioned(state, path, 3);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  // And the next save works.
  saved = SaveVersioned(changed, path, 2);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  loaded = LoadVersioned(changed, path, 1);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
}

TEST_P(MegaStorageHubTest, AsyncSaveIsOneCommit) {
  VersionedState state;
  const std::string path = Path();
  ASSERT_TRUE(SaveVersioned(state, path, 2).ok());
  auto async_save = [&](const VersionedState& st, uint64_t pool_bytes) {
    return AllOk(dist::RunThreadRanks(
        2,
        [&](dist::ProcessGroup& g) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd, st.Build(2, g.rank(), true));
          auto writer = std::make_shared<MegaStorageWriter>(path, std::nullopt, WriterOptions());
          AsyncSaveOptions o;
          o.pool = StagingPool::Create(pool_bytes);  // one per rank
          AsyncSaveHandle h = AsyncSave(std::move(sd), writer, &g, o);
          return h.done.get();
        },
        Quick()));
  };
  const VersionedState changed = state.AllAtVersion(3);
  const size_t before = Commits();
  Status s = async_save(changed, 64ull << 20);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Commits(), before + 1);
  EXPECT_TRUE(LoadVersioned(changed, path, 3).ok());
  // A pool smaller than one rank's shard would split a hub upload: refused,
  // and nothing is committed.
  const std::string head = Head();
  s = async_save(state, 256 * 1024);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_EQ(Head(), head);
  EXPECT_TRUE(LoadVersioned(changed, path, 1).ok());
}

TEST_P(MegaStorageHubTest, PinnedReaderKeepsItsRevisionWhileANewSaveLands) {
  VersionedState v1;
  const std::string path = Path();
  ASSERT_TRUE(SaveVersioned(v1, path, 2).ok());
  const std::string old_commit = Head();
  const VersionedState v2 = v1.AllAtVersion(2);

  MegaStorageReader reader(path, ReaderOptions());
  auto md = reader.ReadMetadata();  // pins the revision
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  ASSERT_TRUE(SaveVersioned(v2, path, 2).ok());  // lands meanwhile (same file names)
  ASSERT_NE(Head(), old_commit);

  auto sd = v1.Build(1, 0, false);
  ASSERT_TRUE(sd.ok());
  auto planner = NewDefaultLoadPlanner();
  ASSERT_TRUE(planner->SetUp(&*sd, *md, true).ok());
  ASSERT_TRUE(reader.SetUpStorageReader(*md, StorageSetUp{}).ok());
  auto local = planner->CreateLocalPlan();
  ASSERT_TRUE(local.ok());
  auto lp = reader.PrepareLocalPlan(*local);
  ASSERT_TRUE(lp.ok());
  auto global = planner->CreateGlobalPlan({*lp});
  ASSERT_TRUE(global.ok());
  auto prepared = reader.PrepareGlobalPlan(*global);
  ASSERT_TRUE(prepared.ok());
  auto fin = planner->FinishPlan((*prepared)[0]);
  ASSERT_TRUE(fin.ok());
  Status read = reader.ReadData(*fin, *planner);
  ASSERT_TRUE(read.ok()) << read.ToString();
  EXPECT_TRUE(v1.Verify(*sd).ok()) << "the pinned reader must read the old revision";

  // New loads see the new save; an explicit @commit keeps the old one.
  EXPECT_TRUE(LoadVersioned(v2, path, 2).ok());
  EXPECT_TRUE(LoadVersioned(v1, "mega://" + repo_ + "@" + old_commit + "/ckpt/step-100", 3).ok());
}

TEST_P(MegaStorageHubTest, BucketSaveAndLoad) {
  const std::string bucket = "mega://buckets/" + repo_ + "-b/scratch/run1";
  const synthetic::Spec spec = synthetic::MakeSpec(3, 2 << 20);
  ASSERT_TRUE(SaveSynthetic(spec, bucket, 2).ok());
  EXPECT_TRUE(LoadSynthetic(spec, bucket, 3, 1).ok());
  // A second save over it (another world size) replaces it in one batch.
  VersionedState state;
  ASSERT_TRUE(SaveVersioned(state, bucket, 3).ok());
  EXPECT_TRUE(LoadVersioned(state, bucket, 2).ok());
  auto entries = hub_->ListBucket(repo_ + "-b", "scratch/run1/");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  MegaStorageReader reader(bucket, ReaderOptions());
  auto md = reader.ReadMetadata();
  ASSERT_TRUE(md.ok());
  std::set<std::string> expected = {".metadata", "model.mega.index.json"};
  for (const auto& [key, info] : md->storage_data) expected.insert(info.relative_path);
  std::set<std::string> have;
  for (const auto& e : *entries) have.insert(e.path.substr(std::strlen("scratch/run1/")));
  EXPECT_EQ(have, expected);
}

TEST_P(MegaStorageHubTest, SliceReadDownloadsAboutTheSlice) {
  // One 4 MiB tensor saved whole; a reader that wants rows [256, 320) of 1024.
  const int64_t rows = 1024, cols = 1024;
  const std::string path = Path("ckpt/slice");
  {
    auto t = Tensor::Empty(DType::kF32, {rows, cols});
    ASSERT_TRUE(t.ok());
    float* p = static_cast<float*>(t->data());
    for (int64_t k = 0; k < rows * cols; ++k) p[k] = static_cast<float>(k % 100003);
    StateDict sd;
    sd.Set("w", StateValue(*t));
    MegaStorageWriter writer(path, std::nullopt, WriterOptions());
    Status saved = Save(sd, writer);
    ASSERT_TRUE(saved.ok()) << saved.ToString();
  }
  auto counting = std::make_shared<testing::InstrumentedFileSystem>(fs_);
  counting->data_marker = ".mega";
  auto part = Tensor::Empty(DType::kF32, {64, cols});
  ASSERT_TRUE(part.ok());
  StateDict sd;
  ShardedTensor st;
  st.dtype = DType::kF32;
  st.global_shape = {rows, cols};
  st.shards.push_back({{256, 0}, *part});
  sd.Set("w", StateValue(std::move(st)));
  MegaStorageReaderOptions o = ReaderOptions();
  o.fs = counting;
  MegaStorageReader reader(path, o);
  const uint64_t received_before = hub_->bytes_received();
  Status s = Load(sd, reader);
  ASSERT_TRUE(s.ok()) << s.ToString();
  if (GetParam()) {
    // What actually travelled over HTTP for the whole load (metadata, index,
    // shard header, API answers and the slice).
    const uint64_t received = hub_->bytes_received() - received_before;
    EXPECT_GE(received, 64u * cols * 4);
    EXPECT_LE(received, 64u * cols * 4 + 256 * 1024) << "HTTP bytes received for a 256 KiB slice";
  }
  const float* p = static_cast<const float*>(part->data());
  for (int64_t k = 0; k < 64 * cols; ++k)
    ASSERT_EQ(p[k], static_cast<float>((256 * cols + k) % 100003));
  const uint64_t slice = 64 * cols * 4;
  EXPECT_GE(counting->data_bytes_read.load(), slice);
  EXPECT_LE(counting->data_bytes_read.load(), slice + 128 * 1024)
      << "a slice read must download about the slice (4 MiB tensor, 256 KiB slice)";
}

TEST_P(MegaStorageHubTest, ConsolidateToSafetensorsIsASecondCommit) {
  const synthetic::Spec spec = synthetic::MakeSpec(5, 2 << 20);
  const std::string path = Path("ckpt/consolidated");
  const size_t before = Commits();
  MegaStorageWriterOptions o = WriterOptions();
  o.consolidate = true;
  o.consolidate_format = ConsolidateFormat::kSafetensors;
  Status s = AllOk(dist::RunThreadRanks(
      2,
      [&](dist::ProcessGroup& g) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, 2, g.rank(), 0, true));
        MegaStorageWriter writer(path, std::nullopt, o);
        MEGA_RETURN_IF_ERROR(Save(sd, writer, &g));
        if (g.rank() == 0 && writer.last_hub_commit() != Head()) {
          return InternalError("last_hub_commit is not the branch head");
        }
        return Status::OK();
      },
      Quick()));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Commits(), before + 2) << "the sharded save, then the consolidation";
  const std::set<std::string> files = FilesAtHead("ckpt/consolidated/");
  EXPECT_TRUE(files.count("model.safetensors.index.json") || files.count("model.safetensors"));
  for (const auto& f : files) EXPECT_FALSE(f.ends_with(".mega")) << f << " should be gone";
  EXPECT_TRUE(LoadSynthetic(spec, path, 3, 1).ok());
  // MEGA consolidation needs positioned writes: refused before anything is written.
  o.consolidate_format = ConsolidateFormat::kMega;
  const std::string head = Head();
  Status refused = AllOk(RunThreadRanks(
      2,
      [&](dist::ProcessGroup& g) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, 2, g.rank(), 0, true));
        MegaStorageWriter writer(path, std::nullopt, o);
        return Save(sd, writer, &g);
      },
      Quick()));
  EXPECT_EQ(refused.code(), StatusCode::kUnimplemented) << refused.ToString();
  EXPECT_EQ(Head(), head);
}

TEST_P(MegaStorageHubTest, WithoutCollectivesEveryRankCommitsAlone) {
  const std::string path = Path("ckpt/alone");
  const size_t before = Commits();
  for (int round = 0; round < 2; ++round) {
    Status s = AllOk(dist::RunThreadRanks(
        2,
        [&](dist::ProcessGroup& g) -> Status {
          StateDict sd;
          MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kF32, {64, 64}));
          float* p = static_cast<float*>(t.data());
          for (int i = 0; i < 64 * 64; ++i)
            p[i] = static_cast<float>(round * 1000 + g.rank() * 100 + i);
          sd.Set("w", t);
          MegaStorageWriter writer(path, std::nullopt, WriterOptions());
          SaveOptions so;
          so.use_collectives = false;
          return Save(sd, writer, &g, so);
        },
        Quick()));
    ASSERT_TRUE(s.ok()) << s.ToString();
    // Concurrent rank commits touch disjoint paths, so they rebase: none is lost.
    EXPECT_EQ(Commits(), before + 2 * (round + 1));
    for (int r : {0, 1}) {
      MegaStorageReaderOptions o = ReaderOptions();
      o.metadata_rank = r == 0 ? -1 : r;
      StateDict sd;
      Tensor t = *Tensor::Empty(DType::kF32, {64, 64}, true);
      sd.Set("w", t);
      MegaStorageReader reader(path, o);
      Status l = Load(sd, reader);
      ASSERT_TRUE(l.ok()) << l.ToString();
      EXPECT_EQ(static_cast<float*>(t.data())[5], static_cast<float>(round * 1000 + r * 100 + 5));
    }
  }
  // The second round replaced the first one's rank-tagged shards.
  size_t shards = 0;
  for (const auto& f : FilesAtHead("ckpt/alone/")) shards += f.ends_with(".mega");
  EXPECT_EQ(shards, 2u);
}

TEST_P(MegaStorageHubTest, RejectsARepositoryRootAsCheckpointFolder) {
  VersionedState state;
  Status s = SaveVersioned(state, "mega://" + repo_ + "@main", 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Hub, MegaStorageHubTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Remote" : "Embedded"; });

// `megackpt demo --out mega://...` against both endpoints.
class MegaStorageHubCliTest : public ::testing::TestWithParam<bool /*remote*/> {};

TEST_P(MegaStorageHubCliTest, DemoSavesOneCommitAndLoadsResharded) {
  TempDir dir{"mshub-cli"};
  static int counter = 0;
  const std::string repo = "org/demo" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  std::string env;
  std::shared_ptr<hub::HubConnection> hub;
  if (GetParam()) {
    ASSERT_TRUE(Server()->ok);
    env = "MEGA_ENDPOINT=" + Server()->server.endpoint() + " MEGA_TOKEN=" + Server()->token;
    auto h = hub::OpenRemoteHub(Server()->server.endpoint(), Server()->token);
    ASSERT_TRUE(h.ok());
    hub = *h;
  } else {
    env = "MEGA_ENDPOINT=file://" + dir.path() + "/hub MEGA_TOKEN=";
  }
  int rc = -1;
  const std::string cmd = "env " + env + " HOME=" + dir.path() + " " +
                          ::megackpt::testing::MegackptBinary() + " demo --out mega://" + repo +
                          "/ckpt --size 2MB --world-size 3 2>&1";
  std::string out = RunCommand(cmd, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_THAT(out, HasSubstr("OK"));
  EXPECT_THAT(out, HasSubstr("mega"));
  if (!GetParam()) {
    auto h = hub::OpenEmbeddedHub(dir.path() + "/hub");
    ASSERT_TRUE(h.ok());
    hub = *h;
  }
  auto log = hub->ListCommits(repo, "main", 100);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  size_t saves = 0;
  for (const auto& c : *log) saves += c.message.find("save checkpoint") != std::string::npos;
  EXPECT_EQ(saves, 1u) << "one commit for the 3-rank save";
  // A second run saves again (one more commit) and loads in another layout.
  out = RunCommand(cmd, &rc);
  EXPECT_EQ(rc, 0) << out;
  log = hub->ListCommits(repo, "main", 100);
  ASSERT_TRUE(log.ok());
  saves = 0;
  for (const auto& c : *log) saves += c.message.find("save checkpoint") != std::string::npos;
  EXPECT_EQ(saves, 2u);
}

INSTANTIATE_TEST_SUITE_P(Hub, MegaStorageHubCliTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Remote" : "Embedded"; });

}  // namespace
}  // namespace megackpt::dcp

// This binary's own main: the crash child role (see RunCrashChild), else the
// tests. tests/CMakeLists.txt links every tests/*_test.cc with GTest::gtest_main,
// a static archive whose main() the linker leaves out when the program has one.
int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], megackpt::dcp::kCrashChildFlag) == 0) {
    return megackpt::dcp::RunCrashChild(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
