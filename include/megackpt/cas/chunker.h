// Xet's content-defined chunker (Gear hash), streaming.
//
// Rules (spec/xet-cas.md): per byte h = (h << 1) + kGearTable[b]; once a chunk
// holds at least kMinChunkSize bytes, cut after a byte when
// (h & kChunkMask) == 0 or the chunk reached kMaxChunkSize; h restarts at 0.
// The first kMinChunkSize - 64 - 1 bytes of each chunk are skipped without
// hashing (h only depends on the last 64 bytes), which gives the same
// boundaries faster. Boundaries never depend on how the input is split across
// Feed() calls.
#ifndef MEGACKPT_CAS_CHUNKER_H_
#define MEGACKPT_CAS_CHUNKER_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace megackpt::cas {

inline constexpr size_t kTargetChunkSize = 64 * 1024;
inline constexpr size_t kMinChunkSize = 8 * 1024;
inline constexpr size_t kMaxChunkSize = 128 * 1024;
inline constexpr uint64_t kChunkMask = 0xFFFF000000000000ull;

// rust-gearhash's default table (spec/xet/gear_table.txt).
extern const std::array<uint64_t, 256> kGearTable;

class Chunker {
 public:
  Chunker() = default;

  // Scans `data` (the next bytes of the stream) and appends to `ends` the
  // stream offsets one past each chunk completed inside it, in order.
  void Feed(std::span<const std::byte> data, std::vector<uint64_t>* ends);

  // End of input: returns the end offset of the final, partial chunk, or
  // nullopt when no bytes are pending. The chunker is then reset to offset 0.
  std::optional<uint64_t> Finish();

  // Bytes fed so far.
  uint64_t position() const { return position_; }
  // Stream offset where the current (unfinished) chunk starts.
  uint64_t chunk_start() const { return chunk_start_; }

 private:
  uint64_t position_ = 0;
  uint64_t chunk_start_ = 0;
  uint64_t hash_ = 0;
};

// Length of the first chunk of `data`, which is the start of a chunk. When
// `at_end` is false and no cut is found, returns 0 (more bytes are needed);
// when `at_end` is true the rest is one chunk. REQUIRES: !data.empty().
size_t FindChunkLength(std::span<const std::byte> data, bool at_end);

// End offsets of every chunk of `data` (one chunk when shorter than the
// minimum; none when empty).
std::vector<uint64_t> ChunkBoundaries(std::span<const std::byte> data);

}  // namespace megackpt::cas

#endif  // MEGACKPT_CAS_CHUNKER_H_
