#include "megackpt/core/checksum.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <type_traits>

#include "core/checksum_kernels.h"
#include "megackpt/core/endian.h"
#include "megackpt/core/text.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace megackpt::inline core {

namespace {

// ISA-L's gzip-reflected CRC is zlib's crc32 (same init/xorout convention).
uint32_t IsalCrc32Extend(uint32_t crc, std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  size_t left = data.size();
  while (left > 0) {
    uint64_t n = std::min<size_t>(left, 1ull << 30);
    crc = crc32_gzip_refl(crc, p, n);
    p += n;
    left -= n;
  }
  return crc;
}

}  // namespace

// ---- CRC-32 combination ---------------------------------------------------------
// Appending len_b zero bytes to A is a linear map on the CRC register over GF(2);
// we apply it by repeated squaring of the one-zero-bit operator, then xor crc(B).

namespace {

uint32_t Gf2Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

void Gf2Square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2Times(mat, mat[n]);
}

// op[k] appends 2^k zero bytes to a CRC register (as a 32x32 GF(2) matrix).
struct ZeroOperators {
  uint32_t op[64][32];
  ZeroOperators() {
    uint32_t one_bit[32], a[32], b[32];
    one_bit[0] = 0xEDB88320u;  // reflected polynomial: operator for one zero bit
    for (int n = 1; n < 32; ++n) one_bit[n] = 1u << (n - 1);
    Gf2Square(a, one_bit);  // 2 bits
    Gf2Square(b, a);        // 4 bits
    Gf2Square(op[0], b);    // 8 bits = 1 byte
    for (int k = 1; k < 64; ++k) Gf2Square(op[k], op[k - 1]);
  }
};

}  // namespace

uint64_t AutoCrcBlockSize(uint64_t row_bytes, uint64_t max_block) {
  uint64_t bs = 64;
  while (bs < max_block && bs * 2 * 16 <= row_bytes) bs *= 2;
  return bs;
}

std::span<const std::byte> EncodeBlockTableInPlace(std::vector<uint32_t>& crcs) {
  for (uint32_t& c : crcs) StoreLE32(&c, c);
  return std::as_bytes(std::span<const uint32_t>(crcs));
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  if (len_b == 0) return crc_a;
  if (crc_a == 0) return crc_b;  // the zero-append operator is linear: 0 stays 0
  static const ZeroOperators kOps;
  for (int k = 0; len_b != 0; ++k, len_b >>= 1) {
    if (len_b & 1) crc_a = Gf2Times(kOps.op[k], crc_a);
  }
  return crc_a ^ crc_b;
}

Crc32Shift::Crc32Shift(uint64_t len_b) : len_(len_b) {
  // The map is linear: its value on each of the 32 basis bits, then every byte
  // value of each byte position as an xor of those.
  uint32_t basis[32];
  for (int bit = 0; bit < 32; ++bit) basis[bit] = Crc32Combine(1u << bit, 0, len_b);
  for (int k = 0; k < 4; ++k) {
    for (uint32_t v = 0; v < 256; ++v) {
      uint32_t sum = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (v >> bit & 1) sum ^= basis[8 * k + bit];
      }
      table_[k][v] = sum;
    }
  }
}

namespace {
// The combine table for blocks of `len` bytes, kept per thread and rebuilt
// (~10 us) only when the block size differs from the previous stream's.
std::shared_ptr<const Crc32Shift> ShiftFor(uint64_t len) {
  thread_local std::shared_ptr<const Crc32Shift> last;
  if (!last || last->len() != len) last = std::make_shared<const Crc32Shift>(len);
  return last;
}

// The CRC of the concatenation of blocks of shift.len() bytes each, from their
// CRCs: four quarters, each a serial chain of Appends, run side by side (one
// chain is bound by the latency of its table lookups), then joined.
uint32_t CombineFullBlocks(const Crc32Shift& shift, std::span<const uint32_t> crcs) {
  const uint64_t full = crcs.size(), block = shift.len();
  const uint64_t m = full / 4;
  uint32_t c[4] = {0, 0, 0, 0};
  const uint32_t* e = crcs.data();
  for (uint64_t j = 0; j < m; ++j) {
    c[0] = shift.Append(c[0], e[j]);
    c[1] = shift.Append(c[1], e[m + j]);
    c[2] = shift.Append(c[2], e[2 * m + j]);
    c[3] = shift.Append(c[3], e[3 * m + j]);
  }
  for (uint64_t j = 4 * m; j < full; ++j) c[3] = shift.Append(c[3], e[j]);
  uint32_t combined = Crc32Combine(c[0], c[1], m * block);
  combined = Crc32Combine(combined, c[2], m * block);
  return Crc32Combine(combined, c[3], (full - 3 * m) * block);
}
}  // namespace

