// Internals of the MEGA storage backend shared by the writer, the reader and
// consolidation: a streaming MEGA shard writer, the `tensorplay.dcp.*` shard
// entries codec and the shard file naming rules (docs/mega-storage.md).
#ifndef MEGACKPT_SRC_DCP_MEGA_STORAGE_SHARD_H_
#define MEGACKPT_SRC_DCP_MEGA_STORAGE_SHARD_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/dcp/metadata.h"
#include "megackpt/core/file.h"
#include "megackpt/format/mega.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"

namespace megackpt::dcp::mega_storage {

// ---- shard writer ------------------------------------------------------------

struct ShardTensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
};

struct ShardWriterOptions {
  uint64_t alignment = 4096;        // general.alignment (header padding)
  uint64_t tensor_alignment = 64;   // alignment of each payload offset
  format::MegaChecksumType checksum = format::MegaChecksumType::kCrc32;
};

// Writes one MEGA v1 file in the TensorPlay profile (raw_dense tensors) whose
// tensors arrive one at a time, in any order, from any thread: the layout is
// fixed up front from names, dtypes and shapes (every header field has a known
// width before the checksums are known), payloads are written with positioned
// writes as they come, and the header last. The bytes are identical to what
// MegaWriter (same profile, alignment, tensor_alignment, checksum, metadata)
// writes for the same tensors. REQUIRES: the file supports positioned writes.
class ShardFileWriter {
 public:
  // Plans the layout. `user_metadata` follows the profile keys.
  // InvalidArgument: duplicate or empty names, bad shapes, a non-positioned file.
  static Result<std::unique_ptr<ShardFileWriter>> Create(std::unique_ptr<WritableFile> file,
                                                         std::vector<ShardTensorSpec> specs,
                                                         format::MegaMetadata user_metadata,
                                                         const ShardWriterOptions& options);
  ~ShardFileWriter();

  const std::string& file_name() const { return file_->name(); }
  size_t num_tensors() const { return specs_.size(); }
  const ShardTensorSpec& spec(size_t i) const { return specs_[i]; }
  uint64_t header_length() const { return header_length_; }
  uint64_t file_size() const { return file_end_; }
  // Absolute file offset of tensor i's payload.
  uint64_t tensor_file_offset(size_t i) const { return header_length_ + offsets_[i]; }
  uint64_t tensor_nbytes(size_t i) const { return nbytes_[i]; }

  // Writes tensor i from `t` (same dtype and shape; any strides). Thread-safe for
  // distinct i. InvalidArgument on mismatch; FailedPrecondition when already written.
  Status WriteTensor(size_t i, const Tensor& t);
  // Writes tensor i (U8 of bytes.size() elements, or any dtype whose bytes these are).
  Status WriteBytes(size_t i, std::span<const std::byte> bytes);

  // "crc32:<8 hex>" / "sha256:<64 hex>" / "" of tensor i. REQUIRES: written.
  std::string checksum_string(size_t i) const;
  bool all_written() const;

  // REQUIRES all_written(): writes the header, then Sync (when `sync`) and Close.
  Status Finish(bool sync);
  // Closes the file without a header (the caller removes it).
  void Abandon();

 private:
  ShardFileWriter() = default;
  Status WriteAt(uint64_t file_offset, std::span<const std::byte> bytes);
  Result<std::string> EncodeFinalHeader();
  void Probe(uint64_t file_offset, std::span<const std::byte> bytes);

  std::unique_ptr<WritableFile> file_;
  ShardWriterOptions options_;
  std::vector<ShardTensorSpec> specs_;
  format::MegaMetadata user_metadata_;
  std::vector<uint64_t> offsets_;  // relative to header_length
  std::vector<uint64_t> nbytes_;
  std::vector<format::MegaChecksum> checksums_;
  std::vector<uint8_t> written_;
  uint64_t header_length_ = 0;
  uint64_t file_end_ = 0;
  uint64_t probe_at_ = UINT64_MAX;
  std::array<std::byte, 4> probe_{};
  std::atomic<uint64_t> end_written_{0};  // largest offset written + 1
  mutable std::mutex mu_;
  bool closed_ = false;
};

// ---- shard entries (tensorplay.dcp.entries) ------------------------------------

struct ShardEntry {
  bool is_bytes = false;
  DType dtype = DType::kU8;     // tensor dtype (bytes: U8)
  Shape global_shape;           // tensors
  Shape offsets;                // chunk offsets in the global tensor
};

// JSON {fqn: {"kind", "dtype", "global_shape", "offsets"}} (keys sorted).
std::string EncodeShardEntries(const std::map<std::string, ShardEntry>& entries);
// DataLoss naming `file` for malformed JSON or values.
Result<std::map<std::string, ShardEntry>> DecodeShardEntries(std::string_view file,
                                                             std::string_view json);

std::string EncodeObjectPaths(const std::map<std::string, ObjectPath>& paths);
Result<std::map<std::string, ObjectPath>> DecodeObjectPaths(std::string_view file,
                                                            std::string_view json);

// ---- naming ---------------------------------------------------------------------

// "model.mega" when count == 1, else "model-NNNNN-of-MMMMM.mega"; with a
// non-empty save id "model-<id>.mega" / "model-<id>-NNNNN-of-MMMMM.mega"; with
// rank_tag >= 0 (saves without collectives) "model-rank<r>-..." always with id.
// `ext` is ".mega" or ".safetensors".
std::string ShardFileName(std::string_view ext, size_t number, size_t count,
                          std::string_view save_id, int rank_tag = -1);
// True for names ShardFileName can produce (any id, counts, ext); *rank_tag = r
// for rank-tagged names, else -1.
bool IsShardFileName(std::string_view name, int* rank_tag = nullptr);

// 12 random lowercase hex digits.
std::string NewSaveId();

// "crc32:%08x".
std::string CrcString(uint32_t crc);
// "crc32:..." / "sha256:..." / "" for a tensor of a MEGA file.
std::string MegaChecksumString(const format::MegaTensorInfo& t);

// 'name' (for messages).
std::string Quote(std::string_view s);

}  // namespace megackpt::dcp::mega_storage

#endif  // MEGACKPT_SRC_DCP_MEGA_STORAGE_SHARD_H_
