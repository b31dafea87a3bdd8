#include "dcp/codec.h"

#include <gtest/gtest.h>

#include "megackpt/dcp/metadata.h"

namespace megackpt::dcp {
namespace {

Metadata SampleMetadata() {
  Metadata md;
  md.version = "megackpt test";
  md.state_dict_metadata["w"] = TensorStorageMetadata{
      TensorProperties{DType::kBF16, true},
      Shape{4, 6},
      {ChunkStorageMetadata{{0, 0}, {2, 6}}, ChunkStorageMetadata{{2, 0}, {2, 6}}}};
  md.state_dict_metadata["s"] = TensorStorageMetadata{
      TensorProperties{DType::kF64, false}, Shape{}, {ChunkStorageMetadata{{}, {}}}};
  md.state_dict_metadata["blob"] = BytesStorageMetadata{};
  md.planner_data.object_paths["a.b.0"] = {PathKey{std::string("a")}, PathKey{std::string("b")},
                                           PathKey{int64_t{0}}};
  md.planner_data.extra = "{\"x\": 1}";
  // i0: an inline block CRC table (how older checkpoints record it); "s": a
  // table in the data file.
  StorageInfo i0{"__0_0.distcp", 0, 24, "crc32:0badf00d", 16, {1, 0xffffffffu}, ""};
  StorageInfo i1{"__0_0.distcp", 64, 24, "", 0, {}, "extra text"};
  md.storage_data[MetadataIndex("w", Shape{0, 0})] = i0;
  md.storage_data[MetadataIndex("w", Shape{2, 0})] = i1;
  md.storage_data[MetadataIndex("s", Shape{})] =
      StorageInfo{"f", 128, 8, "crc32:12345678", 4, {}, "", 136};
  md.storage_data[MetadataIndex("blob")] = StorageInfo{"f", 200, 3, "", 0, {}, ""};
  md.storage_meta = StorageMeta{"/ckpt", "abc", "", {"m1", "m2"}};
  return md;
}

TEST(MetadataCodec, RoundTrip) {
  Metadata md = SampleMetadata();
  std::string enc = EncodeMetadata(md);
  auto dec = DecodeMetadata(enc);
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(*dec, md);
  EXPECT_EQ(EncodeMetadata(*dec), enc);  // deterministic
  EXPECT_NE(enc.find("\"format\":\"megackpt-dcp-metadata\""), std::string::npos);
  EXPECT_NE(enc.find("\"version\":1"), std::string::npos);
}

TEST(MetadataCodec, EmptyMetadataRoundTrips) {
  Metadata md;
  auto dec = DecodeMetadata(EncodeMetadata(md));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(*dec, md);
}

// Each malformed input fails with DataLoss and a message naming the problem.
struct BadCase {
  const char* name;
  std::string from;  // substring of the good encoding to replace
  std::string to;
  const char* expect;  // substring of the error message
};

TEST(MetadataCodec, RejectsMalformedInput) {
  const std::string good = EncodeMetadata(SampleMetadata());
  const BadCase cases[] = {
      {"format", "megackpt-dcp-metadata", "something-else", "format"},
      {"version", "\"version\":1", "\"version\":2", "unsupported version 2"},
      {"version type", "\"version\":1", "\"version\":\"1\"", "expected an integer"},
      {"dtype", "\"BF16\"", "\"BF17\"", "unknown dtype"},
      {"negative size", "\"size\":[4,6]", "\"size\":[4,-6]", "negative"},
      {"chunk out of bounds", "\"offsets\":[2,0],\"sizes\":[2,6]",
       "\"offsets\":[3,0],\"sizes\":[2,6]", "exceed global shape"},
      {"chunk dims", "\"offsets\":[2,0],\"sizes\":[2,6]", "\"offsets\":[2,0],\"sizes\":[2]",
       "dims"},
      {"entry type", "\"type\":\"bytes\"", "\"type\":\"blob\"", "unknown entry type"},
      {"unknown storage fqn", "\"fqn\":\"blob\"},\"info\"", "\"fqn\":\"nope\"},\"info\"",
       "not in state_dict_metadata"},
      {"checksum", "crc32:0badf00d", "crc32:xyz", "checksum"},
      {"block count", "\"block_crc32\":\"00000001ffffffff\"", "\"block_crc32\":\"00000001\"",
       "expected 2 CRCs"},
      {"table offset type", "\"block_table_offset\":136", "\"block_table_offset\":\"136\"",
       "block_table_offset: expected a non-negative integer"},
      {"table offset negative", "\"block_table_offset\":136", "\"block_table_offset\":-1",
       "block_table_offset: expected a non-negative integer"},
      {"table offset overflow", "\"block_table_offset\":136",
       "\"block_table_offset\":18446744073709551612", "overflows"},
      {"table and inline", "\"block_table_offset\":136",
       "\"block_table_offset\":136,\"block_crc32\":\"0000000000000000\"",
       "present together with block_crc32"},
      {"no table", ",\"block_table_offset\":136", "", "missing member \"block_crc32\""},
      {"table without blocks", "\"block_size\":4,\"block_table_offset\":136",
       "\"block_table_offset\":136", "present but block_size is 0"},
      {"missing member",
       "\"storage_data\":", "\"storage_datum\":", "missing member \"storage_data\""},
      {"list index", "[\"a\",\"b\",0]", "[\"a\",\"b\",-1]", "negative list index"},
      {"path start", "[\"a\",\"b\",0]", "[0,\"b\"]", "must start with a key"},
  };
  for (const BadCase& c : cases) {
    std::string bad = good;
    size_t pos = bad.find(c.from);
    ASSERT_NE(pos, std::string::npos) << c.name;
    bad.replace(pos, c.from.size(), c.to);
    auto r = DecodeMetadata(bad);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << c.name;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << c.name << ": " << r.status().message();
  }
}

TEST(MetadataCodec, RejectsNonJsonAndTruncations) {
  const std::string good = EncodeMetadata(SampleMetadata());
  for (size_t n = 0; n < good.size(); n += 7) {
    auto r = DecodeMetadata(good.substr(0, n));
    EXPECT_FALSE(r.ok()) << n;
  }
  EXPECT_EQ(DecodeMetadata("\x80\x04pickle").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeMetadata("[]").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(DecodeMetadata("{\"format\":\"megackpt-dcp-metadata\"}").status().code(),
            StatusCode::kDataLoss);
}

// The metadata protects itself (content_crc32): every single-bit flip of an
// encoded document either fails to decode with DataLoss, or decodes to exactly
// the same Metadata (the flip hit the checksum member's own name).
TEST(MetadataCodec, EveryBitFlipFailsOrChangesNothing) {
  const Metadata md = SampleMetadata();
  const std::string good = EncodeMetadata(md);
  ASSERT_NE(good.find("\"content_crc32\":\""), std::string::npos);
  const std::string canonical = EncodeMetadata(*DecodeMetadata(good));
  size_t unchanged = 0;
  for (size_t pos = 0; pos < good.size(); ++pos) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[pos] = static_cast<char>(bad[pos] ^ (1 << bit));
      auto r = DecodeMetadata(bad);
      if (!r.ok()) {
        EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << pos << ":" << bit;
        continue;
      }
      EXPECT_EQ(EncodeMetadata(*r), canonical)
          << "flip at byte " << pos << " bit " << bit << " changed the decoded metadata";
      ++unchanged;
    }
  }
  EXPECT_LT(unchanged, 8u * 40);  // only flips inside the checksum member's name/structure
}

TEST(MetadataCodec, ContentChecksumMismatchIsNamed) {
  std::string enc = EncodeMetadata(SampleMetadata());
  const size_t pos = enc.find("\"length\":24");
  ASSERT_NE(pos, std::string::npos);
  enc[pos + 10] = '3';  // 24 -> 34: still valid JSON and a valid length
  auto r = DecodeMetadata(enc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("content checksum mismatch"), std::string::npos)
      << r.status().message();
}

// Documents written before content_crc32 existed still decode.
TEST(MetadataCodec, DocumentWithoutContentChecksumDecodes) {
  std::string enc = EncodeMetadata(SampleMetadata());
  const size_t pos = enc.rfind(",\"content_crc32\"");
  ASSERT_NE(pos, std::string::npos);
  enc = enc.substr(0, pos) + "}";
  EXPECT_TRUE(DecodeMetadata(enc).ok());
}

// Block CRC tables: a table in the data file is a number in the document
// (block_table_offset); an inline table (older checkpoints, or a piece an
// incremental save references from one) is the documented hex text, and both
// travel the same way in the write results exchanged between ranks.
Metadata LongCrcMetadata(bool inline_table) {
  Metadata md;
  md.state_dict_metadata["w"] = TensorStorageMetadata{
      TensorProperties{DType::kU8, false}, Shape{4096}, {ChunkStorageMetadata{{0}, {4096}}}};
  StorageInfo info{"__0_0.distcp", 0, 4096, "crc32:0badf00d", 64, {}, "", 4096};
  if (inline_table) {
    info.block_table_offset.reset();
    for (uint32_t b = 0; b < 64; ++b) info.block_crc32.push_back(b * 0x9E3779B9u);
  }
  md.storage_data[MetadataIndex("w", Shape{0})] = info;
  return md;
}

std::string HexOf(const std::vector<uint32_t>& crcs) {
  std::string out;
  char buf[16];
  for (uint32_t c : crcs) {
    std::snprintf(buf, sizeof buf, "%08x", c);
    out += buf;
  }
  return out;
}

TEST(MetadataCodec, BlockCrcTablesRoundTripAsDocumentedText) {
  for (bool inline_table : {false, true}) {
    Metadata md = LongCrcMetadata(inline_table);
    const std::string enc = EncodeMetadata(md);
    const StorageInfo& info = md.storage_data.begin()->second;
    if (inline_table) {
      EXPECT_NE(enc.find("{\"block_crc32\":\"" + HexOf(info.block_crc32) + "\",\"block_size\":64,"),
                std::string::npos)
          << enc;
      EXPECT_EQ(enc.find("block_table_offset"), std::string::npos) << enc;
    } else {
      EXPECT_NE(enc.find("\"block_size\":64,\"block_table_offset\":4096,"), std::string::npos)
          << enc;
      EXPECT_EQ(enc.find("block_crc32"), std::string::npos) << enc;
    }
    auto dec = DecodeMetadata(enc);
    ASSERT_TRUE(dec.ok()) << dec.status().ToString();
    EXPECT_EQ(*dec, md);
    EXPECT_EQ(EncodeMetadata(*dec), enc);
    std::vector<WriteResult> results = {
        WriteResult{md.storage_data.begin()->first, 4096, md.storage_data.begin()->second}};
    auto dr = internal::DecodeWriteResults(internal::EncodeWriteResults(results));
    ASSERT_TRUE(dr.ok()) << dr.status().ToString();
    ASSERT_EQ(dr->size(), 1u);
    EXPECT_EQ((*dr)[0].storage_data, results[0].storage_data);
  }
}

// A number where an inline block CRC table belongs is an error naming it.
TEST(MetadataCodec, NumberForBlockCrcTableIsRejected) {
  Metadata md = LongCrcMetadata(true);
  std::string enc = EncodeMetadata(md);
  const std::string hex = HexOf(md.storage_data.begin()->second.block_crc32);
  const size_t at = enc.find("\"" + hex + "\"");
  ASSERT_NE(at, std::string::npos);
  enc.replace(at, hex.size() + 2, "0");
  const size_t pos = enc.rfind(",\"content_crc32\"");
  enc = enc.substr(0, pos) + "}";  // no content CRC: the structure check must catch it
  auto dec = DecodeMetadata(enc);
  ASSERT_FALSE(dec.ok());
  EXPECT_EQ(dec.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(dec.status().message().find("block_crc32"), std::string::npos)
      << dec.status().message();
}

// relative_path names a file inside the checkpoint folder, nothing else.
TEST(MetadataCodec, RejectsFileNamesOutsideTheFolder) {
  for (const std::string name : {"../../outside/evil.mega", "/etc/passwd", "a/../../b", ""}) {
    Metadata md = SampleMetadata();
    md.storage_data[MetadataIndex("blob")].relative_path = name;
    auto r = DecodeMetadata(EncodeMetadata(md));
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("relative_path"), std::string::npos)
        << r.status().message();
  }
}

TEST(MetadataCodec, DuplicateEntriesRejected) {
  Metadata md = SampleMetadata();
  std::string enc = EncodeMetadata(md);
  // Duplicate the "blob" entry in state_dict_metadata.
  std::string entry = "{\"fqn\":\"blob\",\"type\":\"bytes\"}";
  size_t pos = enc.find(entry);
  ASSERT_NE(pos, std::string::npos);
  enc.insert(pos, entry + ",");
  auto r = DecodeMetadata(enc);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate fqn"), std::string::npos);
}

TEST(PlanCodec, SavePlanRoundTrip) {
  SavePlan p;
  WriteItem t;
  t.index = MetadataIndex("w", Shape{2, 0}, 1);
  t.type = WriteItemType::kShard;
  t.tensor_data =
      TensorWriteData{ChunkStorageMetadata{{2, 0}, {2, 6}}, {DType::kF32, false}, {4, 6}};
  WriteItem b;
  b.index = MetadataIndex("blob");
  b.type = WriteItemType::kByteIO;
  b.bytes_size = 77;
  p.items = {t, b};
  p.storage_data = "__abc_1_";
  p.planner_data.object_paths["x.0"] = {PathKey{std::string("x")}, PathKey{int64_t{0}}};
  auto dec = internal::DecodeSavePlan(internal::EncodeSavePlan(p));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(*dec, p);
  EXPECT_FALSE(internal::DecodeSavePlan("{}").ok());
  EXPECT_FALSE(internal::DecodeSavePlan(internal::EncodeLoadPlan(LoadPlan{})).ok());
}

TEST(PlanCodec, LoadPlanAndResultsRoundTrip) {
  LoadPlan p;
  ReadItem r;
  r.type = LoadItemType::kTensor;
  r.dest_index = MetadataIndex("w", Shape{0, 3});
  r.dest_offsets = {1, 0};
  r.storage_index = MetadataIndex("w", Shape{0, 0}, 0);
  r.storage_offsets = {1, 3};
  r.lengths = {1, 3};
  p.items = {r};
  auto dec = internal::DecodeLoadPlan(internal::EncodeLoadPlan(p));
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(*dec, p);

  std::vector<WriteResult> results = {WriteResult{
      MetadataIndex("w", Shape{0, 0}), 48, StorageInfo{"a", 0, 48, "crc32:00000000", 0, {}, ""}}};
  auto dr = internal::DecodeWriteResults(internal::EncodeWriteResults(results));
  ASSERT_TRUE(dr.ok()) << dr.status().ToString();
  EXPECT_EQ(*dr, results);
}

TEST(PlanCodec, Envelope) {
  auto ok = internal::DecodeEnvelope(internal::EncodeEnvelope(Status::OK(), "payload"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, "payload");
  Status err = NotFoundError("rank 1: gone");
  auto bad = internal::DecodeEnvelope(internal::EncodeEnvelope(err, ""));
  EXPECT_EQ(bad.status(), err);
  EXPECT_EQ(internal::DecodeEnvelope("").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(internal::DecodeEnvelope("Ex").status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace megackpt::dcp