std::optional<size_t> FindBadBlock(std::span<const std::byte> bytes, uint64_t block,
                                   std::span<const uint32_t> expected, uint32_t* got,
                                   std::optional<uint32_t> span_crc) {
  const uint64_t full = bytes.size() / block;
  const uint64_t tail = bytes.size() - full * block;
  if (expected.size() != full + (tail > 0 ? 1 : 0)) {
    // A caller bug; the slow path below names block 0 or the first extra one.
    *got = 0;
    return std::min<size_t>(expected.size(), full);
  }
  const uint32_t* e = expected.data();
  uint32_t combined = CombineFullBlocks(*ShiftFor(block), std::span<const uint32_t>(e, full));
  if (tail > 0) combined = Crc32Combine(combined, e[full], tail);
  if ((span_crc ? *span_crc : Crc32(bytes)) == combined) return std::nullopt;
  // They disagree: find the block, in batches of BlockCrc32s.
  constexpr uint64_t kBatch = 256;
  uint32_t batch[kBatch];
  for (uint64_t j0 = 0; j0 < expected.size(); j0 += kBatch) {
    const uint64_t k = std::min<uint64_t>(kBatch, expected.size() - j0);
    const uint64_t from = j0 * block;
    BlockCrc32s(bytes.subspan(from, std::min<uint64_t>(k * block, bytes.size() - from)), block,
                batch);
    for (uint64_t j = 0; j < k; ++j) {
      if (batch[j] != e[j0 + j]) {
        *got = batch[j];
        return j0 + j;
      }
    }
  }
  // Every block matches: only a caller's span_crc that is not the bytes' own
  // gets here (equal blocks combine to the span's CRC).
  return std::nullopt;
}

BlockCrc32Stream::BlockCrc32Stream(uint64_t block, uint64_t expected_bytes) : block_(block) {
  if (block_ == 0) return;
  shift_ = ShiftFor(block_);
  blocks_.reserve(static_cast<size_t>(expected_bytes / block_ + 1));
}

void BlockCrc32Stream::Add(std::span<const std::byte> data) {
  if (block_ == 0) {
    whole_ = Crc32Extend(whole_, data);
    return;
  }
  if (in_block_ > 0) {  // finish the open block
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block_ - in_block_, data.size()));
    cur_ = Crc32Extend(cur_, data.first(n));
    in_block_ += n;
    data = data.subspan(n);
    if (in_block_ == block_) CloseBlock();
  }
  if (const uint64_t k = data.size() / block_; k > 0) {  // whole blocks
    const size_t old = blocks_.size();
    blocks_.resize(old + static_cast<size_t>(k));
    BlockCrc32s(data.first(static_cast<size_t>(k * block_)), block_, blocks_.data() + old);
    const uint32_t run =
        CombineFullBlocks(*shift_, std::span<const uint32_t>(blocks_.data() + old, k));
    whole_ = Crc32Combine(whole_, run, k * block_);
    data = data.subspan(static_cast<size_t>(k * block_));
  }
  if (!data.empty()) {  // opens a block
    cur_ = Crc32Extend(0, data);
    in_block_ = data.size();
  }
}

void BlockCrc32Stream::Finish() {
  if (in_block_ == 0) return;
  whole_ = Crc32Combine(whole_, cur_, in_block_);  // the short last block
  blocks_.push_back(cur_);
  cur_ = 0;
  in_block_ = 0;
}

void BlockCrc32Stream::CloseBlock() {
  whole_ = shift_->Append(whole_, cur_);
  blocks_.push_back(cur_);
  cur_ = 0;
  in_block_ = 0;
}

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr);
}
Sha256::~Sha256() {
  if (impl_ && impl_->ctx) EVP_MD_CTX_free(impl_->ctx);
}
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(std::span<const std::byte> data) {
  EVP_DigestUpdate(impl_->ctx, data.data(), data.size());
}

Sha256Digest Sha256::Finish() {
  Sha256Digest out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, out.data(), &len);
  return out;
}

Sha256Digest Sha256Of(std::span<const std::byte> data) {
  Sha256 h;
  h.Update(data);
  return h.Finish();
}

std::string ToHex(std::span<const uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(bytes.size() * 2, '0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

Status FromHex(std::string_view hex, std::span<uint8_t> out) {
  if (hex.size() != out.size() * 2) {
    return InvalidArgumentError("hex string of length " + std::to_string(hex.size()) +
                                ", expected " + std::to_string(out.size() * 2));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexDigitValue(hex[2 * i]), lo = HexDigitValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgumentError("invalid hex character at position " + std::to_string(2 * i));
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return Status::OK();
}

std::string RandomHex(size_t n_bytes) {
  std::string bytes(n_bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n_bytes)) != 1) {
    // OpenSSL's generator failing is practically impossible; fall back to the
    // OS entropy source rather than returning predictable ids.
    std::random_device rd;
    for (auto& c : bytes) c = static_cast<char>(rd());
  }
  return ToHex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), n_bytes));
}

