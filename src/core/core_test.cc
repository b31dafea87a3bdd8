#include <dlpack/dlpack.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/checksum_kernels.h"
#include "core/test_files.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/dtype.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/thread_pool.h"

namespace megackpt::inline core {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status UseMacros(int x, int* out) {
  MEGA_ASSIGN_OR_RETURN(int h, Half(x));
  MEGA_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::OK();
}

TEST(StatusTest, CodesMessagesAndMacros) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = DataLossError("x.mega: bad magic");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.ToString(), "DataLoss: x.mega: bad magic");
  EXPECT_EQ(s.WithContext("load").message(), "load: x.mega: bad magic");
  int out = 0;
  EXPECT_TRUE(UseMacros(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status bad = UseMacros(6, &out);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "odd: 3");
  EXPECT_EQ(ErrnoToStatus("f", ENOENT).code(), StatusCode::kNotFound);
}

TEST(DTypeTest, NamesAndSizes) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType d = static_cast<DType>(i);
    auto back = DTypeFromName(DTypeName(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kF8_E8M0), 1);
  EXPECT_EQ(DTypeBits(DType::kF4), 4);
  EXPECT_FALSE(DTypeFromName("f32").ok());
  Shape s{3, 5};
  EXPECT_EQ(*LogicalNbytes(DType::kF4, s), 8u);
  EXPECT_EQ(*LogicalNbytes(DType::kF64, s), 120u);
  EXPECT_EQ(*LogicalNbytes(DType::kF32, Shape{}), 4u);
  EXPECT_EQ(*LogicalNbytes(DType::kF32, Shape{0, 7}), 0u);
  EXPECT_FALSE(LogicalNbytes(DType::kF64, Shape{1LL << 40, 1LL << 30}).ok());
  EXPECT_FALSE(LogicalNbytes(DType::kF64, Shape{-1}).ok());
}

TEST(DTypeTest, FloatElementsKnownAnswers) {
  auto at = [](DType d, uint32_t bits) { return FloatElementAt(d, &bits); };
  EXPECT_EQ(at(DType::kF16, 0x3C00), 1.0);
  EXPECT_EQ(at(DType::kF16, 0xC000), -2.0);
  EXPECT_EQ(at(DType::kF16, 0x0001), std::ldexp(1.0, -24));  // smallest subnormal
  EXPECT_EQ(at(DType::kF16, 0x7BFF), 65504.0);
  EXPECT_TRUE(std::isinf(at(DType::kF16, 0x7C00)));
  EXPECT_TRUE(std::isnan(at(DType::kF16, 0x7E00)));
  EXPECT_EQ(at(DType::kBF16, 0x3F80), 1.0);
  EXPECT_EQ(at(DType::kBF16, 0xC0A0), -5.0);
  EXPECT_EQ(at(DType::kF8_E5M2, 0x3C), 1.0);
  EXPECT_EQ(at(DType::kF8_E5M2, 0x7B), 57344.0);
  EXPECT_EQ(at(DType::kF8_E4M3, 0x38), 1.0);
  EXPECT_EQ(at(DType::kF8_E4M3, 0x7E), 448.0);  // largest E4M3fn
  EXPECT_TRUE(std::isnan(at(DType::kF8_E4M3, 0x7F)));
  EXPECT_EQ(at(DType::kF8_E4M3, 0x01), std::ldexp(1.0, -9));
  float f = -3.25f;
  EXPECT_EQ(FloatElementAt(DType::kF32, &f), -3.25);
  double d = 1e300;
  EXPECT_EQ(FloatElementAt(DType::kF64, &d), 1e300);
  EXPECT_TRUE(IsFloatDType(DType::kBF16));
  EXPECT_FALSE(IsFloatDType(DType::kI32));
  EXPECT_FALSE(IsFloatDType(DType::kF4));
}

Tensor Iota(DType dtype, Shape shape) {
  auto t = Tensor::Empty(dtype, shape);
  EXPECT_TRUE(t.ok());
  auto* p = static_cast<uint8_t*>(t->data());
  for (uint64_t i = 0; i < t->nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
  return *t;
}

TEST(TensorTest, NarrowAndStridedCopy) {
  Tensor a = Iota(DType::kF32, {4, 6, 5});
  EXPECT_TRUE(a.is_contiguous());
  auto rows = a.Narrow(0, 1, 2);
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->is_contiguous());
  auto cols = rows->Narrow(1, 2, 3);
  ASSERT_TRUE(cols.ok());
  EXPECT_FALSE(cols->is_contiguous());
  EXPECT_EQ(cols->shape(), (Shape{2, 3, 5}));
  auto dst = Tensor::Empty(DType::kF32, {2, 3, 5});
  ASSERT_TRUE(dst.ok());
  ASSERT_TRUE(CopyTensor(*cols, *dst).ok());
  const float* src = static_cast<const float*>(a.data());
  const float* out = static_cast<const float*>(dst->data());
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 5; ++k)
        EXPECT_EQ(std::memcmp(&out[(i * 3 + j) * 5 + k], &src[((i + 1) * 6 + j + 2) * 5 + k], 4),
                  0);
  EXPECT_TRUE(TensorBytesEqual(*cols, *dst));
  // Copy into a strided destination (a column block of a bigger tensor).
  Tensor big = Iota(DType::kF32, {4, 6, 5});
  auto view = big.Narrow(1, 3, 3);
  ASSERT_TRUE(view.ok());
  auto view2 = view->Narrow(0, 0, 2);
  ASSERT_TRUE(CopyTensor(*dst, *view2).ok());
  EXPECT_TRUE(TensorBytesEqual(*view2, *dst));
  EXPECT_FALSE(a.Narrow(3, 0, 1).ok());
  EXPECT_FALSE(a.Narrow(0, 3, 2).ok());
  EXPECT_EQ(CopyTensor(a, *dst).code(), StatusCode::kInvalidArgument);
}

