// MegaEncoder: layout planning, payload writes with checksums computed while
// hot, block CRC table, header and tail guard (include/megackpt/format/mega_encoder.h).
//
// Why the layout can be fixed before any byte is written: every header field
// has a known width — checksums are fixed-size fields, their hex forms in
// tensorplay.tensor_checksums have a fixed length per type, and the block
// table's size depends only on shapes. So the header is encoded once with
// placeholder checksums to learn its length, and once more at the end.
#include "megackpt/format/mega_encoder.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "format/mega_internal.h"
#include "format/quote.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/text.h"

namespace megackpt::format {
namespace {

using format_internal::Quote;
using mega_internal::AddOverflows;
using mega_internal::AlignUp;

// The largest CRC + pwrite piece (core's WritePieceFor: kCrcWritePiece, or
// kDirectWritePiece with direct I/O): the strided-gather scratch's size; a
// multiple of every element size and of every block size (<= 64 KiB).
constexpr uint64_t kWritePiece = std::max(kCrcWritePiece, kDirectWritePiece);
constexpr uint64_t kMaxAlignment = 1ull << 30;

// Scratch for gathering strided tensors, one per thread, pre-faulted once.
std::byte* ThreadScratch() {
  thread_local std::shared_ptr<std::byte> buf;
  if (!buf) {
    auto b = AllocateBuffer(kWritePiece, /*prefault=*/true);
    if (!b.ok()) return nullptr;
    buf = std::move(*b);
  }
  return buf.get();
}

uint64_t BlockCount(uint64_t nbytes, uint64_t block) {
  return block == 0 ? 0 : (nbytes + block - 1) / block;
}

bool IsEncoderKey(std::string_view key) {
  return key == kMegaBlockSizesKey || key == kMegaBlockTableKey || key == kMegaHeaderCrcKey;
}

}  // namespace

bool IsCleanMetaValue(const MetaValue& v) {
  if (v.is_string()) return IsCleanText(*v.AsString());
  if (!v.is_array() ||
      (v.element_type() != MetaType::kString && v.element_type() != MetaType::kArray)) {
    return true;
  }
  for (uint64_t i = 0; i < v.size(); ++i) {
    auto e = v.element(i);
    if (!e.ok() || !IsCleanMetaValue(*e)) return false;
  }
  return true;
}

uint64_t MegaBlockSizeFor(DType dtype, const Shape& shape) {
  auto total = LogicalNbytes(dtype, shape);
  if (!total.ok() || *total == 0) return 0;
  if (shape.size() <= 1) return 64u << 10;
  auto row = LogicalNbytes(dtype, std::span<const int64_t>(&shape.back(), 1));
  const uint64_t r = row.ok() ? *row : 0;
  return AutoCrcBlockSize(r, 64u << 10);
}

MegaEncoder::~MegaEncoder() = default;

Result<std::unique_ptr<MegaEncoder>> MegaEncoder::Plan(std::string file_name,
                                                       std::vector<MegaEncoderTensor> tensors,
                                                       MegaMetadata user_metadata,
                                                       const MegaEncoderOptions& options) {
  const std::string& f = file_name;
  if (options.alignment == 0 || options.alignment > kMaxAlignment) {
    return InvalidArgumentError(f + ": MegaWriter alignment " + std::to_string(options.alignment) +
                                " (must be 1..2^30)");
  }
  if (options.tensor_alignment == 0 || options.tensor_alignment > kMaxAlignment) {
    return InvalidArgumentError(f + ": MegaWriter tensor_alignment " +
                                std::to_string(options.tensor_alignment) + " (must be 1..2^30)");
  }
  for (const MetaEntry& e : user_metadata.entries()) {
    if (!IsCleanText(e.key)) {
      return InvalidArgumentError(f + ": metadata key " + Quote(e.key) +
                                  " is not valid UTF-8 without NUL");
    }
    if (!IsCleanMetaValue(e.value)) {
      return InvalidArgumentError(f + ": metadata value of " + Quote(e.key) +
                                  " holds a string that is not valid UTF-8 without NUL");
    }
    if (IsEncoderKey(e.key)) {
      return InvalidArgumentError(f + ": metadata key " + Quote(e.key) +
                                  " is written by the encoder");
    }
  }
  std::unique_ptr<MegaEncoder> enc(new MegaEncoder());
  enc->file_name_ = std::move(file_name);
  enc->options_ = options;
  enc->user_metadata_ = std::move(user_metadata);
  const size_t n = tensors.size();
  enc->infos_.resize(n);
  enc->units_.resize(n);
  enc->unit_offsets_.resize(n);
  enc->unit_done_.resize(n);
  enc->block_size_.assign(n, 0);
  enc->block_crcs_.resize(n);
  enc->table_offsets_.assign(n, 0);
  std::set<std::string_view> names;
  uint64_t cursor = 0;
  for (size_t i = 0; i < n; ++i) {
    MegaEncoderTensor& s = tensors[i];
    const std::string& fn = enc->file_name_;
    if (s.name.empty()) return InvalidArgumentError(fn + ": empty tensor name");
    if (s.name.size() > UINT32_MAX) return InvalidArgumentError(fn + ": tensor name too long");
    if (!IsCleanText(s.name)) {
      return InvalidArgumentError(fn + ": tensor name " + Quote(s.name) +
                                  " is not valid UTF-8 without NUL");
    }
    if (!names.insert(s.name).second) {
      return InvalidArgumentError(fn + ": duplicate tensor name " + Quote(s.name));
    }
    if (static_cast<uint32_t>(s.checksum) > 2)
      return InvalidArgumentError(fn + ": bad checksum type");
    MEGA_ASSIGN_OR_RETURN(uint64_t logical, LogicalNbytes(s.dtype, s.shape));
    if (s.units.empty()) s.units.push_back({0, logical, logical, false, false});
    uint64_t expect = 0;
    bool any_shuffled = false;
    for (const MegaEncoderUnit& u : s.units) {
      if (u.logical_offset != expect || (!u.compressed && u.stored_size != u.logical_size)) {
        return InvalidArgumentError(fn + ": units of tensor " + Quote(s.name) +
                                    " do not tile its bytes");
      }
      expect += u.logical_size;
      any_shuffled = any_shuffled || u.shuffled;
    }
    if (expect != logical) {
      return InvalidArgumentError(fn + ": units of tensor " + Quote(s.name) + " cover " +
                                  std::to_string(expect) + " of " + std::to_string(logical) +
                                  " bytes");
    }
    if (s.units.size() > 1) s.chunked = true;
    if (any_shuffled && s.shuffle_elem_size == 0) {
      return InvalidArgumentError(fn + ": shuffled tensor " + Quote(s.name) +
                                  " needs shuffle_elem_size");
    }
    if (AlignUp(cursor, options.tensor_alignment, &cursor)) {
      return InvalidArgumentError(fn + ": payload size overflows");
    }
    MegaTensorInfo& t = enc->infos_[i];
    t.tensor_id = static_cast<uint32_t>(i);
    t.name = s.name;
    t.dtype = s.dtype;
    t.shape = s.shape;
    t.logical_nbytes = logical;
    t.payload_offset = cursor;
    for (size_t k = 0; k < s.units.size(); ++k) {
      const MegaEncoderUnit& u = s.units[k];
      enc->unit_offsets_[i].push_back(cursor);
      if (AddOverflows(cursor, u.stored_size, &cursor)) {
        return InvalidArgumentError(fn + ": payload size overflows");
      }
      const uint32_t flags =
          (u.compressed ? kMegaTensorCompressed : 0) | (u.shuffled ? kMegaTensorByteShuffled : 0);
      if (s.chunked) {
        MegaChunkInfo c;
        c.tensor_id = t.tensor_id;
        c.chunk_id = static_cast<uint32_t>(k);
        c.logical_offset = u.logical_offset;
        c.logical_size = u.logical_size;
        c.payload_offset = enc->unit_offsets_[i].back();
        c.stored_size = u.stored_size;
        c.codec = u.compressed ? MegaCodec::kZstd : MegaCodec::kNone;
        c.flags = flags;
        c.checksum_type = s.checksum;
        t.chunks.push_back(c);
        t.stored_nbytes += u.stored_size;
        t.tensor_flags |= flags;
        if (u.compressed) t.codec = MegaCodec::kZstd;
        if (u.shuffled) t.shuffle_elem_size = s.shuffle_elem_size;
      } else {
        t.stored_nbytes = u.stored_size;
        t.tensor_flags = flags;
        t.codec = u.compressed ? MegaCodec::kZstd : MegaCodec::kNone;
        t.shuffle_elem_size = u.shuffled ? s.shuffle_elem_size : 0;
        t.checksum_type = s.checksum;
      }
    }
    if (s.chunked) t.storage_format = MegaStorageFormat::kChunkedRawDense;
    t.dir_flags = mega_internal::DirFlagsFor(t);
    enc->unit_done_[i].assign(s.units.size(), 0);
    if (options.block_checksums && t.is_plain() && s.checksum != MegaChecksumType::kNone) {
      enc->block_size_[i] = MegaBlockSizeFor(s.dtype, s.shape);
      // The tensor's table follows its bytes: a re-save that changes some
      // tensors changes only their tables (content-defined dedup keeps the rest).
      // Its entries exist once the tensor is written (WriteRaw).
      if (const uint64_t count = BlockCount(logical, enc->block_size_[i]); count > 0) {
        if (AlignUp(cursor, 4, &cursor))
          return InvalidArgumentError(fn + ": payload size overflows");
        enc->table_offsets_[i] = cursor;
        cursor += 4 * count;
      }
    }
    enc->units_[i] = s.units;
  }
  names.clear();
  enc->specs_ = std::move(tensors);
  MEGA_ASSIGN_OR_RETURN(std::string header, enc->EncodeHeader());
  enc->header_length_ = header.size();
  enc->file_end_ = enc->header_length_ + cursor;
  enc->final_size_ = enc->file_end_;
  if (enc->file_end_ >= kMegaFooterTrailerSize)
    enc->probe_at_ = enc->file_end_ - kMegaFooterTrailerSize;
  return enc;
}

uint64_t MegaEncoder::unit_file_offset(size_t i, size_t unit) const {
  return header_length_ + unit_offsets_[i][unit];
}

MegaTensorInfo MegaEncoder::tensor_info(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  MegaTensorInfo t = infos_[i];
  t.file_offset = header_length_ + t.payload_offset;
  for (MegaChunkInfo& c : t.chunks) c.file_offset = header_length_ + c.payload_offset;
  return t;
}

Result<MegaMetadata> MegaEncoder::BuildMetadata() const {
  const MegaEncoderOptions& o = options_;
  MegaMetadata md;
  if (o.profile == MegaProfile::kTensorPlay) {
    MEGA_RETURN_IF_ERROR(mega_internal::AddTensorplayProfile(
        infos_, o.alignment, o.tensorplay_container, o.checksum, &md));
  }
  for (const MetaEntry& e : user_metadata_.entries()) {
    MEGA_RETURN_IF_ERROR(md.Add(e.key, e.value).WithContext(file_name_));
  }
  if (o.profile == MegaProfile::kBare && !md.Contains("general.alignment") &&
      o.alignment != kMegaDefaultAlignment) {
    MEGA_RETURN_IF_ERROR(md.Add("general.alignment", MetaValue::UInt(o.alignment)));
  }
  uint64_t chunk_total = 0;
  for (const MegaTensorInfo& t : infos_) chunk_total += t.chunks.size();
  if (chunk_total > 0) {
    MEGA_RETURN_IF_ERROR(md.Add("mega.chunk_directory.count", MetaValue::UInt(chunk_total)));
    MEGA_RETURN_IF_ERROR(md.Add("mega.chunk_directory.format", MetaValue::String("v1")));
  }
  if (o.payload_hashes) {
    MEGA_RETURN_IF_ERROR(md.Add("mega.hash.payload.crc32", MetaValue::U32(payload_crc_)));
    MEGA_RETURN_IF_ERROR(
        md.Add("mega.hash.payload.sha256", MetaValue::String(ToHex(payload_sha_))));
  }
  if (o.block_checksums) {
    std::vector<uint32_t> sizes(block_size_.begin(), block_size_.end());
    MEGA_RETURN_IF_ERROR(md.Add(std::string(kMegaBlockSizesKey), MetaValue::U32Array(sizes)));
    MEGA_RETURN_IF_ERROR(
        md.Add(std::string(kMegaBlockTableKey), MetaValue::U64Array(table_offsets_)));
  }
  if (o.header_checksum)
    MEGA_RETURN_IF_ERROR(md.Add(std::string(kMegaHeaderCrcKey), MetaValue::U32(0)));
  return md;
}

Result<std::string> MegaEncoder::EncodeHeader() const {
  MEGA_ASSIGN_OR_RETURN(MegaMetadata md, BuildMetadata());
  std::string header = mega_internal::EncodeHeader(md, infos_, {}, {}, options_.alignment);
  if (options_.header_checksum) {
    // The CRC entry is the last metadata entry: its u32 value ends the metadata.
    mega_internal::ByteWriter w;
    MetaCodec::EncodeEntries(md, w);
    const size_t value_at = 24 + w.size() - 4;
    const uint32_t crc = Crc32(AsBytes(header));  // value bytes are 0 here
    std::memcpy(header.data() + value_at, &crc, 4);
  }
  return header;
}

void MegaEncoder::Observe(uint64_t file_offset, std::span<const std::byte> bytes) {
  if (probe_at_ == UINT64_MAX) return;
  const uint64_t b = std::max(file_offset, probe_at_);
  const uint64_t e = std::min<uint64_t>(file_offset + bytes.size(), probe_at_ + 4);
  if (b >= e) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t x = b; x < e; ++x) probe_[x - probe_at_] = bytes[x - file_offset];
}

