// Multi-rank checkpoints through the threads backend: resharding between world
// sizes and layouts, and faults that must reach every rank as a clear error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>

#include "dcp/synthetic.h"
#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dist/process_group.h"
#include "test_util.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;

// A fresh folder, removed at the end.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("dcp-threads") {}
};

dist::ProcessGroupOptions Quick() {
  dist::ProcessGroupOptions o;
  o.timeout = std::chrono::seconds(30);
  return o;
}

// Runs fn(g, state) on `world` thread ranks, each with its own rank state of
// `spec` in layout `variant` (filled with the known bytes when `fill`).
std::vector<Status> OnRankStates(const synthetic::Spec& spec, int world, int variant, bool fill,
                                 const std::function<Status(dist::ProcessGroup&, StateDict&)>& fn) {
  return dist::RunThreadRanks(
      world,
      [&](dist::ProcessGroup& g) -> Status {
        MEGA_ASSIGN_OR_RETURN(StateDict sd,
                              synthetic::BuildRankState(spec, world, g.rank(), variant, fill));
        return fn(g, sd);
      },
      Quick());
}

Status SaveSynthetic(const synthetic::Spec& spec, const std::string& dir, int world,
                     int variant = 0, FileSystemWriterOptions options = {}) {
  auto results =
      OnRankStates(spec, world, variant, true, [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
        auto writer = NewFileSystemWriter(dir, options);
        return Save(sd, *writer, &g);
      });
  for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

// Loads at `world` with layout `variant` and verifies every rank's bytes.
std::vector<Status> LoadSynthetic(const synthetic::Spec& spec, const std::string& dir, int world,
                                  int variant) {
  return OnRankStates(spec, world, variant, false,
                      [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
                        auto reader = NewFileSystemReader(dir);
                        MEGA_RETURN_IF_ERROR(Load(sd, *reader, &g));
                        return synthetic::VerifyRankState(spec, sd);
                      });
}

void ExpectAllFail(const std::vector<Status>& results, StatusCode code,
                   const std::vector<std::string>& substrings) {
  for (size_t r = 0; r < results.size(); ++r) {
    const Status& s = results[r];
    EXPECT_FALSE(s.ok()) << "rank " << r << " succeeded";
    EXPECT_EQ(s.code(), code) << "rank " << r << ": " << s.ToString();
    for (const auto& sub : substrings) {
      EXPECT_NE(s.message().find(sub), std::string::npos) << "rank " << r << ": " << s.ToString();
    }
  }
}

TEST(DcpThreads, ReshardMatrix) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(42, 600 << 10);
  for (int save_world : {1, 2, 4}) {
    const std::string ckpt = dir.path("ws" + std::to_string(save_world));
    Status s = SaveSynthetic(spec, ckpt, save_world);
    ASSERT_TRUE(s.ok()) << "save at " << save_world << ": " << s.ToString();
    for (int load_world : {1, 2, 3, 4}) {
      for (int variant : {0, 1 + (save_world + load_world) % (synthetic::kNumLayouts - 1)}) {
        auto results = LoadSynthetic(spec, ckpt, load_world, variant);
        for (size_t r = 0; r < results.size(); ++r) {
          EXPECT_TRUE(results[r].ok())
              << "save " << save_world << " -> load " << load_world << " variant " << variant
              << " rank " << r << ": " << results[r].ToString();
        }
      }
    }
  }
}