TEST(TensorTest, ZeroDimAndEmpty) {
  Tensor scalar = Iota(DType::kF64, {});
  EXPECT_EQ(scalar.numel(), 1u);
  EXPECT_EQ(scalar.nbytes(), 8u);
  auto empty = Tensor::Empty(DType::kI32, {3, 0});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->nbytes(), 0u);
  auto e2 = Tensor::Empty(DType::kI32, {3, 0});
  EXPECT_TRUE(CopyTensor(*empty, *e2).ok());
  EXPECT_FALSE(Tensor().defined());
}

TEST(TensorTest, CallerMemoryIsNotCopied) {
  std::vector<float> mem(12, 1.5f);
  auto t = Tensor::FromBlob(mem.data(), DType::kF32, {3, 4});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->data(), mem.data());
}

TEST(TensorTest, StreamingCopyEqualsMemcpyAtAnyAlignmentAndLength) {
  // Source and destination offsets 0..17 against the 16-byte store alignment,
  // lengths around the 64-byte loop and its head/tail; bytes around the
  // destination range must stay untouched.
  std::vector<std::byte> src(1024), dst(1024 + 64), want(1024 + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  for (size_t so : {0, 1, 5, 16, 17}) {
    for (size_t d0 : {0, 3, 8, 15, 16, 17}) {
      for (size_t n : {0, 1, 15, 16, 63, 64, 65, 127, 128, 200, 777, 1000}) {
        if (so + n > src.size()) continue;
        std::fill(dst.begin(), dst.end(), std::byte{0xAA});
        want = dst;
        std::memcpy(want.data() + d0, src.data() + so, n);
        StreamingCopy(dst.data() + d0, src.data() + so, n);
        ASSERT_EQ(dst, want) << "src offset " << so << ", dst offset " << d0 << ", length " << n;
      }
    }
  }
}

TEST(TensorTest, DLPackRoundTrip) {
  Tensor a = Iota(DType::kBF16, {3, 4});
  auto dl = ToDLPack(a);
  ASSERT_TRUE(dl.ok());
  EXPECT_EQ((*dl)->dl_tensor.dtype.code, kDLBfloat);
  auto back = FromDLPack(*dl);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->data(), a.data());
  EXPECT_TRUE(TensorBytesEqual(*back, a));
  EXPECT_FALSE(ToDLPack(Iota(DType::kF8_E4M3, {2})).ok());
}

// The DLPack type codes, by the DLPack 1.1 numbering (known answers, not the
// table in tensor.cc): import knows all, export only the 0.6 codes.
TEST(TensorTest, DLPackDTypeCodesBothWays) {
  struct Case {
    DType dtype;
    uint8_t code, bits;
    bool exported;  // ToDLPack gives (code, bits)
  };
  const Case cases[] = {
      {DType::kI8, 0, 8, true},        {DType::kI16, 0, 16, true},
      {DType::kI32, 0, 32, true},      {DType::kI64, 0, 64, true},
      {DType::kU8, 1, 8, true},        {DType::kU16, 1, 16, true},
      {DType::kU32, 1, 32, true},      {DType::kU64, 1, 64, true},
      {DType::kF16, 2, 16, true},      {DType::kF32, 2, 32, true},
      {DType::kF64, 2, 64, true},      {DType::kBF16, 4, 16, true},
      {DType::kBool, 6, 8, false},     {DType::kF8_E4M3, 10, 8, false},
      {DType::kF8_E5M2, 12, 8, false}, {DType::kF8_E8M0, 14, 8, false},
  };
  for (const Case& c : cases) {
    auto d = DTypeFromDLPack(c.code, c.bits, 1);
    ASSERT_TRUE(d.ok()) << DTypeName(c.dtype);
    EXPECT_EQ(*d, c.dtype);
    EXPECT_FALSE(DTypeFromDLPack(c.code, c.bits, 2).ok()) << DTypeName(c.dtype) << " with 2 lanes";
    auto dl = ToDLPack(Iota(c.dtype, {2}));
    EXPECT_EQ(dl.ok(), c.exported || c.dtype == DType::kBool) << DTypeName(c.dtype);
    if (!dl.ok()) continue;
    // Bool leaves as uint8 (DLPack 0.6 has no bool code).
    EXPECT_EQ((*dl)->dl_tensor.dtype.code, c.dtype == DType::kBool ? 1 : c.code)
        << DTypeName(c.dtype);
    EXPECT_EQ((*dl)->dl_tensor.dtype.bits, c.bits) << DTypeName(c.dtype);
    (*dl)->deleter(*dl);
  }
  for (auto [code, bits] : {std::pair<uint8_t, uint8_t>{2, 8}, {4, 32}, {0, 4}, {3, 64}, {6, 16}}) {
    auto d = DTypeFromDLPack(code, bits, 1, "arr");
    ASSERT_FALSE(d.ok()) << int(code) << "/" << int(bits);
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.status().message().rfind("arr: unsupported array dtype", 0), 0u)
        << d.status().message();
  }
}