bool MegaEncoder::tail_guard_needed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return probe_at_ != UINT64_MAX && mega_internal::Load32(probe_.data()) == kMegaFooterMagic;
}

Status MegaEncoder::WriteAt(WritableFile& file, uint64_t file_offset,
                            std::span<const std::byte> bytes) {
  Observe(file_offset, bytes);
  MEGA_RETURN_IF_ERROR(file.WriteAt(file_offset, bytes));
  const uint64_t end = file_offset + bytes.size();
  uint64_t cur = end_written_.load();
  while (end > cur && !end_written_.compare_exchange_weak(cur, end)) {
  }
  return Status::OK();
}

Status MegaEncoder::Append(WritableFile& file, uint64_t file_offset,
                           std::span<const std::byte> bytes) {
  if (file_offset < appended_) {
    return InternalError(file_name_ + ": out-of-order append at offset " +
                         std::to_string(file_offset) + " after " + std::to_string(appended_) +
                         " bytes");
  }
  static const std::string kZeros(64 << 10, '\0');
  while (appended_ < file_offset) {
    const uint64_t z = std::min<uint64_t>(kZeros.size(), file_offset - appended_);
    auto zb = AsBytes(std::string_view(kZeros).substr(0, z));
    Observe(appended_, zb);
    MEGA_RETURN_IF_ERROR(file.Append(zb));
    appended_ += z;
  }
  Observe(file_offset, bytes);
  MEGA_RETURN_IF_ERROR(file.Append(bytes));
  appended_ += bytes.size();
  return Status::OK();
}

