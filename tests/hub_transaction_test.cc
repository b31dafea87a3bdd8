// Transactions (a checkpoint save = one commit) on the embedded hub and on a
// real megahub: one commit for many files, abort/crash leave the branch alone,
// multi-rank staging, conflicts and rebase, read-your-writes, buckets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "hub_test_server.h"
#include "megackpt/core/checksum.h"
#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/transaction.h"

namespace megackpt {
namespace {

using ::megackpt::testing::SharedHub;
using ::megackpt::testing::SharedHubServer;
using ::megackpt::testing::TempDir;
using ::testing::HasSubstr;

SharedHubServer* Server() { return &SharedHub("txn-hub"); }

class HubTransactionTest : public ::testing::TestWithParam<bool /*remote*/> {
 protected:
  void SetUp() override {
    static int counter = 0;
    repo_ = "mega://org/txn" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    hub_ = Connect();
    ASSERT_NE(hub_, nullptr);
    fs_ = hub::NewMegaFileSystem(hub_);
  }

  std::shared_ptr<hub::HubConnection> Connect() {
    if (GetParam()) {
      if (!Server()->ok) return nullptr;
      auto h = hub::OpenRemoteHub(Server()->server.endpoint(), Server()->token);
      return h.ok() ? *h : nullptr;
    }
    auto h = hub::OpenEmbeddedHub(local_.path() + "/hub");
    return h.ok() ? *h : nullptr;
  }

  std::string RepoId() { return repo_.substr(7); }
  std::string Head() {
    auto h = hub_->ResolveRevision(RepoId(), "main");
    return h.ok() ? *h : "";
  }
  size_t CommitCount() {
    auto l = hub_->ListCommits(RepoId(), "main", 1000);
    return l.ok() ? l->size() : 0;
  }

  TempDir local_{"txn-local"};
  std::string repo_;
  std::shared_ptr<hub::HubConnection> hub_;
  std::shared_ptr<hub::MegaFileSystem> fs_;
};

TEST_P(HubTransactionTest, ManyFilesOneCommit) {
  auto txn = fs_->BeginHubTransaction(repo_ + "@main/ckpt/step-100");
  ASSERT_TRUE(txn.ok()) << txn.status().ToString();
  size_t before = CommitCount();
  std::string base = (*txn)->base_commit();
  EXPECT_EQ(base, Head());
  // Writes through the FileSystem seam below the root join the transaction.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(fs_->WriteAtomically(repo_ + "/ckpt/step-100/shard" + std::to_string(i),
                                     "data" + std::to_string(i))
                    .ok());
  }
  ASSERT_TRUE((*txn)->Put("meta.json", "{}").ok());
  // Nothing is visible on the branch yet, but this FileSystem reads its own writes.
  EXPECT_EQ(Head(), base);
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "/ckpt/step-100/shard3"), "data3");
  auto other = hub::NewMegaFileSystem(Connect());
  EXPECT_FALSE(*other->Exists(repo_ + "/ckpt/step-100/shard3"));
  auto list = fs_->List(repo_ + "/ckpt/step-100");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->size(), 6u);
  auto c = (*txn)->Commit();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c->parent, base);
  EXPECT_EQ(CommitCount(), before + 1);
  EXPECT_EQ(Head(), c->id);
  EXPECT_EQ(*other->ReadWhole(repo_ + "/ckpt/step-100/shard3"), "data3");
  EXPECT_EQ(*other->ReadWhole(repo_ + "/ckpt/step-100/meta.json"), "{}");
  EXPECT_EQ((*txn)->stats().files_written, 6u);
  // After commit, writes no longer join it (a lone write is its own commit).
  ASSERT_TRUE(fs_->WriteAtomically(repo_ + "/ckpt/step-100/late", "x").ok());
  EXPECT_EQ(CommitCount(), before + 2);
}

TEST_P(HubTransactionTest, AbortAndCrashLeaveBranchUntouched) {
  auto setup = fs_->WriteAtomically(repo_ + "/keep.txt", "old");
  ASSERT_TRUE(setup.ok()) << setup.ToString();
  std::string head = Head();
  {
    auto txn = fs_->BeginHubTransaction(repo_);
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE((*txn)->Put("keep.txt", "new").ok());
    ASSERT_TRUE(fs_->Remove(repo_ + "/keep.txt").ok());  // staged delete
    EXPECT_FALSE(*fs_->Exists(repo_ + "/keep.txt"));
    (*txn)->Abort();
    EXPECT_EQ((*txn)->Commit().status().code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(Head(), head);
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "/keep.txt"), "old");
  {
    // A "crash": the transaction is dropped without commit or abort.
    auto txn = hub::HubTransaction::Begin(hub_, *hub::ParseMegaUri(repo_));
    ASSERT_TRUE(txn.ok());
    auto f = (*txn)->OpenForWrite("keep.txt");
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append(AsBytes(std::string_view("half-written"))).ok());
  }
  EXPECT_EQ(Head(), head);
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "/keep.txt"), "old");
}