// FileSystemWriterOptions::direct_io: the data files skip the page cache and
// hold the bytes a buffered save writes (items of odd sizes: partial blocks,
// sources off the 4 KiB grid), and load back verified at other world sizes.
TEST(DcpThreads, DirectIoSaveWritesTheSameDataFiles) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(43, 700 << 10);
  FileSystemWriterOptions direct;
  direct.direct_io = true;
  ASSERT_TRUE(SaveSynthetic(spec, dir.path("buffered"), 2).ok());
  ASSERT_TRUE(SaveSynthetic(spec, dir.path("direct"), 2, 0, direct).ok());
  testing::ExpectSavedAroundThePageCache(dir.path("direct"), dir.path("buffered"), ".distcp");
  // Data files are "__<save id>_<rank>_<n>.distcp": matched by rank and n.
  auto data_files = [](const std::string& folder) {
    std::map<std::string, std::string> by_rank_and_n;
    for (const auto& e : std::filesystem::directory_iterator(folder)) {
      const std::string name = e.path().filename().string();
      if (!name.starts_with("__") || !name.ends_with(".distcp")) continue;
      by_rank_and_n[name.substr(name.find('_', 2))] = e.path().string();
    }
    return by_rank_and_n;
  };
  const auto buffered = data_files(dir.path("buffered"));
  const auto direct_files = data_files(dir.path("direct"));
  ASSERT_FALSE(buffered.empty());
  ASSERT_EQ(direct_files.size(), buffered.size());
  for (const auto& [key, path] : buffered) {
    ASSERT_TRUE(direct_files.count(key)) << key;
    const std::string a = test_util::ReadFileOrEmpty(path);
    const std::string b = test_util::ReadFileOrEmpty(direct_files.at(key));
    EXPECT_EQ(a.size(), b.size()) << key;
    EXPECT_TRUE(a == b) << key << ": differs from the buffered save's";
  }
  for (int world : {1, 3}) {
    for (const Status& s : LoadSynthetic(spec, dir.path("direct"), world, 1))
      EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

TEST(DcpThreads, ReplicatedItemsAreWrittenOnce) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(5, 200 << 10);
  ASSERT_TRUE(SaveSynthetic(spec, dir.path("c"), 4).ok());
  auto reader = NewFileSystemReader(dir.path("c"));
  auto md = reader->ReadMetadata();
  ASSERT_TRUE(md.ok());
  uint64_t stored = 0;
  for (const auto& [idx, info] : md->storage_data) stored += info.length;
  EXPECT_EQ(stored, spec.total_bytes);  // every byte of the global state exactly once
}

TEST(DcpThreads, AsyncSaveFromFourRanks) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(9, 400 << 10);
  auto results =
      OnRankStates(spec, 4, 0, true, [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
        AsyncSaveOptions opts;
        opts.pool = StagingPool::Create(64 << 10);
        AsyncSaveHandle h = AsyncSave(sd, NewFileSystemWriter(dir.path("a")), &g, opts);
        MEGA_RETURN_IF_ERROR(h.staged.get());
        return h.done.get();
      });
  for (const Status& s : results) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const Status& s : LoadSynthetic(spec, dir.path("a"), 3, 4))
    EXPECT_TRUE(s.ok()) << s.ToString();
}

// What a resharded load read: the data bytes read and the bytes the
// destinations need.
struct ReadBytes {
  bool ok = false;  // every rank loaded and checked its values
  uint64_t read = 0, needed = 0;
  double ratio() const { return static_cast<double>(read) / needed; }
};

// Loads `spec` saved at `dir` on `world` ranks with re-sharding `variant` and
// verification `verify`, checks every value, and counts the bytes read (a
// test failure naming the error when a rank fails).
ReadBytes ReshardedLoadReads(const synthetic::Spec& spec, const std::string& dir, int world,
                             int variant, VerifyMode verify) {
  auto counting = std::make_shared<testing::InstrumentedFileSystem>();
  std::atomic<uint64_t> needed{0};
  auto results = OnRankStates(spec, world, variant, false,
                              [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
                                FileSystemReaderOptions ro;
                                ro.fs = counting;
                                ro.verify = verify;
                                MEGA_RETURN_IF_ERROR(Load(sd, *NewFileSystemReader(dir, ro), &g));
                                MEGA_RETURN_IF_ERROR(synthetic::VerifyRankState(spec, sd));
                                needed += synthetic::RankStateBytes(sd);
                                return Status::OK();
                              });
  bool ok = true;
  for (const Status& s : results) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    ok = ok && s.ok();
  }
  return {ok, counting->data_bytes_read.load(), needed.load()};
}

