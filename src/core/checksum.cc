#include "megackpt/core/checksum.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>

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
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return InvalidArgumentError("invalid hex character at position " + std::to_string(2 * i));
    }
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return Status::OK();
}

}  // namespace megackpt::core
