#include "megackpt/format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>

#include "format/quote.h"
#include "megackpt/core/checksum.h"

namespace megackpt::format {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

using format_internal::Quote;

Status Malformed(std::string_view file, std::string_view what) {
  return DataLossError(std::string(file) + ": safetensors " + std::string(what));
}

Status MalformedTensor(std::string_view file, std::string_view tensor, std::string_view what) {
  return DataLossError(std::string(file) + ": safetensors tensor " + Quote(tensor) + ": " +
                       std::string(what));
}

uint64_t LoadLe64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

void StoreLe64(uint64_t v, std::byte* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

// The checks that need the whole entry: offsets ordered, checked size
// arithmetic, whole bytes, and offsets matching dtype x shape.
Status CheckEntrySize(std::string_view file, const SafetensorsTensorInfo& info) {
  const std::string& name = info.name;
  if (info.data_end < info.data_begin) {
    return MalformedTensor(file, name,
                           "data_offsets [" + std::to_string(info.data_begin) + ", " +
                               std::to_string(info.data_end) + ") end before they begin");
  }
  auto numel = NumElements(info.shape);
  if (!numel.ok()) {
    return MalformedTensor(file, name, "shape " + ShapeToString(info.shape) + " overflows");
  }
  uint64_t bits;
  if (__builtin_mul_overflow(*numel, static_cast<uint64_t>(DTypeBits(info.dtype)), &bits)) {
    return MalformedTensor(file, name,
                           "byte size of shape " + ShapeToString(info.shape) + " overflows");
  }
  if (bits % 8 != 0) {
    return MalformedTensor(file, name,
                           "F4 tensor of shape " + ShapeToString(info.shape) +
                               " has an odd element count (not a whole number of bytes)");
  }
  const uint64_t nbytes = bits / 8;
  if (info.nbytes() != nbytes) {
    return MalformedTensor(file, name,
                           "data_offsets [" + std::to_string(info.data_begin) + ", " +
                               std::to_string(info.data_end) + ") hold " +
                               std::to_string(info.nbytes()) + " bytes but " +
                               std::string(DTypeName(info.dtype)) + " " +
                               ShapeToString(info.shape) + " needs " + std::to_string(nbytes));
  }
  return Status::OK();
}

// Streams the header JSON straight into SafetensorsTensorInfo records (no DOM:
// a 10,000-tensor header parses several times faster), rejecting every
// malformed construct as it is seen. Keys repeated within one object are
// errors (plain JSON parsers silently keep the last one).
class HeaderParser final : public nlohmann::json_sax<json> {
 public:
  HeaderParser(std::string_view file, SafetensorsHeader* header) : file_(file), header_(header) {}

  // The first error (OK while parsing succeeds).
  const Status& status() const { return status_; }

  bool null() override { return Other(); }
  bool boolean(bool) override { return Other(); }
  bool number_integer(number_integer_t v) override {
    return v < 0 ? Other() : Unsigned(static_cast<uint64_t>(v));
  }
  bool number_unsigned(number_unsigned_t v) override { return Unsigned(v); }
  bool number_float(number_float_t, const string_t&) override { return Other(); }
  bool binary(binary_t&) override { return Other(); }

  bool string(string_t& v) override {
    if (skip_depth_ > 0) return true;
    if (level_ == Level::kMetadata) {
      header_->metadata.emplace(key_, std::move(v));
      return true;
    }
    if (level_ == Level::kEntry && field_ == kDtype) {
      auto dtype = DTypeFromName(v);
      if (!dtype.ok()) return FailTensor("unsupported dtype " + Quote(v));
      entry_.dtype = *dtype;
      return true;
    }
    return Other();
  }

  bool start_object(std::size_t) override {
    if (skip_depth_ > 0) return Skip();
    switch (level_) {
      case Level::kTop:
        level_ = Level::kRoot;
        return true;
      case Level::kRoot:
        if (key_ == kSafetensorsMetadataKey) {
          level_ = Level::kMetadata;
        } else {
          entry_ = SafetensorsTensorInfo();
          entry_.name = key_;
          seen_ = 0;
          unknown_keys_.clear();
          level_ = Level::kEntry;
        }
        return true;
      case Level::kEntry:
        if (field_ == kOther) return Skip();
        return Other();
      default:
        return Other();
    }
  }

  bool end_object() override {
    if (skip_depth_ > 0) return Unskip();
    switch (level_) {
      case Level::kMetadata:
        level_ = Level::kRoot;
        return true;
      case Level::kEntry:
        level_ = Level::kRoot;
        return FinishEntry();
      case Level::kRoot:
        level_ = Level::kDone;
        return true;
      default:
        return true;
    }
  }

  bool start_array(std::size_t) override {
    if (skip_depth_ > 0) return Skip();
    if (level_ == Level::kEntry) {
      if (field_ == kShape) {
        level_ = Level::kShape;
        return true;
      }
      if (field_ == kOffsets) {
        level_ = Level::kOffsets;
        offsets_count_ = 0;
        return true;
      }
      if (field_ == kOther) return Skip();
    }
    return Other();
  }

  bool end_array() override {
    if (skip_depth_ > 0) return Unskip();
    if (level_ == Level::kShape) {
      level_ = Level::kEntry;
    } else if (level_ == Level::kOffsets) {
      if (offsets_count_ != 2) return ArityError();
      level_ = Level::kEntry;
    }
    return true;
  }

  bool key(string_t& k) override {
    if (skip_depth_ > 0) return true;
    switch (level_) {
      case Level::kRoot:
        if (k == kSafetensorsMetadataKey) {
          if (seen_metadata_) return Fail("header: duplicate key " + Quote(k));
          seen_metadata_ = true;
        } else if (!names_.insert(k).second) {
          return Fail("header: duplicate key " + Quote(k));
        }
        break;
      case Level::kMetadata:
        if (header_->metadata.count(k)) return Fail("header: duplicate key " + Quote(k));
        break;
      case Level::kEntry: {
        field_ = k == "dtype"          ? kDtype
                 : k == "shape"        ? kShape
                 : k == "data_offsets" ? kOffsets
                                       : kOther;
        bool repeated = false;
        if (field_ == kOther) {
          repeated =
              std::find(unknown_keys_.begin(), unknown_keys_.end(), k) != unknown_keys_.end();
          unknown_keys_.push_back(k);
        } else {
          repeated = (seen_ & field_) != 0;
          seen_ |= field_;
        }
        if (repeated) return Fail("header: duplicate key " + Quote(k));
        break;
      }
      default:
        break;
    }
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return Fail(std::string("header is not valid JSON: ") + e.what());
  }

 private:
  enum class Level { kTop, kRoot, kMetadata, kEntry, kShape, kOffsets, kDone };
  enum Field : unsigned { kOther = 0, kDtype = 1, kShape = 2, kOffsets = 4 };
  // Unknown entry fields are skipped whole, but not without bound.
  static constexpr int kMaxSkipDepth = 128;

  bool Fail(std::string what) {
    if (status_.ok()) status_ = Malformed(file_, what);
    return false;
  }
  bool FailTensor(std::string what) {
    if (status_.ok()) status_ = MalformedTensor(file_, entry_.name, what);
    return false;
  }
  bool ArityError() { return FailTensor("\"data_offsets\" is not an array [begin, end]"); }

  bool Skip() {
    if (++skip_depth_ > kMaxSkipDepth) {
      return Fail("header nesting deeper than " + std::to_string(kMaxSkipDepth) + " levels");
    }
    return true;
  }
  bool Unskip() {
    --skip_depth_;
    return true;
  }

  bool Unsigned(uint64_t v) {
    if (skip_depth_ > 0) return true;
    if (level_ == Level::kShape) {
      if (v > static_cast<uint64_t>(INT64_MAX)) return Other();
      entry_.shape.push_back(static_cast<int64_t>(v));
      return true;
    }
    if (level_ == Level::kOffsets) {
      if (offsets_count_ >= 2) return ArityError();
      (offsets_count_++ == 0 ? entry_.data_begin : entry_.data_end) = v;
      return true;
    }
    return Other();
  }

  // A value that is not what its position needs (or is ignored there).
  bool Other() {
    if (skip_depth_ > 0) return true;
    switch (level_) {
      case Level::kTop:
        return Fail("header is not a JSON object");
      case Level::kRoot:
        if (key_ == kSafetensorsMetadataKey) return Fail("\"__metadata__\" is not a JSON object");
        entry_.name = key_;
        return FailTensor("entry is not a JSON object");
      case Level::kMetadata:
        return Fail("\"__metadata__\" value of key " + Quote(key_) + " is not a string");
      case Level::kEntry:
        switch (field_) {
          case kDtype:
            return FailTensor("\"dtype\" is not a string");
          case kShape:
            return FailTensor("\"shape\" is not an array");
          case kOffsets:
            return ArityError();
          default:
            return true;  // unknown fields are ignored, as the reference does
        }
      case Level::kShape:
        return FailTensor("shape dimension " + std::to_string(entry_.shape.size()) +
                          " is not a non-negative integer below 2^63");
      case Level::kOffsets:
        if (offsets_count_ >= 2) return ArityError();
        return FailTensor("\"data_offsets\" are not non-negative integers");
      default:
        return Fail("header has content after its closing brace");
    }
  }

  bool FinishEntry() {
    if (!(seen_ & kDtype)) return FailTensor("missing \"dtype\"");
    if (!(seen_ & kShape)) return FailTensor("missing \"shape\"");
    if (!(seen_ & kOffsets)) return FailTensor("missing \"data_offsets\"");
    Status s = CheckEntrySize(file_, entry_);
    if (!s.ok()) {
      status_ = s;
      return false;
    }
    header_->tensors.push_back(std::move(entry_));
    return true;
  }

  std::string_view file_;
  SafetensorsHeader* header_;
  Status status_;
  Level level_ = Level::kTop;
  std::string key_;
  Field field_ = kOther;
  unsigned seen_ = 0;
  std::vector<std::string> unknown_keys_;
  SafetensorsTensorInfo entry_;
  int offsets_count_ = 0;
  int skip_depth_ = 0;
  bool seen_metadata_ = false;
  std::unordered_set<std::string> names_;
};

}  // namespace

int SafetensorsDTypeRank(DType dtype) {
  // The reference's Dtype enum order (increasing alignment): BOOL, F4, (F6_*), U8,
  // I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, (C64), F64,
  // I64, U64. Gaps keep the two F6 types and C64 we do not support in place.
  switch (dtype) {
    case DType::kBool:
      return 0;
    case DType::kF4:
      return 1;
    case DType::kU8:
      return 4;
    case DType::kI8:
      return 5;
    case DType::kF8_E5M2:
      return 6;
    case DType::kF8_E4M3:
      return 7;
    case DType::kF8_E8M0:
      return 8;
    case DType::kI16:
      return 9;
    case DType::kU16:
      return 10;
    case DType::kF16:
      return 11;
    case DType::kBF16:
      return 12;
    case DType::kI32:
      return 13;
    case DType::kU32:
      return 14;
    case DType::kF32:
      return 15;
    case DType::kF64:
      return 17;
    case DType::kI64:
      return 18;
    case DType::kU64:
      return 19;
  }
  return 0;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file_name,
                                                 std::string_view json_text, uint64_t file_size) {
  SafetensorsHeader header;
  header.header_bytes = json_text.size();
  if (header.header_bytes > kSafetensorsMaxHeaderBytes) {
    return ResourceExhaustedError(std::string(file_name) + ": safetensors header of " +
                                  std::to_string(header.header_bytes) + " bytes exceeds the " +
                                  std::to_string(kSafetensorsMaxHeaderBytes) + "-byte limit");
  }
  if (file_size < kSafetensorsLengthBytes + header.header_bytes) {
    return Malformed(file_name, "header of " + std::to_string(header.header_bytes) +
                                    " bytes does not fit in a file of " +
                                    std::to_string(file_size) + " bytes");
  }
  header.data_bytes = file_size - kSafetensorsLengthBytes - header.header_bytes;
  if (json_text.empty() || json_text.front() != '{') {
    return Malformed(file_name, "header does not start with '{'");
  }

  HeaderParser parser(file_name, &header);
  bool parsed = false;
  try {
    parsed = json::sax_parse(json_text.begin(), json_text.end(), &parser,
                             json::input_format_t::json, /*strict=*/true,
                             /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return Malformed(file_name, std::string("header is not valid JSON: ") + e.what());
  }
  if (!parser.status().ok()) return parser.status();
  if (!parsed) return Malformed(file_name, "header is not valid JSON");

  // The data buffer must be tiled exactly: sorted by offsets, each tensor starts
  // where the previous ended, the last ends at the end of the file.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    if (a.data_begin != b.data_begin) return a.data_begin < b.data_begin;
    if (a.data_end != b.data_end) return a.data_end < b.data_end;
    return a.name < b.name;
  });
  uint64_t expect = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const auto& t : header.tensors) {
    if (t.data_end > header.data_bytes) {
      return MalformedTensor(file_name, t.name,
                             "data_offsets [" + std::to_string(t.data_begin) + ", " +
                                 std::to_string(t.data_end) + ") exceed the data buffer of " +
                                 std::to_string(header.data_bytes) + " bytes");
    }
    if (t.data_begin < expect) {
      return MalformedTensor(file_name, t.name,
                             "data_offsets [" + std::to_string(t.data_begin) + ", " +
                                 std::to_string(t.data_end) + ") overlap tensor " +
                                 Quote(prev->name) + " ending at " + std::to_string(expect));
    }
    if (t.data_begin > expect) {
      return MalformedTensor(file_name, t.name,
                             "data_offsets begin at " + std::to_string(t.data_begin) +
                                 " leaving a gap [" + std::to_string(expect) + ", " +
                                 std::to_string(t.data_begin) + ") not covered by any tensor");
    }
    expect = t.data_end;
    prev = &t;
  }
  if (expect != header.data_bytes) {
    return Malformed(file_name, "data buffer of " + std::to_string(header.data_bytes) +
                                    " bytes is not fully covered: tensors end at " +
                                    std::to_string(expect));
  }
  return header;
}