namespace {

#if defined(__x86_64__)
// CRC-32 (reflected 0xEDB88320) by carry-less multiplication: fold 64 bytes at
// a time into four 128-bit lanes, fold the lanes into one, reduce 128 -> 64 ->
// 32 bits (Barrett). Constants x^k mod P as in Gopal et al., "Fast CRC
// Computation for Generic Polynomials Using PCLMULQDQ" (Intel, 2009) and the
// Linux crc32-pclmul code.
#define MEGACKPT_CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))

// The constants, one place for both register widths. A fold over d bytes
// multiplies a 128-bit lane's low and high halves by (x^(8d+32), x^(8d-32))
// mod P, bit-reflected and shifted left by one (for 16 and 64 bytes the values
// of the references above; 32 and 48 computed the same way). ChecksumTest
// checks every kernel against one zlib-compatible CRC per block.
constexpr long long kFold256[2] = {0x11542778a, 0x1322d1430};  // CopyWithCrc32's four lanes
constexpr long long kFold64[2] = {0x154442bd4, 0x1c6e41596};
constexpr long long kFold48[2] = {0x03db1ecdc, 0x174359406};
constexpr long long kFold32[2] = {0x0f1da05aa, 0x15a546366};
constexpr long long kFold16[2] = {0x1751997d0, 0x0ccaa009e};
constexpr long long kFold64To32 = 0x163cd6124;                 // x^64 mod P: 64 -> 32 bits
constexpr long long kBarrett[2] = {0x1db710641, 0x1f7011641};  // P' and mu'

MEGACKPT_CLMUL_TARGET inline __m128i Pair(const long long (&k)[2]) {
  return _mm_set_epi64x(k[1], k[0]);
}

MEGACKPT_CLMUL_TARGET inline __m128i Fold16(__m128i x, __m128i k, __m128i data) {
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), data);
}

MEGACKPT_CLMUL_TARGET inline __m128i Load16(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The last steps of a folded CRC: 128 -> 64 -> 32 bits (Barrett), the final xor.
MEGACKPT_CLMUL_TARGET inline uint32_t ReduceClmul(__m128i x0) {
  const __m128i k4k3 = Pair(kFold16);
  const __m128i k5 = _mm_set_epi64x(0, kFold64To32);
  const __m128i poly = Pair(kBarrett);
  const __m128i low32 = _mm_set_epi32(0, 0, 0, -1);
  __m128i t = _mm_clmulepi64_si128(x0, k4k3, 0x10);  // 128 -> 64 bits
  x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
  t = _mm_clmulepi64_si128(_mm_and_si128(x0, low32), k5, 0x00);  // 64 -> 32 bits
  x0 = _mm_xor_si128(_mm_srli_si128(x0, 4), t);
  t = _mm_and_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, low32), poly, 0x10), low32);  // Barrett
  x0 = _mm_xor_si128(x0, _mm_clmulepi64_si128(t, poly, 0x00));
  return ~static_cast<uint32_t>(_mm_extract_epi32(x0, 1));
}

// zlib crc32(0, .) of each of the kWays consecutive blocks of n bytes at p,
// into out[0..kWays). The blocks' fold chains are independent and interleaved:
// one block's chain is bound by the multiplier's latency (a 256-byte block
// keeps it busy a third of the time), several in flight keep it full.
// REQUIRES: n >= 64, n % 16 == 0.
template <int kWays>
MEGACKPT_CLMUL_TARGET void Crc32ClmulBlocks(const std::byte* p, uint64_t n, uint32_t* out) {
  const __m128i k2k1 = Pair(kFold64);
  const __m128i k4k3 = Pair(kFold16);
  __m128i x[kWays][4];
#pragma GCC unroll 8
  for (int w = 0; w < kWays; ++w) {
    const std::byte* b = p + w * n;
    x[w][0] = _mm_xor_si128(Load16(b), _mm_cvtsi32_si128(-1));  // initial value ~0
    x[w][1] = Load16(b + 16);
    x[w][2] = Load16(b + 32);
    x[w][3] = Load16(b + 48);
  }
  uint64_t off = 64;
  for (; off + 64 <= n; off += 64) {
#pragma GCC unroll 8
    for (int w = 0; w < kWays; ++w) {
      const std::byte* b = p + w * n + off;
      x[w][0] = Fold16(x[w][0], k2k1, Load16(b));
      x[w][1] = Fold16(x[w][1], k2k1, Load16(b + 16));
      x[w][2] = Fold16(x[w][2], k2k1, Load16(b + 32));
      x[w][3] = Fold16(x[w][3], k2k1, Load16(b + 48));
    }
  }
#pragma GCC unroll 8
  for (int w = 0; w < kWays; ++w) {
    x[w][0] = Fold16(x[w][0], k4k3, x[w][1]);
    x[w][0] = Fold16(x[w][0], k4k3, x[w][2]);
    x[w][0] = Fold16(x[w][0], k4k3, x[w][3]);
  }
  for (; off + 16 <= n; off += 16) {
#pragma GCC unroll 8
    for (int w = 0; w < kWays; ++w) x[w][0] = Fold16(x[w][0], k4k3, Load16(p + w * n + off));
  }
#pragma GCC unroll 8
  for (int w = 0; w < kWays; ++w) out[w] = ReduceClmul(x[w][0]);
}

