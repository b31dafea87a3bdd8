#include "megackpt/cas/hash.h"

#include <blake3.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "megackpt/core/text.h"

namespace megackpt::cas {

namespace {

constexpr MerkleHash MakeKey(std::array<uint8_t, 32> b) { return MerkleHash{b}; }

// Largest number of children of an aggregation node (2 × mean branching + 1).
constexpr size_t kMaxGroup = 9;
constexpr uint64_t kMeanBranching = 4;

// Appends "<hex> : <size>\n" (the text the aggregation hashes).
void AppendNodeLine(const HashAndSize& node, std::string* out) {
  char buf[96];
  int n = 0;
  for (int w = 0; w < 4; ++w) {
    n += std::snprintf(buf + n, sizeof(buf) - n, "%016llx",
                       static_cast<unsigned long long>(node.hash.Word(w)));
  }
  n += std::snprintf(buf + n, sizeof(buf) - n, " : %llu\n",
                     static_cast<unsigned long long>(node.size));
  out->append(buf, n);
}

// Number of leading nodes forming the next group.
size_t NextGroupSize(std::span<const HashAndSize> nodes) {
  if (nodes.size() <= 2) return nodes.size();
  size_t end = std::min(kMaxGroup, nodes.size());
  for (size_t i = 2; i < end; ++i) {
    if (nodes[i].hash.Word(3) % kMeanBranching == 0) return i + 1;
  }
  return end;
}

HashAndSize MergeGroup(std::span<const HashAndSize> group, std::string* scratch) {
  scratch->clear();
  uint64_t total = 0;
  for (const HashAndSize& n : group) {
    AppendNodeLine(n, scratch);
    total += n.size;
  }
  return {KeyedHash(kInternalNodeKey, std::as_bytes(std::span(*scratch))), total};
}

}  // namespace

const MerkleHash kDataKey =
    MakeKey({102, 151, 245, 119, 91,  149, 80, 222, 49,  53,  203, 172, 165, 151, 24,  28,
             157, 228, 33,  16,  155, 235, 43, 88,  180, 208, 176, 75,  147, 173, 242, 41});
const MerkleHash kInternalNodeKey =
    MakeKey({1,  126, 197, 199, 165, 71,  41,  150, 253, 148, 102, 102, 180, 138, 2,   230,
             93, 221, 83,  111, 55,  199, 109, 210, 248, 99,  82,  230, 74,  83,  113, 63});
const MerkleHash kVerificationKey =
    MakeKey({127, 24,  87, 214, 206, 86,  237, 102, 18, 127, 249, 19,  231, 165, 195, 243,
             164, 205, 38, 213, 181, 219, 73,  230, 65, 36,  152, 127, 40,  251, 148, 195});

std::string MerkleHash::ToHex() const {
  char buf[65];
  for (int w = 0; w < 4; ++w) {
    std::snprintf(buf + 16 * w, 17, "%016llx", static_cast<unsigned long long>(Word(w)));
  }
  return std::string(buf, 64);
}

Result<MerkleHash> MerkleHash::FromHex(std::string_view hex) {
  auto bad = [&] {
    return InvalidArgumentError("not a 64-digit hash: '" + std::string(hex.substr(0, 80)) + "'");
  };
  if (hex.size() != 64) return bad();
  MerkleHash h;
  for (int w = 0; w < 4; ++w) {
    uint64_t v = 0;
    for (int i = 0; i < 16; ++i) {
      char c = hex[16 * w + i];
      const int d = HexDigitValue(c);
      if (d < 0) return bad();
      v = (v << 4) | static_cast<uint64_t>(d);
    }
    std::memcpy(h.bytes.data() + 8 * w, &v, 8);
  }
  return h;
}

bool MerkleHash::IsZero() const {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

MerkleHash KeyedHash(const MerkleHash& key, std::span<const std::byte> data) {
  blake3_hasher hasher;
  blake3_hasher_init_keyed(&hasher, key.bytes.data());
  blake3_hasher_update(&hasher, data.data(), data.size());
  MerkleHash out;
  blake3_hasher_finalize(&hasher, out.bytes.data(), out.bytes.size());
  return out;
}

MerkleHash ChunkHash(std::span<const std::byte> chunk) { return KeyedHash(kDataKey, chunk); }

MerkleHash AggregateHashes(std::span<const HashAndSize> leaves) {
  if (leaves.empty()) return MerkleHash{};
  if (leaves.size() == 1) return leaves[0].hash;
  std::vector<HashAndSize> level(leaves.begin(), leaves.end());
  std::string scratch;
  while (level.size() > 1) {
    size_t write = 0, read = 0;
    while (read < level.size()) {
      size_t n = NextGroupSize(std::span(level).subspan(read));
      // The group is read before its slot is written (write <= read).
      HashAndSize parent = MergeGroup(std::span(level).subspan(read, n), &scratch);
      level[write++] = parent;
      read += n;
    }
    level.resize(write);
  }
  return level[0].hash;
}

MerkleHash FileHash(std::span<const HashAndSize> chunks, const MerkleHash& salt) {
  if (chunks.empty()) return MerkleHash{};
  MerkleHash root = AggregateHashes(chunks);
  return KeyedHash(salt, std::as_bytes(std::span(root.bytes)));
}

MerkleHash RangeVerificationHash(std::span<const MerkleHash> chunk_hashes) {
  blake3_hasher hasher;
  blake3_hasher_init_keyed(&hasher, kVerificationKey.bytes.data());
  for (const MerkleHash& h : chunk_hashes) blake3_hasher_update(&hasher, h.bytes.data(), 32);
  MerkleHash out;
  blake3_hasher_finalize(&hasher, out.bytes.data(), out.bytes.size());
  return out;
}

}  // namespace megackpt::cas
