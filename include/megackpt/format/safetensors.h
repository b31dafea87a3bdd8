// safetensors (.safetensors) reader and writer.
//
// File layout (docs/format/safetensors.md has the full description):
//
//   +------------------------------------------------------------+ offset 0
//   | u64 N (little-endian): byte length of the JSON header      |
//   | N bytes: UTF-8 JSON object, starts with '{', may be padded |
//   |          with trailing spaces                              |
//   +------------------------------------------------------------+ offset 8 + N
//   | data buffer: every tensor's bytes, C order, little-endian; |
//   | data_offsets [begin, end) are relative to this point and   |
//   | must tile the whole buffer without gaps or overlaps        |
//   +------------------------------------------------------------+ end of file
//
// JSON header: {"__metadata__": {"k": "v", ...},            (optional, string -> string)
//               "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
//
// Readers validate everything before exposing a tensor (header cap, UTF-8/JSON,
// duplicate keys, dtype names, checked size arithmetic, exact coverage of the data
// buffer) and return DataLoss (malformed bytes) naming the file and the key.
#ifndef MEGACKPT_FORMAT_SAFETENSORS_H_
#define MEGACKPT_FORMAT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/thread_pool.h"

namespace megackpt::format {

// Width of the little-endian header length at the start of the file.
inline constexpr uint64_t kSafetensorsLengthBytes = 8;
// Largest accepted JSON header (the reference implementation's limit). A file
// announcing more is rejected with ResourceExhausted before anything is allocated.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;
// The header is padded with spaces to a multiple of this, so the data buffer
// starts 8-byte aligned in the file.
inline constexpr uint64_t kSafetensorsHeaderAlignment = 8;
// The reserved header key holding the string -> string metadata.
inline constexpr std::string_view kSafetensorsMetadataKey = "__metadata__";

// One tensor entry of a parsed header.
struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  // [data_begin, data_end) relative to the data buffer (not the file).
  uint64_t data_begin = 0;
  uint64_t data_end = 0;

  uint64_t nbytes() const { return data_end - data_begin; }
};

// One destination for SafetensorsReader::ReadTensors.
struct SafetensorsReadRequest {
  std::string name;
  Tensor dst;
};

// A validated header.
struct SafetensorsHeader {
  // The JSON header length N (including padding).
  uint64_t header_bytes = 0;
  // Size of the data buffer (file size - 8 - N); every byte belongs to a tensor.
  uint64_t data_bytes = 0;
  // `__metadata__` (empty when absent).
  std::map<std::string, std::string> metadata;
  // Sorted by (data_begin, data_end, name): the order of the bytes in the file.
  std::vector<SafetensorsTensorInfo> tensors;

  // Absolute file offset of the data buffer.
  uint64_t data_offset() const { return kSafetensorsLengthBytes + header_bytes; }
};

// Validates the JSON header text `json` (the N bytes after the length field) of
// a file of `file_size` bytes named `file_name` (used in messages only).
// DataLoss on any malformed content; ResourceExhausted when json.size() exceeds
// kSafetensorsMaxHeaderBytes.
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file_name, std::string_view json,
                                                 uint64_t file_size);

// Validates a whole file image held in memory (length field, header, coverage).
Result<SafetensorsHeader> ParseSafetensors(std::string_view file_name,
                                           std::span<const std::byte> file_bytes);

// Reads tensors of one safetensors file. Thread-safe after Open (all methods
// are const). The file stays open (and mapped, if it was) as long as this
// reader or any tensor view returned by View() lives.
class SafetensorsReader {
 public:
  struct Options {
    // Map the file (needed by View(); pread-based reads work either way).
    bool mmap = true;
  };

  // Opens a local file and validates its header. NotFound when missing;
  // DataLoss / ResourceExhausted on a malformed file (message names the file).
  static Result<std::unique_ptr<SafetensorsReader>> Open(const std::string& path,
                                                         const Options& options);
  static Result<std::unique_ptr<SafetensorsReader>> Open(const std::string& path) {
    return Open(path, Options());
  }
  // Same over any RandomAccessFile (e.g. a mega:// object).
  static Result<std::unique_ptr<SafetensorsReader>> Open(std::shared_ptr<RandomAccessFile> file);