TEST(ThreadPoolTest, ParallelForRunsAllAndNests) {
  ThreadPool pool(2);
  std::atomic<int> sum{0};
  Status s = ParallelFor(&pool, 100, [&](size_t i) {
    // Nested ParallelFor from inside a pool task must not deadlock.
    return ParallelFor(&pool, 10, [&](size_t j) {
      sum += static_cast<int>(i * 10 + j);
      return Status::OK();
    });
  });
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  Status err = ParallelFor(
      &pool, 50, [&](size_t i) { return i == 17 ? NotFoundError("item 17") : Status::OK(); });
  EXPECT_EQ(err.code(), StatusCode::kNotFound);
  auto fut = pool.Submit([] { return 42; });
  EXPECT_EQ(fut.get(), 42);
}

// zlib's CRC-32 one bit at a time: the reference the kernels are checked
// against, sharing no code with them (nor with isa-l).
uint32_t BitwiseCrc32(uint32_t crc, std::span<const std::byte> data) {
  crc = ~crc;
  for (std::byte b : data) {
    crc ^= static_cast<uint8_t>(b);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(ChecksumTest, KnownAnswers) {
  EXPECT_EQ(Crc32(AsBytes("123456789")), 0xCBF43926u);
  EXPECT_EQ(Crc32Extend(Crc32(AsBytes("1234")), AsBytes("56789")), 0xCBF43926u);
  EXPECT_EQ(ToHex(Sha256Of(AsBytes("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::array<uint8_t, 2> out;
  EXPECT_TRUE(FromHex("aB01", out).ok());
  EXPECT_EQ(out[0], 0xab);
  EXPECT_FALSE(FromHex("zz01", out).ok());
}

// BlockCrc32s (folded inline for small blocks) agrees with one bitwise CRC
// per block, for block sizes 64 B .. 64 KiB, short last blocks and unaligned
// starts.
void CheckBlockCrc32sAgainstCrc32() {
  std::mt19937_64 rng(11);
  // Large enough for the longest case below (11 blocks of 64 KiB + 48 bytes,
  // from offset 7): every span must lie inside the buffer.
  std::vector<std::byte> data(12u << 16);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  // Known answers (zlib.crc32): bytes 0, 1, ..., n-1 as one block, and a
  // short block ("123456789").
  std::vector<std::byte> ramp(128);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<std::byte>(i);
  uint32_t one = 0;
  BlockCrc32s(std::span<const std::byte>(ramp), 128, &one);
  EXPECT_EQ(one, 0x24650d57u);
  BlockCrc32s(std::span<const std::byte>(ramp).first(64), 64, &one);
  EXPECT_EQ(one, 0x100ece8cu);
  BlockCrc32s(AsBytes("123456789"), 64, &one);
  EXPECT_EQ(one, 0xCBF43926u);
  for (uint64_t block : {64u, 80u, 128u, 208u, 256u, 496u, 512u, 1024u, 65536u}) {
    for (size_t start : {0u, 1u, 7u}) {
      for (uint64_t size : {block, 3 * block, 3 * block + 16, 4 * block, 5 * block + 1, 8 * block,
                            11 * block + 48, uint64_t{100u << 10}}) {
        ASSERT_LE(start + size, data.size()) << "block " << block << " size " << size;
        std::span<const std::byte> bytes(data.data() + start, size);
        std::vector<uint32_t> got((size + block - 1) / block + 1, 0xdeadbeef);
        BlockCrc32s(bytes, block, got.data());
        for (size_t j = 0; j * block < size; ++j) {
          const uint64_t len = std::min<uint64_t>(block, size - j * block);
          ASSERT_EQ(got[j], BitwiseCrc32(0, bytes.subspan(j * block, len)))
              << "block " << block << " start " << start << " size " << size << " entry " << j;
        }
        EXPECT_EQ(got.back(), 0xdeadbeefu) << "wrote past the table";
      }
    }
  }
  // One flipped bit changes exactly its block's entry.
  std::vector<uint32_t> before(8), after(8);
  std::span<const std::byte> bytes(data.data(), 8 * 128);
  BlockCrc32s(bytes, 128, before.data());
  data[3 * 128 + 77] ^= std::byte{0x10};
  BlockCrc32s(bytes, 128, after.data());
  for (size_t j = 0; j < 8; ++j) EXPECT_EQ(before[j] != after[j], j == 3) << j;
}

// Every kernel the CPU can run: on an AVX-512 machine the 256- and 128-bit
// kernels see blocks of a multiple of 64 bytes only when the wider ones are
// held back (on a CPU without them a limit changes nothing).
TEST(ChecksumTest, MatchesOneCrc32PerBlock) {
  using checksum_internal::CrcKernels;
  for (CrcKernels k :
       {CrcKernels::kBest, CrcKernels::kVclmul256, CrcKernels::kClmul128, CrcKernels::kPortable}) {
    SCOPED_TRACE("kernels " + std::to_string(static_cast<int>(k)));
    checksum_internal::LimitCrcKernelsForTest(k);
    CheckBlockCrc32sAgainstCrc32();
  }
  checksum_internal::LimitCrcKernelsForTest(CrcKernels::kBest);
}

// CopyWithCrc32 copies exactly the span and returns the CRC of src extended
// from crc, and Crc32Extend returns the same, on the fused 512- and 256-bit
// kernels and on the portable memcpy + isa-l path, for every length around
// the kernels' 64- and 256-byte steps and unaligned ends.
TEST(ChecksumTest, CopyWithCrc32CopiesAndMatchesCrc32) {
  using checksum_internal::CrcKernels;
  // Known answers (zlib.crc32 of bytes i % 251, i < 1000; from 0 and extended).
  std::vector<std::byte> ramp(1000), copy(1000);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = static_cast<std::byte>(i % 251);
  std::mt19937_64 rng(13);
  std::vector<std::byte> src(300000 + 64);
  for (auto& b : src) b = static_cast<std::byte>(rng());
  for (CrcKernels k : {CrcKernels::kBest, CrcKernels::kVclmul256, CrcKernels::kPortable}) {
    SCOPED_TRACE("kernels " + std::to_string(static_cast<int>(k)));
    checksum_internal::LimitCrcKernelsForTest(k);
    EXPECT_EQ(Crc32(ramp), 0x721746a6u);
    EXPECT_EQ(CopyWithCrc32(0, copy, ramp), 0x721746a6u);
    EXPECT_EQ(CopyWithCrc32(0x12345678, copy, ramp), 0xd6c78d93u);
    EXPECT_EQ(copy, ramp);
    for (size_t size : {0, 1, 63, 64, 65, 255, 256, 257, 319, 320, 511, 512, 4096 + 17, 300000}) {
      for (size_t from : {0, 1, 7}) {
        for (size_t to : {0, 3}) {
          for (uint32_t crc0 : {0u, 0x12345678u}) {
            std::vector<std::byte> dst(size + 2 * 64, std::byte{0xA5});
            const std::span<const std::byte> in(src.data() + from, size);
            const std::span<std::byte> out(dst.data() + 64 + to, size);
            const uint32_t want = BitwiseCrc32(crc0, in);
            ASSERT_EQ(Crc32Extend(crc0, in), want) << "size " << size << " from " << from;
            const uint32_t got = CopyWithCrc32(crc0, out, in);
            ASSERT_EQ(got, want) << "size " << size << " from " << from << " to " << to;
            ASSERT_EQ(std::memcmp(dst.data() + 64 + to, in.data(), size), 0) << "size " << size;
            for (size_t i = 0; i < dst.size(); ++i) {
              if (i < 64 + to || i >= 64 + to + size) {
                ASSERT_EQ(dst[i], std::byte{0xA5})
                    << "wrote outside the span at " << i << ", size " << size;
              }
            }
          }
        }
      }
    }
  }
  checksum_internal::LimitCrcKernelsForTest(CrcKernels::kBest);
}

// BlockCrc32Stream, fed in pieces that start and end anywhere, gives the same
// table as one BlockCrc32s call over the whole stream and the whole stream's
// Crc32 (combined from the blocks); block 0 gives the whole CRC only.
// NextWritePiece: up to the next multiple of the piece, rounded down to whole
// 64-byte units when that leaves anything, never past what is left.
TEST(ChecksumTest, NextWritePieceEndsOnPieceMultiples) {
  static_assert(kCrcWritePiece == 2u << 20);
  EXPECT_EQ(NextWritePiece(0, 10 << 20), kCrcWritePiece);
  EXPECT_EQ(NextWritePiece(kCrcWritePiece, 10 << 20), kCrcWritePiece);
  EXPECT_EQ(NextWritePiece(100, 10 << 20), (kCrcWritePiece - 100) / 64 * 64);
  EXPECT_EQ(NextWritePiece(kCrcWritePiece - 10, 10 << 20), 10u);  // under 64: not rounded to 0
  EXPECT_EQ(NextWritePiece(0, 1000), 1000u);
  EXPECT_EQ(NextWritePiece(0, 10 << 20, 2 << 20), 2u << 20);
  EXPECT_EQ(NextWritePiece(3 << 20, 10 << 20, 2 << 20), 1u << 20);
}

TEST(ChecksumTest, BlockCrc32StreamMatchesOneShotOverAnyPieces) {
  std::mt19937_64 rng(12);
  std::vector<std::byte> data(300000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (uint64_t block : {0u, 64u, 256u, 1000u, 65536u}) {
    for (size_t size :
         {size_t{0}, size_t{1}, size_t{255}, size_t{256}, size_t{4097}, data.size()}) {
      const std::span<const std::byte> all(data.data(), size);
      for (size_t max_piece : {size_t{1}, size_t{77}, size_t{256}, size_t{70000}}) {
        if (max_piece == 1 && size > 5000) continue;  // byte by byte only on short streams
        BlockCrc32Stream s(block, size);
        for (size_t off = 0; off < size;) {
          const size_t n = std::min<size_t>(size - off, 1 + rng() % max_piece);
          s.Add(all.subspan(off, n));
          off += n;
        }
        s.Finish();
        const std::string where = "block " + std::to_string(block) + " size " +
                                  std::to_string(size) + " pieces <= " + std::to_string(max_piece);
        EXPECT_EQ(s.whole(), Crc32(all)) << where;
        if (block == 0) {
          EXPECT_TRUE(s.blocks().empty()) << where;
          continue;
        }
        std::vector<uint32_t> want((size + block - 1) / block);
        if (size > 0) BlockCrc32s(all, block, want.data());
        EXPECT_EQ(s.blocks(), want) << where;
      }
    }
  }
}

// The writers' automatic block size: row / 16, a power of two in [64, max].
TEST(ChecksumTest, AutoCrcBlockSizeKnownAnswers) {
  EXPECT_EQ(AutoCrcBlockSize(0, 64 << 10), 64u);
  EXPECT_EQ(AutoCrcBlockSize(100, 64 << 10), 64u);
  EXPECT_EQ(AutoCrcBlockSize(2048, 64 << 10), 128u);
  EXPECT_EQ(AutoCrcBlockSize(4096, 64 << 10), 256u);
  EXPECT_EQ(AutoCrcBlockSize(65535, 64 << 10), 2048u);
  EXPECT_EQ(AutoCrcBlockSize(65536, 64 << 10), 4096u);
  EXPECT_EQ(AutoCrcBlockSize(1ull << 30, 64 << 10), 64u << 10);
  EXPECT_EQ(AutoCrcBlockSize(1ull << 30, 256 << 10), 256u << 10);
}

// FindBadBlock agrees with a comparison of one Crc32 per block: nullopt on
// intact bytes, else the first damaged block and its computed CRC -- for any
// block count (the four combined chains, their remainder, a short last block).
TEST(ChecksumTest, FindBadBlockNamesTheFirstDamagedBlock) {
  std::mt19937_64 rng(13);
  std::vector<std::byte> data(70000);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  for (uint64_t block : {64u, 256u, 4096u}) {
    for (size_t size :
         {size_t{64}, size_t{256}, size_t{300}, size_t{4096}, size_t{12345}, data.size()}) {
      std::vector<std::byte> bytes(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(size));
      std::vector<uint32_t> table((size + block - 1) / block);
      BlockCrc32s(bytes, block, table.data());
      uint32_t got = 0xdeadbeef;
      EXPECT_EQ(FindBadBlock(bytes, block, table, &got), std::nullopt) << block << " " << size;
      for (size_t at : {size_t{0}, size / 2, size - 1}) {
        std::vector<std::byte> bad = bytes;
        bad[at] ^= std::byte{0x04};
        auto j = FindBadBlock(bad, block, table, &got);
        ASSERT_TRUE(j.has_value()) << block << " " << size << " flip at " << at;
        EXPECT_EQ(*j, at / block);
        const uint64_t len = std::min<uint64_t>(block, size - *j * block);
        EXPECT_EQ(got, Crc32(std::span<const std::byte>(bad).subspan(*j * block, len)));
        // With the caller's span CRC: the same verdict, and the same block.
        EXPECT_EQ(FindBadBlock(bad, block, table, &got, Crc32(bad)), j);
        EXPECT_EQ(FindBadBlock(bytes, block, table, &got, Crc32(bytes)), std::nullopt);
        // A span CRC that is not the bytes' own sends it to the per-block
        // search, which finds every block intact.
        EXPECT_EQ(FindBadBlock(bytes, block, table, &got, Crc32(bytes) ^ 1u), std::nullopt);
        // A damaged table entry is found the same way.
        std::vector<uint32_t> bad_table = table;
        bad_table[at / block] ^= 1;
        j = FindBadBlock(bytes, block, bad_table, &got);
        ASSERT_TRUE(j.has_value());
        EXPECT_EQ(*j, at / block);
      }
    }
  }
}

TEST(FileTest, AtomicWriteAndReads) {
  std::string dir = ::testing::TempDir() + "/core_file_test_" + std::to_string(getpid());
  ASSERT_TRUE(CreateDirectories(dir).ok());
  std::string path = dir + "/a.txt";
  ASSERT_TRUE(WriteLocalFileAtomically(path, "hello world").ok());
  ASSERT_TRUE(WriteLocalFileAtomically(path, "second").ok());
  auto content = ReadLocalFile(path);
  ASSERT_TRUE(content.ok());
  EXPECT_EQ(*content, "second");
  auto f = OpenLocalFile(path, /*mmap=*/true);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->size(), 6u);
  EXPECT_EQ(std::memcmp((*f)->mapped_data(), "second", 6), 0);
  std::array<std::byte, 4> buf;
  EXPECT_EQ((*f)->ReadExactlyAt(4, buf).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(OpenLocalFile(dir + "/missing").status().code(), StatusCode::kNotFound);
  // Only the target remains: no temp files left behind.
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  EXPECT_EQ(n, 1);
  std::filesystem::remove_all(dir);
}

// WriteLocalFileAtomically replaces a file by a new one (a reader of the old
// one keeps its bytes), writes empty files, gives new files the mode a plain
// create gives, and fails on a missing folder naming the path.
TEST(FileTest, AtomicWriteReplacesWholeFilesAndFailsCleanly) {
  const std::string dir = ::testing::TempDir() + "/core_atomic_test_" + std::to_string(getpid());
  ASSERT_TRUE(CreateDirectories(dir).ok());
  const std::string path = dir + "/.metadata";
  for (bool sync : {false, true}) {
    ASSERT_TRUE(WriteLocalFileAtomically(path, "old bytes", sync).ok());
    auto old = OpenLocalFile(path, /*mmap=*/false);
    ASSERT_TRUE(old.ok());
    ASSERT_TRUE(WriteLocalFileAtomically(path, "new", sync).ok());
    std::array<std::byte, 9> buf;
    ASSERT_TRUE((*old)->ReadExactlyAt(0, buf).ok());
    EXPECT_EQ(std::memcmp(buf.data(), "old bytes", 9), 0);
    auto now = ReadLocalFile(path);
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(*now, "new");
  }
  ASSERT_TRUE(WriteLocalFileAtomically(dir + "/empty", "", false).ok());
  EXPECT_EQ(std::filesystem::file_size(dir + "/empty"), 0u);
  const mode_t mask = umask(0);
  umask(mask);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u & ~mask);
  const Status missing = WriteLocalFileAtomically(dir + "/no/such/folder/x", "x", false);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.ToString().find(dir + "/no/such/folder/x"), std::string::npos)
      << missing.ToString();
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) n += e.is_regular_file();
  EXPECT_EQ(n, 2);  // .metadata and empty: no temp files
  std::filesystem::remove_all(dir);
}

// A folder where an atomic write puts its file: the write fails, with or
// without sync, and the folder and its content stay (a no-sync write swaps
// only a regular file with its temp file).
TEST(FileTest, AtomicWriteOverAFolderFailsAndKeepsIt) {
  const std::string dir = ::testing::TempDir() + "/core_atomic_dir_" + std::to_string(getpid());
  const std::string target = dir + "/index.json";
  ASSERT_TRUE(CreateDirectories(target).ok());
  ASSERT_TRUE(WriteLocalFileAtomically(target + "/inside", "kept", true).ok());
  for (bool sync : {false, true}) {
    const Status s = WriteLocalFileAtomically(target, "new", sync);
    EXPECT_FALSE(s.ok()) << "sync " << sync;
    EXPECT_NE(s.ToString().find(target), std::string::npos) << s.ToString();
    EXPECT_TRUE(std::filesystem::is_directory(target));
    auto inside = ReadLocalFile(target + "/inside");
    ASSERT_TRUE(inside.ok()) << inside.status().ToString();
    EXPECT_EQ(*inside, "kept");
    const auto entries = std::distance(std::filesystem::directory_iterator(dir),
                                       std::filesystem::directory_iterator());
    EXPECT_EQ(entries, 1) << "a temp file or the swapped folder was left in " << dir;
  }
  std::filesystem::remove_all(dir);
}

// A no-sync atomic write over an existing file leaves the new bytes to the
// kernel's writeback: on ext4 a plain rename over a file would start writing
// them inside the rename (auto_da_alloc), which waits behind the writeback of
// everything written before (43-89 ms measured after a 2 GiB save). ext4 and
// a kernel with cachestat (6.5+) only; the new file's pages must all still be
// dirty right after the write (three tries: the flusher may take them).
TEST(FileTest, NoSyncAtomicReplaceDoesNotFlushTheNewFile) {
  const std::string dir = ::testing::TempDir() + "/core_atomic_flush_" + std::to_string(getpid());
  ASSERT_TRUE(CreateDirectories(dir).ok());
  struct statfs sf {};
  ASSERT_EQ(statfs(dir.c_str(), &sf), 0);
  if (sf.f_type != 0xEF53) {  // EXT4_SUPER_MAGIC
    std::filesystem::remove_all(dir);
    GTEST_SKIP() << dir << " is not on ext4";
  }
  struct Range {
    uint64_t off, len;
  };
  struct Stat {
    uint64_t cache, dirty, writeback, evicted, recently_evicted;
  };
  constexpr long kCachestat = 451;  // __NR_cachestat on every architecture
  const std::string path = dir + "/model.mega.index.json";
  const std::string data(1 << 20, 'x');
  bool all_dirty = false;
  std::string seen;
  for (int attempt = 0; attempt < 3 && !all_dirty; ++attempt) {
    ASSERT_TRUE(WriteLocalFileAtomically(path, "previous", /*sync=*/true).ok());
    ASSERT_TRUE(WriteLocalFileAtomically(path, data, /*sync=*/false).ok());
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    Range range{0, 0};
    Stat st{};
    const long r = syscall(kCachestat, fd, &range, &st, 0);
    const int err = errno;
    close(fd);
    if (r != 0) {
      std::filesystem::remove_all(dir);
      GTEST_SKIP() << "no cachestat: " << std::strerror(err);
    }
    all_dirty = st.dirty == data.size() / 4096;
    seen += " cached " + std::to_string(st.cache) + " dirty " + std::to_string(st.dirty) +
            " writeback " + std::to_string(st.writeback) + ";";
  }
  EXPECT_TRUE(all_dirty) << "the replace wrote the new file out:" << seen;
  auto now = ReadLocalFile(path);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(*now, data);
  std::filesystem::remove_all(dir);
}

// Where two byte strings first differ ("equal" when they do not; sizes too),
// so a failing comparison of megabytes prints one line.
std::string FirstDifference(const std::string& got, const std::string& want) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) return "first difference at byte " + std::to_string(i);
  }
  if (got.size() != want.size()) {
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  }
  return "equal";
}

// WritableFile::UseDirectIo on a local file: writes from several threads at
// once, of every shape direct I/O meets (whole blocks from memory aligned like
// the file and from memory that is not, heads and tails of blocks, writes
// inside one block and across two without a whole one, gaps never written,
// appends, a block rewritten after it went out whole and a partial one after a
// Sync) leave exactly the bytes buffered writes would, at the exact size, at
// Sync and at Close. A file system that refuses O_DIRECT (tmpfs on old
// kernels) skips the test.
TEST(FileTest, DirectIoWritesTheBytesBufferedWritesWould) {
  test_util::TempDir dir;
  const std::string path = dir.path() + "/direct.bin";
  auto made = CreateLocalFile(path);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  WritableFile& f = **made;
  EXPECT_FALSE(f.direct_io());
  EXPECT_EQ(WritePieceFor(f), kCrcWritePiece);
  if (!f.UseDirectIo())
    GTEST_SKIP() << "the file system under " << dir.path() << " refuses O_DIRECT";
  EXPECT_TRUE(f.UseDirectIo());  // taken once, stays taken
  EXPECT_TRUE(f.direct_io());
  EXPECT_EQ(WritePieceFor(f), kDirectWritePiece);  // the writers' pieces on it

  constexpr uint64_t kB = 4096;
  constexpr uint64_t kSize = 5 * (1 << 20) + 1234;
  std::mt19937_64 rng(7);
  // The bytes written at file offset o come from src[o + shift]; src is 4 KiB
  // aligned, so shift 0 is the aligned case, 1, 2, 3 and 64 the bounced one.
  constexpr uint64_t kBufBytes = (kSize + 3 * kB) / kB * kB;  // aligned_alloc: a multiple of kB
  std::unique_ptr<char, decltype(&std::free)> buf(
      static_cast<char*>(std::aligned_alloc(kB, kBufBytes)), &std::free);
  ASSERT_NE(buf, nullptr);
  char* src = buf.get();
  for (uint64_t i = 0; i < kBufBytes; ++i) src[i] = static_cast<char>(rng());
  std::string want(kSize, '\0');
  struct Range {
    uint64_t begin, end, shift;
  };
  std::vector<Range> ranges = {
      {0, 100, 1},                   // inside block 0
      {100, 3 * kB + 7, 0},          // rest of block 0, two whole blocks, a head of block 3
      {3 * kB + 7, 3 * kB + 9, 64},  // inside block 3
      {3 * kB + 9, 5 * kB + 10, 1},  // tail of 3, block 4, head of 5 (source off the grid)
      {5 * kB + 10, 6 * kB + 5, 0},  // across blocks 5 and 6, no whole block
      // [6 kB + 5, 8 kB): never written, reads as zeros
      {8 * kB, (1 << 20) + 3, 0},  // whole blocks, then a head
      {(1 << 20) + 3, (3 << 20) + 333, 64},
      {(3 << 20) + 333, (3 << 20) + 400, 1},
      // [(3 << 20) + 400, 4 MiB + 17): never written
      {(4 << 20) + 17, kSize - 1000, 0},
  };
  const auto* base = reinterpret_cast<const std::byte*>(src);
  auto write = [&](const Range& r) -> Status {
    return f.WriteAt(r.begin, {base + r.begin + r.shift, r.end - r.begin});
  };
  // Every range on its own thread, all at once.
  std::vector<Status> status(ranges.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranges.size(); ++i)
    threads.emplace_back([&, i] { status[i] = write(ranges[i]); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << "range " << i << ": " << status[i].ToString();
    const Range& r = ranges[i];
    want.replace(r.begin, r.end - r.begin, src + r.begin + r.shift, r.end - r.begin);
  }
  // Appends at the end (kSize - 1000), in odd sizes.
  for (uint64_t at = kSize - 1000; at < kSize;) {
    const uint64_t n = std::min<uint64_t>(333, kSize - at);
    ASSERT_TRUE(f.Append({base + at, n}).ok());
    want.replace(at, n, src + at, n);
    at += n;
  }
  EXPECT_EQ(f.size(), kSize);
  ASSERT_TRUE(f.Sync().ok());
  EXPECT_EQ(std::filesystem::file_size(path), kSize);
  EXPECT_EQ(FirstDifference(*ReadLocalFile(path), want), "equal") << "after Sync";
  // After the Sync: rewrite bytes of a block that went out whole (block 1),
  // and of a partial one that went out at the Sync (block 6, with its gap).
  const Range again[] = {{kB + 10, kB + 20, 2}, {6 * kB + 100, 6 * kB + 200, 3}};
  for (const Range& r : again) {
    ASSERT_TRUE(write(r).ok());
    want.replace(r.begin, r.end - r.begin, src + r.begin + r.shift, r.end - r.begin);
  }
  ASSERT_TRUE(f.Close().ok());
  EXPECT_EQ(std::filesystem::file_size(path), kSize);
  EXPECT_EQ(FirstDifference(*ReadLocalFile(path), want), "equal") << "after Close";
}

// UseDirectIo is refused once bytes are written: they went through the page cache.
TEST(FileTest, DirectIoIsRefusedAfterTheFirstWrite) {
  test_util::TempDir dir;
  auto f = CreateLocalFile(dir.path() + "/late.bin");
  ASSERT_TRUE(f.ok());
  const std::string bytes = "abc";
  ASSERT_TRUE((*f)->Append(std::as_bytes(std::span<const char>(bytes.data(), bytes.size()))).ok());
  EXPECT_FALSE((*f)->UseDirectIo());
  EXPECT_FALSE((*f)->direct_io());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(*ReadLocalFile(dir.path() + "/late.bin"), "abc");
}

// Writes `size` pseudo-random bytes (from `seed`) to `path`; returns them.
std::string WriteRandomFile(const std::string& path, size_t size, uint64_t seed) {
  std::string bytes(size, '\0');
  std::mt19937_64 rng(seed);
  for (auto& c : bytes) c = static_cast<char>(rng());
  EXPECT_TRUE(WriteLocalFileAtomically(path, bytes, /*sync=*/false).ok()) << path;
  return bytes;
}

// ReadExactlyAtWithCrc32 of a local file: the bytes and Crc32Extend(crc, bytes)
// of ReadExactlyAt, whether the range goes through the mapped windows (4 MiB
// and up; the first window always does) or pread (smaller), from offsets off
// the page grid, up to the end of the file; past the end, and on a file cut
// short after it was opened, an OutOfRange error naming the file (no SIGBUS).
TEST(FileTest, ReadExactlyAtWithCrc32MatchesReadAndCrc32) {
  test_util::TempDir dir;
  const std::string path = dir.path() + "/data.bin";
  const std::string bytes = WriteRandomFile(path, (20u << 20) + 123, 14);
  auto f = OpenLocalFile(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const auto all = AsBytes(bytes);
  struct Case {
    uint64_t offset, size;
  };
  for (const Case& c :
       {Case{0, 9u << 20}, Case{4097, (12u << 20) + 5}, Case{4096, 1u << 20}, Case{3, 100},
        Case{(8u << 20) + 1, bytes.size() - (8u << 20) - 1}, Case{0, bytes.size()}}) {
    SCOPED_TRACE("offset " + std::to_string(c.offset) + " size " + std::to_string(c.size));
    std::vector<std::byte> dst(c.size);
    auto crc = (*f)->ReadExactlyAtWithCrc32(c.offset, dst, 0x9e3779b9u);
    ASSERT_TRUE(crc.ok()) << crc.status().ToString();
    const auto want = all.subspan(c.offset, c.size);
    EXPECT_EQ(*crc, Crc32Extend(0x9e3779b9u, want));
    EXPECT_TRUE(std::equal(dst.begin(), dst.end(), want.begin()));
  }
  for (uint64_t size : {uint64_t{100}, uint64_t{6u << 20}}) {
    std::vector<std::byte> dst(size);
    auto past = (*f)->ReadExactlyAtWithCrc32(bytes.size() - size / 2, dst);
    EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange) << size;
    EXPECT_NE(past.status().message().find(path), std::string::npos) << past.status().ToString();
  }
  // Cut short after the open: the size seen at open no longer holds; the
  // populate of the missing pages fails and pread reports the short read.
  ASSERT_EQ(truncate(path.c_str(), 5u << 20), 0);
  std::vector<std::byte> dst(12u << 20);
  auto cut = (*f)->ReadExactlyAtWithCrc32(0, dst);
  EXPECT_EQ(cut.status().code(), StatusCode::kOutOfRange) << cut.status().ToString();
}

TEST(FileTest, CopyMappedRangeCopiesAndChecksumsAndNamesTheFileOnError) {
  test_util::TempDir dir;
  const std::string path = dir.path() + "/data.bin";
  const std::string bytes = WriteRandomFile(path, (3u << 20) + 77, 15);
  const auto all = AsBytes(bytes);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  for (uint64_t offset : {uint64_t{0}, uint64_t{4095}, uint64_t{(1u << 20) + 17}}) {
    SCOPED_TRACE("offset " + std::to_string(offset));
    const uint64_t n = bytes.size() - offset;
    std::vector<std::byte> plain(n), checked(n);
    ASSERT_TRUE(CopyMappedRange(fd, offset, plain, path).ok());
    EXPECT_TRUE(
        std::equal(plain.begin(), plain.end(), all.begin() + static_cast<ptrdiff_t>(offset)));
    uint32_t crc = 0x1234u;
    double populate = -1;
    ASSERT_TRUE(CopyMappedRange(fd, offset, checked, path, &crc, &populate).ok());
    EXPECT_EQ(plain, checked);
    EXPECT_EQ(crc, Crc32Extend(0x1234u, all.subspan(offset)));
    EXPECT_GE(populate, 0.0);
  }
  close(fd);
  // A descriptor that cannot be mapped read-only: the errno's Status, naming
  // the file and the call; nothing is copied.
  const int wfd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(wfd, 0);
  std::vector<std::byte> dst(4096, std::byte{0x5a});
  Status s = CopyMappedRange(wfd, 0, dst, path);
  close(wfd);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path + ": mmap"), std::string::npos) << s.ToString();
  EXPECT_TRUE(
      std::all_of(dst.begin(), dst.end(), [](std::byte b) { return b == std::byte{0x5a}; }));
}

}  // namespace
}  // namespace megackpt::inline core
