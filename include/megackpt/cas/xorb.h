// Xorbs: containers of up to 8192 chunks / 64 MiB, each chunk stored as a
// record = 8-byte header + (possibly compressed) bytes.
//
//   record header (8 bytes, little-endian):
//     u8  version            0
//     u24 compressed_len     bytes following the header
//     u8  scheme             0 none | 1 LZ4 frame | 2 BG4 + LZ4 frame
//     u24 uncompressed_len   bytes after decompression
//
// BG4 ("byte grouping 4") splits the chunk into four byte lanes (bytes 4i+0,
// then 4i+1, 4i+2, 4i+3) before LZ4, which helps float data. A record is only
// stored compressed when that is smaller than the raw bytes.
//
// A xorb stored by the local backend carries a footer after its records (chunk
// hashes and record offsets) so readers can fetch any chunk range alone; see
// docs/cas.md. Decoders treat every byte as hostile.
#ifndef MEGACKPT_CAS_XORB_H_
#define MEGACKPT_CAS_XORB_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/cas/hash.h"
#include "megackpt/cas/reconstruction.h"
#include "megackpt/core/status.h"

namespace megackpt::cas {

inline constexpr size_t kChunkRecordHeaderSize = 8;
inline constexpr uint32_t kMaxXorbBytes = 64u << 20;
inline constexpr uint32_t kMaxXorbChunks = 8192;
// What readers accept: hf_xet fills a xorb with up to kMaxXorbBytes of chunk
// data and adds the record headers on top (a 64 MiB file of random bytes
// arrives as one xorb of 64 MiB + 8 KiB). Our builder stays within
// kMaxXorbBytes serialized.
inline constexpr uint32_t kMaxSerializedXorbBytes =
    kMaxXorbBytes + kMaxXorbChunks * kChunkRecordHeaderSize;
// Largest length a u24 field can hold.
inline constexpr uint32_t kMaxRecordLength = (1u << 24) - 1;

enum class CompressionScheme : uint8_t { kNone = 0, kLz4 = 1, kByteGrouping4Lz4 = 2 };
// "none", "lz4", "bg4-lz4".
const char* CompressionSchemeName(CompressionScheme scheme);

// How AppendChunkRecord picks a scheme.
enum class CompressionPolicy {
  kNone,    // always scheme 0
  kAuto,    // by the data: LZ4, or BG4+LZ4 when the byte lanes look different
            // (float-like data), falling back to none when not smaller
  kLz4,     // LZ4 when smaller, else none
  kBg4Lz4,  // BG4+LZ4 when smaller, else none
};

struct ChunkRecordHeader {
  uint8_t version = 0;
  uint32_t compressed_len = 0;
  CompressionScheme scheme = CompressionScheme::kNone;
  uint32_t uncompressed_len = 0;
};

// Appends one record (header + payload) holding `chunk` to *out and returns
// the scheme it used. REQUIRES: chunk.size() <= kMaxRecordLength.
CompressionScheme AppendChunkRecord(std::span<const std::byte> chunk, CompressionPolicy policy,
                                    std::string* out);

// Writes one record for `chunk` to out[0, chunk.size() + 8) (a record is
// never larger than that) and returns its size; *scheme receives the scheme.
// REQUIRES: chunk.size() <= kMaxRecordLength; out has chunk.size() + 8 bytes.
size_t EncodeChunkRecord(std::span<const std::byte> chunk, CompressionPolicy policy, std::byte* out,
                         CompressionScheme* scheme = nullptr);

// Parses and validates the header of the record at buf[offset]: version 0, a
// known scheme, compressed_len within the buffer, scheme 0 having equal
// lengths. DataLoss "chunk record at offset N: ..." otherwise.
Result<ChunkRecordHeader> ParseChunkRecordHeader(std::span<const std::byte> buf, size_t offset);

// Decodes the record at buf[offset], appending exactly uncompressed_len bytes to
// *out (nothing on error). Returns the offset one past the record. DataLoss on
// any malformed length or payload (the decompressed size must match exactly).
Result<size_t> DecodeChunkRecord(std::span<const std::byte> buf, size_t offset, std::string* out);

// Decodes the record at buf[offset] into `dst`, which must be exactly the
// record's uncompressed length (DataLoss otherwise). Returns the offset one past
// the record.
Result<size_t> DecodeChunkRecordTo(std::span<const std::byte> buf, size_t offset,
                                   std::span<std::byte> dst);

// A whole xorb decoded: its bytes and chunk hashes/sizes.
struct DecodedXorb {
  std::string data;                 // all chunks, uncompressed, concatenated
  std::vector<HashAndSize> chunks;  // hash and uncompressed size per chunk
  std::vector<uint32_t> record_offsets;
};

// Decodes every record of a serialized xorb (no footer) and hashes each chunk.
// With `expected` (the xorb's layout), checks the chunk count, record offsets
// and each chunk hash: DataLoss "xorb <hex> chunk <i>: ..." on a mismatch.
// Limits: at most kMaxXorbChunks records, kMaxXorbBytes bytes (readers
// accept up to kMaxSerializedXorbBytes).
Result<DecodedXorb> DecodeXorb(std::span<const std::byte> serialized,
                               const XorbLayout* expected = nullptr);

// Checks a serialized xorb (no footer) as DecodeXorb does — every record
// decoded with the same hostile-input checks and hashed — without keeping
// the decoded bytes (one chunk of scratch memory), and returns its layout:
// chunk hashes, record offsets, unpacked sizes, serialized_bytes and the xorb
// hash they aggregate to. For servers receiving xorbs.
Result<XorbLayout> VerifyXorb(std::span<const std::byte> serialized);

namespace internal {
class ByteBuffer;
}

// Packs encoded chunk records into a xorb. Its buffer is reused from one xorb
// to the next (no new allocation per xorb).
class XorbBuilder {
 public:
  explicit XorbBuilder(uint32_t max_bytes = kMaxXorbBytes, uint32_t max_chunks = kMaxXorbChunks);
  ~XorbBuilder();
  XorbBuilder(XorbBuilder&&) noexcept;
  XorbBuilder& operator=(XorbBuilder&&) noexcept;

