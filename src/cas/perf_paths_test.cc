// The fast paths of uploads: the two-phase xorb write (StageXorb /
// PublishStagedXorb), the background xorb committer, and kAuto's
// compression bail-out for float data that barely compresses.
#include <dirent.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "cas/test_util.h"
#include "megackpt/cas/store.h"
#include "megackpt/cas/xorb.h"

namespace megackpt::cas {
namespace {

using testing::Bytes;
using testing::RandomBytes;
using testing::ScopedTempDir;

size_t CountEntries(const std::string& dir) {
  size_t n = 0;
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// One xorb of `chunks` random chunks.
XorbBuilder::Finished MakeXorb(XorbBuilder& b, uint64_t seed, int chunks) {
  for (int i = 0; i < chunks; ++i) {
    std::string c = RandomBytes(seed * 100 + i, 20000);
    std::string rec;
    AppendChunkRecord(Bytes(c), CompressionPolicy::kNone, &rec);
    b.Add(ChunkHash(Bytes(c)), static_cast<uint32_t>(c.size()), rec);
  }
  return b.Finish();
}

std::string_view View(std::span<const std::byte> s) {
  return std::string_view(reinterpret_cast<const char*>(s.data()), s.size());
}

TEST(StagedXorbTest, PublishMakesVisibleOnceAndDroppingDiscards) {
  for (bool sync : {false, true}) {
    ScopedTempDir dir;
    LocalBackendOptions local;
    local.sync = sync;
    auto backend = OpenLocalBackend(dir.path(), local);
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    XorbBuilder b;
    auto fin = MakeXorb(b, 1, 3);

    // Staged but not published: invisible to readers and to dedup.
    auto staged = (*backend)->StageXorb(View(fin.serialized), fin.layout);
    ASSERT_TRUE(staged.ok()) << staged.status().ToString();
    ASSERT_NE(*staged, nullptr);
    EXPECT_FALSE(*(*backend)->HasXorb(fin.layout.xorb_hash));
    auto found = (*backend)->LookupChunks(std::vector<MerkleHash>{fin.layout.chunks[0].hash});
    ASSERT_TRUE(found.ok());
    EXPECT_FALSE((*found)[0].has_value());
    EXPECT_EQ(CountEntries(dir.path() + "/tmp"), 1u);

    auto created =
        (*backend)->PublishStagedXorb(std::move(*staged), View(fin.serialized), fin.layout);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    EXPECT_TRUE(*created);
    EXPECT_EQ(CountEntries(dir.path() + "/tmp"), 0u);  // the temp name is gone
    EXPECT_TRUE(*(*backend)->HasXorb(fin.layout.xorb_hash));
    found = (*backend)->LookupChunks(std::vector<MerkleHash>{fin.layout.chunks[2].hash});
    ASSERT_TRUE(found.ok());
    ASSERT_TRUE((*found)[0].has_value());
    EXPECT_EQ((*found)[0]->xorb_hash, fin.layout.xorb_hash);
    EXPECT_EQ((*found)[0]->chunk_index, 2u);
    auto bytes = (*backend)->GetXorb(fin.layout.xorb_hash);
    ASSERT_TRUE(bytes.ok());
    EXPECT_EQ(*bytes, View(fin.serialized));

    // Staging it again: already stored → nothing staged, publish says "not created".
    auto again = (*backend)->StageXorb(View(fin.serialized), fin.layout);
    ASSERT_TRUE(again.ok());
    auto created2 =
        (*backend)->PublishStagedXorb(std::move(*again), View(fin.serialized), fin.layout);
    ASSERT_TRUE(created2.ok());
    EXPECT_FALSE(*created2);

    // A staged xorb that is dropped leaves nothing behind.
    XorbBuilder b2;
    auto other = MakeXorb(b2, 2, 2);
    {
      auto dropped = (*backend)->StageXorb(View(other.serialized), other.layout);
      ASSERT_TRUE(dropped.ok());
      EXPECT_EQ(CountEntries(dir.path() + "/tmp"), 1u);
    }
    EXPECT_EQ(CountEntries(dir.path() + "/tmp"), 0u);
    EXPECT_FALSE(*(*backend)->HasXorb(other.layout.xorb_hash));

    // Bad arguments are refused at staging, like PutXorb.
    XorbLayout bad = other.layout;
    bad.serialized_bytes += 1;
    EXPECT_EQ((*backend)->StageXorb(View(other.serialized), bad).status().code(),
              StatusCode::kInvalidArgument);
  }
}

// Many xorbs per file with the background committer (2 threads), the same
// content uploaded by several streams at once: every file reads back, and
// every chunk is stored once.
TEST(StagedXorbTest, ConcurrentMultiXorbUploadsKeepOneCopy) {
  ScopedTempDir dir;
  CasStoreOptions opts;
  opts.upload_threads = 2;
  opts.max_xorb_bytes = 512u << 10;  // many xorbs per file
  LocalBackendOptions local;
  local.sync = false;
  auto store = CasStore::OpenLocal(dir.path(), opts, local);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string data = RandomBytes(7, 6'000'000);
  std::vector<Result<FileUploadResult>> results(4, InternalError("not run"));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      // Appends of odd sizes exercise batch boundaries too.
      auto stream = (*store)->BeginUpload({});
      if (!stream.ok()) {
        results[t] = stream.status();
        return;
      }
      for (size_t off = 0; off < data.size(); off += 777'777) {
        Status s = (*stream)->Append(
            Bytes(data).subspan(off, std::min<size_t>(777'777, data.size() - off)));
        if (!s.ok()) {
          results[t] = s;
          return;
        }
      }
      results[t] = (*stream)->Finish();
    });
  }
  for (auto& th : threads) th.join();
  uint64_t new_bytes = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->file_hash, results[0]->file_hash);
    new_bytes += r->new_bytes;
  }
  EXPECT_EQ(new_bytes, data.size());  // each chunk stored by exactly one stream
  auto stats = (*store)->Stat();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->unpacked_bytes, data.size());
  EXPECT_GT(stats->xorbs, 8u);
  EXPECT_TRUE(*(*store)->Read(results[0]->file_hash) == data);
  EXPECT_TRUE((*store)->Verify().ok());
}

