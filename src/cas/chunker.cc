#include "megackpt/cas/chunker.h"

#include <algorithm>

namespace megackpt::cas {

const std::array<uint64_t, 256> kGearTable = {
#include "cas/gear_table.inc"
};

namespace {

// Bytes at the start of a chunk that never influence a cut decision: h only
// depends on the last 64 bytes hashed and no cut is tested before
// kMinChunkSize bytes.
constexpr size_t kSkipBytes = kMinChunkSize - 64 - 1;

// Hashes p[0..n) into *h without testing for cuts.
inline uint64_t HashOnly(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) h = (h << 1) + kGearTable[p[i]];
  return h;
}

// Hashes p[0..n) testing every byte; returns the count of bytes up to and
// including the first byte where (h & mask) == 0, or n when there is none.
// *h holds the hash after the last byte hashed.
inline size_t HashUntilCut(const uint8_t* p, size_t n, uint64_t* hp) {
  uint64_t h = *hp;
  size_t i = 0;
  // Unrolled by 4: the dependency chain is one shift-add per byte; the tests
  // are independent of each other.
  for (; i + 4 <= n; i += 4) {
    uint64_t h0 = (h << 1) + kGearTable[p[i]];
    uint64_t h1 = (h0 << 1) + kGearTable[p[i + 1]];
    uint64_t h2 = (h1 << 1) + kGearTable[p[i + 2]];
    uint64_t h3 = (h2 << 1) + kGearTable[p[i + 3]];
    if (__builtin_expect(((h0 & kChunkMask) == 0) | ((h1 & kChunkMask) == 0) |
                             ((h2 & kChunkMask) == 0) | ((h3 & kChunkMask) == 0),
                         0)) {
      if ((h0 & kChunkMask) == 0) {
        *hp = h0;
        return i + 1;
      }
      if ((h1 & kChunkMask) == 0) {
        *hp = h1;
        return i + 2;
      }
      if ((h2 & kChunkMask) == 0) {
        *hp = h2;
        return i + 3;
      }
      *hp = h3;
      return i + 4;
    }
    h = h3;
  }
  for (; i < n; ++i) {
    h = (h << 1) + kGearTable[p[i]];
    if ((h & kChunkMask) == 0) {
      *hp = h;
      return i + 1;
    }
  }
  *hp = h;
  return n;
}

}  // namespace

void Chunker::Feed(std::span<const std::byte> data, std::vector<uint64_t>* ends) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t n = data.size();
  size_t i = 0;
  while (i < n) {
    uint64_t size = position_ - chunk_start_;  // bytes already in this chunk
    if (size < kSkipBytes) {
      size_t skip = std::min<uint64_t>(n - i, kSkipBytes - size);
      i += skip;
      position_ += skip;
      continue;
    }
    if (size < kMinChunkSize - 1) {
      // Bytes whose size (counting themselves) stays below the minimum:
      // hashed, never tested.
      size_t k = std::min<uint64_t>(n - i, kMinChunkSize - 1 - size);
      hash_ = HashOnly(p + i, k, hash_);
      i += k;
      position_ += k;
      continue;
    }
    // From here each byte's size is >= kMinChunkSize: test it, up to the cap.
    size_t limit = std::min<uint64_t>(n - i, kMaxChunkSize - size);
    size_t k = HashUntilCut(p + i, limit, &hash_);
    i += k;
    position_ += k;
    bool cut = (hash_ & kChunkMask) == 0 && k > 0;
    if (cut || position_ - chunk_start_ >= kMaxChunkSize) {
      ends->push_back(position_);
      chunk_start_ = position_;
      hash_ = 0;
    }
  }
}

std::optional<uint64_t> Chunker::Finish() {
  std::optional<uint64_t> end;
  if (position_ > chunk_start_) end = position_;
  position_ = chunk_start_ = hash_ = 0;
  return end;
}

size_t FindChunkLength(std::span<const std::byte> data, bool at_end) {
  // Scan at most one maximal chunk; a fresh chunker starts at a chunk start.
  Chunker chunker;
  std::vector<uint64_t> ends;
  chunker.Feed(data.first(std::min(data.size(), kMaxChunkSize)), &ends);
  if (!ends.empty()) return static_cast<size_t>(ends[0]);
  return at_end ? std::min(data.size(), kMaxChunkSize) : 0;
}

std::vector<uint64_t> ChunkBoundaries(std::span<const std::byte> data) {
  Chunker chunker;
  std::vector<uint64_t> ends;
  ends.reserve(data.size() / kTargetChunkSize + 2);
  chunker.Feed(data, &ends);
  if (auto last = chunker.Finish()) ends.push_back(*last);
  return ends;
}

}  // namespace megackpt::cas