TEST_P(HubTransactionTest, MultiRankSaveIsOneCommit) {
  auto root = *hub::ParseMegaUri(repo_ + "@main/ckpt");
  auto coord = hub::HubTransaction::Begin(hub_, root);
  ASSERT_TRUE(coord.ok());
  std::string base = (*coord)->base_commit();
  constexpr int kRanks = 4;
  std::vector<std::string> payloads(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      auto conn = Connect();  // each rank its own connection (as its own process would)
      auto txn = hub::HubTransaction::Begin(conn, root, {}, base);
      ASSERT_TRUE(txn.ok()) << txn.status().ToString();
      ASSERT_TRUE(
          (*txn)->Put("rank" + std::to_string(r) + ".mega", std::string(10000 + r, 'a' + r)).ok());
      payloads[r] = hub::SerializeStaged((*txn)->staged());
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE((*coord)->Put("index.json", "{\"ranks\":4}").ok());
  for (const auto& p : payloads) {
    auto entries = hub::ParseStaged(p);
    ASSERT_TRUE(entries.ok()) << entries.status().ToString();
    ASSERT_TRUE((*coord)->Stage(*entries).ok());
  }
  size_t before = CommitCount();
  auto c = (*coord)->Commit();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(CommitCount(), before + 1);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(*fs_->ReadWhole(repo_ + "/ckpt/rank" + std::to_string(r) + ".mega"),
              std::string(10000 + r, 'a' + r));
  }
  EXPECT_FALSE(hub::ParseStaged("[{\"path\":\"../x\",\"size\":1}]").ok());
  EXPECT_FALSE(hub::ParseStaged("{").ok());
}

TEST_P(HubTransactionTest, ConflictUnlessRebaseWithoutCollision) {
  ASSERT_TRUE(fs_->WriteAtomically(repo_ + "/x", "0").ok());
  auto root = *hub::ParseMegaUri(repo_);
  auto a = hub::HubTransaction::Begin(hub_, root);
  auto b = hub::HubTransaction::Begin(hub_, root);
  auto c = hub::HubTransaction::Begin(hub_, root, {.rebase = true});
  auto d = hub::HubTransaction::Begin(hub_, root, {.rebase = true});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  ASSERT_TRUE((*a)->Put("x", "a").ok());
  ASSERT_TRUE((*b)->Put("y", "b").ok());
  ASSERT_TRUE((*c)->Put("z", "c").ok());
  ASSERT_TRUE((*d)->Put("x", "d").ok());
  ASSERT_TRUE((*a)->Commit().ok());
  auto rb = (*b)->Commit();
  EXPECT_EQ(rb.status().code(), StatusCode::kAborted);
  EXPECT_THAT(rb.status().message(), HasSubstr("conflict"));
  EXPECT_TRUE((*c)->Commit().ok());  // rebased: z does not collide
  auto rd = (*d)->Commit();          // x changed on the branch: no rebase
  EXPECT_EQ(rd.status().code(), StatusCode::kAborted);
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "/x"), "a");
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "/z"), "c");
  EXPECT_FALSE(*fs_->Exists(repo_ + "/y"));
}

TEST_P(HubTransactionTest, OnlyBranchesAreWritable) {
  ASSERT_TRUE(fs_->WriteAtomically(repo_ + "/f", "1").ok());
  std::string head = Head();
  auto at_commit = fs_->OpenForWrite(repo_ + "@" + head + "/g");
  EXPECT_EQ(at_commit.status().code(), StatusCode::kFailedPrecondition);
  // Reading at the commit id works and is pinned.
  ASSERT_TRUE(fs_->WriteAtomically(repo_ + "/f", "2").ok());
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "@" + head + "/f"), "1");
  // A new branch is created from main on first write.
  ASSERT_TRUE(fs_->WriteAtomically(repo_ + "@dev/f", "dev").ok());
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "@dev/f"), "dev");
  EXPECT_EQ(*fs_->ReadWhole(repo_ + "/f"), "2");
}

TEST_P(HubTransactionTest, BucketTransactionIsOneBatch) {
  std::string bucket = "mega://buckets/org/b" + repo_.substr(repo_.rfind('/') + 4);
  ASSERT_TRUE(fs_->WriteAtomically(bucket + "/now.bin", "visible at once").ok());
  EXPECT_EQ(*fs_->ReadWhole(bucket + "/now.bin"), "visible at once");
  auto txn = fs_->BeginHubTransaction(bucket + "/run");
  ASSERT_TRUE(txn.ok()) << txn.status().ToString();
  ASSERT_TRUE(fs_->WriteAtomically(bucket + "/run/a", "A").ok());
  ASSERT_TRUE(fs_->WriteAtomically(bucket + "/run/b", "B").ok());
  auto other = hub::NewMegaFileSystem(Connect());
  EXPECT_FALSE(*other->Exists(bucket + "/run/a"));
  ASSERT_TRUE((*txn)->Commit().ok());
  EXPECT_EQ(*other->ReadWhole(bucket + "/run/b"), "B");
}

INSTANTIATE_TEST_SUITE_P(EmbeddedAndRemote, HubTransactionTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Remote" : "Embedded";
                         });

// FileSystemForPath routes mega:// by MEGA_ENDPOINT (file:// = embedded).
TEST(FileSystemForPathTest, RoutesMegaUris) {
  TempDir dir("fsforpath");
  setenv("MEGA_ENDPOINT", ("file://" + dir.path() + "/hub").c_str(), 1);
  auto bad = fs::FileSystemForPath("mega://org//m");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("empty name"));
  auto fs = fs::FileSystemForPath("mega://org/m@main/ckpt/x");
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  EXPECT_EQ((*fs)->scheme(), "mega");
  ASSERT_TRUE((*fs)->WriteAtomically("mega://org/m/ckpt/x", "hello").ok());
  EXPECT_EQ(*(*fs)->ReadWhole("mega://org/m@main/ckpt/x"), "hello");
  EXPECT_EQ((*fs::FileSystemForPath("/tmp"))->scheme(), "local");
  unsetenv("MEGA_ENDPOINT");
}

}  // namespace
}  // namespace megackpt
