// The fs layer on its own (this binary links megackpt_fs and core only, no hub):
// scheme parsing and the registry, and the in-place transaction's commit
// protocol step by step (the order of its filesystem operations, the commit
// point, restoring earlier Puts when a later one fails, Abort). The shared
// contract every FileSystem passes is tests/fs_conformance_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include "core/test_files.h"
#include "megackpt/core/checksum.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::fs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::megackpt::test_util::TempDir;

TEST(PathSchemeTest, SchemesAndPlainPaths) {
  EXPECT_EQ(PathScheme("mega://org/m"), "mega");
  EXPECT_EQ(PathScheme("s3+x.y-z://b/k"), "s3+x.y-z");
  EXPECT_EQ(PathScheme("/tmp/a://b"), "");
  EXPECT_EQ(PathScheme("relative/dir"), "");
  EXPECT_EQ(PathScheme("1abc://x"), "");
  EXPECT_EQ(PathScheme("mega:/x"), "");
  EXPECT_EQ(PathScheme(""), "");
}

TEST(SchemeRegistryTest, UnregisteredSchemeIsFailedPreconditionAndLocalPathsAreLocal) {
  // This binary does not link the hub: nothing registered "mega".
  EXPECT_FALSE(IsFileSystemSchemeRegistered("mega"));
  auto r = FileSystemForPath("mega://org/m@main/ckpt");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("mega://"));
  auto local = FileSystemForPath("/tmp/x");
  ASSERT_TRUE(local.ok());
  EXPECT_EQ((*local)->scheme(), "local");
  EXPECT_EQ(local->get(), LocalFileSystem().get());
}

TEST(SchemeRegistryTest, RegisteredFactoryGetsThePathCaseInsensitively) {
  std::string seen;
  RegisterFileSystemScheme("Test-Scheme",
                           [&](std::string_view path) -> Result<std::shared_ptr<FileSystem>> {
                             seen = std::string(path);
                             if (path.ends_with("/bad"))
                               return InvalidArgumentError(std::string(path) + ": bad");
                             return LocalFileSystem();
                           });
  EXPECT_TRUE(IsFileSystemSchemeRegistered("test-scheme"));
  auto ok = FileSystemForPath("TEST-SCHEME://a/b");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(seen, "TEST-SCHEME://a/b");
  EXPECT_EQ(FileSystemForPath("test-scheme://a/bad").status().code(), StatusCode::kInvalidArgument);
  // A second registration replaces the first.
  RegisterFileSystemScheme("test-scheme",
                           [](std::string_view) -> Result<std::shared_ptr<FileSystem>> {
                             return UnavailableError("replaced");
                           });
  EXPECT_EQ(FileSystemForPath("test-scheme://a/b").status().code(), StatusCode::kUnavailable);
}

TEST(LocalFileSystemTest, Capabilities) {
  const FileSystemCapabilities c = LocalFileSystem()->capabilities();
  EXPECT_TRUE(c.positioned_writes);
  EXPECT_FALSE(c.isolated_transactions);
  EXPECT_TRUE(c.atomic_rename);
  EXPECT_TRUE(c.hard_links);
  EXPECT_TRUE(c.cached_name_lookups);
  EXPECT_EQ(*LocalFileSystem()->PinPath("/a/b"), "/a/b");
}

// Records every mutating call (and can fail WriteAtomically of a path) over the
// local filesystem. Transactions use the default in-place protocol over it.
class RecordingFs final : public FileSystem {
 public:
  std::string_view scheme() const override { return "local"; }
  FileSystemCapabilities capabilities() const override { return base_->capabilities(); }
  Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& p) override {
    return base_->OpenForRead(p);
  }
  Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& p) override {
    Log("open " + Rel(p));
    return base_->OpenForWrite(p);
  }
  Status WriteAtomically(const std::string& p, std::string_view data, bool sync) override {
    Log("put " + Rel(p));
    if (!fail_put.empty() && p.ends_with("/" + fail_put)) return IOError(p + ": injected");
    return base_->WriteAtomically(p, data, sync);
  }
  Result<bool> Exists(const std::string& p) override { return base_->Exists(p); }
  Result<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Result<std::vector<FileInfo>> List(const std::string& d) override { return base_->List(d); }
  Status Remove(const std::string& p) override {
    Log("remove " + Rel(p));
    return base_->Remove(p);
  }
  Status CreateDirectories(const std::string& d) override { return base_->CreateDirectories(d); }
  Status Rename(const std::string& a, const std::string& b) override { return base_->Rename(a, b); }
  Status SyncDirectory(const std::string& d) override {
    Log("sync " + Rel(d));
    return base_->SyncDirectory(d);
  }

  std::string root;
  std::string fail_put;
  std::vector<std::string> log;

 private:
  std::string Rel(const std::string& p) const {
    return p.starts_with(root) ? (p.size() == root.size() ? "." : p.substr(root.size() + 1)) : p;
  }
  void Log(std::string s) {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(std::move(s));
  }
  std::shared_ptr<FileSystem> base_ = LocalFileSystem();
  std::mutex mu_;
};

std::string Slurp(FileSystem& fs, const std::string& p) {
  auto r = fs.ReadWhole(p);
  return r.ok() ? *r : "<" + std::string(r.status().message()) + ">";
}

