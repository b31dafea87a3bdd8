// One FileSystem contract, run against every implementation: local paths,
// mega:// on an embedded hub (repo and bucket), and mega:// on a real
// `megahub` on loopback (repo and bucket) -- the file operations and the
// transaction suite (fs::Transaction: commit, abort, crash, export/import
// between participants, removals, closed transactions, capabilities).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "hub_test_server.h"
#include "megackpt/core/checksum.h"
#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"

namespace megackpt {
namespace {

using ::megackpt::testing::SharedHub;
using ::megackpt::testing::SharedHubServer;
using ::megackpt::testing::TempDir;

enum class Backend { kLocal, kEmbeddedRepo, kEmbeddedBucket, kRemoteRepo, kRemoteBucket };

std::string BackendName(Backend b) {
  switch (b) {
    case Backend::kLocal:
      return "Local";
    case Backend::kEmbeddedRepo:
      return "EmbeddedRepo";
    case Backend::kEmbeddedBucket:
      return "EmbeddedBucket";
    case Backend::kRemoteRepo:
      return "RemoteRepo";
    case Backend::kRemoteBucket:
      return "RemoteBucket";
  }
  return "?";
}

// One megahub for the whole binary (started lazily, stopped at exit).
SharedHubServer& Server() { return SharedHub("conformance-hub"); }

using ::megackpt::test_util::RandomData;

class FsConformanceTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    std::string unique = "t" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    switch (GetParam()) {
      case Backend::kLocal:
        fs_ = fs::LocalFileSystem();
        base_ = local_root_.path() + "/" + unique;
        break;
      case Backend::kEmbeddedRepo:
      case Backend::kEmbeddedBucket: {
        auto hub = hub::OpenEmbeddedHub(local_root_.path() + "/hub");
        ASSERT_TRUE(hub.ok()) << hub.status().ToString();
        fs_ = hub::NewMegaFileSystem(*hub);
        base_ = GetParam() == Backend::kEmbeddedRepo ? "mega://org/" + unique + "@main/data"
                                                     : "mega://buckets/org/" + unique + "/data";
        break;
      }
      case Backend::kRemoteRepo:
      case Backend::kRemoteBucket: {
        SharedHubServer& s = Server();
        ASSERT_TRUE(s.ok) << "could not start megahub";
        auto hub = hub::OpenRemoteHub(s.server.endpoint(), s.token);
        ASSERT_TRUE(hub.ok()) << hub.status().ToString();
        fs_ = hub::NewMegaFileSystem(*hub);
        base_ = GetParam() == Backend::kRemoteRepo ? "mega://org/" + unique + "@main/data"
                                                   : "mega://buckets/org/" + unique + "/data";
        break;
      }
    }
    ASSERT_TRUE(fs_->CreateDirectories(base_).ok());
  }

  std::string P(const std::string& rel) { return fs::JoinPath(base_, rel); }

