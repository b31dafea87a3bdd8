#include "megackpt/core/checksum.h"
#include "megackpt/core/text.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <random>

namespace megackpt::inline core {

uint32_t Crc32Extend(uint32_t crc, std::span<const std::byte> data) {
  // ISA-L's gzip-reflected CRC is zlib's crc32 (same init/xorout convention).
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

}  // namespace megackpt::core
