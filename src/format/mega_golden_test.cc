// Golden files from tests/testdata/mega/make_golden.py (an independent Python
// writer): the reader reproduces every field of each .expect.json, and for the
// TensorPlay profile our writer reproduces the Python writer's bytes.
#include <gtest/gtest.h>

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

std::string GoldenDir() { return std::string(MEGACKPT_SOURCE_DIR) + "/tests/testdata/mega/"; }

using mega_test::ExpectMetadata;

class MegaGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MegaGoldenTest, ParsesEveryExpectedField) {
  mega_test::CheckEveryReadMode(GoldenDir() + GetParam(), [](const MegaReader& r, bool,
                                                             const json& want, const std::string&) {
    ExpectMetadata(r.metadata(), want.at("metadata"), want.at("metadata_key_order"));
    ExpectMetadata(r.header_metadata(), want.at("header_metadata"),
                   want.at("header_metadata_key_order"));

    mega_test::ExpectEach(
        r.tensors(), want.at("tensors"), [&](const MegaTensorInfo& t, const json& w) {
          SCOPED_TRACE("tensor " + t.name);
          mega_test::ExpectTensorFields(t, w);
          const json& wc = w.at("chunks");
          ASSERT_EQ(t.chunks.size(), wc.size());
          for (size_t k = 0; k < wc.size(); ++k) {
            const MegaChunkInfo& c = t.chunks[k];
            EXPECT_EQ(c.tensor_id, wc[k].at("tensor_id").get<uint32_t>());
            EXPECT_EQ(c.chunk_id, wc[k].at("chunk_id").get<uint32_t>());
            EXPECT_EQ(c.logical_offset, wc[k].at("logical_offset").get<uint64_t>());
            EXPECT_EQ(c.logical_size, wc[k].at("logical_size").get<uint64_t>());
            EXPECT_EQ(c.payload_offset, wc[k].at("payload_offset").get<uint64_t>());
            EXPECT_EQ(c.file_offset, r.header_length() + c.payload_offset);
            EXPECT_EQ(c.stored_size, wc[k].at("stored_size").get<uint64_t>());
            EXPECT_EQ(static_cast<uint32_t>(c.codec), wc[k].at("codec").get<uint32_t>());
            EXPECT_EQ(c.flags, wc[k].at("flags").get<uint32_t>());
            EXPECT_EQ(static_cast<uint32_t>(c.checksum_type),
                      wc[k].at("checksum_type").get<uint32_t>());
            EXPECT_EQ(ToHex(c.checksum), wc[k].at("checksum_hex").get<std::string>());
          }
          auto loaded = r.LoadTensor(t.name);
          ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
          EXPECT_EQ(ToHex(Sha256Of(loaded->Bytes())), w.at("decoded_sha256").get<std::string>());
          EXPECT_TRUE(r.VerifyTensor(t.name).ok());
          // Every byte range decodes to the same bytes as the whole tensor (chunk
          // boundaries, shuffled chunks, compressed tensors).
          const uint64_t n = t.logical_nbytes;
          for (uint64_t a : {uint64_t{0}, n / 3, n / 2}) {
            for (uint64_t len : {uint64_t{1}, n / 4, n - a}) {
              if (a + len > n || len == 0) continue;
              std::vector<std::byte> part(len);
              ASSERT_TRUE(r.ReadRange(t.name, a, part).ok());
              EXPECT_EQ(0, std::memcmp(part.data(), loaded->Bytes().data() + a, len))
                  << a << "+" << len;
            }
          }
        });
    EXPECT_TRUE(r.VerifyAll().ok());

    mega_test::ExpectEach(r.segments(), want.at("segments"),
                          [](const MegaSegment& s, const json& w) {
                            EXPECT_EQ(s.segment_id, w.at("segment_id").get<uint32_t>());
                            EXPECT_EQ(s.kind, w.at("kind").get<uint32_t>());
                            EXPECT_EQ(s.priority, w.at("priority").get<uint32_t>());
                            EXPECT_EQ(s.flags, w.at("flags").get<uint32_t>());
                            EXPECT_EQ(s.layer_start, w.at("layer_start").get<uint32_t>());
                            EXPECT_EQ(s.layer_end, w.at("layer_end").get<uint32_t>());
                            EXPECT_EQ(s.expert_start, w.at("expert_start").get<uint32_t>());
                            EXPECT_EQ(s.expert_end, w.at("expert_end").get<uint32_t>());
                            EXPECT_EQ(s.payload_offset, w.at("payload_offset").get<uint64_t>());
                            EXPECT_EQ(s.payload_size, w.at("payload_size").get<uint64_t>());
                            EXPECT_EQ(s.first_tensor_id, w.at("first_tensor_id").get<uint32_t>());
                            EXPECT_EQ(s.tensor_count, w.at("tensor_count").get<uint32_t>());
                            EXPECT_EQ(s.prefetch_group, w.at("prefetch_group").get<uint32_t>());
                            EXPECT_EQ(s.device_hint, w.at("device_hint").get<uint32_t>());
                            EXPECT_EQ(s.cache_policy, w.at("cache_policy").get<uint32_t>());
                          });
    mega_test::ExpectEach(r.moe_experts(), want.at("moe_experts"),
                          [](const MegaMoeExpert& m, const json& w) {
                            EXPECT_EQ(m.tensor_id, w.at("tensor_id").get<uint32_t>());
                            EXPECT_EQ(m.layer_id, w.at("layer_id").get<uint32_t>());
                            EXPECT_EQ(m.expert_id, w.at("expert_id").get<uint32_t>());
                            EXPECT_EQ(m.expert_role, w.at("expert_role").get<uint32_t>());
                            EXPECT_EQ(m.segment_id, w.at("segment_id").get<uint32_t>());
                            EXPECT_EQ(m.prefetch_group, w.at("prefetch_group").get<uint32_t>());
                            EXPECT_EQ(m.cache_policy, w.at("cache_policy").get<uint32_t>());
                          });
    const json& fo = want.at("footer_overlay");
    const MegaFooterOverlayInfo& ov = r.footer_overlay();
    mega_test::ExpectOverlayFields(ov, fo);
    if (ov.present) {
      EXPECT_EQ(ToHex(ov.sha256), fo.at("checksum_hex").get<std::string>());
      ExpectMetadata(ov.metadata, fo.at("metadata"), fo.at("metadata_key_order"));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Files, MegaGoldenTest,
                         ::testing::Values("chunked", "shuffle", "overlay", "segments_moe",
                                           "tensorplay_dict"));

// Our writer's TensorPlay profile produces the Python writer's bytes.
TEST(MegaGoldenWriterTest, TensorPlayProfileMatchesIndependentWriter) {
  const std::string path = GoldenDir() + "tensorplay_dict.mega";
  const std::string want = mega_test::FileBytes(path);
  auto r = MegaReader::OpenFile(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (bool sequential : {false, true}) {
    MegaWriter w;  // defaults: TensorPlay profile, alignment 4096, CRC32, packed
    std::vector<Tensor> keep;
    ASSERT_NO_FATAL_FAILURE(mega_test::AddTensorsOf(**r, w, &keep));
    std::string got = mega_test::WriteToMemory(w, sequential);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want);
  }
}

// Our writer's chunk layout is what the Python writer describes: reading the
// golden's chunked tensors and writing them chunked at the same boundaries
// gives files our reader decodes identically.
TEST(MegaGoldenWriterTest, ChunkedRoundTripThroughWriter) {
  auto r = MegaReader::OpenFile(GoldenDir() + "chunked.mega");
  ASSERT_TRUE(r.ok());
  MegaWriterOptions o;
  o.chunk_bytes = 128;
  o.compression = MegaCodec::kZstd;
  o.byte_shuffle = true;
  o.min_ratio = 0.9;
  MegaWriter w(o);
  std::vector<Tensor> keep;
  ASSERT_NO_FATAL_FAILURE(mega_test::AddTensorsOf(**r, w, &keep));
  auto back = mega_test::OpenBytes("rt.mega", mega_test::WriteToMemory(w));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (size_t i = 0; i < keep.size(); ++i) {
    EXPECT_TRUE(TensorBytesEqual(*(*back)->LoadTensor((*r)->tensors()[i].name), keep[i]));
  }
  EXPECT_EQ((*back)->Find("w.chunked")->chunks.size(), 4u);
}

}  // namespace
}  // namespace megackpt::format
