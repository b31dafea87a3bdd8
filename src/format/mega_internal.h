// Internals shared by the MEGA reader, writer and their tests: little-endian
// encoding, a bounded byte source for hostile input, the metadata codec, header
// record encoders, byte shuffle, CRC-32 combination, strided byte gather/scatter.
#ifndef MEGACKPT_FORMAT_MEGA_INTERNAL_H_
#define MEGACKPT_FORMAT_MEGA_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/checksum.h"
#include "megackpt/core/endian.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {
namespace mega_internal {

// Nesting limit for arrays of arrays in metadata (bounds recursion on hostile input).
inline constexpr int kMaxArrayDepth = 8;
// Minimum encoded sizes, used to bound counts before reserving memory.
inline constexpr uint64_t kMinMetaEntryBytes = 8 + 4 + 1;  // empty key, type, 1-byte value
inline constexpr uint64_t kMinTensorEntryBytes =
    4 + 4 + 4 + 4 + 8;  // name, flags, ndim, dtype, offset
inline constexpr uint64_t kDefaultIoBlock = 16ull << 20;

// Little-endian fields: megackpt/core/endian.h. Load32 is kept as the name
// mega_encoder.cc uses.
inline uint32_t Load32(const std::byte* p) { return LoadLE32(p); }

// Overflow-checked arithmetic.
inline bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}
inline bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}
// align_up(v, a) or false on overflow. REQUIRES a > 0.
bool AlignUp(uint64_t v, uint64_t a, uint64_t* out);

// Appends little-endian values to a string.
class ByteWriter {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { AppendLE16(&out_, v); }
  void U32(uint32_t v) { AppendLE32(&out_, v); }
  void U64(uint64_t v) { AppendLE64(&out_, v); }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  void Bytes(std::string_view s) { out_.append(s); }
  // u64 length + bytes.
  void String(std::string_view s) {
    U64(s.size());
    Bytes(s);
  }
  // u32 length + bytes. REQUIRES s.size() < 2^32.
  void CompactString(std::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    Bytes(s);
  }
  void Zeros(size_t n) { out_.append(n, '\0'); }
  size_t size() const { return out_.size(); }
  std::string& data() { return out_; }

 private:
  std::string out_;
};

// Reads a window [begin, limit) of a file (or a memory span) with every read
// bounds-checked against `limit` before any allocation. File-backed sources
// fetch bytes lazily into a buffer that grows geometrically (at most ~2x what
// was actually consumed). Errors are DataLoss "<file>: <what> ... at offset N".
class ByteSource {
 public:
  ByteSource(const RandomAccessFile& file, uint64_t begin, uint64_t limit);
  ByteSource(std::string file_name, std::span<const std::byte> data, uint64_t base_offset);

  uint64_t position() const { return pos_; }
  uint64_t limit() const { return limit_; }
  uint64_t remaining() const { return limit_ - pos_; }
  const std::string& file_name() const { return name_; }

  Result<uint8_t> U8(std::string_view what);
  Result<uint16_t> U16(std::string_view what);
  Result<uint32_t> U32(std::string_view what);
  Result<uint64_t> U64(std::string_view what);
  // u64 length + bytes / u32 length + bytes; the length is checked against the
  // bytes left before anything is allocated.
  Result<std::string> String(std::string_view what);
  Result<std::string> CompactString(std::string_view what);
  // A view valid until the next read.
  Result<std::span<const std::byte>> Bytes(uint64_t n, std::string_view what);
  // The bytes [begin, end) of the window (fetched if needed); the position is
  // unchanged. A view valid until the next read.
  Result<std::span<const std::byte>> Window(uint64_t begin, uint64_t end);

  // DataLoss "<file>: <message> (at offset <pos>)".
  Status Error(std::string_view message) const;
  Status ErrorAt(uint64_t offset, std::string_view message) const;

 private:
  // A little-endian value of sizeof(T) bytes (U8 ... U64).
  template <typename T>
  Result<T> Fixed(std::string_view what);
  // The `len` bytes after a length field read at `at`, as a string.
  Result<std::string> LengthPrefixed(uint64_t at, uint64_t len, std::string_view what);
  Status Need(uint64_t n, std::string_view what);
  const std::byte* At() const;

  std::string name_;
  const RandomAccessFile* file_ = nullptr;
  std::span<const std::byte> span_;  // memory or mapped file window
  std::string buffer_;               // file-backed, unmapped: bytes [begin_, begin_ + size)
  uint64_t begin_ = 0;
  uint64_t pos_ = 0;
  uint64_t limit_ = 0;
};

// Width in bytes of a scalar metadata type (0 for STRING and ARRAY).
int MetaScalarWidth(MetaType type);
bool IsKnownMetaType(uint32_t type);

}  // namespace mega_internal

// Encodes/decodes metadata values (friend of MetaValue).
class MetaCodec {
 public:
  // The value bytes (no type tag).
  static void EncodeValue(const MetaValue& v, mega_internal::ByteWriter& w);
  // `depth` counts array nesting.
  static Result<MetaValue> DecodeValue(mega_internal::ByteSource& src, MetaType type, int depth);
  // `count` entries of (string key, u32 type, value); duplicate keys are DataLoss.
  static Status DecodeEntries(mega_internal::ByteSource& src, uint64_t count,
                              std::string_view section, MegaMetadata* out);
  static void EncodeEntries(const MegaMetadata& md, mega_internal::ByteWriter& w);
  static void EncodeEntry(std::string_view key, const MetaValue& v, mega_internal::ByteWriter& w);
  // A scalar of `type` holding the raw (zero- or sign-extended) `bits`.
  static MetaValue Scalar(MetaType type, uint64_t bits);
};

