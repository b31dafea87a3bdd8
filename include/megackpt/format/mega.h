// MEGA v1 (`.mega`) shard files: typed metadata, reader and writer.
//
// The on-disk format: docs/format/mega-v1.md documents it as this library
// implements it (field tables, the choices the reference leaves open, and the
// full list of validations).
//
//   auto reader = MegaReader::OpenFile("model.mega");          // parses + validates
//   const MegaTensorInfo* w = (*reader)->Find("layers.0.w");
//   MEGA_RETURN_IF_ERROR((*reader)->ReadTensor("layers.0.w", dst));  // into caller memory
//
//   MegaWriter writer;                       // TensorPlay profile, CRC32, alignment 4096
//   MEGA_RETURN_IF_ERROR(writer.AddMetadata("tensorplay.dcp.step", MetaValue::U64(7)));
//   MEGA_RETURN_IF_ERROR(writer.AddTensor("layers.0.w", w_view));   // no copy
//   MEGA_ASSIGN_OR_RETURN(MegaWriteResult r, writer.WriteFile("model.mega"));
//
// Errors: malformed or corrupt files are DataLoss, with a message that starts
// with the file name and says what is wrong (tensor name, offset, key).
// Caller mistakes (bad options, wrong destination shape) are InvalidArgument;
// unknown tensor names are NotFound. Nothing here throws.
#ifndef MEGACKPT_FORMAT_MEGA_H_
#define MEGACKPT_FORMAT_MEGA_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "megackpt/core/box_runs.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/dtype.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"

namespace megackpt::inline core {
class ThreadPool;
}  // namespace megackpt::inline core

namespace megackpt::format {

// ---- on-disk constants (spec §1, §3, §4, §7) -------------------------------

inline constexpr uint32_t kMegaMagic = 0x4147454D;  // "MEGA"
inline constexpr uint32_t kMegaVersion = 1;
inline constexpr uint32_t kMegaFooterMagic = 0x4654474D;  // "MGTF"
inline constexpr uint64_t kMegaDefaultAlignment = 32;     // when general.alignment is absent
inline constexpr size_t kMegaChunkRecordSize = 88;
inline constexpr size_t kMegaSegmentRecordSize = 72;
inline constexpr size_t kMegaMoeRecordSize = 32;
inline constexpr size_t kMegaFooterTrailerSize = 68;

// Tensor directory dir_flags: which optional fields follow (spec §3).
inline constexpr uint32_t kMegaDirHasStorageFormat = 1;
inline constexpr uint32_t kMegaDirHasStoredNbytes = 2;
inline constexpr uint32_t kMegaDirHasTensorFlags = 4;
inline constexpr uint32_t kMegaDirHasCodec = 8;
inline constexpr uint32_t kMegaDirHasShuffleElemSize = 16;
inline constexpr uint32_t kMegaDirHasChecksum = 32;
inline constexpr uint32_t kMegaDirKnownFlags = 63;

// tensor_flags and chunk flags.
inline constexpr uint32_t kMegaTensorCompressed = 1;
inline constexpr uint32_t kMegaTensorByteShuffled = 2;
inline constexpr uint32_t kMegaTensorKnownFlags = 3;

enum class MegaCodec : uint32_t { kNone = 0, kZstd = 1 };
enum class MegaChecksumType : uint32_t { kNone = 0, kCrc32 = 1, kSha256 = 2 };
enum class MegaStorageFormat : uint8_t { kRawDense, kChunkedRawDense };

// "NONE" / "ZSTD"; "NONE" / "CRC32" / "SHA256"; "raw_dense" / "chunked_raw_dense".
std::string_view MegaCodecName(MegaCodec codec);
std::string_view MegaChecksumTypeName(MegaChecksumType type);
std::string_view MegaStorageFormatName(MegaStorageFormat format);

// ---- typed metadata (spec §2) ------------------------------------------------

// The value type ids of the format; the numeric values are the on-disk ids.
enum class MetaType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kUint64 = 6,
  kInt64 = 7,
  kFloat32 = 8,
  kFloat64 = 9,
  kBool = 10,
  kString = 11,
  kArray = 12,
};

// "UINT8" ... "ARRAY" (the names used in the reference expectation files).
std::string_view MetaTypeName(MetaType type);