// Crc32ClmulBlocks with 512-bit registers (AVX-512 VPCLMULQDQ): one register
// holds a 64-byte stretch of one block, so a block's four 128-bit lanes fold
// in one instruction pair. The ends of four blocks are then done together, one
// block per lane: each block's lanes fold onto its last lane in one multiply
// by per-lane constants (x^k mod P for 48, 32 and 16 bytes), a shuffle tree
// sums them into one register, and the 128 -> 32-bit reduction runs on all
// four lanes at once. On the bench VM (Zen 4, where a 512-bit carry-less
// multiply takes two cycles) that brings 256-byte blocks from ~27 to ~37 GB/s
// and 64-byte ones from ~10 to ~20 (data in cache): per-block lane folding and
// reduction in 128-bit registers had cost as much as the folding of the data.
#define MEGACKPT_VCLMUL_TARGET \
  __attribute__((target("avx512f,avx512vl,avx512bw,vpclmulqdq,pclmul,sse4.1")))

// GCC 12's broadcast/extract intrinsics pass an "undefined" vector that
// -Wuninitialized reports from inside the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
// The CRCs of four blocks from their folded 512-bit states x[0..4), into
// out[0..4).
MEGACKPT_VCLMUL_TARGET inline void ReduceFourVclmul(const __m512i* x, uint32_t* out) {
  // Lane j (bytes 16j..16j+16 of the last stretch) is folded over the 48 - 16j
  // bytes after it (kFold48, kFold32, kFold16 as (lo, hi) qword pairs); lane 3
  // is kept as is.
  const __m512i lane_fold = _mm512_set_epi64(0, 0, kFold16[1], kFold16[0], kFold32[1], kFold32[0],
                                             kFold48[1], kFold48[0]);
  __m512i f[4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    f[i] = _mm512_xor_si512(_mm512_clmulepi64_epi128(x[i], lane_fold, 0x00),
                            _mm512_clmulepi64_epi128(x[i], lane_fold, 0x11));
    f[i] = _mm512_mask_blend_epi64(0xC0, f[i], x[i]);
  }
  // Sum each block's four lanes: pairs (0^2, 1^3) of blocks 0,1 and 2,3, then
  // the pairs, so lane i of y is block i folded to 128 bits.
  const __m512i a = _mm512_xor_si512(_mm512_shuffle_i64x2(f[0], f[1], 0x44),
                                     _mm512_shuffle_i64x2(f[0], f[1], 0xEE));
  const __m512i b = _mm512_xor_si512(_mm512_shuffle_i64x2(f[2], f[3], 0x44),
                                     _mm512_shuffle_i64x2(f[2], f[3], 0xEE));
  __m512i y = _mm512_xor_si512(_mm512_shuffle_i64x2(a, b, 0x88), _mm512_shuffle_i64x2(a, b, 0xDD));
  // ReduceClmul on every lane.
  const __m512i k4k3 = _mm512_broadcast_i32x4(Pair(kFold16));
  const __m512i k5 = _mm512_broadcast_i32x4(_mm_set_epi64x(0, kFold64To32));
  const __m512i poly = _mm512_broadcast_i32x4(Pair(kBarrett));
  const __m512i low32 = _mm512_broadcast_i32x4(_mm_set_epi32(0, 0, 0, -1));
  __m512i t = _mm512_clmulepi64_epi128(y, k4k3, 0x10);  // 128 -> 64 bits
  y = _mm512_xor_si512(_mm512_bsrli_epi128(y, 8), t);
  t = _mm512_clmulepi64_epi128(_mm512_and_si512(y, low32), k5, 0x00);  // 64 -> 32 bits
  y = _mm512_xor_si512(_mm512_bsrli_epi128(y, 4), t);
  // Barrett
  t = _mm512_and_si512(_mm512_clmulepi64_epi128(_mm512_and_si512(y, low32), poly, 0x10), low32);
  y = _mm512_xor_si512(y, _mm512_clmulepi64_epi128(t, poly, 0x00));
  // Dword 1 of each lane, inverted (the final xor).
  const __m512i pick = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 13, 9, 5, 1);
  const __m128i crcs = _mm512_castsi512_si128(_mm512_permutexvar_epi32(pick, y));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_xor_si128(crcs, _mm_set1_epi32(-1)));
}

