#include "hub/ndjson.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace megackpt::hub {
namespace {

using ::testing::HasSubstr;

std::string Lines(std::initializer_list<std::string> lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

TEST(NdjsonCommitTest, ParsesEveryLineKind) {
  auto c = ParseNdjsonCommit(Lines({
      R"({"key":"header","value":{"summary":"s","description":"d","parentCommit":"0123456789ABCDEF0123456789abcdef01234567"}})",
      R"({"key":"deletedFile","value":{"path":"old.txt"}})",
      R"({"key":"deletedFolder","value":{"path":"logs/"}})",
      R"({"key":"file","value":{"content":"aGVsbG8=","path":"README.md","encoding":"base64"}})",
      R"({"key":"lfsFile","value":{"path":"w.bin","algo":"sha256","oid":"9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08","size":4}})",
  }));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->summary, "s");
  EXPECT_EQ(*c->parent_commit, "0123456789abcdef0123456789abcdef01234567");
  ASSERT_EQ(c->ops.size(), 4u);
  EXPECT_EQ(c->ops[1].path, "logs");
  EXPECT_EQ(c->ops[2].content, "hello");
  EXPECT_EQ(c->ops[3].oid, "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
  EXPECT_EQ(c->ops[3].size, 4u);
}

TEST(NdjsonCommitTest, OneErrorPerFailure) {
  auto err = [](const std::string& body) {
    auto c = ParseNdjsonCommit(body);
    EXPECT_FALSE(c.ok()) << body;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    return c.status().message();
  };
  const std::string h = R"({"key":"header","value":{"summary":"x"}})";
  EXPECT_THAT(err(""), HasSubstr("no header"));
  EXPECT_THAT(err("{"), HasSubstr("line 1: not valid JSON"));
  EXPECT_THAT(err("[1]\n"), HasSubstr("not a JSON object"));
  EXPECT_THAT(err(R"({"key":"file","value":{}})"), HasSubstr("first line must be the header"));
  EXPECT_THAT(err(Lines({h, h})), HasSubstr("second header"));
  EXPECT_THAT(err(Lines({h, R"({"key":"nope","value":{}})"})),
              HasSubstr("line 2: unknown key 'nope'"));
  EXPECT_THAT(err(Lines({h, R"({"key":"file"})"})), HasSubstr("missing object field 'value'"));
  EXPECT_THAT(err(Lines({h, R"({"key":"file","value":{"path":"a"}})"})), HasSubstr("'content'"));
  EXPECT_THAT(err(Lines({h, R"({"key":"file","value":{"path":"a","content":"!!"}})"})),
              HasSubstr("base64"));
  EXPECT_THAT(err(Lines({h, R"({"key":"file","value":{"path":"../a","content":""}})"})),
              HasSubstr("traversal"));
  EXPECT_THAT(err(Lines({h, R"({"key":"file","value":{"path":"/abs","content":""}})"})),
              HasSubstr("absolute"));
  EXPECT_THAT(err(Lines({h, R"({"key":"lfsFile","value":{"path":"a","oid":"xyz"}})"})),
              HasSubstr("sha256"));
  EXPECT_THAT(err(Lines({h, R"({"key":"lfsFile","value":{"path":"a","algo":"md5","oid":"x"}})"})),
              HasSubstr("algo"));
  EXPECT_THAT(err(R"({"key":"header","value":{"parentCommit":"abc"}})"), HasSubstr("40-hex"));
  NdjsonLimits small;
  small.max_inline_bytes = 3;
  auto big = ParseNdjsonCommit(
      Lines({h, R"({"key":"file","value":{"path":"a","content":"aGVsbG8="}})"}), small);
  EXPECT_THAT(big.status().message(), HasSubstr("exceeds"));
}

TEST(BucketBatchTest, ParsesAndRejects) {
  auto ops = ParseBucketBatch(Lines({
      R"({"type":"addFile","path":"a/b","xetHash":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","mtime":1700000000000})",
      R"({"type":"deleteFile","path":"c"})",
  }));
  ASSERT_TRUE(ops.ok()) << ops.status().ToString();
  ASSERT_EQ(ops->size(), 2u);
  EXPECT_EQ((*ops)[0].xet_hash, std::string(64, 'a'));
  EXPECT_EQ((*ops)[0].mtime_ms, 1700000000000);
  EXPECT_FALSE(ParseBucketBatch(R"({"type":"addFile","path":"a","xetHash":"zz"})").ok());
  EXPECT_FALSE(ParseBucketBatch(R"({"type":"moveFile","path":"a"})").ok());
  EXPECT_FALSE(ParseBucketBatch(R"({"type":"deleteFile","path":"a/../../b"})").ok());
  EXPECT_FALSE(
      ParseBucketBatch(
          Lines({R"({"type":"deleteFile","path":"a"})", R"({"type":"deleteFile","path":"b"})"}), 1)
          .ok());
}

TEST(Base64Test, RoundTrip) {
  for (std::string s : {std::string(""), std::string("f"), std::string("fo"), std::string("foo"),
                        std::string("\0\xff\x10", 3)}) {
    auto d = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, s);
  }
  EXPECT_EQ(Base64Encode("hello"), "aGVsbG8=");
  EXPECT_FALSE(Base64Decode("a").ok());
}

}  // namespace
}  // namespace megackpt::hub
