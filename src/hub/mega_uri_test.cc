#include "megackpt/hub/mega_uri.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace megackpt::hub {
namespace {

using ::testing::HasSubstr;

MegaUri Parse(std::string_view s) {
  auto r = ParseMegaUri(s);
  EXPECT_TRUE(r.ok()) << s << ": " << r.status().ToString();
  return r.ok() ? *r : MegaUri{};
}

std::string ParseError(std::string_view s) {
  auto r = ParseMegaUri(s);
  EXPECT_FALSE(r.ok()) << s << " parsed unexpectedly";
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(MegaUriTest, ModelDefaultsToMain) {
  MegaUri u = Parse("mega://org/model");
  EXPECT_FALSE(u.is_bucket);
  EXPECT_EQ(u.type, RepoType::kModel);
  EXPECT_EQ(u.ns, "org");
  EXPECT_EQ(u.name, "model");
  EXPECT_EQ(u.revision, "main");
  EXPECT_FALSE(u.has_revision);
  EXPECT_EQ(u.path, "");
  EXPECT_EQ(u.repo_id(), "org/model");
  EXPECT_EQ(u.ToString(), "mega://org/model");
}

TEST(MegaUriTest, RevisionAndPath) {
  MegaUri u = Parse("mega://org/model@main/ckpt/step-100");
  EXPECT_EQ(u.revision, "main");
  EXPECT_TRUE(u.has_revision);
  EXPECT_EQ(u.path, "ckpt/step-100");
  EXPECT_EQ(u.ToString(), "mega://org/model@main/ckpt/step-100");
}

TEST(MegaUriTest, Types) {
  EXPECT_EQ(Parse("mega://datasets/org/d").type, RepoType::kDataset);
  EXPECT_EQ(Parse("mega://spaces/org/s/app.py").type, RepoType::kSpace);
  EXPECT_EQ(Parse("mega://spaces/org/s/app.py").path, "app.py");
  EXPECT_EQ(Parse("mega://datasets/org/d@v1/x").ToString(), "mega://datasets/org/d@v1/x");
  // "models/" is not a type prefix: it is a namespace.
  MegaUri m = Parse("mega://models/x");
  EXPECT_EQ(m.ns, "models");
  EXPECT_EQ(m.name, "x");
}

TEST(MegaUriTest, PullRequestAndConvertRefsKeepSlash) {
  MegaUri pr = Parse("mega://org/m@refs/pr/12/weights/a.bin");
  EXPECT_EQ(pr.revision, "refs/pr/12");
  EXPECT_EQ(pr.path, "weights/a.bin");
  EXPECT_EQ(pr.ToString(), "mega://org/m@refs/pr/12/weights/a.bin");
  MegaUri cv = Parse("mega://datasets/org/d@refs/convert/parquet/train/0.parquet");
  EXPECT_EQ(cv.revision, "refs/convert/parquet");
  EXPECT_EQ(cv.path, "train/0.parquet");
  EXPECT_EQ(Parse("mega://org/m@refs/pr/3").path, "");
}

TEST(MegaUriTest, EncodedRevision) {
  MegaUri u = Parse("mega://org/m@feature%2Fx/file.txt");
  EXPECT_EQ(u.revision, "feature/x");
  EXPECT_EQ(u.path, "file.txt");
  EXPECT_EQ(u.ToString(), "mega://org/m@feature%2Fx/file.txt");
  EXPECT_EQ(Parse("mega://org/m@feature%2fx").revision, "feature/x");
  // Without encoding, the part after '/' is the path.
  MegaUri plain = Parse("mega://org/m@feature/x");
  EXPECT_EQ(plain.revision, "feature");
  EXPECT_EQ(plain.path, "x");
}

TEST(MegaUriTest, CommitRevision) {
  std::string id(40, 'a');
  MegaUri u = Parse("mega://org/m@" + id + "/f");
  EXPECT_EQ(u.revision, id);
}

TEST(MegaUriTest, Buckets) {
  MegaUri b = Parse("mega://buckets/org/scratch/run1/ckpt.mega");
  EXPECT_TRUE(b.is_bucket);
  EXPECT_EQ(b.ns, "org");
  EXPECT_EQ(b.name, "scratch");
  EXPECT_EQ(b.revision, "");
  EXPECT_EQ(b.path, "run1/ckpt.mega");
  EXPECT_EQ(b.ToString(), "mega://buckets/org/scratch/run1/ckpt.mega");
  EXPECT_THAT(ParseError("mega://buckets/org/scratch@main/x"),
              HasSubstr("buckets take no revision"));
}

TEST(MegaUriTest, TrailingSlashIgnored) {
  EXPECT_EQ(Parse("mega://org/m/").path, "");
  EXPECT_EQ(Parse("mega://org/m/dir/").path, "dir");
}

TEST(MegaUriTest, ErrorsNameTheBadPart) {
  EXPECT_THAT(ParseError("http://org/m"), HasSubstr("does not start with 'mega://'"));
  EXPECT_THAT(ParseError("mega://"), HasSubstr("empty namespace"));
  EXPECT_THAT(ParseError("mega://org"), HasSubstr("missing name after namespace 'org'"));
  EXPECT_THAT(ParseError("mega://org/"), HasSubstr("empty name segment after namespace 'org'"));
  EXPECT_THAT(ParseError("mega:///m"), HasSubstr("empty namespace"));
  EXPECT_THAT(ParseError("mega://org//m"), HasSubstr("empty name segment"));
  EXPECT_THAT(ParseError("mega://org/m@"), HasSubstr("empty revision after '@'"));
  EXPECT_THAT(ParseError("mega://org/m@/x"), HasSubstr("empty revision after '@'"));
  EXPECT_THAT(ParseError("mega://org/m/a//b"), HasSubstr("empty segment"));
  EXPECT_THAT(ParseError("mega://org/m//"), HasSubstr("empty path segment"));
  EXPECT_THAT(ParseError("mega://org/m/a/../b"), HasSubstr("'..' segment"));
  EXPECT_THAT(ParseError("mega://org/m/./b"), HasSubstr("'.' segment"));
  EXPECT_THAT(ParseError("mega://o rg/m"), HasSubstr("namespace 'o rg'"));
  EXPECT_THAT(ParseError("mega://org/m!x"), HasSubstr("name 'm!x'"));
  EXPECT_THAT(ParseError("mega://org/m@refs/pr/abc"), HasSubstr("refs/pr/<number>"));
  EXPECT_THAT(ParseError("mega://org/m@refs/convert/"), HasSubstr("refs/convert/"));
  EXPECT_THAT(ParseError("mega://org/m@bad%2"), HasSubstr("truncated percent escape"));
  EXPECT_THAT(ParseError("mega://org/m@bad%zz"), HasSubstr("bad percent escape '%zz'"));
  EXPECT_THAT(ParseError("mega://org/m@a..b"), HasSubstr("contains '..'"));
  EXPECT_THAT(ParseError("mega://org/m@x%2F%2Fy"), HasSubstr("empty '/' segment"));
  EXPECT_THAT(ParseError("mega://org@x/m"), HasSubstr("namespace 'org@x' contains '@'"));
  EXPECT_THAT(ParseError("mega://org/..@main"), HasSubstr("name '..'"));
  EXPECT_THAT(ParseError("mega://buckets/org"), HasSubstr("bucket id"));
  EXPECT_THAT(ParseError("mega://org/m/a\\b"), HasSubstr("'\\'"));
  EXPECT_THAT(ParseError(std::string("mega://org/m/a\x01") + "b"), HasSubstr("control character"));
  EXPECT_THAT(ParseError("mega://org/" + std::string(97, 'n')), HasSubstr("longer than 96"));
}

TEST(MegaUriTest, WithPathAndRoot) {
  MegaUri u = Parse("mega://org/m@v2/a/b");
  auto w = u.WithPath("/c/d/");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->ToString(), "mega://org/m@v2/c/d");
  EXPECT_EQ(u.Root().ToString(), "mega://org/m@v2");
  EXPECT_FALSE(u.WithPath("a/../../etc").ok());
}

TEST(MegaUriTest, RoundTripThroughToString) {
  for (std::string s : {"mega://org/m", "mega://org/m@main/x/y.bin",
                        "mega://datasets/a/b@refs/pr/1/z", "mega://spaces/a/b@feature%2Fx",
                        "mega://buckets/a/b/c/d", "mega://org/m@refs/convert/parquet"}) {
    MegaUri u = Parse(s);
    EXPECT_EQ(u.ToString(), s);
    EXPECT_EQ(Parse(u.ToString()), u);
  }
}

TEST(MegaUriTest, PercentCoding) {
  EXPECT_EQ(PercentEncode("a/b c"), "a%2Fb%20c");
  EXPECT_EQ(PercentEncodePath("a/b c/d"), "a/b%20c/d");
  auto d = PercentDecode("a%2Fb%20c");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, "a/b c");
}

TEST(MegaUriTest, RepoTypeNames) {
  EXPECT_EQ(RepoTypeName(RepoType::kDataset), "dataset");
  EXPECT_EQ(RepoTypePlural(RepoType::kSpace), "spaces");
  EXPECT_EQ(*RepoTypeFromName("models"), RepoType::kModel);
  EXPECT_FALSE(RepoTypeFromName("cats").ok());
}

TEST(MegaUriTest, ValidateRepoPath) {
  EXPECT_TRUE(ValidateRepoPath("a/b.c").ok());
  EXPECT_FALSE(ValidateRepoPath("/etc/passwd").ok());
  EXPECT_FALSE(ValidateRepoPath("..").ok());
  EXPECT_FALSE(ValidateRepoPath("a/").ok());
  EXPECT_FALSE(ValidateRepoPath("").ok());
}

}  // namespace
}  // namespace megackpt::hub