// One metadata value with its exact type tag: a value read from a file and
// written back is encoded with the same type and bytes. Arrays carry their
// element type; arrays of arrays are allowed (nested up to 8 levels).
// Copyable value type. Accessors never abort: a wrong-type access returns
// InvalidArgument.
class MetaValue {
 public:
  // A UINT8 zero. Prefer the named constructors.
  MetaValue() = default;

  static MetaValue U8(uint8_t v);
  static MetaValue I8(int8_t v);
  static MetaValue U16(uint16_t v);
  static MetaValue I16(int16_t v);
  static MetaValue U32(uint32_t v);
  static MetaValue I32(int32_t v);
  static MetaValue U64(uint64_t v);
  static MetaValue I64(int64_t v);
  static MetaValue F32(float v);
  static MetaValue F64(double v);
  static MetaValue Bool(bool v);
  static MetaValue String(std::string v);
  // The reference writers' integer rule: UINT32 when v fits, else UINT64.
  static MetaValue UInt(uint64_t v);
  // An array of `element_type`. REQUIRES: every element has exactly that type
  // (for kArray elements: any arrays); otherwise InvalidArgument.
  static Result<MetaValue> Array(MetaType element_type, std::vector<MetaValue> elements);
  // Convenience arrays.
  static MetaValue StringArray(std::vector<std::string> v);
  static MetaValue U32Array(std::span<const uint32_t> v);
  static MetaValue U64Array(std::span<const uint64_t> v);
  static MetaValue I64Array(std::span<const int64_t> v);
  static MetaValue F64Array(std::span<const double> v);

  MetaType type() const { return type_; }
  // Element type of an array (meaningless for scalars).
  MetaType element_type() const { return elem_type_; }
  bool is_array() const { return type_ == MetaType::kArray; }
  bool is_string() const { return type_ == MetaType::kString; }
  // UINT8..INT64.
  bool is_integer() const;

  // Any integer type whose value is >= 0.
  Result<uint64_t> AsUint64() const;
  // Any integer type whose value fits in int64.
  Result<int64_t> AsInt64() const;
  // FLOAT32 / FLOAT64 (and integers, converted).
  Result<double> AsDouble() const;
  Result<bool> AsBool() const;
  // STRING only. The view lives as long as this value.
  Result<std::string_view> AsString() const;

  // Arrays: number of elements and one element (a copy). REQUIRES: is_array();
  // element(i) with i >= size() returns InvalidArgument.
  uint64_t size() const;
  Result<MetaValue> element(uint64_t i) const;

  // JSON text of the value (numbers, true/false, "strings", [arrays]);
  // non-finite floats become null. For display and `inspect --json`.
  std::string ToJson() const;

  // Same type tag (and element type) and same encoded bytes.
  friend bool operator==(const MetaValue& a, const MetaValue& b);

 private:
  friend class MetaCodec;  // the encoder/decoder in src/format
  static int ArrayDepth(const MetaValue& v);
  MetaType type_ = MetaType::kUint8;
  MetaType elem_type_ = MetaType::kUint8;
  uint64_t bits_ = 0;                 // scalar value (raw bits, zero-extended)
  std::string bytes_;                 // STRING text; packed LE elements of numeric/bool arrays
  std::vector<std::string> strings_;  // STRING arrays
  std::vector<MetaValue> items_;      // arrays of arrays
  uint64_t count_ = 0;                // number of array elements
};

struct MetaEntry {
  std::string key;
  MetaValue value;
};

// An ordered list of unique keys with typed values, in file order.
class MegaMetadata {
 public:
  const std::vector<MetaEntry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // nullptr when absent.
  const MetaValue* Find(std::string_view key) const;
  bool Contains(std::string_view key) const { return Find(key) != nullptr; }
  // Appends; InvalidArgument when the key is already present.
  Status Add(std::string key, MetaValue value);
  // Replaces in place (keeping the key's position) or appends.
  void Set(std::string key, MetaValue value);
  // Convenience: the string / unsigned value of a key, NotFound when absent,
  // InvalidArgument when of another type.
  Result<std::string_view> GetString(std::string_view key) const;
  Result<uint64_t> GetUint64(std::string_view key) const;