Status MegaEncoder::WriteRaw(
    WritableFile& file, size_t i, uint64_t nbytes,
    const std::function<std::span<const std::byte>(uint64_t, uint64_t)>& piece, bool positioned) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unit_done_[i][0]) {
      return FailedPreconditionError(file_name_ + ": tensor " + Quote(specs_[i].name) +
                                     " written twice");
    }
  }
  const MegaChecksumType type = specs_[i].checksum;
  const uint64_t block = block_size_[i];
  const bool crc_wanted = block > 0 || type == MegaChecksumType::kCrc32;
  BlockCrc32Stream crc(block,
                       crc_wanted ? nbytes : 0);  // the tensor CRC too, combined from the blocks
  std::optional<Sha256> sha;
  if (type == MegaChecksumType::kSha256) sha.emplace();
  const uint64_t base = tensor_file_offset(i);
  const uint64_t piece_size = WritePieceFor(file);
  uint64_t written_back = 0;  // tensor-relative: bytes handed to StartWriteback
  for (uint64_t off = 0, len = 0; off < nbytes; off += len) {
    len = NextWritePiece(base + off, nbytes - off, piece_size);  // ends on a piece_size multiple
    std::span<const std::byte> bytes = piece(off, len);
    // Checksum first, write second: the CRC streams the piece from memory into
    // the caches and the pwrite's copy reads it from there (core kCrcWritePiece).
    if (crc_wanted) crc.Add(bytes);
    if (sha) sha->Update(bytes);
    if (positioned) {
      MEGA_RETURN_IF_ERROR(WriteAt(file, base + off, bytes));
      const uint64_t done = off + bytes.size();
      if (options_.writeback_bytes != 0 && done - written_back >= options_.writeback_bytes) {
        file.StartWriteback(base + written_back, done - written_back);
        written_back = done;
      }
    } else {
      MEGA_RETURN_IF_ERROR(Append(file, base + off, bytes));
    }
  }
  crc.Finish();
  std::vector<uint32_t> crcs = std::move(crc.blocks());
  if (const uint64_t planned = BlockCount(infos_[i].logical_nbytes, block_size_[i]);
      crcs.size() != planned) {
    return InternalError(file_name_ + ": tensor " + Quote(specs_[i].name) + " has " +
                         std::to_string(crcs.size()) + " CRC blocks, planned " +
                         std::to_string(planned));
  }
  if (!crcs.empty()) {
    const std::span<const std::byte> table = EncodeBlockTableInPlace(crcs);
    const uint64_t at = header_length_ + table_offsets_[i];
    if (positioned) {
      MEGA_RETURN_IF_ERROR(
          ForEachTableWritePiece(table, [&](uint64_t o, std::span<const std::byte> piece) {
            return WriteAt(file, at + o, piece);
          }));
    } else {
      MEGA_RETURN_IF_ERROR(Append(file, at, table));
    }
  }
  MegaChecksum sum{};
  if (type == MegaChecksumType::kCrc32) sum = mega_internal::Crc32Field(crc.whole());
  if (sha) sum = mega_internal::Sha256Field(sha->Finish());
  std::lock_guard<std::mutex> lock(mu_);
  infos_[i].checksum = sum;
  if (keep_block_tables_) block_crcs_[i] = std::move(crcs);
  unit_done_[i][0] = 1;
  return Status::OK();
}

