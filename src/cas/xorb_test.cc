// Chunk records, compression schemes, xorb decoding and the stored footer,
// including one failing case per kind of malformed input.
#include "megackpt/cas/xorb.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cas/test_util.h"

namespace megackpt::cas {
namespace {

using testing::Bytes;
using testing::RandomBytes;

std::string FloatBytes(size_t n) { return testing::FloatBytes(1, n, 0.05f); }

std::string Decode(const std::string& rec) {
  std::string out;
  auto next = DecodeChunkRecord(Bytes(rec), 0, &out);
  EXPECT_TRUE(next.ok()) << next.status().ToString();
  if (next.ok()) {
    EXPECT_EQ(*next, rec.size());
  }
  return out;
}

TEST(ChunkRecordTest, RoundTripsEverySchemeAndSize) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{5}, size_t{4097},
                   size_t{65536}, size_t{131072}}) {
    for (const std::string& data : {RandomBytes(n, n), FloatBytes(n), std::string(n, 'z')}) {
      for (CompressionPolicy p : {CompressionPolicy::kNone, CompressionPolicy::kAuto,
                                  CompressionPolicy::kLz4, CompressionPolicy::kBg4Lz4}) {
        std::string rec;
        CompressionScheme scheme = AppendChunkRecord(Bytes(data), p, &rec);
        EXPECT_LE(rec.size(), data.size() + kChunkRecordHeaderSize);
        EXPECT_EQ(Decode(rec), data) << "size " << n << " scheme " << CompressionSchemeName(scheme);
      }
    }
  }
}

TEST(ChunkRecordTest, HeaderLayout) {
  std::string data = RandomBytes(1, 1000);
  std::string rec;
  ASSERT_EQ(AppendChunkRecord(Bytes(data), CompressionPolicy::kNone, &rec),
            CompressionScheme::kNone);
  ASSERT_EQ(rec.size(), 1008u);
  const uint8_t* h = reinterpret_cast<const uint8_t*>(rec.data());
  EXPECT_EQ(h[0], 0);                              // version
  EXPECT_EQ(h[1] | h[2] << 8 | h[3] << 16, 1000);  // compressed_len (u24 LE)
  EXPECT_EQ(h[4], 0);                              // scheme
  EXPECT_EQ(h[5] | h[6] << 8 | h[7] << 16, 1000);  // uncompressed_len
  EXPECT_EQ(rec.substr(8), data);
}

TEST(ChunkRecordTest, AutoPolicyChoosesByData) {
  std::string rec;
  // Random bytes do not shrink: stored raw.
  EXPECT_EQ(AppendChunkRecord(Bytes(RandomBytes(2, 65536)), CompressionPolicy::kAuto, &rec),
            CompressionScheme::kNone);
  // Text-like repetitive bytes: LZ4.
  std::string text;
  while (text.size() < 65536)
    text += "the quick brown fox jumps over the lazy dog " + std::to_string(text.size() % 97);
  rec.clear();
  EXPECT_EQ(AppendChunkRecord(Bytes(text), CompressionPolicy::kAuto, &rec),
            CompressionScheme::kLz4);
  // Small float32 values: byte lanes differ, BG4 + LZ4, and smaller than LZ4 alone.
  std::string floats;
  for (int i = 0; i < 16384; ++i) {
    float f = static_cast<float>(i % 200) * 0.25f;
    floats.append(reinterpret_cast<const char*>(&f), 4);
  }
  std::string bg4, lz4;
  EXPECT_EQ(AppendChunkRecord(Bytes(floats), CompressionPolicy::kAuto, &bg4),
            CompressionScheme::kByteGrouping4Lz4);
  AppendChunkRecord(Bytes(floats), CompressionPolicy::kLz4, &lz4);
  EXPECT_LT(bg4.size(), floats.size());
  EXPECT_EQ(Decode(bg4), floats);
}