// REQUIRES: n >= 64, n % 64 == 0 (every stretch is a whole register).
MEGACKPT_VCLMUL_TARGET void Crc32VclmulFourBlocks(const std::byte* p, uint64_t n, uint32_t* out) {
  const __m512i k2k1 = _mm512_broadcast_i32x4(Pair(kFold64));
  const __m512i init = _mm512_zextsi128_si512(_mm_cvtsi32_si128(-1));  // initial value ~0
  __m512i x[4];
#pragma GCC unroll 4
  for (int w = 0; w < 4; ++w) x[w] = _mm512_xor_si512(_mm512_loadu_si512(p + w * n), init);
  for (uint64_t off = 64; off < n; off += 64) {
#pragma GCC unroll 4
    for (int w = 0; w < 4; ++w) {
      const __m512i lo = _mm512_clmulepi64_epi128(x[w], k2k1, 0x00);
      const __m512i hi = _mm512_clmulepi64_epi128(x[w], k2k1, 0x11);
      x[w] = _mm512_ternarylogic_epi64(lo, hi, _mm512_loadu_si512(p + w * n + off),
                                       0x96);  // a ^ b ^ c
    }
  }
  ReduceFourVclmul(x, out);
}

// a * x^(8d) folded onto data: one 512-bit fold over d bytes (k from kFold<d>).
MEGACKPT_VCLMUL_TARGET inline __m512i Fold64x4(__m512i a, __m512i k, __m512i data) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                   _mm512_clmulepi64_epi128(a, k, 0x11), data, 0x96);
}

// CopyWithCrc32's kernel: copies the whole 64-byte stretches of src (n & ~63
// bytes) into dst and returns the CRC of those bytes extended from `crc`. Four
// registers each fold every fourth stretch (over 256 bytes), so four fold
// chains are in flight while the loads wait on memory; they are then folded
// into one, which takes the stretches left over, and reduced.
// REQUIRES: n >= 256.
MEGACKPT_VCLMUL_TARGET uint32_t CopyCrc32Vclmul(uint32_t crc, std::byte* dst, const std::byte* src,
                                                uint64_t n) {
  const __m512i k256 = _mm512_broadcast_i32x4(Pair(kFold256));
  const __m512i k64 = _mm512_broadcast_i32x4(Pair(kFold64));
  __m512i x[4];
#pragma GCC unroll 4
  for (int w = 0; w < 4; ++w) {
    x[w] = _mm512_loadu_si512(src + 64 * w);
    _mm512_storeu_si512(dst + 64 * w, x[w]);
  }
  x[0] = _mm512_xor_si512(x[0], _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(~crc))));
  uint64_t off = 256;
  for (; off + 256 <= n; off += 256) {
#pragma GCC unroll 4
    for (int w = 0; w < 4; ++w) {
      const __m512i d = _mm512_loadu_si512(src + off + 64 * w);
      _mm512_storeu_si512(dst + off + 64 * w, d);
      x[w] = Fold64x4(x[w], k256, d);
    }
  }
  __m512i a = Fold64x4(Fold64x4(Fold64x4(x[0], k64, x[1]), k64, x[2]), k64, x[3]);
  for (; off + 64 <= n; off += 64) {
    const __m512i d = _mm512_loadu_si512(src + off);
    _mm512_storeu_si512(dst + off, d);
    a = Fold64x4(a, k64, d);
  }
  // ReduceFourVclmul ends four states at once; this one is ended alone.
  const __m512i same[4] = {a, a, a, a};
  uint32_t out[4];
  ReduceFourVclmul(same, out);
  return out[0];
}
#pragma GCC diagnostic pop

// The same kernels with 256-bit registers (AVX2 with VPCLMULQDQ, no AVX-512:
// AMD Zen 3, Intel client cores since Ice Lake). A 64-byte stretch of a block
// is two registers (lo: lanes 0-1, hi: lanes 2-3), each folded over 64 bytes.
// On a Zen 3 VM the 128-bit kernel was bound by the multiplier's throughput
// (256-byte blocks at ~12 GB/s in cache, the same as isa-l's Crc32): a 256-bit
// carry-less multiply does twice the work per instruction.
#define MEGACKPT_VCLMUL256_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))

// How far ahead of the bytes being folded the kernels ask for the cache lines
// they fold next (software prefetch). In a save the block CRCs read each piece
// from memory right before its pwrite while the other core copies into the
// page cache, and the loads of the four-blocks-in-flight kernels did not run
// ahead of their folds on their own.
// - 256-bit kernels, 8 KiB ahead: on the Zen 3 VM a 2 GiB no-sync fs save took
//   0.344 s instead of 0.378 at world 1 and 0.334 instead of 0.366 at world 2
//   (medians of 40, the two builds alternating), user time 0.17 s instead of
//   0.24; verified loads did not move (docs/benchmarks.md, "Prefetching ahead
//   of the CRC folds").
// - 512-bit kernel, 1.5 KiB ahead, blocks of 256 and 512 bytes only: on the
//   Intel VM of sessions 56-58 (AVX-512) one core's 256-byte block CRCs from
//   memory ran at ~10.9 GB/s instead of ~8.9 (two cores: 21.6 instead of
//   17.8), the 512-byte ones at ~11.8 instead of ~10.7; 4 KiB or more ahead
//   gained less or lost, and blocks of 1 KiB and more gained nothing
//   (docs/benchmarks.md, "Prefetching for the 512-bit kernel").
// Prefetches past the end of the bytes are harmless: they never fault, and the
// address is formed as an integer, not as a pointer past the end of an object.
constexpr uint64_t kCrcPrefetchAhead = 8192;
constexpr uint64_t kCrcPrefetchAhead512 = 1536;
constexpr uint64_t kMaxPrefetchedBlock512 = 512;