 private:
  std::vector<MetaEntry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// True for keys a footer overlay may not set (spec §7): general.alignment,
// mega.tensor_info.format, mega.chunk_directory.*, mega.segment_directory.*,
// mega.moe.expert_table.*, and (our choice, spec §2 calls it structural)
// mega.moe.n_experts.
bool IsMegaStructuralKey(std::string_view key);

// ---- directory records -------------------------------------------------------

using MegaChecksum = std::array<uint8_t, 32>;

struct MegaChunkInfo {
  uint32_t tensor_id = 0;
  uint32_t chunk_id = 0;
  uint64_t logical_offset = 0;  // within the tensor's decoded bytes
  uint64_t logical_size = 0;
  uint64_t payload_offset = 0;  // relative to header_length
  uint64_t file_offset = 0;     // absolute: header_length + payload_offset
  uint64_t stored_size = 0;
  MegaCodec codec = MegaCodec::kNone;
  uint32_t flags = 0;  // kMegaTensorCompressed | kMegaTensorByteShuffled
  MegaChecksumType checksum_type = MegaChecksumType::kNone;
  MegaChecksum checksum{};
};

struct MegaTensorInfo {
  uint32_t tensor_id = 0;  // index in the directory (file order)
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;  // normal order (outermost first); the file stores it reversed
  MegaStorageFormat storage_format = MegaStorageFormat::kRawDense;
  uint64_t payload_offset = 0;  // relative to header_length, as stored
  uint64_t file_offset = 0;     // absolute: header_length + payload_offset
  uint64_t stored_nbytes = 0;
  uint64_t logical_nbytes = 0;  // derived from dtype and shape
  uint32_t dir_flags = 0;
  uint32_t tensor_flags = 0;
  MegaCodec codec = MegaCodec::kNone;
  uint32_t shuffle_elem_size = 0;
  MegaChecksumType checksum_type = MegaChecksumType::kNone;
  MegaChecksum checksum{};
  // chunked_raw_dense only: the chunks sorted by logical_offset (they tile
  // [0, logical_nbytes) exactly).
  std::vector<MegaChunkInfo> chunks;
  // Block CRC-32s (megackpt.block_crc32.*, docs/format/mega-v1.md §11): plain
  // tensors only; 0 = none. The CRC of bytes [k * block_size, ...) of the
  // tensor is the u32 at file offset block_table_offset + 4 * k.
  uint64_t block_size = 0;
  uint64_t block_table_offset = 0;

  bool compressed() const { return tensor_flags & kMegaTensorCompressed; }
  bool byte_shuffled() const { return tensor_flags & kMegaTensorByteShuffled; }
  bool chunked() const { return storage_format == MegaStorageFormat::kChunkedRawDense; }
  // Raw, uncompressed, unshuffled, one range: the stored bytes are the tensor.
  bool is_plain() const { return !chunked() && !compressed() && !byte_shuffled(); }
  // The CRC-32 value (first 4 checksum bytes, little-endian).
  uint32_t crc32() const;
  // Lowercase hex digest as TensorPlay writes it: CRC32 as 8 hex digits of
  // the u32 value (big-endian text, like "%08x"), SHA-256 as 64 hex digits,
  // NONE as "".
  std::string checksum_hex() const;
};

struct MegaSegment {
  uint32_t segment_id = 0, kind = 0, priority = 0, flags = 0;
  uint32_t layer_start = 0, layer_end = 0, expert_start = 0, expert_end = 0;
  uint64_t payload_offset = 0, payload_size = 0;
  uint32_t first_tensor_id = 0, tensor_count = 0, prefetch_group = 0, device_hint = 0;
  uint32_t cache_policy = 0, reserved = 0;
};

inline constexpr uint32_t kMegaNoSegment = 0xFFFFFFFF;

struct MegaMoeExpert {
  uint32_t tensor_id = 0, layer_id = 0, expert_id = 0, expert_role = 0;
  uint32_t segment_id = kMegaNoSegment, prefetch_group = 0, cache_policy = 0, reserved = 0;
};

struct MegaFooterOverlayInfo {
  bool present = false;
  uint64_t generation = 0;
  uint64_t overlay_offset = 0;
  uint64_t overlay_size = 0;
  uint64_t base_size = 0;
  Sha256Digest sha256{};
  MegaMetadata metadata;  // the overlay's own entries, in file order
};

// ---- reader ------------------------------------------------------------------

struct MegaReaderOptions {
  // Map the file (local files) so MappedTensor works. Bulk reads still use
  // pread (faster than copying out of a mapping).
  bool use_mmap = false;
  // Verify stored checksums on every read (ReadTensor, ReadRange of whole
  // tensors or chunks, MappedTensor).
  bool verify_checksums = true;
  // Bulk reads are issued in blocks of this size; each block's CRC is computed
  // right after it lands. 0 = default (16 MiB).
  size_t read_block_size = 0;
};

// One destination for MegaReader::ReadTensors.
struct MegaReadRequest {
  size_t tensor_index = 0;
  Tensor dst;
};

// A parsed, validated MEGA file. Thread-safe: all const methods may be called
// concurrently. Keeps the file open until destroyed.
class MegaReader {
 public:
  // Parses and validates the whole header, directory, chunk/segment/MoE tables
  // and footer overlay (every check of spec §8 and docs/format/mega-v1.md).
  // Reads only the header region (and the trailer), never the payload.
  // DataLoss naming file.name() for any malformed input.
  static Result<std::unique_ptr<MegaReader>> Open(std::unique_ptr<RandomAccessFile> file,
                                                  const MegaReaderOptions& options = {});
  // Opens a local file (mmap'ed when options.use_mmap).
  static Result<std::unique_ptr<MegaReader>> OpenFile(const std::string& path,
                                                      const MegaReaderOptions& options = {});
  ~MegaReader();