Result<SafetensorsHeader> ParseSafetensors(std::string_view file_name,
                                           std::span<const std::byte> bytes) {
  if (bytes.size() < kSafetensorsLengthBytes) {
    return Malformed(file_name, "file of " + std::to_string(bytes.size()) +
                                    " bytes is shorter than the 8-byte header length");
  }
  const uint64_t n = LoadLe64(bytes.data());
  if (n > kSafetensorsMaxHeaderBytes) {
    return ResourceExhaustedError(std::string(file_name) + ": safetensors header length " +
                                  std::to_string(n) + " exceeds the " +
                                  std::to_string(kSafetensorsMaxHeaderBytes) + "-byte limit");
  }
  if (n > bytes.size() - kSafetensorsLengthBytes) {
    return Malformed(file_name, "header length " + std::to_string(n) +
                                    " runs past the end of the file (" +
                                    std::to_string(bytes.size()) + " bytes)");
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + kSafetensorsLengthBytes,
                        static_cast<size_t>(n));
  return ParseSafetensorsHeader(file_name, text, bytes.size());
}

// ---- reader ------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(std::shared_ptr<RandomAccessFile> file,
                                     SafetensorsHeader header)
    : file_(std::move(file)), header_(std::move(header)) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) by_name_.emplace(header_.tensors[i].name, i);
}