template <uint64_t kAhead = kCrcPrefetchAhead>
inline void PrefetchAhead(const std::byte* p, uint64_t n) {
  for (uint64_t i = 0; i < n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kAhead + i),
                 _MM_HINT_T0);
  }
}

MEGACKPT_VCLMUL256_TARGET inline __m256i Pair256(const long long (&lane1)[2],
                                                 const long long (&lane0)[2]) {
  return _mm256_set_m128i(Pair(lane1), Pair(lane0));
}

MEGACKPT_VCLMUL256_TARGET inline __m256i Load32(const std::byte* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// a * x^(8d) folded onto data, per 128-bit lane (k from kFold<d>, both lanes).
MEGACKPT_VCLMUL256_TARGET inline __m256i Fold32x2(__m256i a, __m256i k, __m256i data) {
  return _mm256_xor_si256(
      _mm256_xor_si256(_mm256_clmulepi64_epi128(a, k, 0x00), _mm256_clmulepi64_epi128(a, k, 0x11)),
      data);
}

// A folded 64-byte stretch (lanes 0..3 = lo's two, then hi's two) as one
// 128-bit lane at the stretch's last 16 bytes: lane j folded over the 48 - 16j
// bytes after it (lanes 0 and 1 in one multiply pair, lane 2 in another), then
// the four summed.
MEGACKPT_VCLMUL256_TARGET inline __m128i FoldStretch256(__m256i lo, __m256i hi) {
  const __m256i k48k32 = Pair256(kFold32, kFold48);
  const __m128i k16 = Pair(kFold16);
  const __m256i f = _mm256_xor_si256(_mm256_clmulepi64_epi128(lo, k48k32, 0x00),
                                     _mm256_clmulepi64_epi128(lo, k48k32, 0x11));
  const __m128i lane2 = _mm256_castsi256_si128(hi);
  const __m128i g = _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(lane2, k16, 0x00), _mm_clmulepi64_si128(lane2, k16, 0x11)),
      _mm256_extracti128_si256(hi, 1));
  return _mm_xor_si128(_mm_xor_si128(_mm256_castsi256_si128(f), _mm256_extracti128_si256(f, 1)), g);
}

// ReduceClmul on both 128-bit lanes of y: the CRCs of two folded blocks (lane
// 0 into out[0], lane 1 into out[1]).
MEGACKPT_VCLMUL256_TARGET inline void ReduceTwoVclmul256(__m256i y, uint32_t* out) {
  const __m256i k4k3 = _mm256_broadcastsi128_si256(Pair(kFold16));
  const __m256i k5 = _mm256_broadcastsi128_si256(_mm_set_epi64x(0, kFold64To32));
  const __m256i poly = _mm256_broadcastsi128_si256(Pair(kBarrett));
  const __m256i low32 = _mm256_broadcastsi128_si256(_mm_set_epi32(0, 0, 0, -1));
  __m256i t = _mm256_clmulepi64_epi128(y, k4k3, 0x10);  // 128 -> 64 bits
  y = _mm256_xor_si256(_mm256_srli_si256(y, 8), t);
  t = _mm256_clmulepi64_epi128(_mm256_and_si256(y, low32), k5, 0x00);  // 64 -> 32 bits
  y = _mm256_xor_si256(_mm256_srli_si256(y, 4), t);
  // Barrett
  t = _mm256_and_si256(_mm256_clmulepi64_epi128(_mm256_and_si256(y, low32), poly, 0x10), low32);
  y = _mm256_xor_si256(y, _mm256_clmulepi64_epi128(t, poly, 0x00));
  out[0] = ~static_cast<uint32_t>(_mm256_extract_epi32(y, 1));
  out[1] = ~static_cast<uint32_t>(_mm256_extract_epi32(y, 5));
}

// zlib crc32(0, .) of each of the four consecutive blocks of n bytes at p,
// into out[0..4): eight fold chains in flight (two per block).
// REQUIRES: n >= 64, n % 64 == 0.
MEGACKPT_VCLMUL256_TARGET void Crc32Vclmul256FourBlocks(const std::byte* p, uint64_t n,
                                                        uint32_t* out) {
  const __m256i k2k1 = _mm256_broadcastsi128_si256(Pair(kFold64));
  const __m256i init = _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, -1);  // initial value ~0
  __m256i lo[4], hi[4];