Status MegaEncoder::WriteTensorBytes(WritableFile& file, size_t i,
                                     std::span<const std::byte> bytes) {
  if (i >= specs_.size()) return InvalidArgumentError(file_name_ + ": tensor index out of range");
  if (!infos_[i].is_plain()) {
    return InvalidArgumentError(file_name_ + ": tensor " + Quote(specs_[i].name) + " is not raw");
  }
  if (bytes.size() != infos_[i].logical_nbytes) {
    return InvalidArgumentError(file_name_ + ": tensor " + Quote(specs_[i].name) + " needs " +
                                std::to_string(infos_[i].logical_nbytes) + " bytes, got " +
                                std::to_string(bytes.size()));
  }
  return WriteRaw(
      file, i, bytes.size(), [&](uint64_t off, uint64_t n) { return bytes.subspan(off, n); },
      file.supports_write_at());
}

Status MegaEncoder::WriteTensor(WritableFile& file, size_t i, const Tensor& t) {
  if (i >= specs_.size()) return InvalidArgumentError(file_name_ + ": tensor index out of range");
  const MegaEncoderTensor& s = specs_[i];
  if (!t.defined() || t.dtype() != s.dtype || t.shape() != s.shape) {
    return InvalidArgumentError(
        file_name_ + ": tensor " + Quote(s.name) + " planned as " +
        std::string(DTypeName(s.dtype)) + ShapeToString(s.shape) + ", got " +
        (t.defined() ? std::string(DTypeName(t.dtype())) + ShapeToString(t.shape())
                     : std::string("undefined")));
  }
  if (t.is_contiguous()) {
    return WriteTensorBytes(
        file, i, std::span<const std::byte>(static_cast<const std::byte*>(t.data()), t.nbytes()));
  }
  if (t.dtype() == DType::kF4) {
    return InvalidArgumentError(file_name_ + ": F4 tensor " + Quote(s.name) +
                                " must be contiguous");
  }
  if (!infos_[i].is_plain()) {
    return InvalidArgumentError(file_name_ + ": tensor " + Quote(s.name) + " is not raw");
  }
  std::byte* scratch = ThreadScratch();
  if (!scratch) return ResourceExhaustedError(file_name_ + ": no memory for a staging buffer");
  return WriteRaw(
      file, i, infos_[i].logical_nbytes,
      [&](uint64_t off, uint64_t n) {
        std::span<std::byte> piece(scratch, n);
        mega_internal::GatherBytes(t, off, piece);
        return std::span<const std::byte>(piece);
      },
      file.supports_write_at());
}