  const std::string& file_name() const;
  const RandomAccessFile& file() const { return *file_; }
  uint64_t file_size() const;
  uint32_t version() const { return kMegaVersion; }
  // Start of the payload (end of the aligned header).
  uint64_t header_length() const { return header_length_; }
  // End of the payload: the file size, or the footer's base_size.
  uint64_t payload_end() const { return payload_end_; }
  uint64_t alignment() const { return alignment_; }

  // Effective metadata: header entries with the footer overlay's values
  // applied (overridden keys keep their header position, new keys follow).
  const MegaMetadata& metadata() const { return metadata_; }
  // The header's entries exactly as stored.
  const MegaMetadata& header_metadata() const { return header_metadata_; }
  const std::vector<MegaTensorInfo>& tensors() const { return tensors_; }
  // nullptr when no tensor has that name.
  const MegaTensorInfo* Find(std::string_view name) const;
  // NotFound naming the file and tensor.
  Result<size_t> IndexOf(std::string_view name) const;
  const std::vector<MegaSegment>& segments() const { return segments_; }
  const std::vector<MegaMoeExpert>& moe_experts() const { return moe_experts_; }
  const MegaFooterOverlayInfo& footer_overlay() const { return overlay_; }
  // True when the header carries megackpt.header_crc32 (checked at Open: a
  // corrupt header byte fails Open with DataLoss).
  bool header_checksummed() const { return header_checksummed_; }

  // Reads tensor `index`'s decoded bytes into dst (caller memory, any strides).
  // A contiguous dst receives the bytes straight from pread; compressed,
  // shuffled and chunked tensors are decoded. Verifies the stored checksum
  // when options.verify_checksums (DataLoss naming file and tensor).
  // InvalidArgument when dst's dtype or shape differs from the tensor's.
  Status ReadTensor(size_t index, const Tensor& dst) const;
  Status ReadTensor(std::string_view name, const Tensor& dst) const;
  // Allocates a contiguous tensor of the declared size and reads into it.
  // (A compressed tensor may declare up to ~43000x its stored size; callers
  // handling untrusted files should check logical_nbytes first.)
  Result<Tensor> LoadTensor(std::string_view name) const;
  // Reads several tensors. With a pool, work is split finer than tensors:
  // plain CRC-32/unverified tensors into read_block_size blocks (CRC partials
  // combined), chunked tensors into chunks; others are one item each.
  // nullptr = everything on the caller's thread. First error wins.
  Status ReadTensors(std::span<const MegaReadRequest> requests, ThreadPool* pool = nullptr) const;

  // Reads decoded bytes [logical_offset, logical_offset + dst.size()) of one
  // tensor. Plain tensors: preads exactly those bytes (checksum verified only
  // when the range is the whole tensor). Chunked: reads and decodes only the
  // chunks that overlap (each verified). Compressed/shuffled single-range
  // tensors are decoded whole (verified). OutOfRange when the range exceeds the
  // tensor's logical size.
  Status ReadRange(std::string_view name, uint64_t logical_offset, std::span<std::byte> dst) const;
  Status ReadRange(size_t index, uint64_t logical_offset, std::span<std::byte> dst) const;

