// Known answers: the reference MEGA files in tests/testdata/mega-reference/
// (written by the existing MEGA tooling) parse to every field of their
// .expect.json, and our writer reproduces their bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/mega_expect.h"
#include "format/mega_internal.h"
#include "format/mega_test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/memory_file.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {
namespace {

using nlohmann::json;

std::string RefDir() {
  return std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/mega-reference/";
}

std::span<const std::byte> Bytes(const std::string& s) { return AsBytes(s); }

class MegaReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MegaReferenceTest, ParsesEveryExpectedField) {
  mega_test::CheckEveryReadMode(RefDir() + GetParam(), [](const MegaReader& r, bool mmap,
                                                          const json& want,
                                                          const std::string& bytes) {
    EXPECT_TRUE(want.at("parse_ok").get<bool>());  // every reference file parses
    EXPECT_EQ(r.version(), want.at("version").get<uint32_t>());

    // Metadata: same keys, same order, same types and values.
    const auto& order = want.at("metadata_key_order");
    mega_test::ExpectMetadata(r.metadata(), want.at("metadata"), order);
    EXPECT_EQ(r.header_metadata().size(), order.size());

    // Tensors.
    mega_test::ExpectEach(
        r.tensors(), want.at("tensors"), [&](const MegaTensorInfo& t, const json& w) {
          SCOPED_TRACE("tensor " + t.name);
          mega_test::ExpectTensorFields(t, w);
          EXPECT_EQ(t.tensor_id, w.at("tensor_id").get<uint32_t>());
          EXPECT_EQ(t.file_offset, r.header_length() + t.payload_offset);
          EXPECT_EQ(std::string(MegaCodecName(t.codec)), w.at("codec_name").get<std::string>());
          EXPECT_EQ(std::string(MegaChecksumTypeName(t.checksum_type)),
                    w.at("checksum_type_name").get<std::string>());
          EXPECT_EQ(t.dir_flags, mega_internal::DirFlagsFor(t));
          EXPECT_EQ(t.chunks.size(), w.at("chunks").size());
          if (w.contains("crc32_value_hex")) {
            EXPECT_EQ(t.checksum_hex(), w.at("crc32_value_hex").get<std::string>());
          }
          // Decoded bytes.
          auto loaded = r.LoadTensor(t.name);
          ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
          EXPECT_EQ(loaded->nbytes(), w.at("decoded_nbytes").get<uint64_t>());
          EXPECT_EQ(ToHex(Sha256Of(loaded->Bytes())), w.at("decoded_sha256").get<std::string>());
          EXPECT_TRUE(r.VerifyTensor(t.name).ok());
          if (t.is_plain() && mmap) {
            auto mapped = r.MappedTensor(t.name);
            ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
            EXPECT_TRUE(TensorBytesEqual(*mapped, *loaded));
          }
        });
    EXPECT_TRUE(r.VerifyAll().ok());
    EXPECT_EQ(r.segments().size(), want.at("segments").size());
    EXPECT_EQ(r.moe_experts().size(), want.at("moe_experts").size());
    const json& fo = want.at("footer_overlay");
    mega_test::ExpectOverlayFields(r.footer_overlay(), fo);
    EXPECT_EQ(r.footer_overlay().metadata.size(), fo.at("metadata").size());

    // Whole-payload hashes.
    auto payload = Bytes(bytes).subspan(r.header_length(), r.payload_end() - r.header_length());
    EXPECT_EQ(Crc32(payload), want.at("payload_crc32").get<uint32_t>());
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", Crc32(payload));
    EXPECT_EQ(std::string(hex), want.at("payload_crc32_hex").get<std::string>());
    EXPECT_EQ(ToHex(Sha256Of(payload)), want.at("payload_sha256").get<std::string>());
  });
}

// Writes the reference file's tensors and metadata again with the bare profile
// and the per-tensor choices the reference made; returns the bytes.
std::string Rewrite(const MegaReader& r, const MegaWriterOptions& base_options, bool sequential) {
  MegaWriterOptions o = base_options;
  o.profile = MegaProfile::kBare;
  o.alignment = r.alignment();
  MegaWriter w(o);
  for (const MetaEntry& e : r.header_metadata().entries()) {
    EXPECT_TRUE(w.AddMetadata(e.key, e.value).ok()) << e.key;
  }
  std::vector<Tensor> keep;
  mega_test::AddTensorsOf(r, w, &keep, /*same_checksums=*/true);
  return mega_test::WriteToMemory(w, sequential);
}

TEST_P(MegaReferenceTest, WriterReproducesReferenceBytes) {
  const std::string base = RefDir() + GetParam();
  const std::string bytes = mega_test::FileBytes(base + ".mega");
  auto r = MegaReader::OpenFile(base + ".mega");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  MegaWriterOptions o;
  if (GetParam() == "g08_zstd") {
    // "encode_file_tensors(codec=ZSTD, level=3, min_ratio=0.98)".
    o.compression = MegaCodec::kZstd;
    o.zstd_level = 3;
    o.min_ratio = 0.98;
  }
  for (bool sequential : {false, true}) {
    SCOPED_TRACE(sequential ? "sequential sink" : "positioned sink");
    std::string ours = Rewrite(**r, o, sequential);
    ASSERT_EQ(ours.size(), bytes.size());
    size_t first_diff = 0;
    while (first_diff < ours.size() && ours[first_diff] == bytes[first_diff]) ++first_diff;
    EXPECT_EQ(first_diff, ours.size()) << "first differing byte at offset " << first_diff;
  }
}

// g07 carries mega.hash.payload.*: the payload_hashes option recomputes them.
TEST(MegaReferenceRewriteTest, PayloadHashesOptionReproducesG07) {
  const std::string base = RefDir() + "g07_checksums";
  const std::string bytes = mega_test::FileBytes(base + ".mega");
  auto r = MegaReader::OpenFile(base + ".mega");
  ASSERT_TRUE(r.ok());
  MegaWriterOptions o;
  o.profile = MegaProfile::kBare;
  o.alignment = (*r)->alignment();
  o.payload_hashes = true;
  MegaWriter w(o);
  for (const MetaEntry& e : (*r)->header_metadata().entries()) {
    if (e.key.starts_with("mega.hash.payload.")) continue;
    ASSERT_TRUE(w.AddMetadata(e.key, e.value).ok());
  }
  std::vector<Tensor> keep;
  ASSERT_NO_FATAL_FAILURE(mega_test::AddTensorsOf(**r, w, &keep, /*same_checksums=*/true));
  MemoryWritableFile out("g07.rewrite.mega");
  ASSERT_TRUE(w.Finish(out).ok());
  EXPECT_EQ(out.contents(), bytes);
}

INSTANTIATE_TEST_SUITE_P(Files, MegaReferenceTest,
                         ::testing::Values("g01_single_f32", "g02_all_dtypes", "g07_checksums",
                                           "g08_zstd"));

}  // namespace
}  // namespace megackpt::format