Status WriteIn(Transaction& txn, const std::string& rel, std::string_view data) {
  MEGA_ASSIGN_OR_RETURN(auto f, txn.OpenForWrite(rel));
  MEGA_RETURN_IF_ERROR(f->Append(AsBytes(data)));
  return f->Close();
}

TEST(InPlaceTransactionTest, CommitOrderIsFilesSyncPutsInOrderThenRemovals) {
  TempDir dir;
  RecordingFs fs;
  fs.root = dir.path() + "/c";
  ASSERT_TRUE(fs.WriteAtomically(fs.root + "/old.bin", "old", false).ok());
  fs.log.clear();
  auto txn = fs.BeginTransaction(fs.root + "/");  // trailing '/' dropped
  ASSERT_TRUE(txn.ok());
  EXPECT_EQ((*txn)->root(), fs.root);
  EXPECT_EQ((*txn)->base_root(), fs.root);
  EXPECT_EQ((*txn)->token(), "");
  ASSERT_TRUE(WriteIn(**txn, "shard.bin", "data").ok());
  ASSERT_TRUE((*txn)->Remove("old.bin").ok());
  ASSERT_TRUE((*txn)->Put("index", "i1").ok());
  ASSERT_TRUE((*txn)->Put("meta", "m").ok());
  ASSERT_TRUE((*txn)->Put("index", "i2").ok());  // replaces, and moves last
  // In place: the file is there already; the Puts and removals wait for Commit.
  EXPECT_EQ(Slurp(fs, fs.root + "/shard.bin"), "data");
  EXPECT_FALSE(*fs.Exists(fs.root + "/meta"));
  EXPECT_TRUE(*fs.Exists(fs.root + "/old.bin"));
  auto id = (*txn)->Commit();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "");
  EXPECT_THAT(fs.log,
              ElementsAre("open shard.bin", "sync .", "put meta", "put index", "remove old.bin"));
  EXPECT_EQ(Slurp(fs, fs.root + "/index"), "i2");
  EXPECT_FALSE(*fs.Exists(fs.root + "/old.bin"));
}

TEST(InPlaceTransactionTest, AFailedPutRestoresTheEarlierOnesAndDiscardsTheFiles) {
  TempDir dir;
  RecordingFs fs;
  fs.root = dir.path();
  ASSERT_TRUE(fs.WriteAtomically(fs.root + "/index", "previous index", false).ok());
  auto txn = fs.BeginTransaction(fs.root);
  ASSERT_TRUE(txn.ok());
  ASSERT_TRUE(WriteIn(**txn, "new.bin", "new").ok());
  ASSERT_TRUE((*txn)->Put("index", "new index").ok());
  ASSERT_TRUE((*txn)->Put("fresh", "new file").ok());
  ASSERT_TRUE((*txn)->Put("meta", "commit point").ok());
  fs.fail_put = "meta";
  auto id = (*txn)->Commit();
  EXPECT_EQ(id.status().code(), StatusCode::kIOError);
  EXPECT_THAT(id.status().message(), HasSubstr("meta"));
  EXPECT_FALSE((*txn)->is_open());
  EXPECT_EQ(Slurp(fs, fs.root + "/index"), "previous index");  // put back
  EXPECT_FALSE(*fs.Exists(fs.root + "/fresh"));                // removed again
  EXPECT_FALSE(*fs.Exists(fs.root + "/meta"));
  EXPECT_FALSE(*fs.Exists(fs.root + "/new.bin"));  // discarded as by Abort
}

TEST(InPlaceTransactionTest, AbortRemovesOwnFilesOnlyAndExportsRoundTrip) {
  TempDir dir;
  auto fs = LocalFileSystem();
  auto coord = fs->BeginTransaction(dir.path());
  auto rank = fs->BeginTransaction(dir.path(), TransactionOptions{.base = (*coord)->token()});
  ASSERT_TRUE(coord.ok() && rank.ok());
  ASSERT_TRUE(WriteIn(**rank, "sub/rank1.bin", "r1").ok());
  ASSERT_TRUE(WriteIn(**coord, "rank0.bin", "r0").ok());
  auto token = (*rank)->Export();
  ASSERT_TRUE(token.ok());
  ASSERT_TRUE((*coord)->Import(*token).ok());
  EXPECT_THAT((*coord)->staged_files(), ElementsAre("rank0.bin", "sub/rank1.bin"));
  EXPECT_EQ((*coord)->Import("megackpt-inplace-transaction-v1\n../x\n").code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*coord)->Import("megackpt-inplace-transaction-v1\nno-newline").code(),
            StatusCode::kInvalidArgument);
  (*coord)->Abort();
  EXPECT_FALSE(*fs->Exists(dir.path() + "/rank0.bin"));
  EXPECT_TRUE(*fs->Exists(dir.path() + "/sub/rank1.bin"));  // the other participant's
  (*rank)->Abort();
  EXPECT_FALSE(*fs->Exists(dir.path() + "/sub/rank1.bin"));
  (*rank)->Abort();  // idempotent
  EXPECT_EQ(fs->BeginTransaction("").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace megackpt::fs