Result<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(const std::string& path,
                                                                   const Options& options) {
  MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(path, options.mmap));
  return Open(std::shared_ptr<RandomAccessFile>(std::move(file)));
}

Result<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    std::shared_ptr<RandomAccessFile> file) {
  if (!file) return InvalidArgumentError("safetensors: null file");
  const std::string& name = file->name();
  const uint64_t size = file->size();
  if (size < kSafetensorsLengthBytes) {
    return Malformed(name, "file of " + std::to_string(size) +
                               " bytes is shorter than the 8-byte header length");
  }
  SafetensorsHeader header;
  if (const std::byte* map = file->mapped_data()) {
    MEGA_ASSIGN_OR_RETURN(header, ParseSafetensors(name, std::span<const std::byte>(map, size)));
  } else {
    std::byte len[kSafetensorsLengthBytes];
    MEGA_RETURN_IF_ERROR(file->ReadExactlyAt(0, len));
    const uint64_t n = LoadLe64(len);
    // Cap before allocating: a lying length must not cost memory.
    if (n > kSafetensorsMaxHeaderBytes) {
      return ResourceExhaustedError(name + ": safetensors header length " + std::to_string(n) +
                                    " exceeds the " + std::to_string(kSafetensorsMaxHeaderBytes) +
                                    "-byte limit");
    }
    if (n > size - kSafetensorsLengthBytes) {
      return Malformed(name, "header length " + std::to_string(n) +
                                 " runs past the end of the file (" + std::to_string(size) +
                                 " bytes)");
    }
    std::string text(static_cast<size_t>(n), '\0');
    MEGA_RETURN_IF_ERROR(
        file->ReadExactlyAt(kSafetensorsLengthBytes,
                            std::as_writable_bytes(std::span<char>(text.data(), text.size()))));
    MEGA_ASSIGN_OR_RETURN(header, ParseSafetensorsHeader(name, text, size));
  }
  return std::unique_ptr<SafetensorsReader>(
      new SafetensorsReader(std::move(file), std::move(header)));
}

