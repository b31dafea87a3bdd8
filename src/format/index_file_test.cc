#include "megackpt/format/index_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "format/mega_test_util.h"
#include "megackpt/core/file.h"

namespace megackpt::format {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using TempFolder = mega_test::TempDir;

constexpr const char* kHfIndex = R"({
  "metadata": {"total_size": 16060522496, "format": "pt", "nested": {"a": [1, 2]}},
  "weight_map": {
    "lm_head.weight": "model-00002-of-00002.safetensors",
    "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
    "model.norm.weight": "model-00002-of-00002.safetensors"
  },
  "shards": {"model-00001-of-00002.safetensors": "/abs/elsewhere"}
})";

TEST(IndexFileTest, ParsesHuggingFaceStyleIndexAndKeepsExtras) {
  auto index = ParseShardIndex("model.safetensors.index.json", kHfIndex);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 16060522496u);
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->weight_map.at("lm_head.weight"), "model-00002-of-00002.safetensors");
  EXPECT_THAT(index->ShardFiles(),
              ElementsAre("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"));
  EXPECT_THAT(index->TensorsInShard("model-00002-of-00002.safetensors"),
              ElementsAre("lm_head.weight", "model.norm.weight"));
  EXPECT_EQ(index->extra_metadata.at("format"), "\"pt\"");
  EXPECT_EQ(index->extra_metadata.at("nested"), R"({"a":[1,2]})");
  EXPECT_TRUE(index->extra_fields.count("shards"));
}

TEST(IndexFileTest, SerializeRoundTripsAndPreservesUnknownKeys) {
  auto index = *ParseShardIndex("a.json", kHfIndex);
  index.weight_map["new.tensor"] = "model-00001-of-00002.safetensors";
  index.total_size = 42;
  auto text = SerializeShardIndex(index);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->back(), '\n');
  auto again = ParseShardIndex("b.json", *text);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->total_size, 42u);
  EXPECT_EQ(again->weight_map, index.weight_map);
  EXPECT_EQ(again->extra_metadata, index.extra_metadata);
  EXPECT_EQ(again->extra_fields, index.extra_fields);
  // transformers' layout: 2-space indent, sorted keys.
  auto doc = nlohmann::json::parse(*text);
  EXPECT_EQ(doc["metadata"]["total_size"], 42);
  EXPECT_THAT(*text, HasSubstr("{\n  \"metadata\": {\n"));
  EXPECT_LT(text->find("\"metadata\""), text->find("\"weight_map\""));
}

TEST(IndexFileTest, ExactSerializationOfMinimalIndex) {
  ShardIndex index;
  index.total_size = 8;
  index.weight_map = {{"b", "model.safetensors"}, {"a", "model.safetensors"}};
  EXPECT_EQ(*SerializeShardIndex(index),
            "{\n  \"metadata\": {\n    \"total_size\": 8\n  },\n  \"weight_map\": {\n"
            "    \"a\": \"model.safetensors\",\n    \"b\": \"model.safetensors\"\n  }\n}\n");
}

TEST(IndexFileTest, MissingMetadataAndIntegralFloatTotalSizeAreTolerated) {
  auto a = ParseShardIndex("x.json", R"({"weight_map": {}})");
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->total_size.has_value());
  auto b = ParseShardIndex("x.json", R"({"metadata": {"total_size": 12.0}, "weight_map": {}})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->total_size, 12u);
}

TEST(IndexFileTest, KindFromPath) {
  EXPECT_EQ(IndexKindFromPath("/a/model.mega.index.json"), IndexKind::kMega);
  EXPECT_EQ(IndexKindFromPath("model.safetensors.index.json"), IndexKind::kSafetensors);
  EXPECT_EQ(IndexKindFromPath("x.mega.index.json"), IndexKind::kMega);
  EXPECT_EQ(IndexKindFromPath("model.index.json"), std::nullopt);
  EXPECT_EQ(IndexKindFromPath("model.safetensors"), std::nullopt);
}

TEST(IndexFileTest, MegatensorsFields) {
  ShardIndex index;
  index.total_size = 3;
  index.weight_map = {{"a", "model-00001-of-00002.mega"}, {"b", "model-00002-of-00002.mega"}};
  AddMegatensorsFields(&index);
  auto doc = nlohmann::json::parse(*SerializeShardIndex(index));
  EXPECT_EQ(doc["metadata"]["format"], "mega-sharded-index-v1");
  EXPECT_EQ(doc["shards"]["model-00002-of-00002.mega"], "model-00002-of-00002.mega");
  EXPECT_EQ(doc["shards"].size(), 2u);
}