// Unverified loads (VerifyMode::kOff) read exactly the ranges they need: all
// ranks together read at most 1.05x the bytes their destinations need, for a
// load that reshards every tensor. (Verified loads, the default, read whole
// checksum blocks: see VerifiedReshardedLoadsReadAtMostTenPercentExtra.)
TEST(DcpThreads, ReshardedLoadReadsAtMostFivePercentExtra) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(21, 2 << 20);
  ASSERT_TRUE(SaveSynthetic(spec, dir.path("c"), 2).ok());
  for (int variant : {1, 2, 3}) {
    const ReadBytes b = ReshardedLoadReads(spec, dir.path("c"), 3, variant, VerifyMode::kOff);
    ASSERT_TRUE(b.ok);
    const double ratio = b.ratio();
    EXPECT_LE(ratio, 1.05) << "variant " << variant << ": read " << b.read << " bytes for "
                           << b.needed;
    EXPECT_GE(ratio, 1.0) << "variant " << variant;
  }
}

// The resharded-read budget of verified loads (the default): on the demo's
// state and layouts (16 MiB, saved from 2 ranks), loads at 1, 2 and 3 ranks
// with the demo's load sharding (variant 1) and the other re-shardings read at
// most 1.10x the bytes their destinations need, although every byte is
// verified (whole checksum blocks are read).
TEST(DcpThreads, VerifiedReshardedLoadsReadAtMostTenPercentExtra) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(3, 16 << 20);
  ASSERT_TRUE(SaveSynthetic(spec, dir.path("c"), 2).ok());
  for (int world : {1, 2, 3}) {
    for (int variant : {1, 2, 3}) {
      const ReadBytes b =
          ReshardedLoadReads(spec, dir.path("c"), world, variant, FileSystemReaderOptions{}.verify);
      ASSERT_TRUE(b.ok);
      const double ratio = b.ratio();
      EXPECT_LE(ratio, 1.10) << "world " << world << " variant " << variant << ": read " << b.read
                             << " bytes for " << b.needed;
      EXPECT_GE(ratio, 1.0) << "world " << world << " variant " << variant;
      std::printf("verified load, world %d, variant %d: read/needed %.4f\n", world, variant, ratio);
    }
  }
}

// use_collectives = false: every rank saves alone (own metadata file) and loads alone.
TEST(DcpThreads, NoCollectivesPerRankCheckpoints) {
  TempDir dir;
  auto results = dist::RunThreadRanks(
      3,
      [&](dist::ProcessGroup& g) -> Status {
        StateDict sd;
        sd.Set("who", StateValue::Bytes("rank " + std::to_string(g.rank())));
        SaveOptions so;
        so.use_collectives = false;
        MEGA_RETURN_IF_ERROR(Save(sd, *NewFileSystemWriter(dir.path("c")), &g, so));
        MEGA_RETURN_IF_ERROR(g.Barrier());  // all saved before anyone loads
        StateDict back;
        back.Set("who", StateValue::Bytes(""));
        FileSystemReaderOptions ro;
        ro.metadata_rank = g.rank() == 0 ? -1 : g.rank();
        LoadOptions lo;
        lo.use_collectives = false;
        MEGA_RETURN_IF_ERROR(Load(back, *NewFileSystemReader(dir.path("c"), ro), &g, lo));
        if (back.Find("who")->bytes() != "rank " + std::to_string(g.rank())) {
          return DataLossError("rank " + std::to_string(g.rank()) + " loaded '" +
                               back.Find("who")->bytes() + "'");
        }
        return Status::OK();
      },
      Quick());
  for (const Status& s : results) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(stdfs::exists(dir.path("c") + "/.metadata"));
  EXPECT_TRUE(stdfs::exists(dir.path("c") + "/.metadata.rank2"));
}

