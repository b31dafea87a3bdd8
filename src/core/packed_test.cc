// CopyF4Box / F4BoxByteRange: known answers and a randomized comparison with
// an element-by-element reference (1-D, 2-D, 3-D, odd sizes, odd offsets).
#include "megackpt/core/packed.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace megackpt::inline core {
namespace {

using Bytes = std::vector<uint8_t>;

std::byte* B(Bytes& v) { return reinterpret_cast<std::byte*>(v.data()); }
const std::byte* CB(const Bytes& v) { return reinterpret_cast<const std::byte*>(v.data()); }

// Reference nibble accessors, written independently of packed.cc: element i is
// byte i / 2, low nibble for even i.
uint8_t RefGet(const Bytes& v, uint64_t i) { return i % 2 == 0 ? v[i / 2] & 0xF : v[i / 2] >> 4; }
void RefPut(Bytes& v, uint64_t i, uint8_t x) {
  if (i % 2 == 0) {
    v[i / 2] = static_cast<uint8_t>((v[i / 2] & 0xF0) | x);
  } else {
    v[i / 2] = static_cast<uint8_t>((v[i / 2] & 0x0F) | (x << 4));
  }
}

uint64_t Numel(const std::vector<int64_t>& s) {
  uint64_t n = 1;
  for (int64_t x : s) n *= static_cast<uint64_t>(x);
  return n;
}

uint64_t Flat(const std::vector<int64_t>& shape, const std::vector<int64_t>& idx) {
  uint64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * static_cast<uint64_t>(shape[d]) + idx[d];
  return f;
}

// Element-by-element reference copy.
void RefCopy(const Bytes& src, const std::vector<int64_t>& ss, const std::vector<int64_t>& s0,
             Bytes& dst, const std::vector<int64_t>& ds, const std::vector<int64_t>& d0,
             const std::vector<int64_t>& len) {
  const size_t nd = len.size();
  const uint64_t n = Numel(len);
  std::vector<int64_t> i(nd, 0), si(nd), di(nd);
  for (uint64_t e = 0; e < n; ++e) {
    uint64_t rem = e;
    for (size_t d = nd; d-- > 0;) {
      i[d] = static_cast<int64_t>(rem % static_cast<uint64_t>(len[d]));
      rem /= static_cast<uint64_t>(len[d]);
    }
    for (size_t d = 0; d < nd; ++d) {
      si[d] = s0[d] + i[d];
      di[d] = d0[d] + i[d];
    }
    RefPut(dst, Flat(ds, di), RefGet(src, Flat(ss, si)));
  }
}

TEST(CopyF4BoxTest, KnownAnswers1D) {
  // Elements 1, 2, 3, 4, 5, 6 (low nibble first).
  const Bytes src = {0x21, 0x43, 0x65};
  const std::vector<int64_t> s6{6};
  {
    // Same phase, odd start: elements [1, 5) -> dst [1, 5).
    Bytes dst = {0xFF, 0xFF, 0xFF};
    ASSERT_TRUE(CopyF4Box({CB(src), s6}, std::vector<int64_t>{1}, {B(dst), s6},
                          std::vector<int64_t>{1}, std::vector<int64_t>{4})
                    .ok());
    EXPECT_EQ(dst, (Bytes{0x2F, 0x43, 0xF5}));
  }
  {
    // Opposite phase: elements [1, 4) = 2, 3, 4 -> dst [0, 3) of 4 elements.
    Bytes dst = {0xAA, 0xAA};
    const std::vector<int64_t> s4{4};
    ASSERT_TRUE(CopyF4Box({CB(src), s6}, std::vector<int64_t>{1}, {B(dst), s4},
                          std::vector<int64_t>{0}, std::vector<int64_t>{3})
                    .ok());
    EXPECT_EQ(dst, (Bytes{0x32, 0xA4}));
  }
  {
    // Opposite phase the other way: elements [0, 5) -> dst [1, 6) of 7 (padding kept).
    Bytes dst = {0x00, 0x00, 0x00, 0xB0};
    const std::vector<int64_t> s7{7};
    ASSERT_TRUE(CopyF4Box({CB(src), s6}, std::vector<int64_t>{0}, {B(dst), s7},
                          std::vector<int64_t>{1}, std::vector<int64_t>{5})
                    .ok());
    EXPECT_EQ(dst, (Bytes{0x10, 0x32, 0x54, 0xB0}));
  }
}

TEST(CopyF4BoxTest, KnownAnswer2DColumn) {
  // 3x3 source, elements 0..8; copy column 1 (1, 4, 7) into column 2 of a 3x3
  // destination full of 0xF.
  const Bytes src = {0x10, 0x32, 0x54, 0x76, 0x08};
  Bytes dst = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  const std::vector<int64_t> s{3, 3};
  ASSERT_TRUE(CopyF4Box({CB(src), s}, std::vector<int64_t>{0, 1}, {B(dst), s},
                        std::vector<int64_t>{0, 2}, std::vector<int64_t>{3, 1})
                  .ok());
  // dst elements: F F 1 / F F 4 / F F 7 (+ padding F).
  EXPECT_EQ(dst, (Bytes{0xFF, 0xF1, 0x4F, 0xFF, 0xF7}));
}

TEST(CopyF4BoxTest, ZeroDAndEmpty) {
  const Bytes src = {0x09};
  Bytes dst = {0x50};
  ASSERT_TRUE(CopyF4Box({CB(src), {}}, {}, {B(dst), {}}, {}, {}).ok());
  EXPECT_EQ(dst, (Bytes{0x59}));
  const std::vector<int64_t> s{2, 3}, zero{0, 0}, empty{2, 0};
  Bytes d2 = {0xEE, 0xEE, 0xEE};
  const Bytes s2 = {0, 0, 0};
  ASSERT_TRUE(CopyF4Box({CB(s2), s}, zero, {B(d2), s}, zero, empty).ok());
  EXPECT_EQ(d2, (Bytes{0xEE, 0xEE, 0xEE}));
}

TEST(CopyF4BoxTest, Errors) {
  const Bytes src(8, 0);
  Bytes dst(8, 0);
  const std::vector<int64_t> s2{3, 5}, s1{15};
  EXPECT_EQ(CopyF4Box({CB(src), s2}, std::vector<int64_t>{0, 0}, {B(dst), s1},
                      std::vector<int64_t>{0}, std::vector<int64_t>{1})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyF4Box({CB(src), s2}, std::vector<int64_t>{1, 3}, {B(dst), s2},
                      std::vector<int64_t>{0, 0}, std::vector<int64_t>{2, 3})
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyF4Box({CB(src), s2}, std::vector<int64_t>{0, 0}, {B(dst), s2},
                      std::vector<int64_t>{0, -1}, std::vector<int64_t>{1, 1})
                .code(),
            StatusCode::kInvalidArgument);
  // The box starts at element 5 (byte 2); a window starting at byte 3 misses it.
  EXPECT_EQ(CopyF4Box({CB(src), s2, 3}, std::vector<int64_t>{1, 0}, {B(dst), s2},
                      std::vector<int64_t>{0, 0}, std::vector<int64_t>{1, 5})
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(CopyF4BoxTest, ByteRange) {
  const std::vector<int64_t> s{7, 5};
  // Rows 2..4, columns 1..3: first element 11 (byte 5), last 23 (byte 11).
  auto r = F4BoxByteRange(s, std::vector<int64_t>{2, 1}, std::vector<int64_t>{3, 3});
  EXPECT_EQ(r.first, 5u);
  EXPECT_EQ(r.second, 12u);
  r = F4BoxByteRange(s, std::vector<int64_t>{0, 0}, std::vector<int64_t>{7, 5});
  EXPECT_EQ(r.first, 0u);
  EXPECT_EQ(r.second, 18u);  // 35 elements
  r = F4BoxByteRange(s, std::vector<int64_t>{3, 0}, std::vector<int64_t>{0, 5});
  EXPECT_EQ(r.first, r.second);
  r = F4BoxByteRange(std::vector<int64_t>{}, {}, {});
  EXPECT_EQ(r.second - r.first, 1u);
}

// Random shapes (odd sizes) and boxes at random offsets in 1, 2 and 3 dims,
// against the reference; every destination nibble outside the box (and the
// padding nibble) must keep its value. Also reads through a byte window.
TEST(CopyF4BoxTest, MatchesReferenceRandomized) {
  std::mt19937 rng(1234);
  auto uni = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int checked = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const size_t nd = 1 + iter % 3;
    std::vector<int64_t> ss(nd), ds(nd), len(nd), s0(nd), d0(nd);
    for (size_t d = 0; d < nd; ++d) {
      len[d] = uni(1, 6);
      ss[d] = len[d] + uni(0, 4);
      ds[d] = len[d] + uni(0, 4);
      // Whole dims now and then, so runs span several dims.
      if (uni(0, 3) == 0) ss[d] = ds[d] = len[d];
      s0[d] = uni(0, ss[d] - len[d]);
      d0[d] = uni(0, ds[d] - len[d]);
    }
    Bytes src((Numel(ss) + 1) / 2), dst((Numel(ds) + 1) / 2);
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    for (auto& b : dst) b = static_cast<uint8_t>(rng());
    Bytes want = dst;
    RefCopy(src, ss, s0, want, ds, d0, len);
    Bytes got = dst;
    Status st = CopyF4Box({CB(src), ss}, s0, {B(got), ds}, d0, len);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(got, want) << "iteration " << iter;
    // The same copy from a window holding only the box's bytes.
    auto [b, e] = F4BoxByteRange(ss, s0, len);
    ASSERT_LT(b, e);
    ASSERT_LE(e, src.size());
    Bytes win(src.begin() + b, src.begin() + e);
    Bytes got2 = dst;
    st = CopyF4Box({CB(win), ss, b}, s0, {B(got2), ds}, d0, len);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(got2, want) << "window, iteration " << iter;
    ++checked;
  }
  EXPECT_EQ(checked, 3000);
}

}  // namespace
}  // namespace megackpt::inline core