TEST(IndexFileTest, ShardNameValidation) {
  EXPECT_TRUE(ValidateShardFileName("model.safetensors").ok());
  EXPECT_TRUE(ValidateShardFileName("sub/model-00001-of-00002.mega").ok());
  EXPECT_TRUE(ValidateShardFileName("a..b.mega").ok());
  for (std::string bad :
       std::vector<std::string>{"", "/etc/passwd", "../x.mega", "a/../../x", "a/..", "a//b", "a/",
                                "a\\b", std::string("a\0b", 3), "a\nb", "\xff.mega", "./a"}) {
    Status s = ValidateShardFileName(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
}

#define LONG_NAME_30 "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
#define LONG_NAME_300                                                                        \
  LONG_NAME_30 LONG_NAME_30 LONG_NAME_30 LONG_NAME_30 LONG_NAME_30 LONG_NAME_30 LONG_NAME_30 \
      LONG_NAME_30 LONG_NAME_30 LONG_NAME_30

struct BadIndex {
  const char* name;
  const char* text;
  const char* want;
};

void PrintTo(const BadIndex& c, std::ostream* os) { *os << c.name; }

class IndexMalformedTest : public ::testing::TestWithParam<BadIndex> {};

TEST_P(IndexMalformedTest, IsDataLossNamingFileAndKey) {
  auto r = ParseShardIndex("dir/model.mega.index.json", GetParam().text);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr("dir/model.mega.index.json"));
  EXPECT_THAT(r.status().message(), HasSubstr(GetParam().want));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, IndexMalformedTest,
    ::testing::Values(
        BadIndex{"InvalidJson", R"({"weight_map": {)", "not valid JSON"},
        BadIndex{"Empty", "", "not valid JSON"},
        BadIndex{"RootNotObject", "[1]", "root is not a JSON object"},
        BadIndex{"MetadataNotObject", R"({"metadata": 3, "weight_map": {}})",
                 "\"metadata\" is not a JSON object"},
        BadIndex{"NegativeTotalSize", R"({"metadata": {"total_size": -1}, "weight_map": {}})",
                 "total_size\" is not a non-negative integer"},
        BadIndex{"StringTotalSize", R"({"metadata": {"total_size": "12"}, "weight_map": {}})",
                 "total_size"},
        BadIndex{"FractionalTotalSize", R"({"metadata": {"total_size": 1.5}, "weight_map": {}})",
                 "total_size"},
        BadIndex{"MissingWeightMap", R"({"metadata": {"total_size": 1}})", "no \"weight_map\""},
        BadIndex{"WeightMapNotObject", R"({"weight_map": ["a"]})",
                 "\"weight_map\" is not a JSON object"},
        BadIndex{"ShardNotString", R"({"weight_map": {"w": 1}})",
                 "entry for tensor 'w' is not a string"},
        BadIndex{"AbsoluteShard", R"({"weight_map": {"w": "/etc/x.mega"}})",
                 "tensor 'w': shard file name '/etc/x.mega' is an absolute path"},
        BadIndex{"DotDotShard", R"({"weight_map": {"w": "../x.mega"}})", "leaves the index folder"},
        BadIndex{"EmptyShard", R"({"weight_map": {"w": ""}})", "is empty"},
        BadIndex{"DuplicateTensor", R"({"weight_map": {"w": "a.mega", "w": "b.mega"}})",
                 "duplicate key 'w'"},
        BadIndex{"DuplicateTopLevel", R"({"weight_map": {}, "weight_map": {}})",
                 "duplicate key 'weight_map'"},
        // Names the reader would open: the core rule set (core/path_safety.h).
        BadIndex{"ControlByteShard", R"({"weight_map": {"w": "a\u001b[31m.mega"}})",
                 "control byte"},
        BadIndex{"DotComponentShard", R"({"weight_map": {"w": "./a.mega"}})", "'.' component"},
        BadIndex{"LongComponentShard", "{\"weight_map\": {\"w\": \"" LONG_NAME_300 ".mega\"}}",
                 "longer than 255"},
        BadIndex{"NulTensorName", R"({"weight_map": {"a\u0000b": "a.mega"}})",
                 "'a\\x00b' that holds a NUL byte"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(IndexFileTest, SerializeRejectsUnsafeNamesAndBadExtraJson) {
  ShardIndex index;
  index.weight_map["w"] = "../escape.mega";
  EXPECT_EQ(SerializeShardIndex(index).status().code(), StatusCode::kInvalidArgument);
  index.weight_map["w"] = "ok.mega";
  index.extra_metadata["x"] = "{not json";
  EXPECT_EQ(SerializeShardIndex(index).status().code(), StatusCode::kInvalidArgument);
  index.extra_metadata.clear();
  index.extra_fields["weight_map"] = "{}";
  EXPECT_EQ(SerializeShardIndex(index).status().code(), StatusCode::kInvalidArgument);
}

TEST(IndexFileTest, WriteReadLocalFileAtomically) {
  TempFolder dir;
  const std::string path = dir.File("model.mega.index.json");
  ShardIndex index;
  index.total_size = 10;
  index.weight_map = {{"a", "model.mega"}};
  ASSERT_TRUE(WriteShardIndexFile(path, index).ok());
  auto back = ReadShardIndexFile(path);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->weight_map, index.weight_map);
  index.total_size = 11;
  ASSERT_TRUE(WriteShardIndexFile(path, index).ok());
  EXPECT_EQ(ReadShardIndexFile(path)->total_size, 11u);
  // No temp files left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
  // Missing file / folder.
  EXPECT_EQ(ReadShardIndexFile(dir.File("none.json")).status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(WriteShardIndexFile(dir.File("no/such/dir/x.json"), index).ok());
}

TEST(IndexFileTest, ConcurrentReadersNeverSeeAPartialIndex) {
  TempFolder dir;
  const std::string path = dir.File("model.safetensors.index.json");
  ShardIndex small, big;
  small.total_size = 1;
  small.weight_map = {{"a", "s.safetensors"}};
  big.total_size = 2;
  for (int i = 0; i < 2000; ++i) big.weight_map["tensor." + std::to_string(i)] = "b.safetensors";
  ASSERT_TRUE(WriteShardIndexFile(path, small, false).ok());
  std::atomic<bool> done{false};
  std::atomic<int> bad{0}, reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      auto r = ReadShardIndexFile(path);
      if (!r.ok() || (r->weight_map.size() != 1 && r->weight_map.size() != 2000)) ++bad;
      ++reads;
    }
  });
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(WriteShardIndexFile(path, i % 2 ? small : big, /*sync=*/false).ok());
  }
  done = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace megackpt::format