#pragma GCC unroll 4
  for (int w = 0; w < 4; ++w) {
    lo[w] = _mm256_xor_si256(Load32(p + w * n), init);
    hi[w] = Load32(p + w * n + 32);
  }
  for (uint64_t off = 64; off < n; off += 64) {
#pragma GCC unroll 4
    for (int w = 0; w < 4; ++w) {
      lo[w] = Fold32x2(lo[w], k2k1, Load32(p + w * n + off));
      hi[w] = Fold32x2(hi[w], k2k1, Load32(p + w * n + off + 32));
    }
  }
  ReduceTwoVclmul256(_mm256_set_m128i(FoldStretch256(lo[1], hi[1]), FoldStretch256(lo[0], hi[0])),
                     out);
  ReduceTwoVclmul256(_mm256_set_m128i(FoldStretch256(lo[3], hi[3]), FoldStretch256(lo[2], hi[2])),
                     out + 2);
}

// The 32 bytes at src + at, also stored to dst + at when kCopy.
template <bool kCopy>
MEGACKPT_VCLMUL256_TARGET inline __m256i Take32(std::byte* dst, const std::byte* src, uint64_t at) {
  const __m256i d = Load32(src + at);
  if constexpr (kCopy) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + at), d);
  return d;
}

// The CRC of src[0, n) extended from `crc`, with 256-bit registers; with
// kCopy the bytes are also copied to dst in the same pass (CopyWithCrc32).
// Eight registers each fold every eighth 32-byte stretch (over 256 bytes),
// then fold into one 64-byte stretch, which takes the stretches left over and
// is reduced.
// REQUIRES: n >= 256, n % 64 == 0.
template <bool kCopy>
MEGACKPT_VCLMUL256_TARGET uint32_t Crc32Vclmul256(uint32_t crc, std::byte* dst,
                                                  const std::byte* src, uint64_t n) {
  const __m256i k256 = _mm256_broadcastsi128_si256(Pair(kFold256));
  const __m256i k64 = _mm256_broadcastsi128_si256(Pair(kFold64));
  __m256i x[8];
#pragma GCC unroll 8
  for (int w = 0; w < 8; ++w) x[w] = Take32<kCopy>(dst, src, 32 * w);
  x[0] = _mm256_xor_si256(x[0], _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, static_cast<int>(~crc)));
  uint64_t off = 256;
  for (; off + 256 <= n; off += 256) {
    PrefetchAhead(src + off, 256);
#pragma GCC unroll 8
    for (int w = 0; w < 8; ++w) x[w] = Fold32x2(x[w], k256, Take32<kCopy>(dst, src, off + 32 * w));
  }
  __m256i lo = x[0], hi = x[1];
#pragma GCC unroll 3
  for (int j = 1; j < 4; ++j) {
    lo = Fold32x2(lo, k64, x[2 * j]);
    hi = Fold32x2(hi, k64, x[2 * j + 1]);
  }
  for (; off + 64 <= n; off += 64) {
    lo = Fold32x2(lo, k64, Take32<kCopy>(dst, src, off));
    hi = Fold32x2(hi, k64, Take32<kCopy>(dst, src, off + 32));
  }
  return ReduceClmul(FoldStretch256(lo, hi));
}

bool HasVclmul256() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq") &&
                          __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}

bool HasVclmul() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("vpclmulqdq") &&
                          __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}

// Blocks up to this size are folded inline; larger ones go to isa-l, whose
// per-call set-up no longer dominates.
constexpr uint64_t kMaxFoldedBlock = 512;

bool HasClmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}
#endif

}  // namespace

namespace checksum_internal {
namespace {
std::atomic<CrcKernels> g_kernels{CrcKernels::kBest};
}  // namespace
void LimitCrcKernelsForTest(CrcKernels kernels) {
  g_kernels.store(kernels, std::memory_order_relaxed);
}
}  // namespace checksum_internal