  // True when a record of `record_size` bytes still fits.
  bool Fits(size_t record_size) const;
  // Appends a record made by AppendChunkRecord/EncodeChunkRecord for a chunk
  // with this hash and uncompressed size. REQUIRES: Fits(record.size()).
  // Returns the chunk's index in the xorb.
  uint32_t Add(const MerkleHash& chunk_hash, uint32_t unpacked_bytes,
               std::span<const std::byte> record);
  uint32_t Add(const MerkleHash& chunk_hash, uint32_t unpacked_bytes, std::string_view record) {
    return Add(chunk_hash, unpacked_bytes, std::as_bytes(std::span(record)));
  }

  bool empty() const { return layout_.chunks.empty(); }
  size_t num_chunks() const { return layout_.chunks.size(); }
  size_t size_bytes() const;
  const XorbLayout& pending_layout() const { return layout_; }
  // The record of pending chunk i. REQUIRES: i < num_chunks().
  std::span<const std::byte> record(size_t i) const;

  struct Finished {
    std::span<const std::byte> serialized;  // valid until the next Add/Finish/Clear
    XorbLayout layout;
  };
  // Computes the xorb hash and returns the records and layout. The builder
  // is empty afterwards (the returned bytes stay valid until it is used again).
  // REQUIRES: !empty().
  Finished Finish();
  // Drops the pending chunks.
  void Clear();

 private:
  uint32_t max_bytes_, max_chunks_;
  std::unique_ptr<internal::ByteBuffer> data_;
  XorbLayout layout_;
  bool finished_ = false;
};

// The local store's xorb footer (docs/cas.md): per chunk {hash, u32 record
// offset, u32 unpacked bytes}, then a 24-byte trailer {u32 num_chunks, u32
// serialized_bytes, u32 crc32 of the table, u32 version 1, 8-byte magic
// "MCKXORB1"}.
inline constexpr size_t kXorbFooterEntrySize = 40;
inline constexpr size_t kXorbFooterTrailerSize = 24;
std::string EncodeXorbFooter(const XorbLayout& layout);
// Parses a trailer (the last kXorbFooterTrailerSize bytes of a stored xorb):
// returns {num_chunks, serialized_bytes}. DataLoss on bad magic/version/limits.
Result<std::pair<uint32_t, uint32_t>> ParseXorbFooterTrailer(std::span<const std::byte> trailer);
// Parses a whole footer (table + trailer) into a layout and checks it against
// `xorb_hash` (aggregation of the listed chunks). DataLoss naming the xorb.
Result<XorbLayout> ParseXorbFooter(std::span<const std::byte> footer, const MerkleHash& xorb_hash);

}  // namespace megackpt::cas

#endif  // MEGACKPT_CAS_XORB_H_
