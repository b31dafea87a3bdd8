// One FileSystem contract, run against every implementation: local paths,
// mega:// on an embedded hub (repo and bucket), and mega:// on a real
// `megahub` on loopback (repo and bucket).
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

using ::megackpt::testing::CreateToken;
using ::megackpt::testing::MegahubProcess;
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
        Status s = (*f)->ReadExactlyAt(off, std::as_writable_bytes(std::span<char>(buf.data(), buf.size())));
        if (!s.ok() || buf != data.substr(off, buf.size())) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(FsConformanceTest, ManySmallFiles) {
  for (int i = 0; i < 12; ++i) Write(P("many/f" + std::to_string(i)), "content " + std::to_string(i));
  auto list = fs_->List(P("many"));
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(Read(P("many/f" + std::to_string(i))), "content " + std::to_string(i));
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
