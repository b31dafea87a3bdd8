// MegaEncoder: the one MEGA v1 layout + payload writer.
//
// Every MEGA file this library writes goes through it: MegaWriter (format),
// convert, consolidation and the DCP MEGA storage. It works in three steps:
//
//   1. Plan: from tensor specs (names, dtypes, shapes, checksum type and, for
//      callers that encode themselves, the stored size of each compressed
//      tensor or chunk) and the caller's metadata, fix the whole layout: every
//      payload offset, the header length (every header field has a known width
//      before the checksums are known), the profile keys, the block checksum
//      table. Nothing is written.
//   2. Payloads, in any order, from any thread (one tensor per thread at a
//      time): WriteTensor / WriteTensorBytes copy a raw tensor from caller
//      memory to the file in positioned writes (core's WritePieceFor: 2 MiB
//      pieces) and compute its checksum (and block CRCs) on each piece right
//      before writing it, so the write's copy finds it in cache.
//      Callers that produce stored bytes themselves (zstd, byte shuffle)
//      write them with WriteAt / Append and hand in the checksums
//      (SetUnitChecksum).
//   3. Finish: the header (at offset 0, positioned sinks) and
//      the tail guard (docs/format/mega-v1.md §8.11).
//
// Sequential sinks (no WriteAt, e.g. an upload stream) need the header first:
// AppendHeader after every checksum is known, Append in file order, then
// FinishAppend; WriteSequential does all of it for raw tensors (one checksum
// pass over memory, then one write pass). Both sink kinds give identical bytes.
//
// Owned metadata keys (docs/format/mega-v1.md §11), written only when asked:
//   megackpt.block_crc32.block_sizes   ARRAY<UINT32> per tensor (0 = none)
//   megackpt.block_crc32.table_offsets ARRAY<UINT64> per tensor: payload-relative
//                                      offset of its CRC table (right after its bytes)
//   megackpt.header_crc32             UINT32, last header entry: CRC-32 of the
//                                     header bytes with these 4 bytes zeroed
// Readers that do not know them ignore them (the tensors stay raw_dense,
// zero-copy readable; the tables sit in payload bytes no tensor uses).
#ifndef MEGACKPT_FORMAT_MEGA_ENCODER_H_
#define MEGACKPT_FORMAT_MEGA_ENCODER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/format/mega.h"

