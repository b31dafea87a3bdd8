// Path and file safety of the checkpoint readers, one checkpoint per folder,
// and library verification of whole checkpoints (issue 11).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "dcp/test_fs.h"
#include "dcp/test_util.h"
#include "megackpt/core/file.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dcp/metadata.h"

namespace megackpt::dcp {
namespace {

namespace stdfs = std::filesystem;
using testing::TempDir;

Tensor Iota(DType dt, const Shape& shape, int seed) {
  Tensor t = Tensor::Empty(dt, shape, true).value();
  auto* p = static_cast<uint8_t*>(t.data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 31 + seed);
  return t;
}

StateDict SampleState() {
  StateDict sd;
  sd.Set("w", StateValue(Iota(DType::kF32, {64, 96}, 1)));
  sd.Set("b", StateValue(Iota(DType::kBF16, {96}, 2)));
  sd.Set("rng", StateValue::Bytes(std::string(300, 'r')));
  return sd;
}

StateDict EmptyLike() {
  StateDict sd;
  sd.Set("w", StateValue(Tensor::Empty(DType::kF32, {64, 96}, true).value()));
  sd.Set("b", StateValue(Tensor::Empty(DType::kBF16, {96}, true).value()));
  sd.Set("rng", StateValue::Bytes(""));
  return sd;
}

Status SaveFs(const std::string& dir, FileSystemWriterOptions o = {}) {
  StateDict sd = SampleState();
  return Save(sd, *NewFileSystemWriter(dir, o));
}

Status SaveMega(const std::string& dir, MegaStorageWriterOptions o = {}) {
  StateDict sd = SampleState();
  MegaStorageWriter w(dir, std::nullopt, o);
  return Save(sd, w);
}

Status LoadFs(const std::string& dir) {
  StateDict sd = EmptyLike();
  return Load(sd, *NewFileSystemReader(dir));
}

Status LoadMega(const std::string& dir) {
  StateDict sd = EmptyLike();
  MegaStorageReader r(dir);
  return Load(sd, r);
}

std::vector<std::string> Names(const std::string& dir, const std::string& ext) {
  std::vector<std::string> out;
  for (auto& e : stdfs::directory_iterator(dir)) {
    if (e.path().extension() == ext) out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Saves the sample state at `dir` on one writer thread: one data file, whose
// name is returned ("" and a test failure otherwise).
std::string SaveFsOneDataFile(const std::string& dir) {
  FileSystemWriterOptions o;
  o.thread_count = 1;
  Status s = SaveFs(dir, o);
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto data = Names(dir, ".distcp");
  EXPECT_EQ(data.size(), 1u);
  return s.ok() && data.size() == 1 ? data[0] : "";
}

Metadata ReadMd(const std::string& dir) {
  auto text = ReadLocalFile(dir + "/.metadata");
  EXPECT_TRUE(text.ok());
  auto md = DecodeMetadata(*text);
  EXPECT_TRUE(md.ok()) << md.status().ToString();
  return *md;
}

// The case: a MEGA .metadata whose relative_path is
// ../../outside/evil.mega (a valid shard of other values placed there) made the
// load read the outside file. Now the name is refused before anything is
// opened, whether the metadata carries a valid content checksum or none: the
// load fails, or (the MEGA reader's fallback for an undecodable .metadata)
// rebuilds the metadata from the shards inside the folder; it never returns
// the outside file's values. verify fails naming the rule.
TEST(PathSafety, MegaMetadataNamingAFileOutsideIsRefused) {
  TempDir t("path-safety");
  const std::string dir = t.path("a/b/ckpt");
  ASSERT_TRUE(SaveMega(dir).ok());
  {
    StateDict other;
    other.Set("w", StateValue(Iota(DType::kF32, {64, 96}, 77)));
    other.Set("b", StateValue(Iota(DType::kBF16, {96}, 78)));
    other.Set("rng", StateValue::Bytes(std::string(300, 'E')));
    // One file holding every entry (the default layout would split them).
    MegaStorageWriterOptions one_file;
    one_file.files_per_rank = 1;
    MegaStorageWriter w(t.path("evil"), std::nullopt, one_file);
    ASSERT_TRUE(Save(other, w).ok());
  }
  auto evil = Names(t.path("evil"), ".mega");
  ASSERT_EQ(evil.size(), 1u);
  stdfs::create_directories(t.path("a/outside"));
  stdfs::copy_file(t.path("evil") + "/" + evil[0], t.path("a/outside/evil.mega"));
  Metadata md = ReadMd(dir);
  for (auto& [idx, info] : md.storage_data) info.relative_path = "../../outside/evil.mega";
  std::string text = EncodeMetadata(md);
  for (bool with_crc : {true, false}) {
    if (!with_crc) text = text.substr(0, text.rfind(",\"content_crc32\"")) + "}";
    ASSERT_TRUE(WriteLocalFileAtomically(dir + "/.metadata", text).ok());
    StateDict sd = EmptyLike();
    MegaStorageReader r(dir);
    Status s = Load(sd, r);
    if (s.ok()) {
      Tensor want = Iota(DType::kF32, {64, 96}, 1);
      const Tensor& got = sd.Find("w")->tensor();
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0)
          << "the load returned bytes of the file outside the folder";
    }
    auto v = VerifyDcpCheckpoint(dir);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(v.status().message().find("'..'"), std::string::npos) << v.status().ToString();
    EXPECT_NE(v.status().message().find("relative_path"), std::string::npos)
        << v.status().ToString();
  }
}

// A data file replaced by a symlink to a file outside the folder (same bytes):
// refused, and the message shows nothing of the target's content.
TEST(PathSafety, SymlinkLeavingTheFolderIsRefused) {
  TempDir t("path-safety");
  const std::string dir = t.path("ckpt");
  const std::string data = SaveFsOneDataFile(dir);
  ASSERT_FALSE(data.empty());
  stdfs::rename(dir + "/" + data, t.path("outside.bin"));
  stdfs::create_symlink(t.path("outside.bin"), dir + "/" + data);
  Status s = LoadFs(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("outside the checkpoint folder"), std::string::npos) << s.ToString();
  // A symlink inside the folder is fine.
  stdfs::remove(dir + "/" + data);
  stdfs::rename(t.path("outside.bin"), dir + "/real.bin");
  stdfs::create_symlink("real.bin", dir + "/" + data);
  EXPECT_TRUE(LoadFs(dir).ok());
}

// A FIFO in place of a data file fails the load at once, naming the file and
// the tensor that needed it (the load used to block forever).
TEST(PathSafety, FifoDataFileFailsWithoutBlocking) {
  TempDir t("path-safety");
  const std::string dir = t.path("ckpt");
  const std::string data = SaveFsOneDataFile(dir);
  ASSERT_FALSE(data.empty());
  stdfs::remove(dir + "/" + data);
  ASSERT_EQ(mkfifo((dir + "/" + data).c_str(), 0600), 0);
  Status s = LoadFs(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("FIFO"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(data), std::string::npos) << s.ToString();
  auto v = VerifyDcpCheckpoint(dir);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->problems.empty());
}

// An fs save into a folder holding a MEGA checkpoint: a failed commit leaves the
// MEGA checkpoint in place and loadable; a successful one removes its files.
// And the reverse.
TEST(OneCheckpointPerFolder, OtherLayoutsGoAfterTheCommitOnly) {
  TempDir t("one-ckpt");
  const std::string dir = t.path("ckpt");
  ASSERT_TRUE(SaveMega(dir).ok());
  auto failing = std::make_shared<testing::InstrumentedFileSystem>();
  failing->fail_write_atomically = [](const std::string& p) { return p.ends_with("/.metadata"); };
  FileSystemWriterOptions fo;
  fo.fs = failing;
  EXPECT_FALSE(SaveFs(dir, fo).ok());
  EXPECT_FALSE(Names(dir, ".mega").empty());
  EXPECT_TRUE(stdfs::exists(dir + "/model.mega.index.json"));
  EXPECT_TRUE(LoadMega(dir).ok());

  ASSERT_TRUE(SaveFs(dir).ok());
  EXPECT_TRUE(Names(dir, ".mega").empty());
  EXPECT_FALSE(stdfs::exists(dir + "/model.mega.index.json"));
  EXPECT_TRUE(LoadFs(dir).ok());
  EXPECT_EQ(DetectLayout(*fs::LocalFileSystem(), dir).value(), StorageLayout::kFileSystem);

  ASSERT_TRUE(SaveMega(dir).ok());
  EXPECT_TRUE(Names(dir, ".distcp").empty());
  EXPECT_TRUE(LoadMega(dir).ok());
  EXPECT_EQ(DetectLayout(*fs::LocalFileSystem(), dir).value(), StorageLayout::kMega);
}

TEST(OneCheckpointPerFolder, NoOverwriteRefusesAnotherLayout) {
  TempDir t("one-ckpt");
  const std::string dir = t.path("ckpt");
  ASSERT_TRUE(SaveMega(dir).ok());
  stdfs::remove(dir + "/.metadata");  // only shards + index are left
  FileSystemWriterOptions fo;
  fo.overwrite = false;
  Status s = SaveFs(dir, fo);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("model.mega"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("overwrite"), std::string::npos) << s.ToString();
  EXPECT_FALSE(Names(dir, ".mega").empty());
}

// VerifyDcpCheckpoint names every damaged piece (not only the first) and
// agrees with DescribeDcpCheckpoint on what the checkpoint holds.
TEST(VerifyDcp, ReportsEveryDamagedPiece) {
  TempDir t("verify-dcp");
  const std::string dir = t.path("ckpt");
  const std::string data = SaveFsOneDataFile(dir);
  ASSERT_FALSE(data.empty());
  auto clean = VerifyDcpCheckpoint(dir);
  ASSERT_TRUE(clean.ok()) << clean.status().ToString();
  EXPECT_TRUE(clean->problems.empty());
  EXPECT_EQ(clean->summary.tensors, 2u);
  EXPECT_EQ(clean->summary.bytes_values, 1u);
  EXPECT_EQ(clean->chunks_checked, 3u);
  EXPECT_EQ(clean->bytes_checked, 64u * 96 * 4 + 96 * 2 + 300);
  const Metadata md = ReadMd(dir);
  const std::string file = dir + "/" + data;
  for (const char* fqn : {"w", "rng"}) {
    for (const auto& [idx, info] : md.storage_data) {
      if (idx.fqn != fqn) continue;
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(info.offset + info.length - 1));
      f.put('\x5a');
    }
  }
  auto bad = VerifyDcpCheckpoint(dir);
  ASSERT_TRUE(bad.ok());
  ASSERT_EQ(bad->problems.size(), 2u);
  std::string all;
  for (const Status& s : bad->problems) all += s.ToString() + "\n";
  EXPECT_NE(all.find("'w'"), std::string::npos) << all;
  EXPECT_NE(all.find("'rng'"), std::string::npos) << all;
  EXPECT_NE(all.find(data), std::string::npos) << all;
}

// Verification is never skipped silently: an entry without any checksum is
// refused unless the caller turns verification off.
TEST(VerifiedReads, EntryWithoutChecksumNeedsVerifyOff) {
  TempDir t("verified");
  const std::string dir = t.path("ckpt");
  ASSERT_TRUE(SaveFs(dir).ok());
  Metadata md = ReadMd(dir);
  for (auto& [idx, info] : md.storage_data) {
    info.checksum.clear();
    info.block_size = 0;
    info.block_crc32.clear();
    info.block_table_offset.reset();
  }
  ASSERT_TRUE(WriteLocalFileAtomically(dir + "/.metadata", EncodeMetadata(md)).ok());
  Status s = LoadFs(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("kOff"), std::string::npos) << s.ToString();
  FileSystemReaderOptions ro;
  ro.verify = VerifyMode::kOff;
  StateDict sd = EmptyLike();
  EXPECT_TRUE(Load(sd, *NewFileSystemReader(dir, ro)).ok());
}

}  // namespace
}  // namespace megackpt::dcp
