// Byte-level building blocks of the MEGA codec: bounded reads, record
// encoders, byte shuffle, CRC-32 combination, strided byte streams, JSON text.
#include <algorithm>
#include <cstring>

#include "format/mega_internal.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/text.h"

namespace megackpt::format {
namespace mega_internal {

bool AlignUp(uint64_t v, uint64_t a, uint64_t* out) {
  uint64_t rem = v % a;
  if (rem == 0) {
    *out = v;
    return false;
  }
  return AddOverflows(v, a - rem, out);
}

// ---- ByteSource ----------------------------------------------------------------

ByteSource::ByteSource(const RandomAccessFile& file, uint64_t begin, uint64_t limit)
    : name_(file.name()), file_(&file), begin_(begin), pos_(begin), limit_(limit) {
  if (file.mapped_data() != nullptr && limit <= file.size()) {
    span_ = std::span<const std::byte>(file.mapped_data() + begin, limit - begin);
    file_ = nullptr;
  }
}

ByteSource::ByteSource(std::string file_name, std::span<const std::byte> data, uint64_t base_offset)
    : name_(std::move(file_name)),
      span_(data),
      begin_(base_offset),
      pos_(base_offset),
      limit_(base_offset + data.size()) {}

Status ByteSource::Error(std::string_view message) const { return ErrorAt(pos_, message); }

Status ByteSource::ErrorAt(uint64_t offset, std::string_view message) const {
  return DataLossError(name_ + ": " + std::string(message) + " (at offset " +
                       std::to_string(offset) + ")");
}

Status ByteSource::Need(uint64_t n, std::string_view what) {
  if (n > limit_ - pos_) {
    return Error("truncated: " + std::string(what) + " needs " + std::to_string(n) +
                 " bytes but only " + std::to_string(limit_ - pos_) + " remain before offset " +
                 std::to_string(limit_));
  }
  if (file_ == nullptr) return Status::OK();
  uint64_t have_end = begin_ + buffer_.size();
  if (pos_ + n <= have_end) return Status::OK();
  // Grow geometrically so a header of H bytes costs O(log H) reads, never past
  // limit_. The first read (16 KiB) holds a typical shard header whole without
  // reading much payload (a partial load reads one header per shard it touches).
  uint64_t want = std::max<uint64_t>({pos_ + n - begin_, 2 * buffer_.size(), 16u << 10});
  want = std::min<uint64_t>(want, limit_ - begin_);
  size_t old = buffer_.size();
  buffer_.resize(want);
  Status s = file_->ReadExactlyAt(begin_ + old, std::as_writable_bytes(std::span<char>(
                                                    buffer_.data() + old, buffer_.size() - old)));
  if (!s.ok()) {
    buffer_.resize(old);
    if (s.code() == StatusCode::kOutOfRange) return DataLossError(s.message());
    return s;
  }
  return Status::OK();
}

Result<std::span<const std::byte>> ByteSource::Window(uint64_t begin, uint64_t end) {
  if (begin < begin_ || end > limit_ || begin > end) {
    return ErrorAt(begin, "window [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") is outside the header");
  }
  if (file_ == nullptr) return span_.subspan(begin - begin_, end - begin);
  const uint64_t saved = pos_;
  pos_ = begin;
  Status s = Need(end - begin, "header window");
  pos_ = saved;
  MEGA_RETURN_IF_ERROR(s);
  return std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(buffer_.data()) + (begin - begin_), end - begin);
}

const std::byte* ByteSource::At() const {
  if (file_ == nullptr) return span_.data() + (pos_ - begin_);
  return reinterpret_cast<const std::byte*>(buffer_.data()) + (pos_ - begin_);
}

template <typename T>
Result<T> ByteSource::Fixed(std::string_view what) {
  MEGA_RETURN_IF_ERROR(Need(sizeof(T), what));
  const T v = LoadLE<T>(At());
  pos_ += sizeof(T);
  return v;
}

Result<uint8_t> ByteSource::U8(std::string_view what) { return Fixed<uint8_t>(what); }
Result<uint16_t> ByteSource::U16(std::string_view what) { return Fixed<uint16_t>(what); }
Result<uint32_t> ByteSource::U32(std::string_view what) { return Fixed<uint32_t>(what); }
Result<uint64_t> ByteSource::U64(std::string_view what) { return Fixed<uint64_t>(what); }

Result<std::span<const std::byte>> ByteSource::Bytes(uint64_t n, std::string_view what) {
  MEGA_RETURN_IF_ERROR(Need(n, what));
  std::span<const std::byte> out(At(), n);
  pos_ += n;
  return out;
}

Result<std::string> ByteSource::LengthPrefixed(uint64_t at, uint64_t len, std::string_view what) {
  if (len > remaining()) {
    return ErrorAt(at, std::string(what) + " length " + std::to_string(len) + " exceeds the " +
                           std::to_string(remaining()) + " bytes that remain");
  }
  MEGA_ASSIGN_OR_RETURN(auto bytes, Bytes(len, what));
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

Result<std::string> ByteSource::String(std::string_view what) {
  const uint64_t at = pos_;
  MEGA_ASSIGN_OR_RETURN(uint64_t len, U64(what));
  return LengthPrefixed(at, len, what);
}

Result<std::string> ByteSource::CompactString(std::string_view what) {
  const uint64_t at = pos_;
  MEGA_ASSIGN_OR_RETURN(uint32_t len, U32(what));
  return LengthPrefixed(at, len, what);
}

// ---- records -------------------------------------------------------------------

uint32_t DirFlagsFor(const MegaTensorInfo& info) {
  uint32_t f = 0;
  if (info.storage_format != MegaStorageFormat::kRawDense) f |= kMegaDirHasStorageFormat;
  if (info.stored_nbytes != info.logical_nbytes) f |= kMegaDirHasStoredNbytes;
  if (info.tensor_flags != 0) f |= kMegaDirHasTensorFlags;
  if (info.codec != MegaCodec::kNone) f |= kMegaDirHasCodec;
  if (info.shuffle_elem_size != 0) f |= kMegaDirHasShuffleElemSize;
  if (info.checksum_type != MegaChecksumType::kNone) f |= kMegaDirHasChecksum;
  return f;
}

void EncodeTensorEntry(const MegaTensorInfo& info, ByteWriter& w) {
  w.CompactString(info.name);
  w.U32(info.dir_flags);
  w.U32(static_cast<uint32_t>(info.shape.size()));
  for (size_t i = info.shape.size(); i-- > 0;) w.U64(static_cast<uint64_t>(info.shape[i]));
  w.CompactString(DTypeName(info.dtype));
  w.U64(info.payload_offset);
  if (info.dir_flags & kMegaDirHasStorageFormat) {
    w.CompactString(MegaStorageFormatName(info.storage_format));
  }
  if (info.dir_flags & kMegaDirHasStoredNbytes) w.U64(info.stored_nbytes);
  if (info.dir_flags & kMegaDirHasTensorFlags) w.U32(info.tensor_flags);
  if (info.dir_flags & kMegaDirHasCodec) w.U32(static_cast<uint32_t>(info.codec));
  if (info.dir_flags & kMegaDirHasShuffleElemSize) w.U32(info.shuffle_elem_size);
  if (info.dir_flags & kMegaDirHasChecksum) {
    w.U32(static_cast<uint32_t>(info.checksum_type));
    w.Raw(info.checksum.data(), 32);
  }
}

void EncodeChunkRecord(const MegaChunkInfo& c, ByteWriter& w) {
  w.U32(c.tensor_id);
  w.U32(c.chunk_id);
  w.U64(c.logical_offset);
  w.U64(c.logical_size);
  w.U64(c.payload_offset);
  w.U64(c.stored_size);
  w.U32(static_cast<uint32_t>(c.codec));
  w.U32(c.flags);
  w.U32(static_cast<uint32_t>(c.checksum_type));
  w.U32(0);  // reserved
  w.Raw(c.checksum.data(), 32);
}

void EncodeSegmentRecord(const MegaSegment& s, ByteWriter& w) {
  for (uint32_t v : {s.segment_id, s.kind, s.priority, s.flags, s.layer_start, s.layer_end,
                     s.expert_start, s.expert_end}) {
    w.U32(v);
  }
  w.U64(s.payload_offset);
  w.U64(s.payload_size);
  for (uint32_t v : {s.first_tensor_id, s.tensor_count, s.prefetch_group, s.device_hint,
                     s.cache_policy, s.reserved}) {
    w.U32(v);
  }
}

void EncodeMoeRecord(const MegaMoeExpert& m, ByteWriter& w) {
  for (uint32_t v : {m.tensor_id, m.layer_id, m.expert_id, m.expert_role, m.segment_id,
                     m.prefetch_group, m.cache_policy, m.reserved}) {
    w.U32(v);
  }
}

std::string EncodeHeader(const MegaMetadata& metadata, const std::vector<MegaTensorInfo>& tensors,
                         const std::vector<MegaSegment>& segments,
                         const std::vector<MegaMoeExpert>& moe, uint64_t alignment) {
  ByteWriter w;
  w.U32(kMegaMagic);
  w.U32(kMegaVersion);
  w.U64(tensors.size());
  w.U64(metadata.size());
  MetaCodec::EncodeEntries(metadata, w);
  for (const MegaTensorInfo& t : tensors) EncodeTensorEntry(t, w);
  for (const MegaTensorInfo& t : tensors) {
    for (const MegaChunkInfo& c : t.chunks) EncodeChunkRecord(c, w);
  }
  for (const MegaSegment& s : segments) EncodeSegmentRecord(s, w);
  for (const MegaMoeExpert& m : moe) EncodeMoeRecord(m, w);
  uint64_t end = 0;
  AlignUp(w.size(), alignment, &end);
  w.Zeros(end - w.size());
  return std::move(w.data());
}

std::string EncodeOverlay(const MegaMetadata& entries) {
  ByteWriter w;
  w.U32(kMegaFooterMagic);
  w.U64(entries.size());
  MetaCodec::EncodeEntries(entries, w);
  return std::move(w.data());
}

std::string EncodeTrailer(uint64_t generation, uint64_t overlay_offset, uint64_t overlay_size,
                          uint64_t base_size, const Sha256Digest& sha) {
  ByteWriter w;
  w.U32(kMegaFooterMagic);
  w.U64(generation);
  w.U64(overlay_offset);
  w.U64(overlay_size);
  w.U64(base_size);
  w.Raw(sha.data(), sha.size());
  return std::move(w.data());
}

MegaChecksum Crc32Field(uint32_t crc) {
  MegaChecksum c{};
  std::memcpy(c.data(), &crc, 4);
  return c;
}

MegaChecksum Sha256Field(const Sha256Digest& d) {
  MegaChecksum c{};
  std::memcpy(c.data(), d.data(), 32);
  return c;
}

MegaChecksum ChecksumOf(MegaChecksumType type, std::span<const std::byte> data) {
  switch (type) {
    case MegaChecksumType::kCrc32:
      return Crc32Field(Crc32(data));
    case MegaChecksumType::kSha256:
      return Sha256Field(Sha256Of(data));
    case MegaChecksumType::kNone:
      break;
  }
  return MegaChecksum{};
}

// ---- shuffle -------------------------------------------------------------------

void ByteShuffle(const std::byte* plain, std::byte* shuffled, size_t bytes, size_t elem_size) {
  size_t n = bytes / elem_size;
  for (size_t b = 0; b < elem_size; ++b) {
    std::byte* out = shuffled + b * n;
    const std::byte* in = plain + b;
    for (size_t e = 0; e < n; ++e) out[e] = in[e * elem_size];
  }
}

void ByteUnshuffle(const std::byte* shuffled, std::byte* plain, size_t bytes, size_t elem_size) {
  size_t n = bytes / elem_size;
  for (size_t b = 0; b < elem_size; ++b) {
    const std::byte* in = shuffled + b * n;
    std::byte* out = plain + b;
    for (size_t e = 0; e < n; ++e) out[e * elem_size] = in[e];
  }
}

// ---- strided byte streams ---------------------------------------------------------

namespace {

template <bool kGather>
void StridedCopy(const Tensor& t, uint64_t offset, std::byte* buf, uint64_t len) {
  if (len == 0) return;
  auto* base = static_cast<std::byte*>(t.data());
  if (t.is_contiguous()) {
    if (kGather) {
      std::memcpy(buf, base + offset, len);
    } else {
      std::memcpy(base + offset, buf, len);
    }
    return;
  }
  const size_t es = DTypeSize(t.dtype());
  const auto& shape = t.shape();
  const auto& strides = t.strides();
  const int nd = t.ndim();
  uint64_t n = len / es;
  std::vector<int64_t> idx(nd);
  uint64_t rem = offset / es;
  int64_t eoff = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = static_cast<int64_t>(rem % static_cast<uint64_t>(shape[d]));
    rem /= static_cast<uint64_t>(shape[d]);
    eoff += idx[d] * strides[d];
  }
  const int64_t inner = shape[nd - 1];
  const int64_t inner_stride = strides[nd - 1];
  while (n > 0) {
    uint64_t run = std::min<uint64_t>(n, static_cast<uint64_t>(inner - idx[nd - 1]));
    std::byte* p = base + eoff * static_cast<int64_t>(es);
    if (inner_stride == 1) {
      if (kGather) {
        std::memcpy(buf, p, run * es);
      } else {
        std::memcpy(p, buf, run * es);
      }
    } else {
      const int64_t step = inner_stride * static_cast<int64_t>(es);
      for (uint64_t k = 0; k < run; ++k) {
        if (kGather) {
          std::memcpy(buf + k * es, p + static_cast<int64_t>(k) * step, es);
        } else {
          std::memcpy(p + static_cast<int64_t>(k) * step, buf + k * es, es);
        }
      }
    }
    buf += run * es;
    n -= run;
    idx[nd - 1] += static_cast<int64_t>(run);
    eoff += static_cast<int64_t>(run) * inner_stride;
    if (idx[nd - 1] == inner && n > 0) {
      eoff -= inner * inner_stride;
      idx[nd - 1] = 0;
      for (int d = nd - 2; d >= 0; --d) {
        ++idx[d];
        eoff += strides[d];
        if (idx[d] < shape[d]) break;
        eoff -= shape[d] * strides[d];
        idx[d] = 0;
      }
    }
  }
}

}  // namespace

void GatherBytes(const Tensor& t, uint64_t offset, std::span<std::byte> out) {
  StridedCopy<true>(t, offset, out.data(), out.size());
}

void ScatterBytes(const Tensor& t, uint64_t offset, std::span<const std::byte> in) {
  StridedCopy<false>(t, offset, const_cast<std::byte*>(in.data()), in.size());
}

// ---- zstd --------------------------------------------------------------------------

uint64_t ZstdMaxDecodedSize(uint64_t stored) {
  uint64_t blocks = stored / 3 + 1;
  uint64_t out;
  if (MulOverflows(blocks, 128u << 10, &out)) return UINT64_MAX;
  return out;
}

// ---- JSON --------------------------------------------------------------------------

namespace {

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i,
// or -1 when invalid.
int32_t DecodeUtf8(std::string_view s, size_t* i) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  uint8_t c = byte(*i);
  if (c < 0x80) {
    ++*i;
    return c;
  }
  int len;
  int32_t cp;
  int32_t min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return -1;
  }
  if (*i + len > s.size()) return -1;
  for (int k = 1; k < len; ++k) {
    uint8_t cc = byte(*i + k);
    if ((cc & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  *i += len;
  return cp;
}

void AppendU4(std::string& out, uint32_t v) {
  static const char* kHex = "0123456789abcdef";
  out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(v >> shift) & 15];
}

}  // namespace

bool IsValidUtf8(std::string_view s) { return core::IsValidUtf8(s); }

std::string PyJsonQuote(std::string_view s) {
  std::string out = "\"";
  size_t i = 0;
  while (i < s.size()) {
    int32_t cp = DecodeUtf8(s, &i);
    if (cp < 0) {  // REQUIRES said valid UTF-8; degrade to U+FFFD as Python's errors="replace"
      AppendU4(out, 0xFFFD);
      ++i;
      continue;
    }
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20) {
      AppendU4(out, cp);
    } else if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      AppendU4(out, cp);
    } else {
      uint32_t v = cp - 0x10000;
      AppendU4(out, 0xD800 + (v >> 10));
      AppendU4(out, 0xDC00 + (v & 0x3FF));
    }
  }
  out += '"';
  return out;
}

