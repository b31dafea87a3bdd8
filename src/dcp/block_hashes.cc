// Block hashes (dcp/block_hashes.h): XXH3-128 per block and the text record.
#include "dcp/block_hashes.h"

#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
// libxxhash's runtime dispatch (AVX2 / AVX-512 where the CPU has them): the
// plain entry points of Debian's build use SSE2, about 4x slower in cache.
// The header maps XXH3_128bits and XXH3_128bits_update to the dispatchers.
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstdio>

namespace megackpt::dcp {

BlockHasher::BlockHasher(uint64_t block_size) : block_size_(block_size), state_(nullptr) {
  out_.block_size = block_size;
}

BlockHasher::~BlockHasher() {
  if (state_) XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void BlockHasher::Add(std::span<const std::byte> data) {
  total_ += data.size();
  while (!data.empty()) {
    if (in_block_ == 0 && data.size() >= block_size_) {
      // A whole block in one piece: one-shot (the same digest as streaming).
      const XXH128_hash_t h = XXH3_128bits(data.data(), static_cast<size_t>(block_size_));
      out_.digests.emplace_back(h.high64, h.low64);
      data = data.subspan(static_cast<size_t>(block_size_));
      continue;
    }
    auto* state = static_cast<XXH3_state_t*>(state_);
    if (!state) state_ = state = XXH3_createState();
    if (in_block_ == 0) XXH3_128bits_reset(state);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size(), block_size_ - in_block_));
    XXH3_128bits_update(state, data.data(), n);
    in_block_ += n;
    data = data.subspan(n);
    if (in_block_ == block_size_) Close();
  }
}

void BlockHasher::Close() {
  const XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  out_.digests.emplace_back(h.high64, h.low64);
  in_block_ = 0;
}

BlockHashes BlockHasher::Finish() {
  if (in_block_ > 0) {
    Close();
  } else if (total_ == 0) {
    const XXH128_hash_t h = XXH3_128bits(nullptr, 0);
    out_.digests.emplace_back(h.high64, h.low64);
  }
  return std::move(out_);
}

BlockHashes HashBlocks(std::span<const std::byte> data, uint64_t block_size) {
  BlockHasher hasher(block_size);
  hasher.Add(data);
  return hasher.Finish();
}

std::string EncodeBlockHashes(const BlockHashes& hashes) {
  std::string out(kBlockHashPrefix);
  out += std::to_string(hashes.block_size);
  out += '/';
  out.reserve(out.size() + hashes.digests.size() * 32);
  char buf[40];
  for (const auto& [hi, lo] : hashes.digests) {
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
    out += buf;
  }
  return out;
}

std::optional<BlockHashes> DecodeBlockHashes(std::string_view extra) {
  if (!extra.starts_with(kBlockHashPrefix)) return std::nullopt;
  extra.remove_prefix(kBlockHashPrefix.size());
  const size_t slash = extra.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash > 19) return std::nullopt;
  BlockHashes h;
  for (char c : extra.substr(0, slash)) {
    if (c < '0' || c > '9') return std::nullopt;
    h.block_size = h.block_size * 10 + static_cast<uint64_t>(c - '0');
  }
  if (h.block_size == 0) return std::nullopt;
  std::string_view hex = extra.substr(slash + 1);
  if (hex.empty() || hex.size() % 32 != 0) return std::nullopt;
  auto word = [](std::string_view s, uint64_t* v) {
    *v = 0;
    for (char c : s) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      *v = (*v << 4) | static_cast<uint64_t>(d);
    }
    return true;
  };
  h.digests.reserve(hex.size() / 32);
  for (size_t p = 0; p < hex.size(); p += 32) {
    uint64_t hi = 0, lo = 0;
    if (!word(hex.substr(p, 16), &hi) || !word(hex.substr(p + 16, 16), &lo)) return std::nullopt;
    h.digests.emplace_back(hi, lo);
  }
  return h;
}

}  // namespace megackpt::dcp
