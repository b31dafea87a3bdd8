// Known answers: the reference MEGA files in tests/testdata/mega-reference/
// (written by the existing MEGA tooling) parse to every field of their
// .expect.json, and our writer reproduces their bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/mega_internal.h"
#include "megackpt/core/checksum.h"
#include "megackpt/format/mega.h"
#include "megackpt/core/memory_file.h"

namespace megackpt::format {
namespace {

using nlohmann::json;

std::string RefDir() { return std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/mega-reference/"; }

std::string ReadAll(const std::string& path) {
  auto r = ReadLocalFile(path);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::string();
}

std::span<const std::byte> Bytes(const std::string& s) { return AsBytes(s); }

// Compares one metadata value with the expectation {"type": ..., "value": ...}.
void ExpectMetaValue(const std::string& key, const MetaValue& v, const json& want) {
  SCOPED_TRACE("metadata key " + key);
  EXPECT_EQ(std::string(MetaTypeName(v.type())), want.at("type").get<std::string>());
  json got = json::parse(v.ToJson());
  const json& value = want.at("value");
  if (value.is_number_float()) {
    EXPECT_DOUBLE_EQ(got.get<double>(), value.get<double>());
  } else {
    EXPECT_EQ(got, value);
  }
}

class MegaReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MegaReferenceTest, ParsesEveryExpectedField) {
  const std::string base = RefDir() + GetParam();
  const json want = json::parse(ReadAll(base + ".expect.json"));
  const std::string bytes = ReadAll(base + ".mega");
  ASSERT_EQ(bytes.size(), want.at("file_size").get<uint64_t>());
  EXPECT_EQ(ToHex(Sha256Of(Bytes(bytes))), want.at("file_sha256").get<std::string>());