const SafetensorsTensorInfo* SafetensorsReader::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &header_.tensors[it->second];
}

Result<const SafetensorsTensorInfo*> SafetensorsReader::Lookup(std::string_view name) const {
  const SafetensorsTensorInfo* info = Find(name);
  if (!info) return NotFoundError(file_->name() + ": no tensor " + Quote(name));
  return info;
}

Result<Tensor> SafetensorsReader::View(std::string_view name) const {
  MEGA_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Lookup(name));
  const std::byte* map = file_->mapped_data();
  if (map == nullptr) {
    return FailedPreconditionError(file_->name() + ": tensor " + Quote(name) +
                                   ": zero-copy view needs a mapped file (open with mmap)");
  }
  std::byte* data = const_cast<std::byte*>(map) + header_.data_offset() + info->data_begin;
  // The view shares ownership of the file, which owns the mapping.
  return Tensor::FromBlob(data, info->dtype, info->shape, std::shared_ptr<void>(file_));
}

Status SafetensorsReader::ReadRange(std::string_view name, uint64_t offset,
                                    std::span<std::byte> dst) const {
  MEGA_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Lookup(name));
  if (offset > info->nbytes() || dst.size() > info->nbytes() - offset) {
    return OutOfRangeError(file_->name() + ": tensor " + Quote(name) + ": range [" +
                           std::to_string(offset) + ", " + std::to_string(offset + dst.size()) +
                           ") outside its " + std::to_string(info->nbytes()) + " bytes");
  }
  return file_->ReadExactlyAt(header_.data_offset() + info->data_begin + offset, dst);
}

