// The local-directory backend against the backend conformance suite.
#include <fstream>
#include <iterator>

#include "cas/backend_conformance.h"
#include "megackpt/cas/hash.h"

namespace megackpt::cas::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Local, CasBackendConformanceTest,
    ::testing::Values(BackendFactory{"local",
                                     [](const std::string& dir) {
                                       return OpenLocalBackend(dir,
                                                               {.create = true, .sync = false});
                                     }},
                      BackendFactory{"local_sync",
                                     [](const std::string& dir) {
                                       return OpenLocalBackend(dir, {.create = true, .sync = true});
                                     }}),
    BackendFactoryName);

}  // namespace
}  // namespace megackpt::cas::testing

// Direct I/O (the default; MEGACKPT_CAS_DIRECT_IO=0 turns it off): large synced xorbs are written
// with O_DIRECT through core's WritableFile::UseDirectIo (whole blocks of the body from the
// builder's memory, the partial last block and the footer gathered and written at the fsync, then
// truncated). The stored bytes must be exactly those of a buffered write, for sizes on and off the
// 4 KiB grid.
namespace megackpt::cas {
namespace {

class CasDirectIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MEGACKPT_CAS_DIRECT_IO", "1", 1);
    char tmpl[] = "/tmp/megackpt-direct-io-XXXXXX";  // a disk file system (not tmpfs) when possible
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    unsetenv("MEGACKPT_CAS_DIRECT_IO");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(CasDirectIoTest, StoredXorbsAreByteIdenticalToBufferedOnes) {
  auto direct = OpenLocalBackend(dir_ + "/direct", {.create = true, .sync = true});
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  std::mt19937 rng(5);
  // Chunk counts/sizes giving records that end on and off 4 KiB boundaries.
  for (size_t chunk : {size_t{65536} - 8, size_t{65536}, size_t{70001}}) {
    XorbBuilder b;
    std::vector<std::string> chunks;
    for (int i = 0; i < 24; ++i) {
      std::string c(chunk, '\0');
      for (char& ch : c) ch = static_cast<char>(rng());
      std::string rec;
      AppendChunkRecord(std::as_bytes(std::span(c)), CompressionPolicy::kNone, &rec);
      b.Add(ChunkHash(std::as_bytes(std::span(c))), static_cast<uint32_t>(c.size()), rec);
      chunks.push_back(std::move(c));
    }
    auto fin = b.Finish();
    ASSERT_GE(fin.serialized.size(), size_t{1} << 20);
    const std::string_view bytes(reinterpret_cast<const char*>(fin.serialized.data()),
                                 fin.serialized.size());
    // Staged + published (the upload path) ...
    auto staged = (*direct)->StageXorb(bytes, fin.layout);
    ASSERT_TRUE(staged.ok()) << staged.status().ToString();
    auto created = (*direct)->PublishStagedXorb(std::move(*staged), bytes, fin.layout);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    EXPECT_TRUE(*created);
    auto back = (*direct)->GetXorb(fin.layout.xorb_hash);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_TRUE(*back == bytes) << "chunk size " << chunk;
    // ... and the whole file (records + footer) equals a buffered store's.
    std::string buffered_dir = dir_ + "/buffered-" + std::to_string(chunk);
    setenv("MEGACKPT_CAS_DIRECT_IO", "0", 1);
    auto plain = OpenLocalBackend(buffered_dir, {.create = true, .sync = true});
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE((*plain)->PutXorb(bytes, fin.layout).ok());
    setenv("MEGACKPT_CAS_DIRECT_IO", "1", 1);
    const std::string hex = fin.layout.xorb_hash.ToHex();
    auto slurp = [](const std::string& path) {
      std::ifstream in(path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    std::string a = slurp(dir_ + "/direct/xorbs/" + hex.substr(0, 2) + "/" + hex);
    std::string c = slurp(buffered_dir + "/xorbs/" + hex.substr(0, 2) + "/" + hex);
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == c) << "chunk size " << chunk << ": " << a.size() << " vs " << c.size()
                        << " bytes";
    // A fresh backend reads the layout from the footer.
    auto reopened = OpenLocalBackend(dir_ + "/direct", {.create = false, .sync = true});
    ASSERT_TRUE(reopened.ok());
    auto layout = (*reopened)->GetXorbLayout(fin.layout.xorb_hash);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    EXPECT_EQ(layout->chunks.size(), chunks.size());
    auto mid = (*reopened)->GetXorbRange(fin.layout.xorb_hash, 12345, 100000);
    ASSERT_TRUE(mid.ok());
    EXPECT_TRUE(*mid == bytes.substr(12345, 100000));
  }
}

}  // namespace
}  // namespace megackpt::cas