  for (bool mmap : {false, true}) {
    SCOPED_TRACE(mmap ? "mmap" : "pread");
    MegaReaderOptions opts;
    opts.use_mmap = mmap;
    auto reader_or = MegaReader::OpenFile(base + ".mega", opts);
    ASSERT_EQ(reader_or.ok(), want.at("parse_ok").get<bool>()) << reader_or.status().ToString();
    const MegaReader& r = **reader_or;
    EXPECT_EQ(r.version(), want.at("version").get<uint32_t>());
    EXPECT_EQ(r.header_length(), want.at("header_length").get<uint64_t>());
    EXPECT_EQ(r.payload_end(), want.at("payload_end").get<uint64_t>());
    EXPECT_EQ(r.alignment(), want.at("alignment").get<uint64_t>());

    // Metadata: same keys, same order, same types and values.
    const auto& order = want.at("metadata_key_order");
    ASSERT_EQ(r.metadata().size(), order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      const MetaEntry& e = r.metadata().entries()[i];
      EXPECT_EQ(e.key, order[i].get<std::string>());
      ExpectMetaValue(e.key, e.value, want.at("metadata").at(e.key));
    }
    EXPECT_EQ(r.header_metadata().size(), order.size());

    // Tensors.
    const auto& wt = want.at("tensors");
    ASSERT_EQ(r.tensors().size(), wt.size());
    for (size_t i = 0; i < wt.size(); ++i) {
      const json& w = wt[i];
      const MegaTensorInfo& t = r.tensors()[i];
      SCOPED_TRACE("tensor " + t.name);
      EXPECT_EQ(t.tensor_id, w.at("tensor_id").get<uint32_t>());
      EXPECT_EQ(t.name, w.at("name").get<std::string>());
      EXPECT_EQ(std::string(DTypeName(t.dtype)), w.at("dtype").get<std::string>());
      EXPECT_EQ(t.shape, w.at("shape").get<std::vector<int64_t>>());
      EXPECT_EQ(std::string(MegaStorageFormatName(t.storage_format)),
                w.at("storage_format").get<std::string>());
      EXPECT_EQ(t.payload_offset, w.at("payload_offset").get<uint64_t>());
      EXPECT_EQ(t.file_offset, r.header_length() + t.payload_offset);
      EXPECT_EQ(t.logical_nbytes, w.at("logical_nbytes").get<uint64_t>());
      EXPECT_EQ(t.stored_nbytes, w.at("stored_nbytes").get<uint64_t>());
      EXPECT_EQ(t.tensor_flags, w.at("flags").get<uint32_t>());
      EXPECT_EQ(static_cast<uint32_t>(t.codec), w.at("codec").get<uint32_t>());
      EXPECT_EQ(std::string(MegaCodecName(t.codec)), w.at("codec_name").get<std::string>());
      EXPECT_EQ(t.shuffle_elem_size, w.at("shuffle_elem_size").get<uint32_t>());
      EXPECT_EQ(static_cast<uint32_t>(t.checksum_type), w.at("checksum_type").get<uint32_t>());
      EXPECT_EQ(std::string(MegaChecksumTypeName(t.checksum_type)),
                w.at("checksum_type_name").get<std::string>());
      EXPECT_EQ(ToHex(t.checksum), w.at("checksum_hex").get<std::string>());
      EXPECT_EQ(t.dir_flags, w.at("dir_flags").get<uint32_t>());
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
    }
    EXPECT_TRUE(r.VerifyAll().ok());
    EXPECT_EQ(r.segments().size(), want.at("segments").size());
    EXPECT_EQ(r.moe_experts().size(), want.at("moe_experts").size());
    const json& fo = want.at("footer_overlay");
    EXPECT_EQ(r.footer_overlay().present, fo.at("present").get<bool>());
    EXPECT_EQ(r.footer_overlay().generation, fo.at("generation").get<uint64_t>());
    EXPECT_EQ(r.footer_overlay().overlay_offset, fo.at("overlay_offset").get<uint64_t>());
    EXPECT_EQ(r.footer_overlay().overlay_size, fo.at("overlay_size").get<uint64_t>());
    EXPECT_EQ(r.footer_overlay().base_size, fo.at("base_size").get<uint64_t>());
    EXPECT_EQ(r.footer_overlay().metadata.size(), fo.at("metadata").size());

    // Whole-payload hashes.
    auto payload = Bytes(bytes).subspan(r.header_length(), r.payload_end() - r.header_length());
    EXPECT_EQ(Crc32(payload), want.at("payload_crc32").get<uint32_t>());
    char hex[9];
    std::snprintf(hex, sizeof(hex), "%08x", Crc32(payload));
    EXPECT_EQ(std::string(hex), want.at("payload_crc32_hex").get<std::string>());
    EXPECT_EQ(ToHex(Sha256Of(payload)), want.at("payload_sha256").get<std::string>());
  }
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
  for (const MegaTensorInfo& t : r.tensors()) {
    auto loaded = r.LoadTensor(t.name);
    EXPECT_TRUE(loaded.ok());
    keep.push_back(*loaded);
    MegaTensorWriteOptions to;
    to.checksum = t.checksum_type;
    EXPECT_TRUE(w.AddTensor(t.name, keep.back(), to).ok());
  }
  MemoryWritableFile out("rewrite.mega", /*supports_write_at=*/!sequential);
  auto res = w.Finish(out);
  EXPECT_TRUE(res.ok()) << res.status().ToString();
  return out.contents();
}

TEST_P(MegaReferenceTest, WriterReproducesReferenceBytes) {
  const std::string base = RefDir() + GetParam();
  const std::string bytes = ReadAll(base + ".mega");
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
  const std::string bytes = ReadAll(base + ".mega");
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
  for (const MegaTensorInfo& t : (*r)->tensors()) {
    keep.push_back(*(*r)->LoadTensor(t.name));
    MegaTensorWriteOptions to;
    to.checksum = t.checksum_type;
    ASSERT_TRUE(w.AddTensor(t.name, keep.back(), to).ok());
  }
  MemoryWritableFile out("g07.rewrite.mega");
  ASSERT_TRUE(w.Finish(out).ok());
  EXPECT_EQ(out.contents(), bytes);
}

INSTANTIATE_TEST_SUITE_P(Files, MegaReferenceTest,
                         ::testing::Values("g01_single_f32", "g02_all_dtypes", "g07_checksums",
                                           "g08_zstd"));

}  // namespace
}  // namespace megackpt::format