namespace {

// Fills the (possibly strided) view `dst` from the dense bytes at `offset` of
// `file`, staging through `staging` (capacity `cap`).
Status ReadStrided(const RandomAccessFile& file, uint64_t offset, const Tensor& dst,
                   std::byte* staging, size_t cap) {
  const uint64_t nbytes = dst.nbytes();
  if (nbytes <= cap) {
    MEGA_RETURN_IF_ERROR(file.ReadExactlyAt(offset, std::span<std::byte>(staging, nbytes)));
    MEGA_ASSIGN_OR_RETURN(Tensor src, Tensor::FromBlob(staging, dst.dtype(), dst.shape()));
    return CopyTensor(src, dst);
  }
  // Too big for one staging pass: split along dim 0 (ndim >= 1 here because a
  // 0-d tensor is at most 8 bytes).
  const int64_t rows = dst.shape()[0];
  const uint64_t row_bytes = nbytes / static_cast<uint64_t>(rows);
  const int64_t rows_per_pass = static_cast<int64_t>(cap / row_bytes);
  if (rows_per_pass >= 1) {
    for (int64_t r = 0; r < rows; r += rows_per_pass) {
      int64_t n = std::min(rows_per_pass, rows - r);
      MEGA_ASSIGN_OR_RETURN(Tensor part, dst.Narrow(0, r, n));
      MEGA_RETURN_IF_ERROR(
          ReadStrided(file, offset + static_cast<uint64_t>(r) * row_bytes, part, staging, cap));
    }
    return Status::OK();
  }
  // One row is bigger than the staging buffer: recurse into each row as a
  // tensor of rank ndim - 1.
  const size_t esize = static_cast<size_t>(DTypeSize(dst.dtype()));
  Shape sub_shape(dst.shape().begin() + 1, dst.shape().end());
  std::vector<int64_t> sub_strides(dst.strides().begin() + 1, dst.strides().end());
  for (int64_t r = 0; r < rows; ++r) {
    auto* base =
        static_cast<std::byte*>(dst.data()) + r * dst.strides()[0] * static_cast<int64_t>(esize);
    MEGA_ASSIGN_OR_RETURN(Tensor row,
                          Tensor::FromBlobStrided(base, dst.dtype(), sub_shape, sub_strides));
    MEGA_RETURN_IF_ERROR(
        ReadStrided(file, offset + static_cast<uint64_t>(r) * row_bytes, row, staging, cap));
  }
  return Status::OK();
}

}  // namespace