TEST(ChunkRecordTest, MalformedRecordsAreDataLoss) {
  std::string data = RandomBytes(3, 5000);
  std::string good;
  AppendChunkRecord(Bytes(data), CompressionPolicy::kNone, &good);
  std::string compressible(20000, 'q');
  std::string lz;
  ASSERT_EQ(AppendChunkRecord(Bytes(compressible), CompressionPolicy::kLz4, &lz),
            CompressionScheme::kLz4);
  auto expect_loss = [](const std::string& rec, const char* what) {
    std::string out;
    auto r = DecodeChunkRecord(Bytes(rec), 0, &out);
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what;
    EXPECT_TRUE(out.empty()) << what;
  };
  expect_loss(good.substr(0, 5), "truncated header");
  expect_loss(good.substr(0, 100), "payload shorter than compressed_len");
  std::string v = good;
  v[0] = 1;
  expect_loss(v, "version 1");
  std::string s = good;
  s[4] = 3;
  expect_loss(s, "scheme 3");
  std::string lens = good;
  lens[5] = 0x11;  // uncompressed_len != compressed_len for scheme 0
  expect_loss(lens, "scheme 0 with different lengths");
  std::string frame = lz;
  frame[8 + 10] ^= 0x55;
  frame[8 + 11] ^= 0x55;
  expect_loss(frame, "corrupt LZ4 frame");
  std::string big = lz;
  big[5] = static_cast<char>(0xff);  // says more bytes than the frame holds
  expect_loss(big, "uncompressed_len larger than the frame");
  std::string small = lz;
  small[5] = 1;
  small[6] = 0;
  small[7] = 0;  // says 1 byte
  expect_loss(small, "uncompressed_len smaller than the frame");
  std::string cut = lz;
  cut.resize(cut.size() - 4);
  uint32_t clen = static_cast<uint32_t>(cut.size() - 8);
  cut[1] = static_cast<char>(clen);
  cut[2] = static_cast<char>(clen >> 8);
  cut[3] = static_cast<char>(clen >> 16);
  expect_loss(cut, "truncated LZ4 frame");
  // An LZ4 header promising more than 256x its payload is refused before
  // anything is allocated for it.
  std::string bomb = lz.substr(0, 8 + 10);
  bomb[1] = 10;
  bomb[2] = 0;
  bomb[3] = 0;
  bomb[5] = bomb[6] = bomb[7] = static_cast<char>(0xff);
  expect_loss(bomb, "impossible expansion");
  // Decoding into a buffer of the wrong size.
  std::string dst(10, '\0');
  EXPECT_EQ(
      DecodeChunkRecordTo(Bytes(good), 0, std::as_writable_bytes(std::span(dst))).status().code(),
      StatusCode::kDataLoss);
}

XorbBuilder::Finished BuildXorb(XorbBuilder& b, int chunks, std::vector<std::string>* datas) {
  for (int i = 0; i < chunks; ++i) {
    std::string d = i % 2 ? FloatBytes(20000 + i) : RandomBytes(i, 30000 + i);
    std::string rec;
    AppendChunkRecord(Bytes(d), CompressionPolicy::kAuto, &rec);
    EXPECT_TRUE(b.Fits(rec.size()));
    EXPECT_EQ(b.Add(ChunkHash(Bytes(d)), static_cast<uint32_t>(d.size()), rec),
              static_cast<uint32_t>(i));
    datas->push_back(d);
  }
  return b.Finish();
}

TEST(XorbTest, BuildAndDecode) {
  XorbBuilder b;
  std::vector<std::string> datas;
  auto fin = BuildXorb(b, 6, &datas);
  EXPECT_TRUE(b.empty());
  EXPECT_TRUE(fin.layout.Validate().ok());
  std::vector<HashAndSize> leaves;
  for (auto& d : datas) leaves.push_back({ChunkHash(Bytes(d)), d.size()});
  EXPECT_EQ(fin.layout.xorb_hash, XorbHash(leaves));
  auto decoded = DecodeXorb(fin.serialized, &fin.layout);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  std::string all;
  for (auto& d : datas) all += d;
  EXPECT_EQ(decoded->data, all);
  EXPECT_EQ(decoded->chunks, leaves);
  // The footer round-trips and is checked against the xorb's name.
  std::string footer = EncodeXorbFooter(fin.layout);
  EXPECT_EQ(footer.size(), 6 * kXorbFooterEntrySize + kXorbFooterTrailerSize);
  auto parsed = ParseXorbFooter(Bytes(footer), fin.layout.xorb_hash);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, fin.layout);
  MerkleHash other = fin.layout.xorb_hash;
  other.bytes[0] ^= 1;
  EXPECT_EQ(ParseXorbFooter(Bytes(footer), other).status().code(), StatusCode::kDataLoss);
  std::string bad = footer;
  bad[3] ^= 1;  // chunk table no longer matches its CRC
  EXPECT_EQ(ParseXorbFooter(Bytes(bad), fin.layout.xorb_hash).status().code(),
            StatusCode::kDataLoss);
  bad = footer;
  bad[bad.size() - 1] = 'X';  // magic
  EXPECT_EQ(ParseXorbFooter(Bytes(bad), fin.layout.xorb_hash).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(ParseXorbFooter(Bytes(footer).first(30), fin.layout.xorb_hash).status().code(),
            StatusCode::kDataLoss);
}