  const std::string& name() const { return file_->name(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // In file order (by data offset).
  const std::vector<SafetensorsTensorInfo>& tensors() const { return header_.tensors; }
  // nullptr when no tensor has this name.
  const SafetensorsTensorInfo* Find(std::string_view name) const;
  // The underlying file (for bulk reads by callers that plan their own I/O).
  const std::shared_ptr<RandomAccessFile>& file() const { return file_; }

  // A zero-copy view of the tensor's bytes in the file mapping. The view owns a
  // reference to the mapping. The memory is read-only: writing through the view
  // is undefined (the mapping is PROT_READ). The data pointer may be unaligned for
  // the dtype (safetensors only guarantees 8-byte alignment of the buffer start).
  // NotFound for an unknown name; FailedPrecondition when the file is not mapped.
  Result<Tensor> View(std::string_view name) const;

  // Reads bytes [offset, offset + dst.size()) of the tensor's data with pread.
  // OutOfRange when the range leaves the tensor; NotFound for an unknown name.
  Status ReadRange(std::string_view name, uint64_t offset, std::span<std::byte> dst) const;

  // Reads the whole tensor into `dst` (same dtype and shape; any strides). A
  // contiguous dst is filled by pread straight into its memory; a strided dst is
  // filled through a bounded staging buffer (at most `kStagingBytes` or one
  // innermost row, whichever is larger). InvalidArgument on dtype/shape mismatch.
  Status ReadTensor(std::string_view name, const Tensor& dst) const;

  // Allocates a new contiguous tensor and reads into it.
  Result<Tensor> Load(std::string_view name) const;

  // Reads several whole tensors, each as ReadTensor. With a pool, a contiguous
  // destination larger than `block` bytes is read in `block`-sized preads
  // shared out over the pool's threads and the caller's, so one large tensor
  // is read by every thread; others are one item each. nullptr = everything on
  // the caller's thread. First error wins. (MegaReader::ReadTensors is the MEGA
  // counterpart; safetensors carries no checksums, so nothing is verified.)
  Status ReadTensors(std::span<const SafetensorsReadRequest> requests, ThreadPool* pool = nullptr,
                     uint64_t block = kStagingBytes) const;

  static constexpr size_t kStagingBytes = 16u << 20;

 private:
  SafetensorsReader(std::shared_ptr<RandomAccessFile> file, SafetensorsHeader header);
  Result<const SafetensorsTensorInfo*> Lookup(std::string_view name) const;

  std::shared_ptr<RandomAccessFile> file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t, std::less<>> by_name_;
};

// Order of the tensors in a written file.
enum class SafetensorsOrder {
  // As the reference `safetensors.serialize`: descending dtype alignment (the
  // reference's dtype ranking: U64, I64, F64, F32, U32, I32, BF16, F16, U16, I16,
  // F8_E8M0, F8_E4M3, F8_E5M2, I8, U8, F4, BOOL), then by name (bytewise). Every
  // tensor then starts aligned to its element size. Deterministic.
  kReference,
  // In the order given by the caller.
  kAsGiven,
};

struct SafetensorsWriteOptions {
  SafetensorsOrder order = SafetensorsOrder::kReference;
};

// Name, dtype and shape of a tensor to be written.
struct SafetensorsTensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
};

// Streams one safetensors file to a WritableFile (a sequential sink is enough:
// the format needs no back-patching). Usage:
//   auto w = SafetensorsWriter::Start(out, specs, metadata);     // writes the header
//   for (const auto& info : (*w)->layout()) (*w)->WriteTensor(tensor_named(info.name));
//   (*w)->Finish();                                              // then out->Close()
// Tensor bytes go from the caller's memory to `out` with one Append per
// contiguous tensor (no intermediate copy); strided tensors are staged through
// a bounded buffer.
class SafetensorsWriter {
 public:
  // Plans the layout and appends the length field and the JSON header to `out`.
  // InvalidArgument on duplicate or reserved ("__metadata__") names, invalid
  // UTF-8 in names or metadata, a bad shape, an F4 tensor with an odd element
  // count (not representable in safetensors), or a header above the 100 MB cap.
  // REQUIRES: `out` outlives the writer and is empty (nothing appended yet).
  static Result<std::unique_ptr<SafetensorsWriter>> Start(
      WritableFile* out, std::vector<SafetensorsTensorSpec> tensors,
      const std::map<std::string, std::string>& metadata,
      const SafetensorsWriteOptions& options = {});

  // The tensors in file order; data must be supplied in exactly this order.
  const std::vector<SafetensorsTensorInfo>& layout() const { return layout_; }
  // Total size of the file once finished.
  uint64_t file_size() const { return data_offset_ + data_bytes_; }

  // Writes the next tensor of layout(). InvalidArgument when its dtype/shape
  // differ from the spec or every tensor was already written.
  Status WriteTensor(const Tensor& tensor);

  // Appends raw bytes of the data buffer (for callers streaming a tensor in
  // pieces). Pieces may span tensor boundaries; the total must not exceed the
  // planned data size (InvalidArgument).
  Status AppendData(std::span<const std::byte> bytes);

  // Bytes of the data buffer written so far.
  uint64_t data_written() const { return written_; }

  // Checks every planned byte was written (FailedPrecondition otherwise). Does
  // not sync or close `out`.
  Status Finish();

 private:
  SafetensorsWriter() = default;

  WritableFile* out_ = nullptr;
  std::vector<SafetensorsTensorInfo> layout_;
  uint64_t data_offset_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
  size_t next_index_ = 0;
  std::shared_ptr<std::byte> staging_;
  size_t staging_cap_ = 0;
};

// Writes `tensors` (name, tensor) and `metadata` as one safetensors file to
// `out` (not closed). Same errors as SafetensorsWriter::Start.
Status WriteSafetensors(WritableFile* out, std::span<const std::pair<std::string, Tensor>> tensors,
                        const std::map<std::string, std::string>& metadata = {},
                        const SafetensorsWriteOptions& options = {});

// Writes a local file: created (truncated), written, fsync'ed when `sync`, closed.
Status SaveSafetensorsFile(const std::string& path,
                           std::span<const std::pair<std::string, Tensor>> tensors,
                           const std::map<std::string, std::string>& metadata = {},
                           const SafetensorsWriteOptions& options = {}, bool sync = false);

// Rank used by SafetensorsOrder::kReference (higher sorts first).
int SafetensorsDTypeRank(DType dtype);

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_SAFETENSORS_H_
