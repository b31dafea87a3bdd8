// MDB shard v2: layout facts, round trips, one failing case per malformation,
// export/import through a store.
#include "megackpt/cas/shard.h"

#include <gtest/gtest.h>

#include <cstring>

#include "cas/test_util.h"
#include "megackpt/cas/store.h"

namespace megackpt::cas {
namespace {

using testing::Bytes;
using testing::RandomBytes;
using testing::ScopedTempDir;

MerkleHash H(uint8_t seed) {
  MerkleHash h;
  for (int i = 0; i < 32; ++i) h.bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return h;
}

Shard SampleShard() {
  Shard s;
  ShardFileInfo f;
  f.reconstruction.file_hash = H(1);
  f.reconstruction.terms = {{H(2), 0, 3, 1000, H(3)}, {H(4), 5, 6, 77, H(5)}};
  f.reconstruction.size = 1077;
  s.files.push_back(f);
  ShardFileInfo g;
  g.reconstruction.file_hash = H(6);
  g.reconstruction.terms = {{H(2), 3, 4, 10, H(7)}};
  g.reconstruction.size = 10;
  std::array<uint8_t, 32> sha{};
  sha[0] = 0xab;
  g.sha256 = sha;
  s.files.push_back(g);
  ShardXorbInfo x;
  x.xorb_hash = H(2);
  x.chunks = {{H(8), 0, 400}, {H(9), 400, 600}};
  x.unpacked_bytes = 1000;
  x.bytes_on_disk = 900;
  s.xorbs.push_back(x);
  s.creation_timestamp = 1700000000;
  s.key_expiry = 1800000000;
  return s;
}

TEST(ShardTest, LayoutFacts) {
  Shard s = SampleShard();
  std::string bytes = SerializeShard(s);
  // header + file1 (1 + 2 terms + 2 verification) + file2 (1 + 1 + 1 + ext) +
  // bookend + xorb (1 + 2) + bookend + footer
  size_t entries = (1 + 2 + 2) + (1 + 1 + 1 + 1) + 1 + (1 + 2) + 1;
  ASSERT_EQ(bytes.size(), kShardHeaderSize + entries * kShardEntrySize + kShardFooterSize);
  EXPECT_EQ(bytes.substr(0, 14), "HFRepoMetaData");
  uint64_t version, footer_size;
  std::memcpy(&version, bytes.data() + 32, 8);
  std::memcpy(&footer_size, bytes.data() + 40, 8);
  EXPECT_EQ(version, 2u);
  EXPECT_EQ(footer_size, 200u);
  // First file header: hash, flags (verification), entry count.
  EXPECT_EQ(std::memcmp(bytes.data() + 48, H(1).bytes.data(), 32), 0);
  uint32_t flags, n;
  std::memcpy(&flags, bytes.data() + 48 + 32, 4);
  std::memcpy(&n, bytes.data() + 48 + 36, 4);
  EXPECT_EQ(flags, kShardFileFlagWithVerification);
  EXPECT_EQ(n, 2u);
  // The file-info bookend: 32 x 0xFF then 16 x 0.
  size_t bookend = 48 + 9 * 48;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(static_cast<uint8_t>(bytes[bookend + i]), 0xFF);
  for (int i = 32; i < 48; ++i) EXPECT_EQ(bytes[bookend + i], 0);
  // Footer: version 1, offsets.
  const char* f = bytes.data() + bytes.size() - 200;
  uint64_t fv, file_off, cas_off, footer_off;
  std::memcpy(&fv, f, 8);
  std::memcpy(&file_off, f + 8, 8);
  std::memcpy(&cas_off, f + 16, 8);
  std::memcpy(&footer_off, f + 192, 8);
  EXPECT_EQ(fv, 1u);
  EXPECT_EQ(file_off, 48u);
  EXPECT_EQ(cas_off, bookend + 48);
  EXPECT_EQ(footer_off, bytes.size() - 200);
}

// hf_xet stores the SHA-256 of FileMetadataExt as a Xet hash parsed from the
// digest's hex (each 8-byte group byte-reversed): known answer for SHA-256("abc"),
// ba7816bf 8f01cfea 414140de 5dae2223 b00361a3 96177a9c b410ff61 f20015ad.
TEST(ShardTest, MetadataExtSha256IsStoredAsAXetHash) {
  const uint8_t digest[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40,
                              0xde, 0x5d, 0xae, 0x22, 0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17,
                              0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
  const uint8_t stored[32] = {0xea, 0xcf, 0x01, 0x8f, 0xbf, 0x16, 0x78, 0xba, 0x23, 0x22, 0xae,
                              0x5d, 0xde, 0x40, 0x41, 0x41, 0x9c, 0x7a, 0x17, 0x96, 0xa3, 0x61,
                              0x03, 0xb0, 0xad, 0x15, 0x00, 0xf2, 0x61, 0xff, 0x10, 0xb4};
  Shard s;
  ShardFileInfo f;
  f.reconstruction.file_hash = H(1);
  f.reconstruction.terms = {{H(2), 0, 1, 10, H(3)}};
  f.reconstruction.size = 10;
  f.sha256.emplace();
  std::memcpy(f.sha256->data(), digest, 32);
  s.files.push_back(f);
  std::string bytes = SerializeShard(s, {.with_verification = false, .with_footer = false});
  // header, file header, one term, then the FileMetadataExt.
  ASSERT_GE(bytes.size(), 48u + 3 * 48u + 32u);
  EXPECT_EQ(std::memcmp(bytes.data() + 48 + 2 * 48, stored, 32), 0);
  MerkleHash as_xet;
  std::memcpy(as_xet.bytes.data(), stored, 32);
  EXPECT_EQ(as_xet.ToHex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto parsed = ParseShard(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->files.size(), 1u);
  ASSERT_TRUE(parsed->files[0].sha256.has_value());
  EXPECT_EQ(std::memcmp(parsed->files[0].sha256->data(), digest, 32), 0);
}

TEST(ShardTest, RoundTrip) {
  Shard s = SampleShard();
  for (bool footer : {true, false}) {
    std::string bytes = SerializeShard(s, {.with_verification = true, .with_footer = footer});
    auto parsed = ParseShard(Bytes(bytes));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    Shard want = s;
    if (!footer) {
      want.creation_timestamp = 0;
      want.key_expiry = ~0ull;
    }
    EXPECT_EQ(*parsed, want);
  }
  // Without verification entries the hashes come back zero.
  auto parsed = ParseShard(Bytes(SerializeShard(s, {.with_verification = false})));
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->files[0].reconstruction.terms[0].verification_hash.IsZero());
  // Empty shard.
  auto empty = ParseShard(Bytes(SerializeShard(Shard{})));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->files.empty() && empty->xorbs.empty());
}

void ExpectLoss(std::string bytes, const char* what) {
  auto r = ParseShard(Bytes(bytes));
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what;
}

TEST(ShardTest, MalformedShardsAreDataLoss) {
  const std::string good = SerializeShard(SampleShard());
  const std::string nofoot = SerializeShard(SampleShard(), {.with_footer = false});
  auto put32 = [](std::string s, size_t at, uint32_t v) {
    std::memcpy(s.data() + at, &v, 4);
    return s;
  };
  auto put64 = [](std::string s, size_t at, uint64_t v) {
    std::memcpy(s.data() + at, &v, 8);
    return s;
  };
  ExpectLoss(good.substr(0, 40), "truncated header");
  std::string tag = good;
  tag[3] = 'x';
  ExpectLoss(tag, "bad magic");
  ExpectLoss(put64(good, 32, 3), "header version 3");
  ExpectLoss(put64(good, 40, 199), "footer size 199");
  ExpectLoss(put64(nofoot, 40, 1u << 20), "footer larger than the shard");
  ExpectLoss(put32(good, 48 + 36, 1000000), "entry count past the end");
  ExpectLoss(put32(good, 48 + 32, 1), "unknown file flag");
  ExpectLoss(put32(good, 48 + 48 + 40, 3), "term with start == end");
  ExpectLoss(put32(good, 48 + 48 + 36, 0), "term with 0 bytes");
  std::string bookend = good;
  bookend[48 + 9 * 48 + 40] = 1;
  ExpectLoss(bookend, "malformed bookend");
  ExpectLoss(nofoot.substr(0, nofoot.size() - 48), "missing CAS bookend");
  ExpectLoss(nofoot + "junk", "trailing bytes without footer");
  size_t footer = good.size() - 200;
  ExpectLoss(put64(good, footer, 2), "footer version 2");
  ExpectLoss(put64(good, footer + 8, 96), "file info offset");
  ExpectLoss(put64(good, footer + 16, 48), "cas info offset");
  ExpectLoss(put64(good, footer + 192, 5), "footer offset");
  ExpectLoss(put64(good, footer + 24, 1ull << 40), "lookup offset past the footer");
  ExpectLoss(put64(good, footer + 24, 50), "lookup offset inside the sections");
  size_t xorb_header = 48 + 10 * 48;
  ExpectLoss(put32(good, xorb_header + 36, 0x7fffffff), "xorb chunk count past the end");
  // Every truncation of a valid shard fails cleanly.
  for (size_t n = 0; n < good.size(); n += 7) ExpectLoss(good.substr(0, n), "truncated");
}

TEST(ShardTest, LimitsAreEnforced) {
  std::string bytes = SerializeShard(SampleShard());
  EXPECT_EQ(ParseShard(Bytes(bytes), {.max_files = 1}).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ParseShard(Bytes(bytes), {.max_xorbs = 0}).status().code(), StatusCode::kDataLoss);
}

TEST(ShardTest, ExportImportBetweenStores) {
  ScopedTempDir a_dir, b_dir;
  LocalBackendOptions local{.create = true, .sync = false};
  auto a = CasStore::OpenLocal(a_dir.path(), {}, local);
  auto b = CasStore::OpenLocal(b_dir.path(), {}, local);
  ASSERT_TRUE(a.ok() && b.ok());
  std::string data = RandomBytes(1, 2'000'000);
  auto up = (*a)->Upload(Bytes(data));
  ASSERT_TRUE(up.ok());
  MerkleHash files[] = {up->file_hash};
  auto shard = ExportShard((*a)->backend(), files);
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  auto parsed = ParseShard(Bytes(*shard));
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->files.size(), 1u);
  EXPECT_EQ(parsed->files[0].reconstruction, up->reconstruction);
  ASSERT_EQ(parsed->xorbs.size(), up->reconstruction.terms.size());
  // Importing into a store without the xorbs fails: xorbs come first.
  EXPECT_EQ(ImportShard((*b)->backend(), Bytes(*shard)).status().code(),
            StatusCode::kFailedPrecondition);
  // Copy the xorbs (as an uploader would), then the shard.
  for (const auto& t : up->reconstruction.terms) {
    auto bytes = (*a)->backend().GetXorb(t.xorb_hash);
    auto layout = (*a)->backend().GetXorbLayout(t.xorb_hash);
    ASSERT_TRUE(bytes.ok() && layout.ok());
    ASSERT_TRUE((*b)->backend().PutXorb(*bytes, *layout).ok());
  }
  auto imported = ImportShard((*b)->backend(), Bytes(*shard));
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  EXPECT_EQ(imported->files_imported, 1u);
  EXPECT_TRUE(*(*b)->Read(up->file_hash) == data);
  auto again = ImportShard((*b)->backend(), Bytes(*shard));
  EXPECT_EQ(again->files_already_present, 1u);
  // A shard whose file hash does not match its chunks is refused.
  Shard lie = *parsed;
  lie.files[0].reconstruction.file_hash.bytes[0] ^= 1;
  EXPECT_EQ(ImportShard((*b)->backend(), Bytes(SerializeShard(lie))).status().code(),
            StatusCode::kDataLoss);
  Shard wrong_bytes = *parsed;
  wrong_bytes.files[0].reconstruction.terms[0].unpacked_bytes += 1;
  EXPECT_EQ(ImportShard((*b)->backend(), Bytes(SerializeShard(wrong_bytes))).status().code(),
            StatusCode::kDataLoss);
  Shard bad_verify = *parsed;
  bad_verify.files[0].reconstruction.terms[0].verification_hash.bytes[0] ^= 1;
  EXPECT_EQ(ImportShard((*b)->backend(), Bytes(SerializeShard(bad_verify))).status().code(),
            StatusCode::kDataLoss);
}

}  // namespace
}  // namespace megackpt::cas