  void Write(const std::string& path, const std::string& data, size_t piece = 0) {
    auto f = fs_->OpenForWrite(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    if (piece == 0) piece = std::max<size_t>(1, data.size());
    for (size_t off = 0; off < data.size(); off += piece) {
      ASSERT_TRUE((*f)->Append(AsBytes(std::string_view(data).substr(off, piece))).ok());
    }
    EXPECT_EQ((*f)->size(), data.size());
    Status s = (*f)->Close();
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  std::string Read(const std::string& path) {
    auto r = fs_->ReadWhole(path);
    EXPECT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    return r.ok() ? *r : "";
  }

  TempDir local_root_{"conformance"};
  std::shared_ptr<fs::FileSystem> fs_;
  std::string base_;
};

TEST_P(FsConformanceTest, WriteThenReadRoundTrip) {
  std::string data = RandomData(300000, 1);
  Write(P("a/b/file.bin"), data, 7777);
  auto f = fs_->OpenForRead(P("a/b/file.bin"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->size(), data.size());
  std::string buf(1000, '\0');
  auto dst = std::as_writable_bytes(std::span<char>(buf.data(), buf.size()));
  for (uint64_t off : {uint64_t{0}, uint64_t{65535}, uint64_t{131072}, uint64_t{299000}}) {
    auto n = (*f)->ReadAt(off, dst);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_EQ(*n, 1000u);
    EXPECT_EQ(buf, data.substr(off, 1000)) << "offset " << off;
  }
  // Short read at the end, empty read past it.
  auto n = (*f)->ReadAt(data.size() - 10, dst);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 10u);
  EXPECT_EQ(buf.substr(0, 10), data.substr(data.size() - 10));
  auto past = (*f)->ReadAt(data.size() + 5, dst);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(*past, 0u);
  EXPECT_FALSE((*f)->ReadExactlyAt(data.size() - 10, dst).ok());
  EXPECT_EQ(Read(P("a/b/file.bin")), data);
}

TEST_P(FsConformanceTest, EmptyFile) {
  Write(P("empty"), "");
  auto st = fs_->Stat(P("empty"));
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->size, 0u);
  EXPECT_FALSE(st->is_directory);
  EXPECT_EQ(Read(P("empty")), "");
}

TEST_P(FsConformanceTest, MissingFileIsNotFound) {
  EXPECT_EQ(fs_->OpenForRead(P("nope")).status().code(), StatusCode::kNotFound);
  auto st = fs_->Stat(P("nope"));
  EXPECT_EQ(st.status().code(), StatusCode::kNotFound) << st.status().ToString();
  auto ex = fs_->Exists(P("nope"));
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  EXPECT_FALSE(*ex);
  EXPECT_EQ(fs_->Remove(P("nope")).code(), StatusCode::kNotFound);
}

TEST_P(FsConformanceTest, OverwriteReplacesContent) {
  Write(P("f.txt"), "first version");
  Write(P("f.txt"), "second");
  EXPECT_EQ(Read(P("f.txt")), "second");
  ASSERT_TRUE(fs_->WriteAtomically(P("f.txt"), "third, atomically").ok());
  EXPECT_EQ(Read(P("f.txt")), "third, atomically");
}

TEST_P(FsConformanceTest, StatExistsAndList) {
  Write(P("dir/x.bin"), "xx");
  Write(P("dir/sub/y.bin"), "yyy");
  Write(P("dir/z.bin"), "z");
  auto st = fs_->Stat(P("dir/x.bin"));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size, 2u);
  EXPECT_FALSE(st->is_directory);
  auto dir = fs_->Stat(P("dir/sub"));
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_TRUE(dir->is_directory);
  EXPECT_TRUE(*fs_->Exists(P("dir")));
  EXPECT_TRUE(*fs_->Exists(P("dir/sub/y.bin")));
  auto list = fs_->List(P("dir"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].path, P("dir/sub"));
  EXPECT_TRUE((*list)[0].is_directory);
  EXPECT_EQ((*list)[1].path, P("dir/x.bin"));
  EXPECT_EQ((*list)[1].size, 2u);
  EXPECT_EQ((*list)[2].path, P("dir/z.bin"));
  EXPECT_EQ(fs_->List(P("no-such-dir")).status().code(), StatusCode::kNotFound);
}

TEST_P(FsConformanceTest, RemoveAndRename) {
  Write(P("r/a"), "alpha");
  Write(P("r/b"), "beta");
  ASSERT_TRUE(fs_->Remove(P("r/a")).ok());
  EXPECT_FALSE(*fs_->Exists(P("r/a")));
  EXPECT_EQ(Read(P("r/b")), "beta");
  Status s = fs_->Rename(P("r/b"), P("r/c"));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(*fs_->Exists(P("r/b")));
  EXPECT_EQ(Read(P("r/c")), "beta");
  // Rename replaces an existing target.
  Write(P("r/d"), "delta");
  ASSERT_TRUE(fs_->Rename(P("r/d"), P("r/c")).ok());
  EXPECT_EQ(Read(P("r/c")), "delta");
}