  // Reads the box [start, start + dst.shape()) of a tensor into dst (any
  // strides), reading only the byte runs the box covers (plain tensors; the
  // runs come from core/box_runs.h) or the overlapping chunks (chunked).
  // REQUIRES: dst.ndim() == tensor rank, start.size() == rank;
  // InvalidArgument/OutOfRange otherwise. F4 boxes must be whole rows of bytes
  // (InvalidArgument otherwise).
  //
  // Verification of partial reads (ReadRange and ReadSlice of plain tensors)
  // when options.verify_checksums and the tensor has a checksum: with block
  // CRCs (files written with MegaEncoderOptions::block_checksums) the runs are
  // widened to whole blocks and every block is checked once, on the bytes as
  // they land (DataLoss naming file, tensor, block and offset); without them
  // the whole stored tensor is verified once per reader (VerifyTensor) before
  // the first partial read of it.
  Status ReadSlice(std::string_view name, std::span<const int64_t> start, const Tensor& dst) const;
  Status ReadSlice(size_t index, std::span<const int64_t> start, const Tensor& dst) const;

  // A zero-copy, read-only view into the mapping for a plain tensor (writing
  // through it faults: the mapping is PROT_READ). The view's owner keeps the
  // mapping alive (also after the reader is destroyed). The data pointer is
  // only as aligned as the tensor's file offset.
  // FailedPrecondition when the file is not mapped or the tensor is not plain.
  // Verifies the checksum first when options.verify_checksums.
  Result<Tensor> MappedTensor(std::string_view name) const;

  // Reads the stored bytes and checks the stored checksum (every chunk for
  // chunked tensors) and that compressed data decodes to logical_nbytes.
  // DataLoss naming the file and tensor on mismatch. Tensors with checksum
  // NONE are still decoded when compressed.
  Status VerifyTensor(size_t index) const;
  Status VerifyTensor(std::string_view name) const;
  // Every tensor, in parallel on `pool` (nullptr = the caller's thread);
  // returns the first failure.
  Status VerifyAll(ThreadPool* pool = nullptr) const;

 private:
  friend class MegaParser;  // src/format/mega_reader.cc
  MegaReader() = default;
  // Plain tensor `index`: bytes runs (src relative to the tensor) into out.
  Status ReadPlainRuns(size_t index, std::span<const BoxRun> runs, std::span<std::byte> out) const;
  Status VerifyOnce(size_t index) const;