Status SafetensorsReader::ReadTensor(std::string_view name, const Tensor& dst) const {
  MEGA_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Lookup(name));
  if (!dst.defined()) {
    return InvalidArgumentError(file_->name() + ": tensor " + Quote(name) +
                                ": destination tensor is undefined");
  }
  if (dst.dtype() != info->dtype || dst.shape() != info->shape) {
    return InvalidArgumentError(
        file_->name() + ": tensor " + Quote(name) + " is " + std::string(DTypeName(info->dtype)) +
        " " + ShapeToString(info->shape) + " but the destination is " +
        std::string(DTypeName(dst.dtype())) + " " + ShapeToString(dst.shape()));
  }
  const uint64_t offset = header_.data_offset() + info->data_begin;
  if (dst.numel() == 0) return Status::OK();
  if (dst.is_contiguous()) return file_->ReadExactlyAt(offset, dst.Bytes());
  const size_t cap = static_cast<size_t>(std::min<uint64_t>(kStagingBytes, info->nbytes()));
  MEGA_ASSIGN_OR_RETURN(auto staging, AllocateBuffer(cap));
  Status s = ReadStrided(*file_, offset, dst, staging.get(), cap);
  return s.WithContext(file_->name() + ": tensor " + Quote(name));
}

Result<Tensor> SafetensorsReader::Load(std::string_view name) const {
  MEGA_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Lookup(name));
  MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(info->dtype, info->shape));
  MEGA_RETURN_IF_ERROR(ReadTensor(name, t));
  return t;
}

Status SafetensorsReader::ReadTensors(std::span<const SafetensorsReadRequest> requests,
                                      ThreadPool* pool, uint64_t block) const {
  block = std::max<uint64_t>(block, 1);
  // Items: [begin, end) of a contiguous destination (end > 0), or a whole
  // request (end == 0).
  struct Item {
    size_t request;
    uint64_t begin = 0, end = 0;
  };
  std::vector<Item> items;
  std::vector<uint64_t> base(requests.size(), 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    const SafetensorsReadRequest& req = requests[i];
    const SafetensorsTensorInfo* info = Find(req.name);
    const bool split = pool && info && req.dst.defined() && req.dst.dtype() == info->dtype &&
                       req.dst.shape() == info->shape && req.dst.is_contiguous() &&
                       info->nbytes() > block;
    if (!split) {
      items.push_back({i});
      continue;
    }
    base[i] = header_.data_offset() + info->data_begin;
    for (uint64_t b = 0; b < info->nbytes(); b += block) {
      items.push_back({i, b, std::min(info->nbytes(), b + block)});
    }
  }
  return ParallelFor(pool, items.size(), [&](size_t k) -> Status {
    const Item& it = items[k];
    const SafetensorsReadRequest& req = requests[it.request];
    if (it.end == 0) return ReadTensor(req.name, req.dst);
    return file_
        ->ReadExactlyAt(base[it.request] + it.begin,
                        req.dst.Bytes().subspan(it.begin, it.end - it.begin))
        .WithContext(file_->name() + ": tensor " + Quote(req.name));
  });
}