namespace megackpt::format {

inline constexpr std::string_view kMegaBlockSizesKey = "megackpt.block_crc32.block_sizes";
inline constexpr std::string_view kMegaBlockTableKey = "megackpt.block_crc32.table_offsets";
inline constexpr std::string_view kMegaHeaderCrcKey = "megackpt.header_crc32";
// Block sizes are powers of two in [kMegaMinBlockSize, kMegaMaxBlockSize].
inline constexpr uint64_t kMegaMinBlockSize = 64;
inline constexpr uint64_t kMegaMaxBlockSize = 1ull << 20;

// The block size the encoder picks for a raw tensor (0 = no blocks: empty
// tensors): core's AutoCrcBlockSize of the innermost dimension's bytes (the
// power of two at or below 1/16 of a row, clamped to [64, 64 KiB]); 64 KiB for
// 0-d and 1-d tensors. A read of a box is widened to whole blocks, so a box
// cutting the innermost dimension in k parts reads about k/16 more than it
// needs (docs/mega-storage.md §5).
uint64_t MegaBlockSizeFor(DType dtype, const Shape& shape);

// True when every string in v (STRING, arrays of strings, nested arrays) is
// valid UTF-8 without NUL: what writers accept and readers require.
bool IsCleanMetaValue(const MetaValue& v);

// One independently stored byte range of a tensor: the whole tensor, or one
// chunk of a chunked_raw_dense tensor.
struct MegaEncoderUnit {
  uint64_t logical_offset = 0;
  uint64_t logical_size = 0;
  uint64_t stored_size = 0;  // = logical_size unless compressed
  bool compressed = false;   // zstd
  bool shuffled = false;     // byte-shuffled (with the tensor's shuffle_elem_size)
};

struct MegaEncoderTensor {
  std::string name;  // non-empty, unique, valid UTF-8 without NUL
  DType dtype = DType::kU8;
  Shape shape;
  MegaChecksumType checksum = MegaChecksumType::kCrc32;
  // Empty: one raw unit (stored = logical bytes). Otherwise the units tile
  // [0, logical_nbytes) in order; several units = chunked_raw_dense.
  std::vector<MegaEncoderUnit> units;
  bool chunked = false;            // chunked_raw_dense (even with one unit)
  uint32_t shuffle_elem_size = 0;  // when a unit is shuffled
};

struct MegaEncoderOptions {
  uint64_t alignment = 4096;      // general.alignment, in [1, 2^30]
  uint64_t tensor_alignment = 1;  // each tensor's payload_offset, in [1, 2^30]
  MegaProfile profile = MegaProfile::kTensorPlay;
  std::string tensorplay_container = "dict";
  // tensorplay.checksum (the writer-wide default; TensorPlay profile).
  MegaChecksumType checksum = MegaChecksumType::kCrc32;
  // Block CRC-32s of every raw, checksummed tensor (MegaBlockSizeFor) in a
  // table right after the tensor's bytes, so a partial read can be verified.
  bool block_checksums = false;
  // megackpt.header_crc32 as the last header entry.
  bool header_checksum = false;
  // mega.hash.payload.crc32 / .sha256 entries (values from SetPayloadHashes).
  bool payload_hashes = false;
  // Positioned writes of a tensor: after each further `writeback_bytes` bytes,
  // WritableFile::StartWriteback of them, so the device works while the next
  // bytes are copied and a final Sync waits for less (durable saves; a hint
  // only). 0: never.
  uint64_t writeback_bytes = 0;
};

class MegaEncoder {
 public:
  // Plans the layout. `file_name` prefixes error messages. `user_metadata`
  // follows the profile keys. InvalidArgument: empty, duplicate, too long or
  // not clean-text names or keys, bad shapes, units that do not tile the
  // tensor, alignments out of range, a user key the encoder writes itself.
  static Result<std::unique_ptr<MegaEncoder>> Plan(std::string file_name,
                                                   std::vector<MegaEncoderTensor> tensors,
                                                   MegaMetadata user_metadata,
                                                   const MegaEncoderOptions& options);
  ~MegaEncoder();
  MegaEncoder(const MegaEncoder&) = delete;
  MegaEncoder& operator=(const MegaEncoder&) = delete;

  const std::string& file_name() const { return file_name_; }
  size_t num_tensors() const { return specs_.size(); }
  uint64_t header_length() const { return header_length_; }
  // End of the planned bytes (the tail guard may add 68 zero bytes at Finish).
  uint64_t planned_size() const { return file_end_; }
  // Absolute file offsets and sizes of tensor i (as planned).
  uint64_t tensor_file_offset(size_t i) const { return header_length_ + infos_[i].payload_offset; }
  uint64_t tensor_nbytes(size_t i) const { return infos_[i].logical_nbytes; }
  uint64_t unit_file_offset(size_t i, size_t unit) const;
  size_t num_units(size_t i) const { return units_[i].size(); }
  uint64_t block_size(size_t i) const { return block_size_[i]; }
  // Tensor i as a reader will parse it (checksum filled once known). A copy:
  // safe while other threads write.
  MegaTensorInfo tensor_info(size_t i) const;