// float32 weights like a trained layer: random signs and mantissas, exponents
// in a narrow band (bench cas's data). The lanes differ (kAuto predicts BG4) but BG4+LZ4 saves ~1%:
// kAuto stores the chunk raw after trying a sample, explicit BG4 still
// compresses, and float data that does compress keeps BG4.
TEST(CompressionBailOutTest, IncompressibleFloatsAreStoredRaw) {
  std::mt19937 rng(5);
  std::string weights(65536, '\0');
  for (size_t i = 0; i < weights.size(); i += 4) {
    uint32_t w = static_cast<uint32_t>(rng());
    w = (w & 0x807FFFFFu) | ((117u + ((w >> 23) & 7u)) << 23);  // exponent band 2^-10..2^-3
    std::memcpy(weights.data() + i, &w, 4);
  }
  std::string rec;
  EXPECT_EQ(AppendChunkRecord(Bytes(weights), CompressionPolicy::kAuto, &rec),
            CompressionScheme::kNone);
  EXPECT_EQ(rec.size(), weights.size() + kChunkRecordHeaderSize);
  std::string forced;
  AppendChunkRecord(Bytes(weights), CompressionPolicy::kBg4Lz4, &forced);
  EXPECT_LE(forced.size(), weights.size() + kChunkRecordHeaderSize);

  std::string small_floats;
  for (int i = 0; i < 16384; ++i) {
    float f = static_cast<float>(i % 200) * 0.25f;
    small_floats.append(reinterpret_cast<const char*>(&f), 4);
  }
  rec.clear();
  EXPECT_EQ(AppendChunkRecord(Bytes(small_floats), CompressionPolicy::kAuto, &rec),
            CompressionScheme::kByteGrouping4Lz4);
  EXPECT_LT(rec.size(), small_floats.size() / 2);
}

// VerifyXorb agrees with DecodeXorb on what a xorb holds, and rejects what
// DecodeXorb rejects.
TEST(VerifyXorbTest, LayoutMatchesDecodeAndCorruptionIsDataLoss) {
  XorbBuilder b;
  for (int i = 0; i < 5; ++i) {
    std::string c =
        i % 2 ? RandomBytes(40 + i, 30000) : std::string(25000 + i, static_cast<char>('a' + i));
    std::string rec;
    AppendChunkRecord(Bytes(c), CompressionPolicy::kAuto, &rec);
    b.Add(ChunkHash(Bytes(c)), static_cast<uint32_t>(c.size()), rec);
  }
  auto fin = b.Finish();
  auto layout = VerifyXorb(fin.serialized);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->xorb_hash, fin.layout.xorb_hash);
  EXPECT_EQ(layout->serialized_bytes, fin.layout.serialized_bytes);
  EXPECT_EQ(layout->chunks, fin.layout.chunks);
  EXPECT_TRUE(DecodeXorb(fin.serialized, &*layout).ok());

  std::string bad(reinterpret_cast<const char*>(fin.serialized.data()), fin.serialized.size());
  bad[bad.size() - 3] ^= 0x40;  // inside the last (compressed) record's payload
  auto corrupt = VerifyXorb(Bytes(bad));
  if (corrupt.ok()) {
    // A flipped literal byte may still decode: then the chunk hash differs.
    EXPECT_NE(corrupt->xorb_hash, fin.layout.xorb_hash);
  }
  std::string truncated = bad.substr(0, bad.size() - 1);
  EXPECT_EQ(VerifyXorb(Bytes(truncated)).status().code(), StatusCode::kDataLoss);
  std::string header_only = std::string("\0\xff\xff\xff\0\xff\xff\xff", 8);
  EXPECT_EQ(VerifyXorb(Bytes(header_only)).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace megackpt::cas