// ---- writer ------------------------------------------------------------------

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Start(
    WritableFile* out, std::vector<SafetensorsTensorSpec> specs,
    const std::map<std::string, std::string>& metadata, const SafetensorsWriteOptions& options) {
  if (out == nullptr) return InvalidArgumentError("safetensors writer: null output file");
  const std::string& file = out->name();
  if (out->size() != 0) {
    return FailedPreconditionError(file + ": safetensors writer needs an empty file (" +
                                   std::to_string(out->size()) + " bytes already written)");
  }
  {
    std::unordered_set<std::string_view> seen;
    for (const auto& s : specs) {
      if (s.name == kSafetensorsMetadataKey) {
        return InvalidArgumentError(file + ": tensor name " + Quote(s.name) +
                                    " is reserved for metadata");
      }
      if (!seen.insert(s.name).second) {
        return InvalidArgumentError(file + ": duplicate tensor name " + Quote(s.name));
      }
    }
  }
  if (options.order == SafetensorsOrder::kReference) {
    std::stable_sort(specs.begin(), specs.end(), [](const auto& a, const auto& b) {
      int ra = SafetensorsDTypeRank(a.dtype), rb = SafetensorsDTypeRank(b.dtype);
      if (ra != rb) return ra > rb;
      return a.name < b.name;
    });
  }

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->out_ = out;
  w->layout_.reserve(specs.size());
  uint64_t offset = 0;
  for (auto& s : specs) {
    auto numel = NumElements(s.shape);
    if (!numel.ok()) return numel.status().WithContext(file + ": tensor " + Quote(s.name));
    if (s.dtype == DType::kF4 && *numel % 2 != 0) {
      return InvalidArgumentError(file + ": tensor " + Quote(s.name) + ": F4 shape " +
                                  ShapeToString(s.shape) +
                                  " has an odd element count; safetensors stores whole bytes");
    }
    auto nbytes = LogicalNbytes(s.dtype, s.shape);
    if (!nbytes.ok()) return nbytes.status().WithContext(file + ": tensor " + Quote(s.name));
    SafetensorsTensorInfo info;
    info.name = std::move(s.name);
    info.dtype = s.dtype;
    info.shape = std::move(s.shape);
    info.data_begin = offset;
    if (__builtin_add_overflow(offset, *nbytes, &offset)) {
      return InvalidArgumentError(file + ": total data size overflows");
    }
    info.data_end = offset;
    w->layout_.push_back(std::move(info));
  }
  w->data_bytes_ = offset;

  // The header as the reference writes it: compact JSON, "__metadata__" first
  // (keys sorted here; the reference's order is unspecified), then the tensors in
  // file order with fields dtype, shape, data_offsets; padded with spaces to a
  // multiple of 8.
  ordered_json root = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    root[std::string(kSafetensorsMetadataKey)] = std::move(m);
  }
  for (const auto& t : w->layout_) {
    ordered_json e = ordered_json::object();
    e["dtype"] = std::string(DTypeName(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {t.data_begin, t.data_end};
    root[t.name] = std::move(e);
  }
  std::string text;
  try {
    text = root.dump();
  } catch (const ordered_json::exception& e) {
    return InvalidArgumentError(file +
                                ": cannot encode safetensors header (names and metadata "
                                "must be valid UTF-8): " +
                                e.what());
  }
  text.append((kSafetensorsHeaderAlignment - text.size() % kSafetensorsHeaderAlignment) %
                  kSafetensorsHeaderAlignment,
              ' ');
  if (text.size() > kSafetensorsMaxHeaderBytes) {
    return InvalidArgumentError(file + ": safetensors header of " + std::to_string(text.size()) +
                                " bytes exceeds the " + std::to_string(kSafetensorsMaxHeaderBytes) +
                                "-byte limit");
  }
  std::string prefix(kSafetensorsLengthBytes, '\0');
  StoreLe64(text.size(), reinterpret_cast<std::byte*>(prefix.data()));
  prefix += text;
  w->data_offset_ = prefix.size();
  MEGA_RETURN_IF_ERROR(out->Append(AsBytes(prefix)));
  return w;
}

Status SafetensorsWriter::AppendData(std::span<const std::byte> bytes) {
  if (bytes.size() > data_bytes_ - written_) {
    return InvalidArgumentError(out_->name() + ": " + std::to_string(bytes.size()) +
                                " more bytes exceed the planned data size " +
                                std::to_string(data_bytes_) + " (written " +
                                std::to_string(written_) + ")");
  }
  if (bytes.empty()) return Status::OK();
  MEGA_RETURN_IF_ERROR(out_->Append(bytes));
  written_ += bytes.size();
  return Status::OK();
}

Status SafetensorsWriter::WriteTensor(const Tensor& tensor) {
  // Tensors already covered by AppendData calls are skipped.
  while (next_index_ < layout_.size() &&
         (layout_[next_index_].data_begin < written_ ||
          (layout_[next_index_].nbytes() > 0 && layout_[next_index_].data_end <= written_))) {
    ++next_index_;
  }
  const size_t next = next_index_;
  if (next >= layout_.size()) {
    return InvalidArgumentError(out_->name() + ": every planned tensor was already written");
  }
  const SafetensorsTensorInfo& info = layout_[next];
  if (written_ != info.data_begin) {
    return FailedPreconditionError(out_->name() + ": tensor " + Quote(info.name) +
                                   " must start at data offset " + std::to_string(info.data_begin) +
                                   " but " + std::to_string(written_) + " bytes were written");
  }
  if (!tensor.defined() || tensor.dtype() != info.dtype || tensor.shape() != info.shape) {
    return InvalidArgumentError(
        out_->name() + ": tensor " + Quote(info.name) + " was planned as " +
        std::string(DTypeName(info.dtype)) + " " + ShapeToString(info.shape) + " but got " +
        (tensor.defined()
             ? std::string(DTypeName(tensor.dtype())) + " " + ShapeToString(tensor.shape())
             : std::string("an undefined tensor")));
  }
  if (tensor.is_contiguous()) {
    MEGA_RETURN_IF_ERROR(AppendData(tensor.Bytes()));
  } else {
    // Strided: copy bounded pieces along dim 0 into a reused staging buffer.
    constexpr size_t kStaging = 16u << 20;
    const int64_t rows = tensor.shape()[0];
    const uint64_t row_bytes = tensor.nbytes() / static_cast<uint64_t>(rows);
    const int64_t per_pass = std::max<int64_t>(1, static_cast<int64_t>(kStaging / row_bytes));
    const size_t cap = static_cast<size_t>(
        std::min<uint64_t>(tensor.nbytes(), static_cast<uint64_t>(per_pass) * row_bytes));
    if (!staging_ || staging_cap_ < cap) {
      MEGA_ASSIGN_OR_RETURN(staging_, AllocateBuffer(cap));
      staging_cap_ = cap;
    }
    for (int64_t r = 0; r < rows; r += per_pass) {
      int64_t n = std::min(per_pass, rows - r);
      MEGA_ASSIGN_OR_RETURN(Tensor src, tensor.Narrow(0, r, n));
      MEGA_ASSIGN_OR_RETURN(Tensor dst, Tensor::FromBlob(staging_.get(), src.dtype(), src.shape()));
      MEGA_RETURN_IF_ERROR(CopyTensor(src, dst));
      MEGA_RETURN_IF_ERROR(AppendData(dst.Bytes()));
    }
  }
  ++next_index_;
  return Status::OK();
}

Status SafetensorsWriter::Finish() {
  if (written_ != data_bytes_) {
    return FailedPreconditionError(out_->name() +
                                   ": safetensors data incomplete: " + std::to_string(written_) +
                                   " of " + std::to_string(data_bytes_) + " bytes written");
  }
  return Status::OK();
}

Status WriteSafetensors(WritableFile* out, std::span<const std::pair<std::string, Tensor>> tensors,
                        const std::map<std::string, std::string>& metadata,
                        const SafetensorsWriteOptions& options) {
  std::vector<SafetensorsTensorSpec> specs;
  specs.reserve(tensors.size());
  std::map<std::string_view, const Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      return InvalidArgumentError((out ? out->name() : std::string("safetensors")) + ": tensor " +
                                  Quote(name) + " is undefined");
    }
    specs.push_back({name, t.dtype(), t.shape()});
    by_name.emplace(name, &t);
  }
  MEGA_ASSIGN_OR_RETURN(auto writer,
                        SafetensorsWriter::Start(out, std::move(specs), metadata, options));
  for (const auto& info : writer->layout()) {
    MEGA_RETURN_IF_ERROR(writer->WriteTensor(*by_name.at(info.name)));
  }
  return writer->Finish();
}

Status SaveSafetensorsFile(const std::string& path,
                           std::span<const std::pair<std::string, Tensor>> tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SafetensorsWriteOptions& options, bool sync) {
  MEGA_ASSIGN_OR_RETURN(auto out, CreateLocalFile(path));
  MEGA_RETURN_IF_ERROR(WriteSafetensors(out.get(), tensors, metadata, options));
  if (sync) MEGA_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

}  // namespace megackpt::format