  // ---- positioned sinks (file.supports_write_at()) -------------------------
  // Writes raw tensor i (one unit, uncompressed) from `t` (same dtype and
  // shape, any strides; F4 contiguous). Thread-safe for distinct i.
  // InvalidArgument on mismatch; FailedPrecondition when written twice.
  Status WriteTensor(WritableFile& file, size_t i, const Tensor& t);
  // The same from its dense bytes (bytes.size() == tensor_nbytes(i)).
  Status WriteTensorBytes(WritableFile& file, size_t i, std::span<const std::byte> bytes);
  // Stored bytes at an absolute file offset (for callers that encode units
  // themselves). Thread-safe.
  Status WriteAt(WritableFile& file, uint64_t file_offset, std::span<const std::byte> bytes);
  // REQUIRES every checksum known (all_written()): writes the block table, the
  // header at 0 and the tail guard. Does not Sync or Close.
  Status FinishPositioned(WritableFile& file);

  // ---- sequential sinks ----------------------------------------------------
  // REQUIRES every checksum known: appends the header. Then Append the payload
  // in file order (gaps are filled with zeros), then FinishAppend.
  Status AppendHeader(WritableFile& file);
  Status Append(WritableFile& file, uint64_t file_offset, std::span<const std::byte> bytes);
  Status FinishAppend(WritableFile& file);
  // Raw tensors only, tensors[i] for spec i: a checksum pass over memory, then
  // header, payload and table appended in order.
  Status WriteSequential(WritableFile& file, std::span<const Tensor> tensors);

  // ---- checksums from callers that encode units themselves -----------------
  void SetUnitChecksum(size_t i, size_t unit, const MegaChecksum& checksum);
  void SetPayloadHashes(uint32_t crc32, const Sha256Digest& sha256);
  // Bytes the caller computed hashes over but writes later: lets the tail
  // guard decision be known early (tail_guard_needed()).
  void Observe(uint64_t file_offset, std::span<const std::byte> bytes);
  bool tail_guard_needed() const;

  bool tensor_written(size_t i) const;
  bool all_written() const;

  // After a Finish: the final layout and metadata.
  MegaWriteResult result() const;

 private:
  MegaEncoder() = default;
  Result<std::string> EncodeHeader() const;
  Result<MegaMetadata> BuildMetadata() const;
  // Writes tensor i's nbytes in pieces ending on multiples of core's
  // WritePieceFor(file) (NextWritePiece); piece(off, n) hands over bytes
  // [off, off + n).
  Status WriteRaw(WritableFile& file, size_t i, uint64_t nbytes,
                  const std::function<std::span<const std::byte>(uint64_t, uint64_t)>& piece,
                  bool positioned);

  std::string file_name_;
  MegaEncoderOptions options_;
  std::vector<MegaEncoderTensor> specs_;
  MegaMetadata user_metadata_;
  std::vector<MegaTensorInfo> infos_;                // planned directory (checksums as set)
  std::vector<std::vector<MegaEncoderUnit>> units_;  // per tensor
  std::vector<std::vector<uint64_t>> unit_offsets_;  // payload-relative
  std::vector<std::vector<uint8_t>> unit_done_;
  std::vector<uint64_t> block_size_;  // per tensor, 0 = none
  // Per tensor, once written and only while keep_block_tables_: its table as
  // stored (u32 LE). Other writes free each table once it is in the file.
  std::vector<std::vector<uint32_t>> block_crcs_;
  bool keep_block_tables_ = false;       // WriteSequential's pass 2 appends them
  std::vector<uint64_t> table_offsets_;  // per tensor, payload-relative
  uint32_t payload_crc_ = 0;
  Sha256Digest payload_sha_{};
  uint64_t header_length_ = 0;
  uint64_t file_end_ = 0;
  uint64_t final_size_ = 0;
  MegaMetadata final_metadata_;
  uint64_t probe_at_ = UINT64_MAX;
  std::array<std::byte, 4> probe_{};
  std::atomic<uint64_t> end_written_{0};
  uint64_t appended_ = 0;  // sequential: bytes appended so far
  mutable std::mutex mu_;
};

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_MEGA_ENCODER_H_