Status AddTensorplayProfile(const std::vector<MegaTensorInfo>& tensors, uint64_t alignment,
                            std::string_view container, MegaChecksumType checksum,
                            MegaMetadata* md) {
  MEGA_RETURN_IF_ERROR(md->Add("general.architecture", MetaValue::String("tensorplay")));
  MEGA_RETURN_IF_ERROR(md->Add("general.alignment", MetaValue::UInt(alignment)));
  MEGA_RETURN_IF_ERROR(md->Add("mega.tensor_info.format", MetaValue::String("self_describing")));
  MEGA_RETURN_IF_ERROR(md->Add("tensorplay.container", MetaValue::String(std::string(container))));
  MEGA_RETURN_IF_ERROR(md->Add("tensorplay.byteorder", MetaValue::String("little")));
  std::string devices = "{", sums = "{";
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string key = PyJsonQuote(tensors[i].name);
    devices += (i ? ", " : "") + key + ": \"cpu\"";
    if (tensors[i].checksum_type != MegaChecksumType::kNone) {
      sums += (sums.size() > 1 ? ", " : "") + key + ": \"" + tensors[i].checksum_hex() + "\"";
    }
  }
  MEGA_RETURN_IF_ERROR(md->Add("tensorplay.tensor_devices", MetaValue::String(devices + "}")));
  // The "tensorplay.checksum" value: "none" | "crc32" | "sha256".
  const std::string checksum_name = ToLower(MegaChecksumTypeName(checksum));
  MEGA_RETURN_IF_ERROR(md->Add("tensorplay.checksum", MetaValue::String(checksum_name)));
  return md->Add("tensorplay.tensor_checksums", MetaValue::String(sums + "}"));
}

}  // namespace mega_internal
}  // namespace megackpt::format
