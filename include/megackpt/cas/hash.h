// Xet-compatible hashes: BLAKE3 keyed hashes of chunks, the merkle aggregation
// that names xorbs and files, and the range-verification hash.
//
// Every function here is a pure function of its inputs and matches the Xet
// protocol bit for bit (docs/cas.md, spec/xet-cas.md). BLAKE3 is the official C
// implementation (SIMD, runtime dispatch).
#ifndef MEGACKPT_CAS_HASH_H_
#define MEGACKPT_CAS_HASH_H_

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "megackpt/core/status.h"

namespace megackpt::cas {

// A 32-byte hash (chunk, xorb or file). Value type; zero-initialised.
struct MerkleHash {
  std::array<uint8_t, 32> bytes{};

  // The Xet text form: the 32 bytes as four little-endian u64 words, each
  // printed as 16 lowercase hex digits (so each 8-byte group appears
  // byte-reversed compared with a plain hex dump).
  std::string ToHex() const;
  // Parses the Xet text form (64 hex digits, either case). InvalidArgument
  // naming the text otherwise.
  static Result<MerkleHash> FromHex(std::string_view hex);

  // Little-endian u64 word i (0..3) — word 3 is bytes 24..31, used by the
  // merkle cut rule and the global-dedup eligibility rule.
  uint64_t Word(int i) const {
    uint64_t w;
    std::memcpy(&w, bytes.data() + 8 * i, 8);
    return w;  // x86-64 is little-endian
  }
  bool IsZero() const;

  friend bool operator==(const MerkleHash&, const MerkleHash&) = default;
  friend auto operator<=>(const MerkleHash&, const MerkleHash&) = default;
};

// For unordered containers (the hash is already uniformly distributed).
struct MerkleHashHasher {
  size_t operator()(const MerkleHash& h) const { return static_cast<size_t>(h.Word(0)); }
};

// The protocol's BLAKE3 keys.
extern const MerkleHash kDataKey;          // chunk hashes
extern const MerkleHash kInternalNodeKey;  // merkle aggregation nodes
extern const MerkleHash kVerificationKey;  // range verification hashes

// blake3_keyed(key, data).
MerkleHash KeyedHash(const MerkleHash& key, std::span<const std::byte> data);

// chunk hash = blake3_keyed(DATA_KEY, chunk bytes).
MerkleHash ChunkHash(std::span<const std::byte> chunk);

// A merkle leaf or node: a hash and the number of bytes it covers.
struct HashAndSize {
  MerkleHash hash;
  uint64_t size = 0;
  friend bool operator==(const HashAndSize&, const HashAndSize&) = default;
};

// The Xet aggregation root of `leaves` (groups cut by the "hash word 3 % 4 == 0"
// rule, 2..9 children per node, node = blake3_keyed(INTERNAL_NODE_KEY,
// "<hex> : <size>\n" lines)). Empty → 32 zero bytes; one leaf → its hash.
MerkleHash AggregateHashes(std::span<const HashAndSize> leaves);

// xorb hash = aggregation root of the xorb's chunks, in order.
inline MerkleHash XorbHash(std::span<const HashAndSize> chunks) { return AggregateHashes(chunks); }

// file hash = blake3_keyed(salt, aggregation root of the file's chunks);
// an empty file (no chunks) hashes to 32 zero bytes. Xet's default salt is 32
// zero bytes.
MerkleHash FileHash(std::span<const HashAndSize> chunks, const MerkleHash& salt = MerkleHash{});

// Range verification hash = blake3_keyed(VERIFICATION_KEY, raw bytes of the
// chunk hashes of the range, concatenated in order).
MerkleHash RangeVerificationHash(std::span<const MerkleHash> chunk_hashes);

// True when a chunk is eligible for a global-dedup query: word 3 % 1024 == 0
// (a file's first chunk is always queried as well).
inline bool IsGlobalDedupEligible(const MerkleHash& chunk_hash) {
  return chunk_hash.Word(3) % 1024 == 0;
}

}  // namespace megackpt::cas

template <>
struct std::hash<megackpt::cas::MerkleHash> : megackpt::cas::MerkleHashHasher {};

#endif  // MEGACKPT_CAS_HASH_H_