TEST(DcpThreadsFaults, RankThrowingDuringWriteFailsEveryRank) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(1, 100 << 10);
  auto results =
      OnRankStates(spec, 3, 0, true, [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
        testing::ThrowingSavePlanner planner(g.rank() == 1, "disk on fire");
        SaveOptions so;
        so.planner = &planner;
        return Save(sd, *NewFileSystemWriter(dir.path("t")), &g, so);
      });
  ExpectAllFail(results, StatusCode::kInternal, {"rank 1: ", "disk on fire"});
  EXPECT_FALSE(stdfs::exists(dir.path("t") + "/.metadata"));
  // Every rank aborted: no data files left behind.
  for (auto& e : stdfs::directory_iterator(dir.path("t")))
    ADD_FAILURE() << "left over: " << e.path();
}

TEST(DcpThreadsFaults, WriterErrorOnOneRankFailsEveryRank) {
  TempDir dir;
  auto spec = synthetic::MakeSpec(2, 100 << 10);
  // Rank 2 writes into a path that is a regular file: its data files cannot be created.
  stdfs::create_directories(dir.path("w"));
  std::ofstream(dir.path("blocker")) << "x";
  auto results =
      OnRankStates(spec, 3, 0, true, [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
        auto writer = NewFileSystemWriter(g.rank() == 2 ? dir.path("blocker/sub") : dir.path("w"));
        return Save(sd, *writer, &g);
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].ok()) << r;
    EXPECT_NE(results[r].message().find("rank 2: "), std::string::npos) << results[r].ToString();
  }
}

class DcpThreadsLoadFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = synthetic::MakeSpec(3, 300 << 10);
    ckpt_ = dir_.path("c");
    ASSERT_TRUE(SaveSynthetic(spec_, ckpt_, 2).ok());
    for (auto& e : stdfs::directory_iterator(ckpt_)) {
      if (e.path().extension() == ".distcp") data_files_.push_back(e.path().string());
    }
    std::sort(data_files_.begin(), data_files_.end());
    ASSERT_FALSE(data_files_.empty());
  }
  std::vector<Status> LoadAt(int world) { return LoadSynthetic(spec_, ckpt_, world, 1); }

  TempDir dir_;
  synthetic::Spec spec_;
  std::string ckpt_;
  std::vector<std::string> data_files_;
};

TEST_F(DcpThreadsLoadFaults, MissingDataFile) {
  stdfs::remove(data_files_.back());
  ExpectAllFail(LoadAt(3), StatusCode::kNotFound,
                {"is missing", stdfs::path(data_files_.back()).filename()});
}

TEST_F(DcpThreadsLoadFaults, TruncatedDataFile) {
  stdfs::resize_file(data_files_[0], stdfs::file_size(data_files_[0]) / 2);
  ExpectAllFail(LoadAt(4), StatusCode::kDataLoss,
                {"truncated", stdfs::path(data_files_[0]).filename()});
}

TEST_F(DcpThreadsLoadFaults, CorruptMetadata) {
  std::ofstream(ckpt_ + "/.metadata", std::ios::trunc)
      << "{\"format\": \"megackpt-dcp-metadata\", \"version\": 1}";
  ExpectAllFail(LoadAt(2), StatusCode::kDataLoss, {".metadata", "state_dict_metadata"});
}

TEST_F(DcpThreadsLoadFaults, FlippedDataByte) {
  {
    std::fstream f(data_files_[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(5000);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    f.seekp(5000);
    f.write(&c, 1);
  }
  // World 1 reads every byte, so the flipped one is certainly checked.
  ExpectAllFail(LoadAt(1), StatusCode::kDataLoss,
                {"checksum mismatch", stdfs::path(data_files_[0]).filename()});
  auto r3 = LoadAt(3);
  for (const Status& s : r3) EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
}

TEST_F(DcpThreadsLoadFaults, ShapeMismatchOnOneRankFailsEveryRank) {
  auto results =
      OnRankStates(spec_, 3, 1, false, [&](dist::ProcessGroup& g, StateDict& sd) -> Status {
        if (g.rank() == 1) sd.Set("rng_state", StateValue(Tensor::Empty(DType::kF32, {3}).value()));
        return Load(sd, *NewFileSystemReader(ckpt_), &g);
      });
  ExpectAllFail(results, StatusCode::kInvalidArgument, {"rank 1: ", "'rng_state'"});
}

}  // namespace
}  // namespace megackpt::dcp