  std::shared_ptr<RandomAccessFile> file_;
  MegaReaderOptions options_;
  uint64_t header_length_ = 0;
  uint64_t payload_end_ = 0;
  uint64_t alignment_ = kMegaDefaultAlignment;
  MegaMetadata metadata_;
  MegaMetadata header_metadata_;
  std::vector<MegaTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::vector<MegaSegment> segments_;
  std::vector<MegaMoeExpert> moe_experts_;
  MegaFooterOverlayInfo overlay_;
  bool header_checksummed_ = false;
  // Tensors VerifyOnce has checked (partial reads of tensors without blocks).
  std::unique_ptr<std::atomic<uint8_t>[]> verified_;
};

// ---- writer ------------------------------------------------------------------

enum class MegaProfile {
  // What TensorPlay's tp.save(dict, "x.mega") writes: the writer emits
  // general.architecture="tensorplay", general.alignment,
  // mega.tensor_info.format="self_describing", tensorplay.container,
  // tensorplay.byteorder="little", tensorplay.tensor_devices,
  // tensorplay.checksum, tensorplay.tensor_checksums (in that order), then the
  // caller's entries. Callers may not add those keys themselves.
  kTensorPlay,
  // Only the caller's entries, in order; general.alignment is appended when
  // the caller did not add it and alignment != 32.
  kBare,
};

// Per-tensor overrides of the writer-wide options (unset = writer default).
struct MegaTensorWriteOptions {
  std::optional<MegaChecksumType> checksum;
  std::optional<MegaCodec> compression;
  std::optional<bool> byte_shuffle;
  std::optional<uint64_t> chunk_bytes;  // 0 = not chunked
};

struct MegaWriterOptions {
  // Header alignment = general.alignment. Must be in [1, 2^30] (else
  // InvalidArgument from Finish).
  uint64_t alignment = 4096;
  // Alignment of each tensor's payload_offset (relative to header_length), in
  // [1, 2^30]. 1 = packed back to back, as the reference tooling writes.
  uint64_t tensor_alignment = 1;
  MegaChecksumType checksum = MegaChecksumType::kCrc32;
  MegaCodec compression = MegaCodec::kNone;
  int zstd_level = 3;
  // Byte-shuffle before compressing (shuffle_elem_size = dtype size; not for
  // 1-byte types or F4, which are never shuffled).
  bool byte_shuffle = false;
  // Keep a tensor (or chunk) raw when compressed_size / raw_size > min_ratio.
  double min_ratio = 0.95;
  MegaProfile profile = MegaProfile::kTensorPlay;
  // tensorplay.container value (TensorPlay profile).
  std::string tensorplay_container = "dict";
  // > 0: tensors larger than this are written as chunked_raw_dense with chunks
  // of this many logical bytes (rounded down to whole elements).
  uint64_t chunk_bytes = 0;
  // Also write mega.hash.payload.crc32 (UINT32) and mega.hash.payload.sha256
  // (hex STRING) over [header_length, payload_end) (costs an extra pass).
  bool payload_hashes = false;
  // Bytes per write call and size of the staging buffer for small and
  // non-contiguous tensors. 0 = default (16 MiB).
  size_t io_block_size = 0;
  // Tensors are written in parallel on this pool when the sink supports
  // positioned writes (nullptr = ThreadPool::Default()); max_parallel = 1
  // writes on the caller's thread only.
  ThreadPool* pool = nullptr;
  int max_parallel = 2;
  // Compressed outputs are kept in memory up to this many bytes between the
  // sizing pass and the write pass; beyond that they are recompressed.
  uint64_t compression_buffer_limit = 256ull << 20;
};

// Result of a successful write: the final layout, for building indexes.
struct MegaWriteResult {
  uint64_t file_size = 0;
  uint64_t header_length = 0;
  uint64_t payload_end = 0;
  std::vector<MegaTensorInfo> tensors;  // as a reader would parse them
  MegaMetadata metadata;                // as written
};

// Builds one MEGA file from caller tensors. Not thread-safe; one Finish per
// writer. Tensors are referenced, not copied: their memory must stay valid and
// unchanged until Finish/WriteFile returns.
class MegaWriter {
 public:
  explicit MegaWriter(MegaWriterOptions options = {});
  ~MegaWriter();
  MegaWriter(const MegaWriter&) = delete;
  MegaWriter& operator=(const MegaWriter&) = delete;

  const MegaWriterOptions& options() const { return options_; }

  // Appends a metadata entry. InvalidArgument on a duplicate key, on a key the
  // profile writes itself (TensorPlay profile), or on a general.alignment that
  // is not an unsigned integer equal to options.alignment.
  Status AddMetadata(std::string key, MetaValue value);

  // Appends a tensor (written in the order added). InvalidArgument on an empty
  // or duplicate name, a name longer than 2^32-1 bytes, an undefined tensor or
  // a non-contiguous F4 tensor.
  Status AddTensor(std::string name, const Tensor& tensor,
                   const MegaTensorWriteOptions& tensor_options = {});

  // Writes the file to `file` (which must be empty). Uses positioned writes
  // when file.supports_write_at() (payload streamed, header written last);
  // otherwise writes strictly in order (checksums computed in a first pass
  // over memory). Both produce identical bytes. Does not Sync or Close.
  Result<MegaWriteResult> Finish(WritableFile& file);

  // Creates `path`, writes, optionally fsyncs, closes. The file is written in
  // place (callers that need atomic replacement write a temp name and rename).
  Result<MegaWriteResult> WriteFile(const std::string& path, bool sync = true);

 private:
  struct PendingTensor;
  class Finisher;  // the steps of Finish (src/format/mega_writer.cc)
  MegaWriterOptions options_;
  MegaMetadata user_metadata_;
  std::vector<PendingTensor> tensors_;
  std::unordered_map<std::string, size_t> names_;
  bool finished_ = false;
};

// Appends a footer overlay to an existing MEGA file: the new overlay holds the
// previous overlay's entries updated with `entries` (so the last overlay is
// always complete), generation = previous + 1 (1 for the first),
// base_size = the payload end (preserved across generations). The header is
// not touched. InvalidArgument for structural keys (IsMegaStructuralKey) or
// an empty `entries`; DataLoss when the file is not a valid MEGA file.
// Returns the new overlay's info.
Result<MegaFooterOverlayInfo> AppendFooterOverlay(const std::string& path,
                                                  const MegaMetadata& entries, bool sync = true);

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_MEGA_H_