TEST(XorbTest, DecodeNamesTheBadChunk) {
  XorbBuilder b;
  std::vector<std::string> datas;
  auto fin = BuildXorb(b, 4, &datas);
  std::string bytes(reinterpret_cast<const char*>(fin.serialized.data()), fin.serialized.size());
  // Corrupt a payload byte of chunk 2 (chunk 2 is random data, stored raw).
  bytes[fin.layout.chunks[2].byte_offset + 8 + 5] ^= 1;
  auto r = DecodeXorb(Bytes(bytes), &fin.layout);
  ASSERT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("xorb " + fin.layout.xorb_hash.ToHex() + " chunk 2"),
            std::string::npos)
      << r.status().message();
  // Without a layout the decoder still parses (hashes are then reported).
  EXPECT_TRUE(DecodeXorb(Bytes(bytes)).ok());
  // Truncation is caught.
  EXPECT_EQ(DecodeXorb(Bytes(bytes).first(bytes.size() - 1)).status().code(),
            StatusCode::kDataLoss);
}

TEST(XorbTest, BuilderLimits) {
  XorbBuilder b(/*max_bytes=*/100000, /*max_chunks=*/3);
  std::string rec;
  AppendChunkRecord(Bytes(RandomBytes(1, 30000)), CompressionPolicy::kNone, &rec);
  MerkleHash h;
  EXPECT_TRUE(b.Fits(rec.size()));
  b.Add(h, 30000, rec);
  b.Add(h, 30000, rec);
  b.Add(h, 30000, rec);
  EXPECT_FALSE(b.Fits(rec.size()));  // chunk count
  XorbBuilder c(/*max_bytes=*/70000);
  c.Add(h, 30000, rec);
  c.Add(h, 30000, rec);
  EXPECT_FALSE(c.Fits(rec.size()));  // bytes
}

// hf_xet packs up to 64 MiB of chunk data and adds the record headers on
// top: a 64 MiB file of random bytes is one xorb of 64 MiB + 1024 x 8 bytes.
// Readers accept it; one record more than the header allowance is refused.
TEST(XorbTest, ReadersAcceptXetsFullXorbs) {
  std::string chunk = RandomBytes(7, 64 << 10);
  std::string rec;
  AppendChunkRecord(Bytes(chunk), CompressionPolicy::kNone, &rec);
  std::string xorb;
  xorb.reserve(kMaxSerializedXorbBytes + rec.size());
  while (xorb.size() + rec.size() <= kMaxXorbBytes + 1024 * kChunkRecordHeaderSize) xorb += rec;
  ASSERT_GT(xorb.size(), kMaxXorbBytes);
  auto span = std::as_bytes(std::span<const char>(xorb.data(), xorb.size()));
  auto layout = VerifyXorb(span);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->chunks.size(), 1024u);
  EXPECT_TRUE(DecodeXorb(span).ok());
  // Past the allowance: DataLoss naming the limit.
  std::string tail(kMaxSerializedXorbBytes + 1 - xorb.size(), '\0');
  xorb += tail;
  auto too_big = VerifyXorb(std::as_bytes(std::span<const char>(xorb.data(), xorb.size())));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(too_big.status().message().find("exceeds the xorb limit"), std::string::npos);
}

TEST(XorbLayoutTest, ValidateRejectsInconsistentLayouts) {
  XorbBuilder b;
  std::vector<std::string> datas;
  auto fin = BuildXorb(b, 3, &datas);
  XorbLayout l = fin.layout;
  ASSERT_TRUE(l.Validate().ok());
  XorbLayout x = l;
  x.chunks[1].byte_offset = x.chunks[2].byte_offset + 1;
  EXPECT_EQ(x.Validate().code(), StatusCode::kDataLoss);
  x = l;
  x.serialized_bytes = x.chunks[2].byte_offset + 3;
  EXPECT_EQ(x.Validate().code(), StatusCode::kDataLoss);
  x = l;
  x.chunks.clear();
  EXPECT_EQ(x.Validate().code(), StatusCode::kDataLoss);
  x = l;
  x.chunks[0].byte_offset = 1;
  EXPECT_EQ(x.Validate().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace megackpt::cas