void MegaEncoder::SetUnitChecksum(size_t i, size_t unit, const MegaChecksum& checksum) {
  std::lock_guard<std::mutex> lock(mu_);
  if (infos_[i].chunked()) {
    infos_[i].chunks[unit].checksum = checksum;
  } else {
    infos_[i].checksum = checksum;
  }
  unit_done_[i][unit] = 1;
}

void MegaEncoder::SetPayloadHashes(uint32_t crc32, const Sha256Digest& sha256) {
  std::lock_guard<std::mutex> lock(mu_);
  payload_crc_ = crc32;
  payload_sha_ = sha256;
}

bool MegaEncoder::tensor_written(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(unit_done_[i].begin(), unit_done_[i].end(), [](uint8_t d) { return d != 0; });
}

bool MegaEncoder::all_written() const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (!tensor_written(i)) return false;
  }
  return true;
}

Status MegaEncoder::FinishPositioned(WritableFile& file) {
  if (!all_written()) return FailedPreconditionError(file_name_ + ": not every tensor was written");
  MEGA_ASSIGN_OR_RETURN(std::string header, EncodeHeader());
  if (header.size() != header_length_) {
    return InternalError(file_name_ + ": header size changed from " +
                         std::to_string(header_length_) + " to " + std::to_string(header.size()));
  }
  MEGA_RETURN_IF_ERROR(WriteAt(file, 0, AsBytes(header)));
  // Never leave a tail that reads as a footer trailer (a reader would parse
  // it): pad with zeros, which are unused payload.
  if (tail_guard_needed()) {
    const std::string zeros(kMegaFooterTrailerSize, '\0');
    MEGA_RETURN_IF_ERROR(file.WriteAt(file_end_, AsBytes(zeros)));
    final_size_ = file_end_ + zeros.size();
  } else if (end_written_.load() < file_end_) {
    // The file ends in an alignment gap before a trailing empty tensor: write
    // its last (zero) byte so the size is exact.
    const std::byte zero{0};
    MEGA_RETURN_IF_ERROR(file.WriteAt(file_end_ - 1, std::span<const std::byte>(&zero, 1)));
  }
  MEGA_ASSIGN_OR_RETURN(final_metadata_, BuildMetadata());
  return Status::OK();
}

