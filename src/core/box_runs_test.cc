// Box -> runs planner and text escaping (include/megackpt/core/{box_runs,text}.h).
#include "megackpt/core/box_runs.h"

#include <gtest/gtest.h>

#include <numeric>

#include "megackpt/core/checksum.h"
#include "megackpt/core/tensor.h"

namespace megackpt {
namespace {

std::vector<BoxRun> Runs(Shape shape, Shape start, Shape lengths,
                         std::vector<int64_t> strides = {}) {
  auto r = BoxRuns(shape, strides, start, lengths);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<BoxRun>{};
}

TEST(BoxRuns, WholeRowsAreOneRun) {
  EXPECT_EQ(Runs({1024, 1024}, {512, 0}, {16, 1024}),
            (std::vector<BoxRun>{{512 * 1024, 0, 16 * 1024}}));
  EXPECT_EQ(Runs({4, 3}, {0, 0}, {4, 3}), (std::vector<BoxRun>{{0, 0, 12}}));
}

TEST(BoxRuns, ColumnsAreOneRunPerRow) {
  auto runs = Runs({1024, 1024}, {0, 512}, {1024, 16});
  ASSERT_EQ(runs.size(), 1024u);
  EXPECT_EQ(runs[0], (BoxRun{512, 0, 16}));
  EXPECT_EQ(runs[1023], (BoxRun{1023 * 1024 + 512, 1023 * 16, 16}));
}

TEST(BoxRuns, KnownAnswer3d) {
  // shape [2,3,4], box start [1,1,0] lengths [1,2,4]: rows 1..2 of plane 1 are adjacent.
  EXPECT_EQ(Runs({2, 3, 4}, {1, 1, 0}, {1, 2, 4}), (std::vector<BoxRun>{{16, 0, 8}}));
  // inner partial: start [0,1,1] lengths [2,2,2]: 4 runs of 2.
  EXPECT_EQ(Runs({2, 3, 4}, {0, 1, 1}, {2, 2, 2}),
            (std::vector<BoxRun>{{5, 0, 2}, {9, 2, 2}, {17, 4, 2}, {21, 6, 2}}));
  // middle-dim length 1 with whole inner dims folds: [0..2, 2, 0..4) -> 2 runs of 4.
  EXPECT_EQ(Runs({2, 3, 4}, {0, 2, 0}, {2, 1, 4}), (std::vector<BoxRun>{{8, 0, 4}, {20, 4, 4}}));
}

TEST(BoxRuns, ScalarsEmptyAndStrides) {
  EXPECT_EQ(Runs({}, {}, {}), (std::vector<BoxRun>{{0, 0, 1}}));
  EXPECT_TRUE(Runs({4, 0}, {0, 0}, {4, 0}).empty());
  EXPECT_TRUE(Runs({4, 3}, {1, 0}, {0, 3}).empty());
  // A transposed view: strides {1, 4} of a [4, 4] array: every element its own run.
  auto runs = Runs({4, 4}, {0, 0}, {2, 2}, {1, 4});
  EXPECT_EQ(runs, (std::vector<BoxRun>{{0, 0, 1}, {4, 1, 1}, {1, 2, 1}, {5, 3, 1}}));
}

TEST(BoxRuns, Errors) {
  EXPECT_EQ(BoxRuns(Shape{4, 3}, {}, Shape{0}, Shape{4, 3}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(BoxRuns(Shape{4, 3}, {}, Shape{1, 0}, Shape{4, 3}).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(BoxRuns(Shape{4, 3}, {}, Shape{-1, 0}, Shape{1, 3}).status().code(),
            StatusCode::kInvalidArgument);
}

// Every element of the box is visited exactly once, at the right destination.
TEST(BoxRuns, MatchesNaiveCopy) {
  const Shape shape{5, 6, 7};
  for (int64_t a = 0; a < 5; a += 2) {
    for (int64_t b = 0; b < 6; b += 3) {
      for (int64_t c = 0; c < 7; c += 3) {
        const Shape start{a, b, c}, len{5 - a, 6 - b, 7 - c};
        std::vector<int64_t> got(len[0] * len[1] * len[2], -1);
        for (const BoxRun& r : Runs(shape, start, len)) {
          for (uint64_t k = 0; k < r.n; ++k) got[r.dst + k] = static_cast<int64_t>(r.src + k);
        }
        size_t q = 0;
        for (int64_t i = 0; i < len[0]; ++i)
          for (int64_t j = 0; j < len[1]; ++j)
            for (int64_t k = 0; k < len[2]; ++k)
              EXPECT_EQ(got[q++], ((a + i) * 6 + (b + j)) * 7 + (c + k));
      }
    }
  }
}

TEST(BoxRuns, ByteRunsAndF4) {
  std::vector<BoxRun> runs;
  auto collect = [&](const BoxRun& r) {
    runs.push_back(r);
    return Status::OK();
  };
  ASSERT_TRUE(ForEachBoxByteRun(DType::kF32, Shape{4, 3}, Shape{1, 1}, Shape{2, 2}, collect).ok());
  EXPECT_EQ(runs, (std::vector<BoxRun>{{16, 0, 8}, {28, 8, 8}}));
  runs.clear();
  ASSERT_TRUE(ForEachBoxByteRun(DType::kF4, Shape{4, 4}, Shape{1, 2}, Shape{2, 2}, collect).ok());
  EXPECT_EQ(runs, (std::vector<BoxRun>{{3, 0, 1}, {5, 1, 1}}));
  EXPECT_EQ(ForEachBoxByteRun(DType::kF4, Shape{4, 4}, Shape{0, 1}, Shape{2, 2}, collect).code(),
            StatusCode::kInvalidArgument);
}

TEST(BoxRuns, SpansMergeWithinOverhead) {
  // Runs of 100 bytes every 104 bytes: 4% waste per join.
  std::vector<BoxRun> runs;
  for (uint64_t i = 0; i < 10; ++i) runs.push_back({i * 104, i * 100, 100});
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  auto collect = [&](const ByteSpan& s) {
    spans.push_back({s.begin, s.end});
    return Status::OK();
  };
  ASSERT_TRUE(ForEachByteSpan(runs, 1 << 20, 0.05, collect).ok());
  EXPECT_EQ(spans, (std::vector<std::pair<uint64_t, uint64_t>>{{0, 1036}}));
  spans.clear();
  ASSERT_TRUE(ForEachByteSpan(runs, 1 << 20, 0.01, collect).ok());
  EXPECT_EQ(spans.size(), 10u);
  spans.clear();
  ASSERT_TRUE(ForEachByteSpan(runs, 300, 0.05, collect).ok());
  EXPECT_EQ(spans.size(), 5u);  // two runs (204 bytes) per 300-byte span
}

TEST(Crc32Shift, MatchesCombineAndConcatenation) {
  std::string data(3000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  for (uint64_t len : {1u, 64u, 256u, 1000u}) {
    const Crc32Shift shift(len);
    const auto a = AsBytes(std::string_view(data).substr(0, 500));
    const auto b = AsBytes(std::string_view(data).substr(500, len));
    EXPECT_EQ(shift.Append(Crc32(a), Crc32(b)),
              Crc32(AsBytes(std::string_view(data).substr(0, 500 + len))));
    EXPECT_EQ(shift.Append(0x12345678u, 0x9abcdef0u), Crc32Combine(0x12345678u, 0x9abcdef0u, len));
  }
}

}  // namespace
}  // namespace megackpt