// RemoveGarbage: the names are gone when it returns (new files may take them),
// missing paths are skipped, everything else stays.
TEST_P(FsConformanceTest, RemoveGarbageTakesTheNamesAtOnce) {
  const std::string big = RandomData(9 << 20, 7);  // large enough for the local background free
  Write(P("g/big"), big);
  Write(P("g/small"), "s");
  Write(P("g/kept"), "k");
  fs_->RemoveGarbage({P("g/big"), P("g/small"), P("g/never-existed")});
  EXPECT_FALSE(*fs_->Exists(P("g/big")));
  EXPECT_FALSE(*fs_->Exists(P("g/small")));
  EXPECT_EQ(Read(P("g/kept")), "k");
  Write(P("g/big"), "new");  // the name is free at once
  fs::FinishBackgroundFrees();
  EXPECT_EQ(Read(P("g/big")), "new");
  fs_->RemoveGarbage({});
}

TEST_P(FsConformanceTest, ConcurrentRangeReads) {
  std::string data = RandomData(1 << 20, 2);
  Write(P("big.bin"), data, 100000);
  auto f = fs_->OpenForRead(P("big.bin"));
  ASSERT_TRUE(f.ok());
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::string buf(4096, '\0');
      for (int i = 0; i < 20; ++i) {
        uint64_t off = rng() % (data.size() - buf.size());
        Status s = (*f)->ReadExactlyAt(
            off, std::as_writable_bytes(std::span<char>(buf.data(), buf.size())));
        if (!s.ok() || buf != data.substr(off, buf.size())) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(FsConformanceTest, ManySmallFiles) {
  for (int i = 0; i < 12; ++i)
    Write(P("many/f" + std::to_string(i)), "content " + std::to_string(i));
  auto list = fs_->List(P("many"));
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 12u);
  for (int i = 0; i < 12; ++i)
    EXPECT_EQ(Read(P("many/f" + std::to_string(i))), "content " + std::to_string(i));
}

// ---- transactions ---------------------------------------------------------------

std::unique_ptr<fs::Transaction> Begin(fs::FileSystem& fs, const std::string& root,
                                       fs::TransactionOptions o = {}) {
  auto t = fs.BeginTransaction(root, o);
  EXPECT_TRUE(t.ok()) << root << ": " << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

Status WriteIn(fs::Transaction& txn, const std::string& rel, const std::string& data) {
  MEGA_ASSIGN_OR_RETURN(auto f, txn.OpenForWrite(rel));
  for (size_t off = 0; off < data.size(); off += 4096) {
    MEGA_RETURN_IF_ERROR(f->Append(AsBytes(std::string_view(data).substr(off, 4096))));
  }
  return f->Close();
}

TEST_P(FsConformanceTest, TransactionCommitPublishesEverything) {
  Write(P("t/meta"), "old meta");
  const std::string big = RandomData(200000, 3);
  auto txn = Begin(*fs_, P("t"));
  ASSERT_NE(txn, nullptr);
  EXPECT_EQ(txn->root(), P("t"));
  EXPECT_TRUE(txn->is_open());
  ASSERT_TRUE(WriteIn(*txn, "data/shard-1.bin", big).ok());
  ASSERT_TRUE(txn->Put("index.json", "{\"v\":2}").ok());
  ASSERT_TRUE(txn->Put("meta", "new meta").ok());
  EXPECT_THAT(txn->staged_files(),
              ::testing::ElementsAre("data/shard-1.bin", "index.json", "meta"));
  // Nothing counts as committed yet: the Puts are not visible, and on an
  // isolated store nothing is.
  EXPECT_EQ(Read(P("t/meta")), "old meta");
  EXPECT_FALSE(*fs_->Exists(P("t/index.json")));
  if (fs_->capabilities().isolated_transactions) {
    EXPECT_FALSE(*fs_->Exists(P("t/data/shard-1.bin")));
  }
  // The previous state stays readable at base_root().
  EXPECT_EQ(*fs_->ReadWhole(fs::JoinPath(txn->base_root(), "meta")), "old meta");
  auto id = txn->Commit();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_FALSE(txn->is_open());
  EXPECT_EQ(Read(P("t/meta")), "new meta");
  EXPECT_EQ(Read(P("t/index.json")), "{\"v\":2}");
  EXPECT_EQ(Read(P("t/data/shard-1.bin")), big);
  // Closed: no more writes, no second commit.
  EXPECT_EQ(txn->OpenForWrite("late").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(txn->Put("late", "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(txn->Commit().status().code(), StatusCode::kFailedPrecondition);
  txn->Abort();  // idempotent, and never undoes a commit
  EXPECT_EQ(Read(P("t/meta")), "new meta");
}

TEST_P(FsConformanceTest, TransactionAbortAndCrashLeaveThePreviousState) {
  Write(P("a/meta"), "old");
  Write(P("a/old.bin"), "old data");
  for (bool crash : {false, true}) {
    SCOPED_TRACE(crash ? "crash" : "abort");
    auto txn = Begin(*fs_, P("a"));
    ASSERT_NE(txn, nullptr);
    ASSERT_TRUE(WriteIn(*txn, "new.bin", "new data").ok());
    ASSERT_TRUE(txn->Put("meta", "new").ok());
    ASSERT_TRUE(txn->Remove("old.bin").ok());
    if (crash) {
      txn.reset();  // dropped without Commit or Abort
    } else {
      txn->Abort();
      EXPECT_FALSE(txn->is_open());
      EXPECT_EQ(txn->Commit().status().code(), StatusCode::kFailedPrecondition);
      // Abort removes what this participant wrote in place.
      EXPECT_FALSE(*fs_->Exists(P("a/new.bin")));
    }
    EXPECT_EQ(Read(P("a/meta")), "old");
    EXPECT_EQ(Read(P("a/old.bin")), "old data");
    if (fs_->capabilities().isolated_transactions) {
      EXPECT_FALSE(*fs_->Exists(P("a/new.bin")));
    }
  }
}

TEST_P(FsConformanceTest, TransactionRemovalsApplyAtCommit) {
  Write(P("r/keep"), "k");
  Write(P("r/gone"), "g");
  Write(P("r/sub/gone too"), "g2");
  auto txn = Begin(*fs_, P("r"));
  ASSERT_NE(txn, nullptr);
  ASSERT_TRUE(txn->Remove("gone").ok());
  ASSERT_TRUE(txn->Remove("sub/gone too").ok());
  ASSERT_TRUE(txn->Remove("never-existed").ok());  // ignored at commit
  ASSERT_TRUE(txn->Put("marker", "m").ok());
  EXPECT_TRUE(*fs_->Exists(P("r/gone")));
  auto id = txn->Commit();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_FALSE(*fs_->Exists(P("r/gone")));
  EXPECT_FALSE(*fs_->Exists(P("r/sub/gone too")));
  EXPECT_EQ(Read(P("r/keep")), "k");
  EXPECT_EQ(Read(P("r/marker")), "m");
}

TEST_P(FsConformanceTest, TransactionParticipantsExportAndTheCoordinatorCommitsOnce) {
  Write(P("m/meta"), "before");
  auto coord = Begin(*fs_, P("m"));
  ASSERT_NE(coord, nullptr);
  fs::TransactionOptions join;
  join.base = coord->token();
  std::vector<std::string> exports(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      auto txn = Begin(*fs_, P("m"), join);
      ASSERT_NE(txn, nullptr);
      ASSERT_TRUE(
          WriteIn(*txn, "rank" + std::to_string(r) + ".bin", RandomData(50000 + r, 10 + r)).ok());
      auto e = txn->Export();
      ASSERT_TRUE(e.ok()) << e.status().ToString();
      exports[r] = *e;
      // The participant just drops its transaction.
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(WriteIn(*coord, "rank-coord.bin", "coordinator's").ok());
  for (const std::string& e : exports) {
    Status s = coord->Import(e);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_TRUE(coord->Import(exports[0]).ok());  // importing twice is harmless
  EXPECT_THAT(coord->staged_files(),
              ::testing::IsSupersetOf({"rank0.bin", "rank1.bin", "rank2.bin", "rank-coord.bin"}));
  EXPECT_EQ(coord->Import("not an export").code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(coord->Put("meta", "after").ok());
  EXPECT_EQ(Read(P("m/meta")), "before");
  auto id = coord->Commit();
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(Read(P("m/meta")), "after");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(Read(P("m/rank" + std::to_string(r) + ".bin")), RandomData(50000 + r, 10 + r));
  }
  EXPECT_EQ(Read(P("m/rank-coord.bin")), "coordinator's");
  // A follow-up transaction based on that commit.
  fs::TransactionOptions next;
  next.base = *id;
  auto txn = Begin(*fs_, P("m"), next);
  ASSERT_NE(txn, nullptr);
  ASSERT_TRUE(txn->Put("meta", "third").ok());
  ASSERT_TRUE(txn->Commit().ok());
  EXPECT_EQ(Read(P("m/meta")), "third");
}

TEST_P(FsConformanceTest, TransactionRejectsBadPaths) {
  auto txn = Begin(*fs_, P("bad"));
  ASSERT_NE(txn, nullptr);
  EXPECT_EQ(txn->OpenForWrite("a/../b").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(txn->Put("", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(txn->Remove("x//y").code(), StatusCode::kInvalidArgument);
  txn->Abort();
}

TEST_P(FsConformanceTest, CapabilitiesMatchTheFiles) {
  const fs::FileSystemCapabilities caps = fs_->capabilities();
  auto f = fs_->OpenForWrite(P("cap.bin"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->supports_write_at(), caps.positioned_writes);
  ASSERT_TRUE((*f)->Close().ok());
  auto txn = Begin(*fs_, P("cap"));
  ASSERT_NE(txn, nullptr);
  auto g = txn->OpenForWrite("x.bin");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->supports_write_at(), caps.positioned_writes);
  if (caps.positioned_writes) {
    ASSERT_TRUE((*g)->WriteAt(4, AsBytes(std::string_view("tail"))).ok());
    ASSERT_TRUE((*g)->WriteAt(0, AsBytes(std::string_view("head"))).ok());
  } else {
    ASSERT_TRUE((*g)->Append(AsBytes(std::string_view("headtail"))).ok());
  }
  ASSERT_TRUE((*g)->Close().ok());
  ASSERT_TRUE(txn->Commit().ok());
  EXPECT_EQ(Read(P("cap/x.bin")), "headtail");
}

TEST_P(FsConformanceTest, PinPathKeepsReadingOneState) {
  Write(P("pin/f"), "one");
  auto pinned = fs_->PinPath(P("pin/f"));
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  Write(P("pin/f"), "two");
  const bool history = GetParam() == Backend::kEmbeddedRepo || GetParam() == Backend::kRemoteRepo;
  EXPECT_EQ(Read(*pinned), history ? "one" : "two");
  EXPECT_EQ(Read(P("pin/f")), "two");
}

INSTANTIATE_TEST_SUITE_P(AllBackends, FsConformanceTest,
                         ::testing::Values(Backend::kLocal, Backend::kEmbeddedRepo,
                                           Backend::kEmbeddedBucket, Backend::kRemoteRepo,
                                           Backend::kRemoteBucket),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

}  // namespace
}  // namespace megackpt