Status MegaEncoder::AppendHeader(WritableFile& file) {
  if (appended_ != 0) return InternalError(file_name_ + ": header appended after payload");
  if (!all_written()) return FailedPreconditionError(file_name_ + ": checksums are not all known");
  MEGA_ASSIGN_OR_RETURN(std::string header, EncodeHeader());
  if (header.size() != header_length_) {
    return InternalError(file_name_ + ": header size changed from " +
                         std::to_string(header_length_) + " to " + std::to_string(header.size()));
  }
  return Append(file, 0, AsBytes(header));
}

Status MegaEncoder::FinishAppend(WritableFile& file) {
  if (appended_ < file_end_) MEGA_RETURN_IF_ERROR(Append(file, file_end_, {}));
  if (tail_guard_needed()) {
    const std::string zeros(kMegaFooterTrailerSize, '\0');
    MEGA_RETURN_IF_ERROR(file.Append(AsBytes(zeros)));
    final_size_ = file_end_ + zeros.size();
  }
  MEGA_ASSIGN_OR_RETURN(final_metadata_, BuildMetadata());
  return Status::OK();
}

Status MegaEncoder::WriteSequential(WritableFile& file, std::span<const Tensor> tensors) {
  if (tensors.size() != specs_.size()) {
    return InvalidArgumentError(file_name_ + ": " + std::to_string(tensors.size()) +
                                " tensors for " + std::to_string(specs_.size()) + " planned");
  }
  // Pass 1: checksums (and block CRCs) over memory; nothing is written.
  class NullFile final : public WritableFile {
   public:
    explicit NullFile(const std::string& name) : name_(name) {}
    const std::string& name() const override { return name_; }
    uint64_t size() const override { return 0; }
    Status Append(std::span<const std::byte>) override { return Status::OK(); }
    bool supports_write_at() const override { return true; }
    Status WriteAt(uint64_t, std::span<const std::byte>) override { return Status::OK(); }
    Status Sync() override { return Status::OK(); }
    Status Close() override { return Status::OK(); }

   private:
    std::string name_;
  } null_file(file_name_);
  keep_block_tables_ = true;
  for (size_t i = 0; i < tensors.size(); ++i)
    MEGA_RETURN_IF_ERROR(WriteTensor(null_file, i, tensors[i]));
  // The probe saw the bytes in pass 1; pass 2 sees the same ones.
  end_written_ = 0;
  // Pass 2: header, payloads in file order, table.
  MEGA_RETURN_IF_ERROR(AppendHeader(file));
  std::byte* scratch = ThreadScratch();
  if (!scratch) return ResourceExhaustedError(file_name_ + ": no memory for a staging buffer");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const uint64_t n = infos_[i].logical_nbytes;
    for (uint64_t off = 0; off < n; off += kWritePiece) {
      const uint64_t len = std::min(kWritePiece, n - off);
      std::span<const std::byte> bytes;
      if (t.is_contiguous()) {
        bytes = std::span<const std::byte>(static_cast<const std::byte*>(t.data()) + off, len);
      } else {
        mega_internal::GatherBytes(t, off, std::span<std::byte>(scratch, len));
        bytes = std::span<const std::byte>(scratch, len);
      }
      MEGA_RETURN_IF_ERROR(Append(file, tensor_file_offset(i) + off, bytes));
    }
    if (!block_crcs_[i].empty()) {
      MEGA_RETURN_IF_ERROR(Append(file, header_length_ + table_offsets_[i],
                                  std::as_bytes(std::span<const uint32_t>(block_crcs_[i]))));
    }
  }
  return FinishAppend(file);
}

MegaWriteResult MegaEncoder::result() const {
  MegaWriteResult r;
  r.file_size = final_size_;
  r.header_length = header_length_;
  r.payload_end = final_size_;
  for (size_t i = 0; i < infos_.size(); ++i) r.tensors.push_back(tensor_info(i));
  r.metadata = final_metadata_;
  return r;
}

}  // namespace megackpt::format
