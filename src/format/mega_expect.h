// Checks of a parsed MEGA file against its .expect.json, shared by the two
// known-answer tests (mega_golden_test: files of an independent Python
// writer; mega_reference_test: files of the existing MEGA tooling).
// Header-only; tests only.
#ifndef MEGACKPT_FORMAT_MEGA_EXPECT_H_
#define MEGACKPT_FORMAT_MEGA_EXPECT_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/mega_test_util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/dtype.h"
#include "megackpt/format/mega.h"

namespace megackpt::mega_test {

// Reads `base`.expect.json into *want and `base`.mega into *bytes, whose size
// and SHA-256 must be the expectation's file_size and file_sha256 (a wrong size
// is a fatal failure).
inline void ReadExpectation(const std::string& base, nlohmann::json* want, std::string* bytes) {
  *want = nlohmann::json::parse(FileBytes(base + ".expect.json"));
  *bytes = FileBytes(base + ".mega");
  ASSERT_EQ(bytes->size(), want->at("file_size").get<uint64_t>());
  EXPECT_EQ(ToHex(Sha256Of(AsBytes(*bytes))), want->at("file_sha256").get<std::string>());
}

// The known-answer test of `base`.mega: ReadExpectation, then the file opened
// with pread and with mmap; for each reader the header fields every
// expectation gives (header_length, payload_end, alignment) are compared, then
// `check` runs with the expectation and the file's bytes. A reader that does
// not open is a fatal failure.
using ExpectationCheck = std::function<void(const format::MegaReader& r, bool mmap,
                                            const nlohmann::json& want, const std::string& bytes)>;
inline void CheckEveryReadMode(const std::string& base, const ExpectationCheck& check) {
  nlohmann::json want;
  std::string bytes;
  ASSERT_NO_FATAL_FAILURE(ReadExpectation(base, &want, &bytes));
  for (bool mmap : {false, true}) {
    SCOPED_TRACE(mmap ? "mmap" : "pread");
    format::MegaReaderOptions o;
    o.use_mmap = mmap;
    auto r = format::MegaReader::OpenFile(base + ".mega", o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->header_length(), want.at("header_length").get<uint64_t>());
    EXPECT_EQ((*r)->payload_end(), want.at("payload_end").get<uint64_t>());
    EXPECT_EQ((*r)->alignment(), want.at("alignment").get<uint64_t>());
    check(**r, mmap, want, bytes);
  }
}

// check(got[i], want[i]) for each element of `got`, after asserting that
// `want` (a JSON array) has as many.
template <typename T, typename Check>
void ExpectEach(const std::vector<T>& got, const nlohmann::json& want, Check check) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) check(got[i], want[i]);
}

// One metadata value against {"type": ..., "value": ...}: floats (and arrays of
// floats) to double precision, everything else exactly.
inline void ExpectMetaValue(const std::string& key, const format::MetaValue& v,
                            const nlohmann::json& want) {
  using nlohmann::json;
  SCOPED_TRACE("metadata key " + key);
  EXPECT_EQ(std::string(format::MetaTypeName(v.type())), want.at("type").get<std::string>());
  json got = json::parse(v.ToJson());
  const json& value = want.at("value");
  if (value.is_number_float()) {
    EXPECT_DOUBLE_EQ(got.get<double>(), value.get<double>());
  } else if (value.is_array() && !value.empty() && value[0].is_number_float()) {
    ASSERT_EQ(got.size(), value.size());
    for (size_t k = 0; k < value.size(); ++k) {
      EXPECT_DOUBLE_EQ(got[k].get<double>(), value[k].get<double>());
    }
  } else {
    EXPECT_EQ(got, value);
  }
}

// The entries of `md`: exactly the keys of `order`, in that order, each valued
// as `values[key]` says.
inline void ExpectMetadata(const format::MegaMetadata& md, const nlohmann::json& values,
                           const nlohmann::json& order) {
  ASSERT_EQ(md.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const format::MetaEntry& e = md.entries()[i];
    EXPECT_EQ(e.key, order[i].get<std::string>());
    ExpectMetaValue(e.key, e.value, values.at(e.key));
  }
}

// The directory fields of tensor `t` that every expectation `w` gives.
inline void ExpectTensorFields(const format::MegaTensorInfo& t, const nlohmann::json& w) {
  EXPECT_EQ(t.name, w.at("name").get<std::string>());
  EXPECT_EQ(std::string(DTypeName(t.dtype)), w.at("dtype").get<std::string>());
  EXPECT_EQ(t.shape, w.at("shape").get<std::vector<int64_t>>());
  EXPECT_EQ(std::string(format::MegaStorageFormatName(t.storage_format)),
            w.at("storage_format").get<std::string>());
  EXPECT_EQ(t.payload_offset, w.at("payload_offset").get<uint64_t>());
  EXPECT_EQ(t.logical_nbytes, w.at("logical_nbytes").get<uint64_t>());
  EXPECT_EQ(t.stored_nbytes, w.at("stored_nbytes").get<uint64_t>());
  EXPECT_EQ(t.tensor_flags, w.at("flags").get<uint32_t>());
  EXPECT_EQ(static_cast<uint32_t>(t.codec), w.at("codec").get<uint32_t>());
  EXPECT_EQ(t.shuffle_elem_size, w.at("shuffle_elem_size").get<uint32_t>());
  EXPECT_EQ(static_cast<uint32_t>(t.checksum_type), w.at("checksum_type").get<uint32_t>());
  EXPECT_EQ(ToHex(t.checksum), w.at("checksum_hex").get<std::string>());
  EXPECT_EQ(t.dir_flags, w.at("dir_flags").get<uint32_t>());
}

// The footer-overlay fields that every expectation `fo` gives.
inline void ExpectOverlayFields(const format::MegaFooterOverlayInfo& ov, const nlohmann::json& fo) {
  EXPECT_EQ(ov.present, fo.at("present").get<bool>());
  EXPECT_EQ(ov.generation, fo.at("generation").get<uint64_t>());
  EXPECT_EQ(ov.overlay_offset, fo.at("overlay_offset").get<uint64_t>());
  EXPECT_EQ(ov.overlay_size, fo.at("overlay_size").get<uint64_t>());
  EXPECT_EQ(ov.base_size, fo.at("base_size").get<uint64_t>());
}

}  // namespace megackpt::mega_test

#endif  // MEGACKPT_FORMAT_MEGA_EXPECT_H_