namespace mega_internal {

// ---- header records -----------------------------------------------------------

// dir_flags for `info`: a bit is set exactly when the field differs from its default.
uint32_t DirFlagsFor(const MegaTensorInfo& info);
// One tensor directory entry as described by info.dir_flags (dims reversed).
void EncodeTensorEntry(const MegaTensorInfo& info, ByteWriter& w);
void EncodeChunkRecord(const MegaChunkInfo& c, ByteWriter& w);
void EncodeSegmentRecord(const MegaSegment& s, ByteWriter& w);
void EncodeMoeRecord(const MegaMoeExpert& m, ByteWriter& w);
// magic, version, counts, metadata, directory, chunk records (every tensor's
// chunks in tensor order), segments, MoE records, zero padding to `alignment`.
std::string EncodeHeader(const MegaMetadata& metadata, const std::vector<MegaTensorInfo>& tensors,
                         const std::vector<MegaSegment>& segments,
                         const std::vector<MegaMoeExpert>& moe, uint64_t alignment);
// Overlay bytes (magic, kv_count, entries) and the 68-byte trailer.
std::string EncodeOverlay(const MegaMetadata& entries);
std::string EncodeTrailer(uint64_t generation, uint64_t overlay_offset, uint64_t overlay_size,
                          uint64_t base_size, const Sha256Digest& sha);

// Writes `type`'s checksum of data into a 32-byte field.
MegaChecksum ChecksumOf(MegaChecksumType type, std::span<const std::byte> data);
MegaChecksum Crc32Field(uint32_t crc);
MegaChecksum Sha256Field(const Sha256Digest& d);

// ---- byte shuffle ------------------------------------------------------------
// shuffled[b * n + e] = plain[e * size + b] for n = bytes / size elements.
void ByteShuffle(const std::byte* plain, std::byte* shuffled, size_t bytes, size_t elem_size);
void ByteUnshuffle(const std::byte* shuffled, std::byte* plain, size_t bytes, size_t elem_size);

// ---- block CRC tables ----------------------------------------------------------
// The entries of a megackpt.block_crc32 table (docs/mega-format.md): core's one
// implementation.
using core::BlockCrc32s;

// ---- CRC-32 combination ----------------------------------------------------------
// CRC-32 of A||B from crc(A), crc(B) and len(B): the one implementation in core.
using core::Crc32Combine;

// ---- strided tensors as byte streams ---------------------------------------------
// Copies bytes [offset, offset + out.size()) of t's dense (row-major) form into
// out / from in. REQUIRES: offset and size are multiples of the element size
// (F4: t contiguous); the range lies inside t.nbytes().
void GatherBytes(const Tensor& t, uint64_t offset, std::span<std::byte> out);
void ScatterBytes(const Tensor& t, uint64_t offset, std::span<const std::byte> in);

// ---- zstd --------------------------------------------------------------------------
// Upper bound of the decoded size of `stored` bytes of zstd frames: every block
// carries a 3-byte header and decodes to at most 128 KiB.
uint64_t ZstdMaxDecodedSize(uint64_t stored);

// ---- JSON text as Python's json.dumps writes it ----------------------------------
// A JSON string literal with ensure_ascii escaping. REQUIRES valid UTF-8.
std::string PyJsonQuote(std::string_view s);
bool IsValidUtf8(std::string_view s);

// Adds the TensorPlay profile keys for `tensors`, in the order MegaWriter
// writes them: general.architecture, general.alignment, mega.tensor_info.format,
// tensorplay.container, tensorplay.byteorder, tensorplay.tensor_devices (all
// "cpu"), tensorplay.checksum, tensorplay.tensor_checksums. REQUIRES: the names
// are valid UTF-8.
Status AddTensorplayProfile(const std::vector<MegaTensorInfo>& tensors, uint64_t alignment,
                            std::string_view container, MegaChecksumType checksum,
                            MegaMetadata* md);

// Running CRC-32 / SHA-256 of stored bytes (shared by reader and writer).
class Checker {
 public:
  explicit Checker(MegaChecksumType type) : type_(type) {
    if (type == MegaChecksumType::kSha256) sha_.emplace();
  }
  void Update(std::span<const std::byte> data) {
    if (type_ == MegaChecksumType::kCrc32) crc_ = Crc32Extend(crc_, data);
    if (type_ == MegaChecksumType::kSha256) sha_->Update(data);
  }
  // Update(data) when the caller already has crc == Crc32(data): a CRC32
  // checksum combines it instead of reading the bytes again.
  void Update(std::span<const std::byte> data, uint32_t crc) {
    if (type_ == MegaChecksumType::kCrc32) crc_ = Crc32Combine(crc_, crc, data.size());
    if (type_ == MegaChecksumType::kSha256) sha_->Update(data);
  }
  MegaChecksum Finish() {
    if (type_ == MegaChecksumType::kCrc32) return mega_internal::Crc32Field(crc_);
    if (type_ == MegaChecksumType::kSha256) return mega_internal::Sha256Field(sha_->Finish());
    return MegaChecksum{};
  }

 private:
  MegaChecksumType type_;
  uint32_t crc_ = 0;
  std::optional<Sha256> sha_;
};

}  // namespace mega_internal
}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_MEGA_INTERNAL_H_
