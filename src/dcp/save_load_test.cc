// dcp::Save(state_dict, path) / dcp::Load(path, state_dict): both storages,
// errors. This binary links dcp without the hub, so mega:// paths have no
// filesystem here (FailedPrecondition): dcp reaches storage only through fs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "dcp/test_util.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {
namespace {

using ::testing::HasSubstr;

StateDict MakeState(float base, Tensor* out_w) {
  Tensor w = *Tensor::Empty(DType::kF32, {32, 16});
  float* p = static_cast<float*>(w.data());
  for (int i = 0; i < 32 * 16; ++i) p[i] = base + static_cast<float>(i);
  StateDict sd;
  sd.Set("w", w);
  sd.Set("note", StateValue::Bytes("bytes too"));
  if (out_w) *out_w = w;
  return sd;
}

TEST(PathSaveLoadTest, RoundTripsWithBothStorages) {
  testing::TempDir dir;
  for (const std::string storage : {"mega", "fs"}) {
    SCOPED_TRACE(storage);
    const std::string path = dir.path(storage);
    Tensor w;
    StateDict sd = MakeState(3.5f, &w);
    PathSaveOptions so;
    so.storage = storage;
    Status s = Save(sd, path, so);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(std::filesystem::exists(path + "/.metadata"));
    EXPECT_EQ(std::filesystem::exists(path + "/model.mega.index.json"), storage == "mega");

    Tensor back = *Tensor::Empty(DType::kF32, {32, 16}, true);
    StateDict into;
    into.Set("w", back);
    into.Set("note", StateValue::Bytes(""));
    PathLoadOptions lo;
    lo.storage = storage;
    s = Load(path, into, lo);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::memcmp(back.data(), w.data(), w.nbytes()), 0);
    ASSERT_NE(into.Find("note"), nullptr);
    EXPECT_EQ(into.Find("note")->bytes(), "bytes too");
    // A second save over it: overwrite by default, refused without.
    EXPECT_TRUE(Save(sd, path, so).ok());
    so.overwrite = false;
    EXPECT_EQ(Save(sd, path, so).code(), StatusCode::kAlreadyExists);
  }
}

// PathSaveOptions::direct_io reaches both storages' writers (through
// StorageFactoryOptions): the data files skip the page cache, and load back.
TEST(PathSaveLoadTest, DirectIoReachesBothStorages) {
  testing::TempDir dir;
  Tensor w = *Tensor::Empty(DType::kF32, {256, 1027});  // 1 MiB + 12 KiB: whole and partial blocks
  float* p = static_cast<float*>(w.data());
  for (uint64_t i = 0; i < 256 * 1027; ++i) p[i] = static_cast<float>(i % 9973) * 0.25f;
  StateDict sd;
  sd.Set("w", w);
  for (const std::string storage : {"mega", "fs"}) {
    SCOPED_TRACE(storage);
    PathSaveOptions so;
    so.storage = storage;
    ASSERT_TRUE(Save(sd, dir.path(storage + "-buffered"), so).ok());
    so.direct_io = true;
    Status s = Save(sd, dir.path(storage + "-direct"), so);
    ASSERT_TRUE(s.ok()) << s.ToString();
    testing::ExpectSavedAroundThePageCache(dir.path(storage + "-direct"),
                                           dir.path(storage + "-buffered"),
                                           storage == "mega" ? ".mega" : ".distcp");
    Tensor back = *Tensor::Empty(DType::kF32, {256, 1027}, true);
    StateDict into;
    into.Set("w", back);
    PathLoadOptions lo;
    lo.storage = storage;
    s = Load(dir.path(storage + "-direct"), into, lo);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(std::memcmp(back.data(), w.data(), w.nbytes()), 0);
  }
}

TEST(PathSaveLoadTest, Errors) {
  testing::TempDir dir;
  StateDict sd = MakeState(0, nullptr);
  PathSaveOptions bad;
  bad.storage = "tape";
  EXPECT_EQ(Save(sd, dir.path("x"), bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Load(dir.path("missing"), sd).code(), StatusCode::kNotFound);
  // No hub linked into this binary: nothing serves mega://.
  ASSERT_FALSE(fs::IsFileSystemSchemeRegistered("mega"));
  Status s = Save(sd, "mega://org/m@main/ckpt");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("mega://"));
}

}  // namespace
}  // namespace megackpt::dcp