void BlockCrc32s(std::span<const std::byte> bytes, uint64_t block, uint32_t* out) {
  const uint64_t n = bytes.size();
  uint64_t off = 0;
#if defined(__x86_64__)
  using checksum_internal::CrcKernels;
  const CrcKernels kernels = checksum_internal::g_kernels.load(std::memory_order_relaxed);
  if (kernels != CrcKernels::kPortable && block >= 64 && block <= kMaxFoldedBlock &&
      block % 16 == 0) {
    // Several blocks in flight: the 512-bit form for whole-register blocks,
    // the 128-bit one for the rest (and the CPUs without AVX-512).
    auto run = [&](auto ways, auto fn) {
      constexpr int kWays = decltype(ways)::value;
      for (; off + kWays * block <= n; off += kWays * block, out += kWays)
        fn(bytes.data() + off, out);
    };
    // Four blocks in flight read four streams `block` bytes apart. From
    // memory, where a save's pieces come from, the 256-bit kernel ran 512-byte
    // blocks at ~8 GB/s on the Zen 3 VM (one core) against ~11.5 for 256-byte
    // ones, in cache at about the same speed. So there a block of 2 or 4
    // `sub`-byte sub-blocks is computed as those, four in flight (fn(p, sub,
    // crcs)), and its CRC joined from theirs with a fixed `sub`-byte shift
    // (four table lookups per join): 512-byte blocks ~12-15 GB/s from memory,
    // ~19-20 in cache (against ~21); no-sync saves of a state with 8 KiB rows
    // 13-16% faster (docs/benchmarks.md, "CRC blocks read from memory"). The
    // 512-bit kernel needs no such join: on an Intel VM with AVX-512 it ran
    // 512-byte blocks from memory at ~14 GB/s, at least as fast as any other
    // size (docs/benchmarks.md, "An Intel VM with AVX-512"). The 128-bit one
    // is left as it is: no CPU that runs it natively was measured.
    auto joined = [&](uint64_t sub, const Crc32Shift& shift, auto fn) {
      const uint64_t k = block / sub;
      for (; off + 4 * sub <= n; off += 4 * sub) {
        uint32_t c[4];
        fn(bytes.data() + off, sub, c);
        for (uint64_t b = 0; b < 4; b += k) {
          uint32_t crc = c[b];
          for (uint64_t j = 1; j < k; ++j) crc = shift.Append(crc, c[b + j]);
          *out++ = crc;
        }
      }
    };
    if (kernels == CrcKernels::kBest && HasVclmul() && block % 64 == 0) {
      if (block <= kMaxPrefetchedBlock512) {
        run(std::integral_constant<int, 4>{}, [&](const std::byte* p, uint32_t* o) {
          PrefetchAhead<kCrcPrefetchAhead512>(p, 4 * block);
          Crc32VclmulFourBlocks(p, block, o);
        });
      } else {
        run(std::integral_constant<int, 4>{},
            [&](const std::byte* p, uint32_t* o) { Crc32VclmulFourBlocks(p, block, o); });
      }
    } else if (kernels <= CrcKernels::kVclmul256 && HasVclmul256() && block == 512) {
      static const Crc32Shift kShift256(256);
      joined(256, kShift256, [](const std::byte* p, uint64_t sub, uint32_t* c) {
        PrefetchAhead(p, 4 * sub);
        Crc32Vclmul256FourBlocks(p, sub, c);
      });
    } else if (kernels <= CrcKernels::kVclmul256 && HasVclmul256() && block % 64 == 0) {
      run(std::integral_constant<int, 4>{}, [&](const std::byte* p, uint32_t* o) {
        PrefetchAhead(p, 4 * block);
        Crc32Vclmul256FourBlocks(p, block, o);
      });
    } else if (HasClmul()) {
      run(std::integral_constant<int, 4>{},
          [&](const std::byte* p, uint32_t* o) { Crc32ClmulBlocks<4>(p, block, o); });
    }
    if (HasClmul()) {
      run(std::integral_constant<int, 1>{},
          [&](const std::byte* p, uint32_t* o) { Crc32ClmulBlocks<1>(p, block, o); });
    }
  }
#endif
  for (; off < n; off += block)
    *out++ = Crc32(bytes.subspan(off, std::min<uint64_t>(block, n - off)));
}

uint32_t Crc32Extend(uint32_t crc, std::span<const std::byte> data) {
#if defined(__x86_64__)
  // isa-l has 128-bit and AVX-512 kernels. Between them, on CPUs with 256-bit
  // VPCLMULQDQ only, the kernel here is about twice as fast as isa-l's 128-bit
  // one (~23 against ~12 GB/s in cache on a Zen 3 VM).
  using checksum_internal::CrcKernels;
  const CrcKernels kernels = checksum_internal::g_kernels.load(std::memory_order_relaxed);
  const bool isal_wider = kernels == CrcKernels::kBest && HasVclmul();
  if (data.size() >= 256 && !isal_wider && kernels <= CrcKernels::kVclmul256 && HasVclmul256()) {
    const uint64_t whole = data.size() & ~uint64_t{63};
    crc = Crc32Vclmul256<false>(crc, nullptr, data.data(), whole);
    data = data.subspan(whole);
  }
#endif
  return IsalCrc32Extend(crc, data);
}

uint32_t CopyWithCrc32(uint32_t crc, std::span<std::byte> dst, std::span<const std::byte> src) {
  const uint64_t n = src.size();
  uint64_t off = 0;
#if defined(__x86_64__)
  using checksum_internal::CrcKernels;
  const CrcKernels kernels = checksum_internal::g_kernels.load(std::memory_order_relaxed);
  if (n >= 256 && HasVclmul() && kernels == CrcKernels::kBest) {
    off = n & ~uint64_t{63};
    crc = CopyCrc32Vclmul(crc, dst.data(), src.data(), off);
  } else if (n >= 256 && HasVclmul256() && kernels <= CrcKernels::kVclmul256) {
    off = n & ~uint64_t{63};
    crc = Crc32Vclmul256<true>(crc, dst.data(), src.data(), off);
  }
#endif
  for (; off < n; off += kCrcHotPiece) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kCrcHotPiece, n - off));
    std::memcpy(dst.data() + off, src.data() + off, len);
    crc = Crc32Extend(crc, dst.subspan(off, len));
  }
  return crc;
}

}  // namespace megackpt::inline core
