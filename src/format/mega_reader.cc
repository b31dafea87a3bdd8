// MegaReader: parses and validates a MEGA v1 file (spec §8), then reads tensors.
//
// Parsing touches only the header window [0, payload_end) through a bounded
// ByteSource and the 68-byte trailer (+ overlay) at the end; every length is
// checked against the bytes that remain before anything is allocated.
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_set>

#include "format/mega_internal.h"
#include "format/quote.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/text.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/mega_encoder.h"

namespace megackpt::format {

using mega_internal::AddOverflows;
using mega_internal::ByteSource;
using mega_internal::MulOverflows;

uint32_t MegaTensorInfo::crc32() const { return LoadLE32(checksum.data()); }

std::string MegaTensorInfo::checksum_hex() const {
  switch (checksum_type) {
    case MegaChecksumType::kNone:
      return "";
    case MegaChecksumType::kCrc32: {
      char buf[9];
      std::snprintf(buf, sizeof(buf), "%08x", crc32());
      return buf;
    }
    case MegaChecksumType::kSha256:
      return ToHex(checksum);
  }
  return "";
}

using mega_internal::Checker;

namespace {

using format_internal::Quote;

// DataLoss unless `count` records of `record_size` bytes fit in what is left
// of the header; `count_key` names the count in the message.
Status RecordsFit(const mega_internal::ByteSource& src, uint64_t count, uint64_t record_size,
                  std::string_view count_key) {
  uint64_t bytes;
  if (MulOverflows(count, record_size, &bytes) || bytes > src.remaining()) {
    return src.Error(std::string(count_key) + " " + std::to_string(count) +
                     " records do not fit in the header");
  }
  return Status::OK();
}

// The `count` fixed-size records of `size` bytes at the source's position
// (RecordsFit first): fn(i, at, q) for each, `at` its file offset and q its
// bytes; stops at the first error.
template <typename Fn>
Status ForEachRecord(mega_internal::ByteSource& src, uint64_t count, uint64_t size,
                     const char* count_key, const char* what, Fn&& fn) {
  MEGA_RETURN_IF_ERROR(RecordsFit(src, count, size, count_key));
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = src.position();
    MEGA_ASSIGN_OR_RETURN(auto rec, src.Bytes(size, what));
    MEGA_RETURN_IF_ERROR(fn(i, at, rec.data()));
  }
  return Status::OK();
}

std::string Range(uint64_t a, uint64_t b) {
  std::string out = "[";
  out += std::to_string(a);
  out += ", ";
  out += std::to_string(b);
  out += ")";
  return out;
}

std::string DigestText(MegaChecksumType type, const MegaChecksum& c) {
  if (type == MegaChecksumType::kCrc32) {
    const uint32_t v = LoadLE32(c.data());
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", v);
    return buf;
  }
  return ToHex(c);
}

// One stored byte range that decodes independently: a raw_dense tensor or a chunk.
struct Unit {
  uint64_t file_offset = 0;
  uint64_t stored = 0;
  uint64_t logical = 0;
  bool compressed = false;
  bool shuffled = false;
  uint32_t shuffle_elem_size = 0;
  MegaChecksumType checksum_type = MegaChecksumType::kNone;
  const MegaChecksum* checksum = nullptr;
  std::string what;  // "tensor 'x'" or "tensor 'x' chunk 3"

  bool plain() const { return !compressed && !shuffled; }
};

Unit TensorUnit(const MegaTensorInfo& t) {
  Unit u;
  u.file_offset = t.file_offset;
  u.stored = t.stored_nbytes;
  u.logical = t.logical_nbytes;
  u.compressed = t.compressed();
  u.shuffled = t.byte_shuffled();
  u.shuffle_elem_size = t.shuffle_elem_size;
  u.checksum_type = t.checksum_type;
  u.checksum = &t.checksum;
  u.what = "tensor " + Quote(t.name);
  return u;
}

Unit ChunkUnit(const MegaTensorInfo& t, const MegaChunkInfo& c) {
  Unit u;
  u.file_offset = c.file_offset;
  u.stored = c.stored_size;
  u.logical = c.logical_size;
  u.compressed = c.flags & kMegaTensorCompressed;
  u.shuffled = c.flags & kMegaTensorByteShuffled;
  u.shuffle_elem_size = t.shuffle_elem_size;
  u.checksum_type = c.checksum_type;
  u.checksum = &c.checksum;
  u.what = "tensor " + Quote(t.name) + " chunk " + std::to_string(c.chunk_id) + " (logical " +
           Range(c.logical_offset, c.logical_offset + c.logical_size) + ")";
  return u;
}

// A heap buffer without value-initialisation (big ones get huge pages).
Result<std::shared_ptr<std::byte>> Scratch(uint64_t n) {
  if (n > SIZE_MAX / 2) return ResourceExhaustedError("buffer of " + std::to_string(n) + " bytes");
  return AllocateBuffer(static_cast<size_t>(n));
}

}  // namespace

// ---- parsing -------------------------------------------------------------------

namespace {

// What the steps of MegaParser::Parse share.
struct ParseState {
  MegaReader* r;
  const std::string& name;
  ByteSource src;  // the header window [0, payload_end)
  uint64_t payload_end = 0;
  uint64_t tensor_count = 0, kv_count = 0;
  uint64_t metadata_end = 0;  // file offset where the tensor directory starts
  uint64_t chunk_count = 0, segment_count = 0, moe_count = 0;
  std::optional<uint64_t> n_experts;
  std::unordered_set<uint32_t> segment_ids;
};

}  // namespace

// Parse runs one step per section of docs/format/mega-v1.md, in file order:
// footer overlay (§7, first: it fixes payload_end), preamble, metadata,
// structural keys, directory, chunk / segment / MoE records, stored ranges,
// then the owned keys (§11: header checksum, block CRC tables).
class MegaParser {
 public:
  static Status Parse(MegaReader* r);

 private:
  static Status ParseFooter(MegaReader* r, uint64_t* payload_end);
  static Status ParsePreamble(ParseState& p);
  static Status ParseMetadata(ParseState& p);
  static Status CheckStructuralKeys(ParseState& p);
  static Status ParseDirectory(ParseState& p);
  static Status ParseChunkRecords(ParseState& p);
  static Status CheckChunkTiling(ParseState& p);
  static Status ParseSegmentRecords(ParseState& p);
  static Status ParseMoeRecords(ParseState& p);
  static Status CheckStoredRanges(ParseState& p);
  static Status CheckHeaderChecksum(ParseState& p);
  static Status ParseBlockTables(ParseState& p);
  static Status CheckCountKey(const MegaMetadata& md, const std::string& name,
                              std::string_view count_key, std::string_view format_key,
                              uint64_t* count);
};

Status MegaParser::ParseFooter(MegaReader* r, uint64_t* payload_end) {
  const RandomAccessFile& f = *r->file_;
  const std::string& name = f.name();
  const uint64_t size = f.size();
  *payload_end = size;
  if (size < kMegaFooterTrailerSize) return Status::OK();
  std::array<std::byte, kMegaFooterTrailerSize> tr;
  MEGA_RETURN_IF_ERROR(f.ReadExactlyAt(size - kMegaFooterTrailerSize, tr));
  if (LoadLE32(tr.data()) != kMegaFooterMagic) return Status::OK();

  const uint64_t trailer_at = size - kMegaFooterTrailerSize;
  auto bad = [&](const std::string& msg) {
    return DataLossError(name + ": footer overlay: " + msg + " (trailer at offset " +
                         std::to_string(trailer_at) + ")");
  };
  MegaFooterOverlayInfo& ov = r->overlay_;
  ov.present = true;
  ov.generation = LoadLE64(tr.data() + 4);
  ov.overlay_offset = LoadLE64(tr.data() + 12);
  ov.overlay_size = LoadLE64(tr.data() + 20);
  ov.base_size = LoadLE64(tr.data() + 28);
  std::memcpy(ov.sha256.data(), tr.data() + 36, 32);
  if (ov.generation == 0) return bad("generation 0 (must be >= 1)");
  uint64_t overlay_end;
  if (AddOverflows(ov.overlay_offset, ov.overlay_size, &overlay_end) || overlay_end != trailer_at) {
    return bad("overlay range [" + std::to_string(ov.overlay_offset) + ", +" +
               std::to_string(ov.overlay_size) + ") does not end at the trailer");
  }
  if (ov.base_size > ov.overlay_offset) {
    return bad("base_size " + std::to_string(ov.base_size) + " is past the overlay offset " +
               std::to_string(ov.overlay_offset));
  }
  if (ov.overlay_size < 12) {
    return bad("overlay size " + std::to_string(ov.overlay_size) + " is below the 12-byte minimum");
  }
  MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(ov.overlay_size));
  std::span<std::byte> bytes(buf.get(), ov.overlay_size);
  MEGA_RETURN_IF_ERROR(f.ReadExactlyAt(ov.overlay_offset, bytes));
  Sha256Digest got = Sha256Of(bytes);
  if (got != ov.sha256) {
    return bad("SHA-256 mismatch: trailer says " + ToHex(ov.sha256) + ", overlay bytes hash to " +
               ToHex(got));
  }
  ByteSource src(name, bytes, ov.overlay_offset);
  MEGA_ASSIGN_OR_RETURN(uint32_t magic, src.U32("footer overlay magic"));
  if (magic != kMegaFooterMagic) return bad("overlay does not start with the footer magic");
  MEGA_ASSIGN_OR_RETURN(uint64_t count, src.U64("footer overlay kv_count"));
  MEGA_RETURN_IF_ERROR(MetaCodec::DecodeEntries(src, count, "footer overlay", &ov.metadata));
  if (src.remaining() != 0) {
    return bad(std::to_string(src.remaining()) + " bytes after the last overlay entry");
  }
  for (const MetaEntry& e : ov.metadata.entries()) {
    if (IsMegaStructuralKey(e.key)) {
      return bad("overlay sets structural key " + Quote(e.key) + ", which only the header may set");
    }
  }
  *payload_end = ov.base_size;
  return Status::OK();
}

Status MegaParser::CheckCountKey(const MegaMetadata& md, const std::string& name,
                                 std::string_view count_key, std::string_view format_key,
                                 uint64_t* count) {
  *count = 0;
  const MetaValue* c = md.Find(count_key);
  const MetaValue* f = md.Find(format_key);
  if (f != nullptr) {
    auto s = f->AsString();
    if (!s.ok() || *s != "v1") {
      return DataLossError(name + ": metadata " + Quote(format_key) + " is " +
                           (s.ok() ? "'" + std::string(*s) + "'" : f->ToJson()) +
                           ", expected \"v1\"");
    }
  }
  if (c == nullptr) return Status::OK();
  if (f == nullptr) {
    return DataLossError(name + ": metadata " + Quote(count_key) + " present without " +
                         Quote(format_key));
  }
  auto v = c->AsUint64();
  if (!v.ok()) {
    return DataLossError(name + ": metadata " + Quote(count_key) +
                         " must be a non-negative integer, got " +
                         std::string(MetaTypeName(c->type())) + " " + c->ToJson());
  }
  *count = *v;
  return Status::OK();
}

// §1: magic, version, tensor_count, metadata_kv_count.
Status MegaParser::ParsePreamble(ParseState& p) {
  ByteSource& src = p.src;
  MEGA_ASSIGN_OR_RETURN(uint32_t magic, src.U32("magic"));
  if (magic != kMegaMagic) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "0x%08x", magic);
    return src.ErrorAt(0, std::string("bad magic ") + buf + " (expected 0x4147454d \"MEGA\")");
  }
  MEGA_ASSIGN_OR_RETURN(uint32_t version, src.U32("version"));
  if (version != kMegaVersion) {
    return src.ErrorAt(4, "unsupported version " + std::to_string(version) + " (expected 1)");
  }
  MEGA_ASSIGN_OR_RETURN(p.tensor_count, src.U64("tensor_count"));
  MEGA_ASSIGN_OR_RETURN(p.kv_count, src.U64("metadata_kv_count"));
  return Status::OK();
}
// §2: the header metadata entries (types, unique keys, clean text).
Status MegaParser::ParseMetadata(ParseState& p) {
  MegaReader* r = p.r;
  ByteSource& src = p.src;
  MEGA_RETURN_IF_ERROR(
      MetaCodec::DecodeEntries(src, p.kv_count, "header metadata", &r->header_metadata_));
  p.metadata_end = src.position();
  return Status::OK();
}
// §2 / §8.13: general.alignment, mega.tensor_info.format, the *.count keys.
Status MegaParser::CheckStructuralKeys(ParseState& p) {
  MegaReader* r = p.r;
  const std::string& name = p.name;
  const MegaMetadata& md = r->header_metadata_;
  if (const MetaValue* a = md.Find("general.alignment")) {
    auto v = a->AsUint64();
    if (!v.ok()) {
      return DataLossError(name + ": general.alignment must be an unsigned integer, got " +
                           std::string(MetaTypeName(a->type())) + " " + a->ToJson());
    }
    if (*v == 0) return DataLossError(name + ": general.alignment is 0");
    r->alignment_ = *v;
  }
  if (const MetaValue* tf = md.Find("mega.tensor_info.format")) {
    auto s = tf->AsString();
    if (!s.ok() || *s != "self_describing") {
      return DataLossError(name + ": unsupported mega.tensor_info.format " + tf->ToJson() +
                           " (expected \"self_describing\")");
    }
  }
  MEGA_RETURN_IF_ERROR(CheckCountKey(md, name, "mega.chunk_directory.count",
                                     "mega.chunk_directory.format", &p.chunk_count));
  MEGA_RETURN_IF_ERROR(CheckCountKey(md, name, "mega.segment_directory.count",
                                     "mega.segment_directory.format", &p.segment_count));
  MEGA_RETURN_IF_ERROR(CheckCountKey(md, name, "mega.moe.expert_table.count",
                                     "mega.moe.expert_table.format", &p.moe_count));
  if (const MetaValue* ne = md.Find("mega.moe.n_experts")) {
    auto v = ne->AsUint64();
    if (!v.ok()) {
      return DataLossError(name + ": mega.moe.n_experts must be a non-negative integer, got " +
                           ne->ToJson());
    }
    p.n_experts = *v;
  }
  return Status::OK();
}
// §3: tensor directory entries and their field consistency.
Status MegaParser::ParseDirectory(ParseState& p) {
  MegaReader* r = p.r;
  ByteSource& src = p.src;
  auto& tensors = r->tensors_;
  uint64_t min_dir;
  if (p.tensor_count > (1ull << 32) ||
      MulOverflows(p.tensor_count, mega_internal::kMinTensorEntryBytes, &min_dir) ||
      min_dir > src.remaining()) {
    return src.Error("tensor_count " + std::to_string(p.tensor_count) + " cannot fit in the " +
                     std::to_string(src.remaining()) + " header bytes that remain");
  }
  tensors.reserve(p.tensor_count);
  for (uint64_t i = 0; i < p.tensor_count; ++i) {
    const uint64_t at = src.position();
    MegaTensorInfo t;
    t.tensor_id = static_cast<uint32_t>(i);
    MEGA_ASSIGN_OR_RETURN(t.name, src.CompactString("tensor name"));
    auto who = [&t] { return "tensor " + Quote(t.name); };  // built only on error
    if (!IsCleanText(t.name))
      return src.ErrorAt(at, who() + ": name is not valid UTF-8 without NUL");
    if (r->by_name_.count(t.name)) return src.ErrorAt(at, "duplicate tensor name " + Quote(t.name));
    MEGA_ASSIGN_OR_RETURN(t.dir_flags, src.U32("dir_flags"));
    if (t.dir_flags & ~kMegaDirKnownFlags) {
      return src.ErrorAt(at, who() + ": unknown dir_flags bits " + std::to_string(t.dir_flags));
    }
    MEGA_ASSIGN_OR_RETURN(uint32_t ndims, src.U32("n_dims"));
    if (uint64_t{ndims} * 8 > src.remaining()) {
      return src.Error(who() + ": n_dims " + std::to_string(ndims) + " exceeds the header");
    }
    t.shape.assign(ndims, 0);
    for (uint32_t d = 0; d < ndims; ++d) {
      MEGA_ASSIGN_OR_RETURN(uint64_t dim, src.U64("dim"));
      if (dim > static_cast<uint64_t>(INT64_MAX)) {
        return src.ErrorAt(at, who() + ": dimension " + std::to_string(dim) + " is too large");
      }
      t.shape[ndims - 1 - d] = static_cast<int64_t>(dim);  // stored innermost first
    }
    MEGA_ASSIGN_OR_RETURN(std::string dtype_name, src.CompactString("dtype"));
    auto dtype = DTypeFromName(dtype_name);
    if (!dtype.ok()) return src.ErrorAt(at, who() + ": unknown dtype " + Quote(dtype_name));
    t.dtype = *dtype;
    MEGA_ASSIGN_OR_RETURN(t.payload_offset, src.U64("payload_offset"));
    auto logical = LogicalNbytes(t.dtype, t.shape);
    if (!logical.ok()) {
      return src.ErrorAt(at, who() + ": shape " + ShapeToString(t.shape) + " of " + dtype_name +
                                 " overflows the logical size");
    }
    t.logical_nbytes = *logical;
    t.stored_nbytes = t.logical_nbytes;
    if (t.dir_flags & kMegaDirHasStorageFormat) {
      MEGA_ASSIGN_OR_RETURN(std::string sf, src.CompactString("storage_format"));
      if (sf == "raw_dense") {
        t.storage_format = MegaStorageFormat::kRawDense;
      } else if (sf == "chunked_raw_dense") {
        t.storage_format = MegaStorageFormat::kChunkedRawDense;
      } else {
        return src.ErrorAt(at, who() + ": unknown storage_format " + Quote(sf));
      }
    }
    if (t.dir_flags & kMegaDirHasStoredNbytes) {
      MEGA_ASSIGN_OR_RETURN(t.stored_nbytes, src.U64("stored_nbytes"));
    }
    if (t.dir_flags & kMegaDirHasTensorFlags) {
      MEGA_ASSIGN_OR_RETURN(t.tensor_flags, src.U32("tensor_flags"));
      if (t.tensor_flags & ~kMegaTensorKnownFlags) {
        return src.ErrorAt(at,
                           who() + ": unknown tensor_flags bits " + std::to_string(t.tensor_flags));
      }
    }
    if (t.dir_flags & kMegaDirHasCodec) {
      MEGA_ASSIGN_OR_RETURN(uint32_t codec, src.U32("codec"));
      if (codec > static_cast<uint32_t>(MegaCodec::kZstd)) {
        return src.ErrorAt(at, who() + ": unknown codec " + std::to_string(codec));
      }
      t.codec = static_cast<MegaCodec>(codec);
    }
    if (t.dir_flags & kMegaDirHasShuffleElemSize) {
      MEGA_ASSIGN_OR_RETURN(t.shuffle_elem_size, src.U32("shuffle_elem_size"));
    }
    if (t.dir_flags & kMegaDirHasChecksum) {
      MEGA_ASSIGN_OR_RETURN(uint32_t ct, src.U32("checksum_type"));
      if (ct > static_cast<uint32_t>(MegaChecksumType::kSha256)) {
        return src.ErrorAt(at, who() + ": unknown checksum type " + std::to_string(ct));
      }
      t.checksum_type = static_cast<MegaChecksumType>(ct);
      MEGA_ASSIGN_OR_RETURN(auto ck, src.Bytes(32, "checksum"));
      std::memcpy(t.checksum.data(), ck.data(), 32);
    }
    // Field consistency rules (spec §3).
    if (t.compressed() && t.codec == MegaCodec::kNone) {
      return src.ErrorAt(at, who() + ": flagged COMPRESSED but codec is NONE");
    }
    if (!t.compressed() && t.codec != MegaCodec::kNone) {
      return src.ErrorAt(at, who() + ": codec " + std::string(MegaCodecName(t.codec)) +
                                 " on an uncompressed tensor");
    }
    if (t.byte_shuffled() &&
        (t.shuffle_elem_size == 0 || t.logical_nbytes % t.shuffle_elem_size != 0)) {
      return src.ErrorAt(at, who() + ": BYTE_SHUFFLED with shuffle_elem_size " +
                                 std::to_string(t.shuffle_elem_size) +
                                 " that does not divide logical size " +
                                 std::to_string(t.logical_nbytes));
    }
    if (!t.chunked()) {
      if (!t.compressed() && t.stored_nbytes != t.logical_nbytes) {
        return src.ErrorAt(at, who() + ": uncompressed raw_dense tensor stores " +
                                   std::to_string(t.stored_nbytes) + " bytes, logical size is " +
                                   std::to_string(t.logical_nbytes));
      }
      if (t.compressed() && t.logical_nbytes > mega_internal::ZstdMaxDecodedSize(t.stored_nbytes)) {
        return src.ErrorAt(at, who() + ": logical size " + std::to_string(t.logical_nbytes) +
                                   " cannot be decoded from " + std::to_string(t.stored_nbytes) +
                                   " zstd bytes");
      }
    }
    r->by_name_.emplace(t.name, tensors.size());
    tensors.push_back(std::move(t));
  }
  return Status::OK();
}
// §4: chunk records (88 bytes each).
Status MegaParser::ParseChunkRecords(ParseState& p) {
  MegaReader* r = p.r;
  ByteSource& src = p.src;
  auto& tensors = r->tensors_;
  std::unordered_set<uint64_t> chunk_ids;
  auto record = [&](uint64_t i, uint64_t at, const std::byte* q) -> Status {
    MegaChunkInfo c;
    c.tensor_id = LoadLE32(q);
    c.chunk_id = LoadLE32(q + 4);
    c.logical_offset = LoadLE64(q + 8);
    c.logical_size = LoadLE64(q + 16);
    c.payload_offset = LoadLE64(q + 24);
    c.stored_size = LoadLE64(q + 32);
    uint32_t codec = LoadLE32(q + 40);
    c.flags = LoadLE32(q + 44);
    uint32_t ct = LoadLE32(q + 48);
    uint32_t reserved = LoadLE32(q + 52);
    std::memcpy(c.checksum.data(), q + 56, 32);
    std::string who = "chunk record " + std::to_string(i);
    if (c.tensor_id >= tensors.size()) {
      return src.ErrorAt(at, who + ": tensor_id " + std::to_string(c.tensor_id) +
                                 " out of range (" + std::to_string(tensors.size()) + " tensors)");
    }
    MegaTensorInfo& t = tensors[c.tensor_id];
    who = "tensor " + Quote(t.name) + " chunk " + std::to_string(c.chunk_id);
    if (!t.chunked()) return src.ErrorAt(at, who + ": chunk record for a raw_dense tensor");
    if (!chunk_ids.insert(uint64_t{c.tensor_id} << 32 | c.chunk_id).second) {
      return src.ErrorAt(at, who + ": duplicate (tensor_id, chunk_id)");
    }
    if (c.logical_size == 0 || c.stored_size == 0) {
      return src.ErrorAt(at, who + ": zero logical_size or stored_size");
    }
    uint64_t lend;
    if (AddOverflows(c.logical_offset, c.logical_size, &lend)) {
      return src.ErrorAt(at, who + ": logical range overflows");
    }
    if (codec > static_cast<uint32_t>(MegaCodec::kZstd)) {
      return src.ErrorAt(at, who + ": unknown codec " + std::to_string(codec));
    }
    c.codec = static_cast<MegaCodec>(codec);
    if (c.flags & ~kMegaTensorKnownFlags) {
      return src.ErrorAt(at, who + ": unknown flags bits " + std::to_string(c.flags));
    }
    const bool compressed = c.flags & kMegaTensorCompressed;
    if (compressed != (c.codec != MegaCodec::kNone)) {
      return src.ErrorAt(at, who + ": COMPRESSED flag and codec " +
                                 std::string(MegaCodecName(c.codec)) + " disagree");
    }
    if (!compressed && c.stored_size != c.logical_size) {
      return src.ErrorAt(at, who + ": uncompressed chunk stores " + std::to_string(c.stored_size) +
                                 " bytes for logical size " + std::to_string(c.logical_size));
    }
    if (compressed && c.logical_size > mega_internal::ZstdMaxDecodedSize(c.stored_size)) {
      return src.ErrorAt(at, who + ": logical size " + std::to_string(c.logical_size) +
                                 " cannot be decoded from " + std::to_string(c.stored_size) +
                                 " zstd bytes");
    }
    if ((c.flags & kMegaTensorByteShuffled) &&
        (t.shuffle_elem_size == 0 || c.logical_size % t.shuffle_elem_size != 0)) {
      return src.ErrorAt(at, who + ": BYTE_SHUFFLED but the tensor's shuffle_elem_size " +
                                 std::to_string(t.shuffle_elem_size) + " does not divide " +
                                 std::to_string(c.logical_size));
    }
    if (ct > static_cast<uint32_t>(MegaChecksumType::kSha256)) {
      return src.ErrorAt(at, who + ": unknown checksum type " + std::to_string(ct));
    }
    c.checksum_type = static_cast<MegaChecksumType>(ct);
    if (reserved != 0)
      return src.ErrorAt(at, who + ": reserved field is " + std::to_string(reserved));
    t.chunks.push_back(c);
    return Status::OK();
  };
  return ForEachRecord(src, p.chunk_count, kMegaChunkRecordSize, "mega.chunk_directory.count",
                       "chunk record", record);
}
// §4: the chunks of each chunked tensor tile its logical bytes exactly.
Status MegaParser::CheckChunkTiling(ParseState& p) {
  MegaReader* r = p.r;
  const std::string& name = p.name;
  auto& tensors = r->tensors_;
  for (MegaTensorInfo& t : tensors) {
    if (!t.chunked()) continue;
    std::sort(t.chunks.begin(), t.chunks.end(), [](const MegaChunkInfo& a, const MegaChunkInfo& b) {
      return a.logical_offset < b.logical_offset;
    });
    uint64_t expect = 0;
    for (const MegaChunkInfo& c : t.chunks) {
      if (c.logical_offset != expect) {
        return DataLossError(
            name + ": tensor " + Quote(t.name) + ": chunk " + std::to_string(c.chunk_id) +
            " starts at logical offset " + std::to_string(c.logical_offset) + ", expected " +
            std::to_string(expect) + (c.logical_offset > expect ? " (gap)" : " (overlap)"));
      }
      expect += c.logical_size;
    }
    if (expect != t.logical_nbytes) {
      return DataLossError(name + ": tensor " + Quote(t.name) + ": chunks cover " +
                           std::to_string(expect) + " bytes, logical size is " +
                           std::to_string(t.logical_nbytes));
    }
  }
  return Status::OK();
}
// §5: segment records (72 bytes each).
Status MegaParser::ParseSegmentRecords(ParseState& p) {
  MegaReader* r = p.r;
  ByteSource& src = p.src;
  auto& tensors = r->tensors_;
  auto record = [&](uint64_t /*i*/, uint64_t at, const std::byte* q) -> Status {
    MegaSegment s;
    uint32_t* head[] = {&s.segment_id,  &s.kind,      &s.priority,     &s.flags,
                        &s.layer_start, &s.layer_end, &s.expert_start, &s.expert_end};
    for (int k = 0; k < 8; ++k) *head[k] = LoadLE32(q + 4 * k);
    s.payload_offset = LoadLE64(q + 32);
    s.payload_size = LoadLE64(q + 40);
    uint32_t* tail[] = {&s.first_tensor_id, &s.tensor_count, &s.prefetch_group,
                        &s.device_hint,     &s.cache_policy, &s.reserved};
    for (int k = 0; k < 6; ++k) *tail[k] = LoadLE32(q + 48 + 4 * k);
    const std::string who = "segment " + std::to_string(s.segment_id);
    if (!p.segment_ids.insert(s.segment_id).second) return src.ErrorAt(at, "duplicate " + who);
    if (s.layer_start > s.layer_end) {
      return src.ErrorAt(at, who + ": layer range " + std::to_string(s.layer_start) + ".." +
                                 std::to_string(s.layer_end) + " is reversed");
    }
    if (s.expert_start > s.expert_end) {
      return src.ErrorAt(at, who + ": expert range " + std::to_string(s.expert_start) + ".." +
                                 std::to_string(s.expert_end) + " is reversed");
    }
    if (uint64_t{s.first_tensor_id} + s.tensor_count > tensors.size()) {
      return src.ErrorAt(at, who + ": tensors [" + std::to_string(s.first_tensor_id) + ", +" +
                                 std::to_string(s.tensor_count) + ") exceed the " +
                                 std::to_string(tensors.size()) + "-tensor directory");
    }
    if (s.reserved != 0) return src.ErrorAt(at, who + ": reserved field is non-zero");
    r->segments_.push_back(s);
    return Status::OK();
  };
  return ForEachRecord(src, p.segment_count, kMegaSegmentRecordSize, "mega.segment_directory.count",
                       "segment record", record);
}
// §6: MoE expert records (32 bytes each).
Status MegaParser::ParseMoeRecords(ParseState& p) {
  MegaReader* r = p.r;
  ByteSource& src = p.src;
  auto& tensors = r->tensors_;
  std::unordered_set<uint32_t> moe_tensors;
  auto record = [&](uint64_t i, uint64_t at, const std::byte* q) -> Status {
    MegaMoeExpert m;
    uint32_t* fields[] = {&m.tensor_id,  &m.layer_id,       &m.expert_id,    &m.expert_role,
                          &m.segment_id, &m.prefetch_group, &m.cache_policy, &m.reserved};
    for (int k = 0; k < 8; ++k) *fields[k] = LoadLE32(q + 4 * k);
    const std::string who = "MoE expert record " + std::to_string(i);
    if (m.tensor_id >= tensors.size()) {
      return src.ErrorAt(at, who + ": tensor_id " + std::to_string(m.tensor_id) + " out of range");
    }
    if (!moe_tensors.insert(m.tensor_id).second) {
      return src.ErrorAt(at, who + ": duplicate tensor_id " + std::to_string(m.tensor_id) + " (" +
                                 Quote(tensors[m.tensor_id].name) + ")");
    }
    if (p.n_experts && m.expert_id >= *p.n_experts) {
      return src.ErrorAt(at, who + ": expert_id " + std::to_string(m.expert_id) +
                                 " >= mega.moe.n_experts " + std::to_string(*p.n_experts));
    }
    if (m.segment_id != kMegaNoSegment && !r->segments_.empty() &&
        !p.segment_ids.count(m.segment_id)) {
      return src.ErrorAt(at, who + ": unknown segment_id " + std::to_string(m.segment_id));
    }
    if (m.reserved != 0) return src.ErrorAt(at, who + ": reserved field is non-zero");
    r->moe_experts_.push_back(m);
    return Status::OK();
  };
  return ForEachRecord(src, p.moe_count, kMegaMoeRecordSize, "mega.moe.expert_table.count",
                       "MoE expert record", record);
}
// §1 / §9: header_length, and every stored range inside the payload, pairwise disjoint.
Status MegaParser::CheckStoredRanges(ParseState& p) {
  MegaReader* r = p.r;
  const std::string& name = p.name;
  ByteSource& src = p.src;
  auto& tensors = r->tensors_;
  const uint64_t records_end = src.position();
  uint64_t header_length;
  if (mega_internal::AlignUp(records_end, r->alignment_, &header_length) ||
      header_length > p.payload_end) {
    return DataLossError(name + ": header records end at " + std::to_string(records_end) +
                         "; aligned to " + std::to_string(r->alignment_) +
                         " the header does not fit in the " + std::to_string(p.payload_end) +
                         "-byte " + (r->overlay_.present ? "base" : "file"));
  }
  r->header_length_ = header_length;
  const uint64_t payload_size = p.payload_end - header_length;

  struct StoredRange {
    uint64_t begin, end;
    size_t tensor;
    int64_t chunk;  // -1 for raw_dense
  };
  std::vector<StoredRange> ranges;
  auto describe = [&](const StoredRange& s) {
    std::string d = "tensor " + Quote(tensors[s.tensor].name);
    if (s.chunk >= 0) d += " chunk " + std::to_string(tensors[s.tensor].chunks[s.chunk].chunk_id);
    return d;
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    MegaTensorInfo& t = tensors[i];
    auto add = [&](uint64_t off, uint64_t n, int64_t chunk) -> Status {
      uint64_t end;
      StoredRange s{off, 0, i, chunk};
      if (AddOverflows(off, n, &end) || end > payload_size) {
        return DataLossError(name + ": " + describe(s) + ": payload range [" + std::to_string(off) +
                             ", +" + std::to_string(n) + ") exceeds the payload size " +
                             std::to_string(payload_size));
      }
      s.end = end;
      if (n > 0) ranges.push_back(s);
      return Status::OK();
    };
    if (t.chunked()) {
      uint64_t fo;
      t.file_offset = AddOverflows(header_length, t.payload_offset, &fo) ? 0 : fo;
      for (size_t k = 0; k < t.chunks.size(); ++k) {
        MEGA_RETURN_IF_ERROR(
            add(t.chunks[k].payload_offset, t.chunks[k].stored_size, static_cast<int64_t>(k)));
        t.chunks[k].file_offset = header_length + t.chunks[k].payload_offset;
      }
    } else {
      MEGA_RETURN_IF_ERROR(add(t.payload_offset, t.stored_nbytes, -1));
      t.file_offset = header_length + t.payload_offset;
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const StoredRange& a, const StoredRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t k = 1; k < ranges.size(); ++k) {
    const StoredRange& a = ranges[k - 1];
    const StoredRange& b = ranges[k];
    if (b.begin < a.end) {
      return DataLossError(name + ": " + describe(b) + " payload range " + Range(b.begin, b.end) +
                           " overlaps " + describe(a) + " range " + Range(a.begin, a.end));
    }
  }
  for (const MegaSegment& s : r->segments_) {
    uint64_t end;
    if (AddOverflows(s.payload_offset, s.payload_size, &end) || end > payload_size) {
      return DataLossError(name + ": segment " + std::to_string(s.segment_id) +
                           ": payload range [" + std::to_string(s.payload_offset) + ", +" +
                           std::to_string(s.payload_size) + ") exceeds the payload size " +
                           std::to_string(payload_size));
    }
  }
  return Status::OK();
}

// §11: megackpt.header_crc32, when present, is the last header entry; its
// value is the CRC-32 of [0, header_length) with those 4 value bytes zeroed.
Status MegaParser::CheckHeaderChecksum(ParseState& p) {
  MegaReader* r = p.r;
  const MegaMetadata& md = r->header_metadata_;
  const MetaValue* v = md.Find(kMegaHeaderCrcKey);
  if (v == nullptr) return Status::OK();
  if (v->type() != MetaType::kUint32 || md.entries().back().key != kMegaHeaderCrcKey) {
    return DataLossError(p.name + ": " + std::string(kMegaHeaderCrcKey) +
                         " must be the last header entry, of type UINT32 (got " +
                         std::string(MetaTypeName(v->type())) + ")");
  }
  const uint32_t want = static_cast<uint32_t>(*v->AsUint64());
  const uint64_t value_at = p.metadata_end - 4;
  MEGA_ASSIGN_OR_RETURN(auto header, p.src.Window(0, r->header_length_));
  const std::byte zeros[4] = {};
  uint32_t got = Crc32(header.subspan(0, value_at));
  got = Crc32Extend(got, zeros);
  got = Crc32Extend(got, header.subspan(value_at + 4));
  if (got != want) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "0x%08x, the header bytes [0, %llu) hash to 0x%08x", want,
                  static_cast<unsigned long long>(r->header_length_), got);
    return DataLossError(p.name + ": header checksum mismatch: " + std::string(kMegaHeaderCrcKey) +
                         " says " + buf + " (a header byte is corrupt)");
  }
  r->header_checksummed_ = true;
  return Status::OK();
}

// §11: megackpt.block_crc32.block_sizes and .table_offsets (one per tensor).
Status MegaParser::ParseBlockTables(ParseState& p) {
  MegaReader* r = p.r;
  const MegaMetadata& md = r->header_metadata_;
  const MetaValue* sizes = md.Find(kMegaBlockSizesKey);
  const MetaValue* tables = md.Find(kMegaBlockTableKey);
  if (sizes == nullptr && tables == nullptr) return Status::OK();
  const std::string sk(kMegaBlockSizesKey), tk(kMegaBlockTableKey);
  if (sizes == nullptr || tables == nullptr) {
    return DataLossError(p.name + ": " + (sizes ? sk : tk) + " present without " +
                         (sizes ? tk : sk));
  }
  auto& tensors = r->tensors_;
  const std::string count = std::to_string(tensors.size());
  if (!sizes->is_array() || sizes->element_type() != MetaType::kUint32 ||
      sizes->size() != tensors.size()) {
    return DataLossError(p.name + ": " + sk + " must be an array of " + count +
                         " UINT32 (one per tensor)");
  }
  if (!tables->is_array() || tables->element_type() != MetaType::kUint64 ||
      tables->size() != tensors.size()) {
    return DataLossError(p.name + ": " + tk + " must be an array of " + count +
                         " UINT64 (one per tensor)");
  }
  const uint64_t payload_size = p.payload_end - r->header_length_;
  // Every stored range and every table, to check that none overlaps another.
  struct Span {
    uint64_t begin, end;
    size_t tensor;
    bool table;
  };
  std::vector<Span> spans;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MegaTensorInfo& t = tensors[i];
    if (t.chunked()) {
      for (const MegaChunkInfo& c : t.chunks)
        spans.push_back({c.payload_offset, c.payload_offset + c.stored_size, i, false});
    } else if (t.stored_nbytes > 0) {
      spans.push_back({t.payload_offset, t.payload_offset + t.stored_nbytes, i, false});
    }
    const uint64_t b = *(*sizes->element(i)).AsUint64();
    if (b == 0) continue;
    if ((b & (b - 1)) != 0 || b < kMegaMinBlockSize || b > kMegaMaxBlockSize) {
      return DataLossError(p.name + ": tensor " + Quote(t.name) + ": block size " +
                           std::to_string(b) + " is not a power of two in [64, 2^20]");
    }
    if (!t.is_plain()) {
      return DataLossError(p.name + ": tensor " + Quote(t.name) +
                           " has a block size but is compressed, shuffled or chunked");
    }
    const uint64_t off = *(*tables->element(i)).AsUint64();
    const uint64_t entries = (t.logical_nbytes + b - 1) / b;
    uint64_t end;
    if (AddOverflows(off, 4 * entries, &end) || end > payload_size) {
      return DataLossError(p.name + ": tensor " + Quote(t.name) +
                           ": block CRC table at payload offset " + std::to_string(off) + " (" +
                           std::to_string(entries) + " entries) exceeds the payload size " +
                           std::to_string(payload_size));
    }
    t.block_size = b;
    t.block_table_offset = r->header_length_ + off;
    if (entries > 0) spans.push_back({off, end, i, true});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  auto what = [&](const Span& s) {
    return std::string(s.table ? "the block CRC table of tensor " : "tensor ") +
           Quote(tensors[s.tensor].name) + " " + Range(s.begin, s.end);
  };
  for (size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].begin < spans[k - 1].end && (spans[k].table || spans[k - 1].table)) {
      return DataLossError(p.name + ": " + what(spans[k]) + " overlaps " + what(spans[k - 1]));
    }
  }
  return Status::OK();
}

Status MegaParser::Parse(MegaReader* r) {
  const RandomAccessFile& f = *r->file_;
  uint64_t payload_end = 0;
  MEGA_RETURN_IF_ERROR(ParseFooter(r, &payload_end));
  r->payload_end_ = payload_end;
  ParseState p{r, f.name(), ByteSource(f, 0, payload_end), payload_end};
  MEGA_RETURN_IF_ERROR(ParsePreamble(p));
  MEGA_RETURN_IF_ERROR(ParseMetadata(p));
  MEGA_RETURN_IF_ERROR(CheckStructuralKeys(p));
  MEGA_RETURN_IF_ERROR(ParseDirectory(p));
  MEGA_RETURN_IF_ERROR(ParseChunkRecords(p));
  MEGA_RETURN_IF_ERROR(CheckChunkTiling(p));
  MEGA_RETURN_IF_ERROR(ParseSegmentRecords(p));
  MEGA_RETURN_IF_ERROR(ParseMoeRecords(p));
  MEGA_RETURN_IF_ERROR(CheckStoredRanges(p));
  MEGA_RETURN_IF_ERROR(CheckHeaderChecksum(p));
  MEGA_RETURN_IF_ERROR(ParseBlockTables(p));
  // Effective metadata: overlay values replace header values.
  r->metadata_ = r->header_metadata_;
  for (const MetaEntry& e : r->overlay_.metadata.entries()) r->metadata_.Set(e.key, e.value);
  return Status::OK();
}

// ---- open ----------------------------------------------------------------------

MegaReader::~MegaReader() = default;

Result<std::unique_ptr<MegaReader>> MegaReader::Open(std::unique_ptr<RandomAccessFile> file,
                                                     const MegaReaderOptions& options) {
  if (file == nullptr) return InvalidArgumentError("MegaReader::Open: null file");
  std::unique_ptr<MegaReader> r(new MegaReader());
  r->file_ = std::move(file);
  r->options_ = options;
  if (r->options_.read_block_size == 0)
    r->options_.read_block_size = mega_internal::kDefaultIoBlock;
  MEGA_RETURN_IF_ERROR(MegaParser::Parse(r.get()));
  r->verified_ = std::make_unique<std::atomic<uint8_t>[]>(r->tensors_.size());
  return r;
}

Result<std::unique_ptr<MegaReader>> MegaReader::OpenFile(const std::string& path,
                                                         const MegaReaderOptions& options) {
  MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(path, options.use_mmap));
  return Open(std::move(file), options);
}

const std::string& MegaReader::file_name() const { return file_->name(); }
uint64_t MegaReader::file_size() const { return file_->size(); }

const MegaTensorInfo* MegaReader::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

Result<size_t> MegaReader::IndexOf(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  if (it == by_name_.end()) {
    return NotFoundError(file_name() + ": no tensor named " + Quote(name));
  }
  return it->second;
}

// ---- decoding ------------------------------------------------------------------

namespace {

struct ReadContext {
  const RandomAccessFile& file;
  size_t block;
  bool verify;
};

Status ChecksumMismatch(const ReadContext& ctx, const Unit& u, const MegaChecksum& got) {
  return DataLossError(ctx.file.name() + ": " + u.what + ": " +
                       std::string(MegaChecksumTypeName(u.checksum_type)) + " mismatch: stored " +
                       DigestText(u.checksum_type, *u.checksum) + ", computed " +
                       DigestText(u.checksum_type, got) + " over " + std::to_string(u.stored) +
                       " stored bytes at offset " + std::to_string(u.file_offset));
}

bool Verifies(const ReadContext& ctx, const Unit& u) {
  return ctx.verify && u.checksum_type != MegaChecksumType::kNone;
}

// Verified reads checksum each piece right after it lands, while it is still in
// the core's cache (one pass over the bytes from memory, not two): pieces of at
// most kCrcHotPiece, whatever larger read_block_size the reader was given.
constexpr uint64_t kFusedPiece = kCrcHotPiece;

// The piece size of a read of ctx that checksums when `verify`.
uint64_t PieceSize(const ReadContext& ctx, bool verify) {
  return verify ? std::min<uint64_t>(ctx.block, kFusedPiece) : ctx.block;
}

// Reads the stored bytes of `u` into dst (dst.size() == u.stored) in blocks,
// checksumming each block right after it lands.
Status ReadStored(const ReadContext& ctx, const Unit& u, std::span<std::byte> dst) {
  const bool verify = Verifies(ctx, u);
  if (verify && u.checksum_type == MegaChecksumType::kCrc32) {  // the CRC from the read's own pass
    MEGA_ASSIGN_OR_RETURN(uint32_t crc, ctx.file.ReadExactlyAtWithCrc32(u.file_offset, dst));
    const MegaChecksum got = mega_internal::Crc32Field(crc);
    if (got != *u.checksum) return ChecksumMismatch(ctx, u, got);
    return Status::OK();
  }
  Checker ck(verify ? u.checksum_type : MegaChecksumType::kNone);
  const uint64_t step = PieceSize(ctx, verify);
  for (uint64_t off = 0; off < dst.size(); off += step) {
    auto piece = dst.subspan(off, std::min<uint64_t>(step, dst.size() - off));
    MEGA_RETURN_IF_ERROR(ctx.file.ReadExactlyAt(u.file_offset + off, piece));
    if (verify) ck.Update(piece);
  }
  if (verify) {
    MegaChecksum got = ck.Finish();
    if (got != *u.checksum) return ChecksumMismatch(ctx, u, got);
  }
  return Status::OK();
}

Status Decompress(const ReadContext& ctx, const Unit& u, std::span<const std::byte> stored,
                  std::span<std::byte> out) {
  std::byte dummy{};
  size_t got = ZSTD_decompress(out.empty() ? &dummy : out.data(), out.size(),
                               stored.empty() ? &dummy : stored.data(), stored.size());
  if (ZSTD_isError(got)) {
    return DataLossError(ctx.file.name() + ": " + u.what + ": zstd data at offset " +
                         std::to_string(u.file_offset) + " does not decode to " +
                         std::to_string(u.logical) + " bytes: " + ZSTD_getErrorName(got));
  }
  if (got != out.size()) {
    return DataLossError(ctx.file.name() + ": " + u.what + ": zstd data decodes to " +
                         std::to_string(got) + " bytes, logical size is " +
                         std::to_string(u.logical));
  }
  return Status::OK();
}

// Decodes unit `u` into out (out.size() == u.logical).
Status DecodeUnit(const ReadContext& ctx, const Unit& u, std::span<std::byte> out) {
  if (u.plain()) return ReadStored(ctx, u, out);
  MEGA_ASSIGN_OR_RETURN(auto stored_buf, Scratch(u.stored));
  std::span<std::byte> stored(stored_buf.get(), u.stored);
  MEGA_RETURN_IF_ERROR(ReadStored(ctx, u, stored));
  if (!u.compressed) {  // shuffled only
    mega_internal::ByteUnshuffle(stored.data(), out.data(), out.size(), u.shuffle_elem_size);
    return Status::OK();
  }
  if (!u.shuffled) return Decompress(ctx, u, stored, out);
  MEGA_ASSIGN_OR_RETURN(auto tmp_buf, Scratch(u.logical));
  std::span<std::byte> tmp(tmp_buf.get(), u.logical);
  MEGA_RETURN_IF_ERROR(Decompress(ctx, u, stored, tmp));
  mega_internal::ByteUnshuffle(tmp.data(), out.data(), out.size(), u.shuffle_elem_size);
  return Status::OK();
}

// Checks a unit without materialising its decoded bytes: checksum of the
// stored bytes and, for compressed units, that they decode to exactly u.logical
// bytes (streamed through a bounded buffer).
Status VerifyUnit(const ReadContext& ctx, const Unit& u) {
  const bool check = u.checksum_type != MegaChecksumType::kNone;
  if (!check && !u.compressed) return Status::OK();
  const size_t block = std::min<uint64_t>(PieceSize(ctx, check), std::max<uint64_t>(u.stored, 1));
  MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(block));
  Checker ck(u.checksum_type);
  struct DctxFree {
    void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
  };
  std::unique_ptr<ZSTD_DCtx, DctxFree> dctx;
  std::shared_ptr<std::byte> out_buf;
  size_t out_cap = 0;
  if (u.compressed) {
    dctx.reset(ZSTD_createDCtx());
    if (!dctx) return ResourceExhaustedError("ZSTD_createDCtx failed");
    out_cap = ZSTD_DStreamOutSize();
    MEGA_ASSIGN_OR_RETURN(out_buf, Scratch(out_cap));
  }
  uint64_t produced = 0;
  size_t last_ret = 0;
  auto decode_error = [&](const std::string& why) {
    return DataLossError(ctx.file.name() + ": " + u.what + ": zstd data at offset " +
                         std::to_string(u.file_offset) + " " + why);
  };
  for (uint64_t off = 0; off < u.stored; off += block) {
    std::span<std::byte> piece(buf.get(), std::min<uint64_t>(block, u.stored - off));
    MEGA_RETURN_IF_ERROR(ctx.file.ReadExactlyAt(u.file_offset + off, piece));
    if (check) ck.Update(piece);
    if (u.compressed) {
      ZSTD_inBuffer in{piece.data(), piece.size(), 0};
      while (in.pos < in.size) {
        ZSTD_outBuffer out{out_buf.get(), out_cap, 0};
        last_ret = ZSTD_decompressStream(dctx.get(), &out, &in);
        if (ZSTD_isError(last_ret)) {
          return decode_error(std::string("is corrupt: ") + ZSTD_getErrorName(last_ret));
        }
        produced += out.pos;
        if (produced > u.logical) {
          return decode_error("decodes to more than the logical size " + std::to_string(u.logical));
        }
      }
    }
  }
  if (u.compressed) {
    // Drain output the decoder still holds.
    while (last_ret != 0) {
      ZSTD_inBuffer in{nullptr, 0, 0};
      ZSTD_outBuffer out{out_buf.get(), out_cap, 0};
      last_ret = ZSTD_decompressStream(dctx.get(), &out, &in);
      if (ZSTD_isError(last_ret)) {
        return decode_error(std::string("is corrupt: ") + ZSTD_getErrorName(last_ret));
      }
      if (out.pos == 0) break;
      produced += out.pos;
      if (produced > u.logical) {
        return decode_error("decodes to more than the logical size " + std::to_string(u.logical));
      }
    }
    if (last_ret != 0) return decode_error("ends in the middle of a frame");
    if (produced != u.logical) {
      return decode_error("decodes to " + std::to_string(produced) + " bytes, logical size is " +
                          std::to_string(u.logical));
    }
  }
  if (check) {
    MegaChecksum got = ck.Finish();
    if (got != *u.checksum) return ChecksumMismatch(ctx, u, got);
  }
  return Status::OK();
}

// A plain tensor with block CRCs: one pass over its bytes checks the tensor
// checksum and every block against the table (so verify covers the table too).
Status VerifyWithBlocks(const ReadContext& ctx, const MegaTensorInfo& t) {
  const uint64_t b = t.block_size, n = t.logical_nbytes;
  const uint64_t blocks = (n + b - 1) / b;
  std::vector<uint32_t> table(blocks);
  MEGA_RETURN_IF_ERROR(ctx.file.ReadExactlyAt(t.block_table_offset,
                                              std::as_writable_bytes(std::span<uint32_t>(table))));
  const uint64_t piece_max = std::max<uint64_t>(PieceSize(ctx, true) / b * b, b);
  MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(std::min(piece_max, n)));
  const Unit u = TensorUnit(t);
  Checker ck(t.checksum_type);
  for (uint64_t off = 0; off < n; off += piece_max) {
    std::span<std::byte> piece(buf.get(), std::min(piece_max, n - off));
    MEGA_RETURN_IF_ERROR(ctx.file.ReadExactlyAt(t.file_offset + off, piece));
    // One CRC pass over the piece feeds both checks.
    const uint32_t piece_crc = Crc32(piece);
    ck.Update(piece, piece_crc);
    uint32_t got = 0;
    const size_t nblocks = static_cast<size_t>((piece.size() + b - 1) / b);
    if (auto j = FindBadBlock(piece, b, std::span<const uint32_t>(table).subspan(off / b, nblocks),
                              &got, piece_crc)) {
      const uint64_t k = off / b + *j;
      const uint64_t len = std::min<uint64_t>(b, piece.size() - *j * b);
      char text[64];
      std::snprintf(text, sizeof text, "stored 0x%08x, computed 0x%08x", table[k], got);
      return DataLossError(ctx.file.name() + ": " + u.what + ": block " + std::to_string(k) +
                           " (bytes " + Range(k * b, k * b + len) + " of the tensor, at offset " +
                           std::to_string(t.file_offset + k * b) + ") CRC32 mismatch: " + text +
                           " (the tensor's bytes or its block CRC table at offset " +
                           std::to_string(t.block_table_offset + 4 * k) + " are corrupt)");
    }
  }
  const MegaChecksum got = ck.Finish();
  if (got != t.checksum) return ChecksumMismatch(ctx, u, got);
  return Status::OK();
}

// Decoded bytes [0, logical) of tensor t into out.
Status DecodeTensor(const ReadContext& ctx, const MegaTensorInfo& t, std::span<std::byte> out) {
  if (!t.chunked()) return DecodeUnit(ctx, TensorUnit(t), out);
  for (const MegaChunkInfo& c : t.chunks) {
    MEGA_RETURN_IF_ERROR(
        DecodeUnit(ctx, ChunkUnit(t, c), out.subspan(c.logical_offset, c.logical_size)));
  }
  return Status::OK();
}

}  // namespace

Status MegaReader::ReadTensor(size_t index, const Tensor& dst) const {
  if (index >= tensors_.size()) {
    return NotFoundError(file_name() + ": tensor index " + std::to_string(index) +
                         " out of range (" + std::to_string(tensors_.size()) + " tensors)");
  }
  const MegaTensorInfo& t = tensors_[index];
  if (!dst.defined() || dst.dtype() != t.dtype || dst.shape() != t.shape) {
    return InvalidArgumentError(
        file_name() + ": tensor " + Quote(t.name) + " is " + std::string(DTypeName(t.dtype)) + " " +
        ShapeToString(t.shape) + ", destination is " +
        (dst.defined() ? std::string(DTypeName(dst.dtype())) + " " + ShapeToString(dst.shape())
                       : std::string("undefined")));
  }
  ReadContext ctx{*file_, options_.read_block_size, options_.verify_checksums};
  if (dst.is_contiguous()) return DecodeTensor(ctx, t, dst.Bytes());
  if (t.is_plain()) {
    // Stream through a bounded staging buffer into the strided destination.
    const Unit u = TensorUnit(t);
    const bool verify = Verifies(ctx, u);
    Checker ck(verify ? u.checksum_type : MegaChecksumType::kNone);
    const size_t es = DTypeSize(t.dtype);  // F4 destinations are always contiguous
    const uint64_t block = std::max<uint64_t>(PieceSize(ctx, verify) / es * es, es);
    MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(std::min<uint64_t>(block, t.logical_nbytes)));
    for (uint64_t off = 0; off < t.logical_nbytes; off += block) {
      std::span<std::byte> piece(buf.get(), std::min<uint64_t>(block, t.logical_nbytes - off));
      MEGA_RETURN_IF_ERROR(file_->ReadExactlyAt(t.file_offset + off, piece));
      if (verify) ck.Update(piece);
      mega_internal::ScatterBytes(dst, off, piece);
    }
    if (verify) {
      MegaChecksum got = ck.Finish();
      if (got != t.checksum) return ChecksumMismatch(ctx, u, got);
    }
    return Status::OK();
  }
  MEGA_ASSIGN_OR_RETURN(Tensor tmp, Tensor::Empty(t.dtype, t.shape));
  MEGA_RETURN_IF_ERROR(DecodeTensor(ctx, t, tmp.Bytes()));
  return CopyTensor(tmp, dst);
}

Status MegaReader::ReadTensor(std::string_view name, const Tensor& dst) const {
  MEGA_ASSIGN_OR_RETURN(size_t index, IndexOf(name));
  return ReadTensor(index, dst);
}

Result<Tensor> MegaReader::LoadTensor(std::string_view name) const {
  MEGA_ASSIGN_OR_RETURN(size_t index, IndexOf(name));
  const MegaTensorInfo& t = tensors_[index];
  MEGA_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(t.dtype, t.shape));
  MEGA_RETURN_IF_ERROR(ReadTensor(index, out));
  return out;
}

Status MegaReader::ReadTensors(std::span<const MegaReadRequest> requests, ThreadPool* pool) const {
  if (pool == nullptr) {
    for (const MegaReadRequest& req : requests) {
      MEGA_RETURN_IF_ERROR(ReadTensor(req.tensor_index, req.dst));
    }
    return Status::OK();
  }
  // Work items finer than a tensor, so one big tensor still keeps every core
  // busy: blocks of plain CRC-32/unverified tensors (CRC partials combined
  // afterwards), chunks of chunked tensors; anything else is one item.
  struct Item {
    size_t request;
    int64_t chunk = -1;            // chunk index, or -1
    uint64_t offset = 0, len = 0;  // block of a plain tensor (len > 0)
  };
  std::vector<Item> items;
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> crc_parts(requests.size());
  const uint64_t block = options_.read_block_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    const MegaReadRequest& req = requests[i];
    if (req.tensor_index >= tensors_.size()) return ReadTensor(req.tensor_index, req.dst);
    const MegaTensorInfo& t = tensors_[req.tensor_index];
    const bool shape_ok =
        req.dst.defined() && req.dst.dtype() == t.dtype && req.dst.shape() == t.shape;
    const bool contiguous = shape_ok && req.dst.is_contiguous();
    const bool crc_or_none =
        !options_.verify_checksums || t.checksum_type != MegaChecksumType::kSha256;
    if (contiguous && t.is_plain() && crc_or_none && t.logical_nbytes > block) {
      for (uint64_t off = 0; off < t.logical_nbytes; off += block) {
        items.push_back({i, -1, off, std::min(block, t.logical_nbytes - off)});
      }
      crc_parts[i].resize((t.logical_nbytes + block - 1) / block);
    } else if (contiguous && t.chunked()) {
      for (size_t c = 0; c < t.chunks.size(); ++c) items.push_back({i, static_cast<int64_t>(c)});
    } else {
      items.push_back({i});
    }
  }
  ReadContext ctx{*file_, block, options_.verify_checksums};
  MEGA_RETURN_IF_ERROR(ParallelFor(pool, items.size(), [&](size_t k) -> Status {
    const Item& it = items[k];
    const MegaReadRequest& req = requests[it.request];
    const MegaTensorInfo& t = tensors_[req.tensor_index];
    if (it.len > 0) {
      auto dst = req.dst.Bytes().subspan(it.offset, it.len);
      if (!ctx.verify || t.checksum_type != MegaChecksumType::kCrc32) {
        return file_->ReadExactlyAt(t.file_offset + it.offset, dst);
      }
      // The item's CRC from the read's own pass.
      MEGA_ASSIGN_OR_RETURN(uint32_t crc,
                            file_->ReadExactlyAtWithCrc32(t.file_offset + it.offset, dst));
      crc_parts[it.request][it.offset / block] = {crc, dst.size()};
      return Status::OK();
    }
    if (it.chunk >= 0) {
      const MegaChunkInfo& c = t.chunks[it.chunk];
      return DecodeUnit(ctx, ChunkUnit(t, c),
                        req.dst.Bytes().subspan(c.logical_offset, c.logical_size));
    }
    return ReadTensor(req.tensor_index, req.dst);
  }));
  for (size_t i = 0; i < requests.size(); ++i) {
    if (crc_parts[i].empty() || !ctx.verify) continue;
    const MegaTensorInfo& t = tensors_[requests[i].tensor_index];
    if (t.checksum_type != MegaChecksumType::kCrc32) continue;
    uint32_t crc = 0;
    for (const auto& [part, len] : crc_parts[i]) crc = mega_internal::Crc32Combine(crc, part, len);
    const MegaChecksum got = mega_internal::Crc32Field(crc);
    if (got != t.checksum) return ChecksumMismatch(ctx, TensorUnit(t), got);
  }
  return Status::OK();
}

namespace {

// One thread's staging buffer for partial reads (reused across calls).
Result<std::byte*> RunStaging(uint64_t n) {
  thread_local std::shared_ptr<std::byte> buf;
  thread_local uint64_t size = 0;
  if (size < n) {
    MEGA_ASSIGN_OR_RETURN(buf, Scratch(n));
    size = n;
  }
  return buf.get();
}

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }

// Reads byte runs of plain tensor t (sorted by src, src relative to the
// tensor) into out, widened to t's checksum blocks: every block a run touches
// is read once and its CRC-32 checked against the block table right after it
// lands; then the runs' bytes are handed over. Pieces inside one run go
// straight into out (verified there); edges and gaps through staging.
Status ReadRunsVerified(const RandomAccessFile& file, const MegaTensorInfo& t,
                        std::span<const BoxRun> runs, std::span<std::byte> out,
                        uint64_t max_piece) {
  const uint64_t b = t.block_size;
  const uint64_t stored = t.logical_nbytes;
  const uint64_t piece_max = std::max<uint64_t>(AlignDown(max_piece, b), b);
  // Consecutive touched blocks form groups; each gets its slice of the table.
  struct Group {
    uint64_t b0, b1;  // block indices [b0, b1)
    size_t crc_at;    // index of block b0's CRC in `crcs`
  };
  std::vector<Group> groups;
  size_t total = 0;
  for (const BoxRun& r : runs) {
    if (r.n == 0) continue;
    const uint64_t rb0 = r.src / b, rb1 = (r.src + r.n + b - 1) / b;
    if (!groups.empty() && rb0 <= groups.back().b1) {
      if (rb1 > groups.back().b1) {
        total += rb1 - groups.back().b1;
        groups.back().b1 = rb1;
      }
    } else {
      groups.push_back({rb0, rb1, total});
      total += rb1 - rb0;
    }
  }
  if (groups.empty()) return Status::OK();
  // The table entries: neighbouring groups' entries in one read while the gap
  // between them is at most 16 entries or the read stays within 5% more than
  // the entries needed.
  std::vector<uint32_t> crcs(total);
  for (size_t g = 0; g < groups.size();) {
    size_t h = g + 1;
    uint64_t needed = groups[g].b1 - groups[g].b0;
    while (h < groups.size()) {
      const uint64_t span = groups[h].b1 - groups[g].b0;
      const uint64_t want = needed + (groups[h].b1 - groups[h].b0);
      if (groups[h].b0 - groups[h - 1].b1 > 16 && span * 100 > want * 105) break;
      needed = want;
      ++h;
    }
    const uint64_t span = groups[h - 1].b1 - groups[g].b0;
    std::vector<uint32_t> raw(span);
    MEGA_RETURN_IF_ERROR(file.ReadExactlyAt(t.block_table_offset + 4 * groups[g].b0,
                                            std::as_writable_bytes(std::span<uint32_t>(raw))));
    for (size_t k = g; k < h; ++k) {
      std::memcpy(crcs.data() + groups[k].crc_at, raw.data() + (groups[k].b0 - groups[g].b0),
                  4 * (groups[k].b1 - groups[k].b0));
    }
    g = h;
  }
  // `at` is block-aligned: every piece starts on a block boundary.
  // `bytes_crc`: Crc32(bytes) when the read computed it.
  auto check = [&](const Group& g, uint64_t at, std::span<const std::byte> bytes,
                   std::optional<uint32_t> bytes_crc = std::nullopt) -> Status {
    uint32_t got = 0;
    const size_t nblocks = static_cast<size_t>((bytes.size() + b - 1) / b);
    const std::span<const uint32_t> table(crcs.data() + g.crc_at + (at / b - g.b0), nblocks);
    if (auto j = FindBadBlock(bytes, b, table, &got, bytes_crc)) {
      const uint64_t k = at / b + *j;
      const uint64_t len = std::min<uint64_t>(b, bytes.size() - *j * b);
      char buf[64];
      std::snprintf(buf, sizeof buf, "stored 0x%08x, computed 0x%08x", table[*j], got);
      return DataLossError(file.name() + ": tensor " + Quote(t.name) + ": block " +
                           std::to_string(k) + " (bytes " + Range(k * b, k * b + len) +
                           " of the tensor, at offset " + std::to_string(t.file_offset + k * b) +
                           ") CRC32 mismatch: " + buf);
    }
    return Status::OK();
  };
  size_t ri = 0;
  for (const Group& g : groups) {
    uint64_t p = g.b0 * b;
    const uint64_t end = std::min(g.b1 * b, stored);
    while (p < end) {
      while (ri < runs.size() && runs[ri].src + runs[ri].n <= p) ++ri;
      // End of the part of run r that is whole blocks (the tensor's short last
      // block counts as whole).
      auto whole_end = [&](const BoxRun& r) {
        return r.src + r.n == stored ? stored : AlignDown(r.src + r.n, b);
      };
      // Whole blocks of one run: read straight into out in one call, the CRC
      // from the read's own pass (ReadExactlyAtWithCrc32).
      if (ri < runs.size() && runs[ri].src <= p && whole_end(runs[ri]) > p) {
        const BoxRun& r = runs[ri];
        const uint64_t q = std::min(end, whole_end(r));
        auto dst = out.subspan(r.dst + (p - r.src), q - p);
        MEGA_ASSIGN_OR_RETURN(uint32_t crc, file.ReadExactlyAtWithCrc32(t.file_offset + p, dst));
        MEGA_RETURN_IF_ERROR(check(g, p, dst, crc));
        p = q;
        continue;
      }
      uint64_t q = std::min(p + piece_max, end);
      for (size_t k = ri; k < runs.size() && runs[k].src < q; ++k) {
        const uint64_t d = (runs[k].src + b - 1) / b * b;  // first whole block of run k
        if (d > p && d < q && whole_end(runs[k]) > d) {
          q = d;
          break;
        }
      }
      MEGA_ASSIGN_OR_RETURN(std::byte * staging, RunStaging(piece_max));
      std::span<std::byte> bytes(staging, q - p);
      MEGA_RETURN_IF_ERROR(file.ReadExactlyAt(t.file_offset + p, bytes));
      MEGA_RETURN_IF_ERROR(check(g, p, bytes));
      for (size_t k = ri; k < runs.size() && runs[k].src < q; ++k) {
        const uint64_t a = std::max(runs[k].src, p), e = std::min(runs[k].src + runs[k].n, q);
        if (a < e)
          std::memcpy(out.data() + runs[k].dst + (a - runs[k].src), staging + (a - p), e - a);
      }
      p = q;
    }
  }
  return Status::OK();
}

}  // namespace

Status MegaReader::VerifyOnce(size_t index) const {
  if (verified_[index].load(std::memory_order_acquire)) return Status::OK();
  MEGA_RETURN_IF_ERROR(VerifyTensor(index));
  verified_[index].store(1, std::memory_order_release);
  return Status::OK();
}

Status MegaReader::ReadPlainRuns(size_t index, std::span<const BoxRun> runs,
                                 std::span<std::byte> out) const {
  const MegaTensorInfo& t = tensors_[index];
  if (options_.verify_checksums && t.checksum_type != MegaChecksumType::kNone) {
    // Pieces checked right after they land, as whole-tensor reads do.
    const ReadContext ctx{*file_, options_.read_block_size, true};
    if (t.block_size > 0) return ReadRunsVerified(*file_, t, runs, out, PieceSize(ctx, true));
    MEGA_RETURN_IF_ERROR(VerifyOnce(index));
  }
  return ReadBoxRuns(*file_, t.file_offset, runs, out);
}

Status MegaReader::ReadRange(size_t index, uint64_t logical_offset,
                             std::span<std::byte> dst) const {
  if (index >= tensors_.size()) {
    return NotFoundError(file_name() + ": tensor index " + std::to_string(index) + " out of range");
  }
  const MegaTensorInfo& t = tensors_[index];
  uint64_t end;
  if (AddOverflows(logical_offset, dst.size(), &end) || end > t.logical_nbytes) {
    return OutOfRangeError(file_name() + ": tensor " + Quote(t.name) + ": range [" +
                           std::to_string(logical_offset) + ", +" + std::to_string(dst.size()) +
                           ") exceeds its " + std::to_string(t.logical_nbytes) + " bytes");
  }
  if (dst.empty()) return Status::OK();
  ReadContext ctx{*file_, options_.read_block_size, options_.verify_checksums};
  if (logical_offset == 0 && dst.size() == t.logical_nbytes) return DecodeTensor(ctx, t, dst);
  if (t.is_plain()) {
    const BoxRun run{logical_offset, 0, dst.size()};
    return ReadPlainRuns(index, std::span<const BoxRun>(&run, 1), dst);
  }
  if (!t.chunked()) {
    MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(t.logical_nbytes));
    std::span<std::byte> all(buf.get(), t.logical_nbytes);
    MEGA_RETURN_IF_ERROR(DecodeUnit(ctx, TensorUnit(t), all));
    std::memcpy(dst.data(), all.data() + logical_offset, dst.size());
    return Status::OK();
  }
  for (const MegaChunkInfo& c : t.chunks) {
    const uint64_t cb = c.logical_offset, ce = c.logical_offset + c.logical_size;
    const uint64_t b = std::max(cb, logical_offset), e = std::min(ce, end);
    if (b >= e) continue;
    const Unit u = ChunkUnit(t, c);
    std::span<std::byte> out = dst.subspan(b - logical_offset, e - b);
    if (b == cb && e == ce) {
      MEGA_RETURN_IF_ERROR(DecodeUnit(ctx, u, out));
    } else if (u.plain() && !Verifies(ctx, u)) {
      MEGA_RETURN_IF_ERROR(file_->ReadExactlyAt(c.file_offset + (b - cb), out));
    } else {
      MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(c.logical_size));
      std::span<std::byte> whole(buf.get(), c.logical_size);
      MEGA_RETURN_IF_ERROR(DecodeUnit(ctx, u, whole));
      std::memcpy(out.data(), whole.data() + (b - cb), out.size());
    }
  }
  return Status::OK();
}

Status MegaReader::ReadRange(std::string_view name, uint64_t logical_offset,
                             std::span<std::byte> dst) const {
  MEGA_ASSIGN_OR_RETURN(size_t index, IndexOf(name));
  return ReadRange(index, logical_offset, dst);
}

Status MegaReader::ReadSlice(std::string_view name, std::span<const int64_t> start,
                             const Tensor& dst) const {
  MEGA_ASSIGN_OR_RETURN(size_t index, IndexOf(name));
  return ReadSlice(index, start, dst);
}

Status MegaReader::ReadSlice(size_t index, std::span<const int64_t> start,
                             const Tensor& dst) const {
  if (index >= tensors_.size()) {
    return NotFoundError(file_name() + ": tensor index " + std::to_string(index) + " out of range");
  }
  const MegaTensorInfo& t = tensors_[index];
  const std::string who = file_name() + ": tensor " + Quote(t.name);
  const size_t nd = t.shape.size();
  if (!dst.defined() || dst.dtype() != t.dtype || dst.ndim() != static_cast<int>(nd) ||
      start.size() != nd) {
    return InvalidArgumentError(who + ": slice destination/start must have dtype " +
                                std::string(DTypeName(t.dtype)) + " and rank " +
                                std::to_string(nd));
  }
  Status box = CheckBox(t.shape, {}, start, dst.shape());
  if (!box.ok()) return Status(box.code(), who + ": slice " + box.message());
  if (dst.numel() == 0) return Status::OK();
  if (!dst.is_contiguous()) {
    MEGA_ASSIGN_OR_RETURN(Tensor tmp, Tensor::Empty(dst.dtype(), dst.shape()));
    MEGA_RETURN_IF_ERROR(ReadSlice(index, start, tmp));
    return CopyTensor(tmp, dst);
  }
  // The box as byte runs of the stored (row-major) tensor, merged where adjacent.
  std::vector<BoxRun> runs;
  Status planned = ForEachBoxByteRun(t.dtype, t.shape, start, dst.shape(), [&](const BoxRun& r) {
    runs.push_back(r);
    return Status::OK();
  });
  if (!planned.ok()) return Status(planned.code(), who + ": " + planned.message());
  std::span<std::byte> out = dst.Bytes();
  if (t.is_plain()) return ReadPlainRuns(index, runs, out);
  // Decoded units (verified as they are decoded); each run's part copied out.
  ReadContext ctx{*file_, options_.read_block_size, options_.verify_checksums};
  auto copy_runs = [&](uint64_t piece_begin, std::span<const std::byte> piece, size_t* first) {
    const uint64_t piece_end = piece_begin + piece.size();
    while (*first < runs.size() && runs[*first].src + runs[*first].n <= piece_begin) ++*first;
    for (size_t q = *first; q < runs.size() && runs[q].src < piece_end; ++q) {
      const uint64_t b = std::max(runs[q].src, piece_begin);
      const uint64_t e = std::min(runs[q].src + runs[q].n, piece_end);
      std::memcpy(out.data() + runs[q].dst + (b - runs[q].src), piece.data() + (b - piece_begin),
                  e - b);
    }
  };
  size_t first = 0;
  if (!t.chunked()) {
    MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(t.logical_nbytes));
    std::span<std::byte> all(buf.get(), t.logical_nbytes);
    MEGA_RETURN_IF_ERROR(DecodeUnit(ctx, TensorUnit(t), all));
    copy_runs(0, all, &first);
    return Status::OK();
  }
  const uint64_t lo = runs.front().src, hi = runs.back().src + runs.back().n;
  for (const MegaChunkInfo& c : t.chunks) {
    const uint64_t cb = c.logical_offset, ce = cb + c.logical_size;
    if (ce <= lo || cb >= hi) continue;
    // Skip chunks no run touches.
    while (first < runs.size() && runs[first].src + runs[first].n <= cb) ++first;
    if (first >= runs.size() || runs[first].src >= ce) continue;
    MEGA_ASSIGN_OR_RETURN(auto buf, Scratch(c.logical_size));
    std::span<std::byte> whole(buf.get(), c.logical_size);
    MEGA_RETURN_IF_ERROR(DecodeUnit(ctx, ChunkUnit(t, c), whole));
    copy_runs(cb, whole, &first);
  }
  return Status::OK();
}

Result<Tensor> MegaReader::MappedTensor(std::string_view name) const {
  MEGA_ASSIGN_OR_RETURN(size_t index, IndexOf(name));
  const MegaTensorInfo& t = tensors_[index];
  const std::byte* base = file_->mapped_data();
  if (base == nullptr && file_->size() > 0) {
    return FailedPreconditionError(file_name() + ": not memory-mapped (open with use_mmap)");
  }
  if (!t.is_plain()) {
    return FailedPreconditionError(file_name() + ": tensor " + Quote(t.name) +
                                   " is compressed, shuffled or chunked; it cannot be mapped");
  }
  static std::byte empty_anchor[1];
  std::byte* p = base ? const_cast<std::byte*>(base) + t.file_offset : empty_anchor;
  if (options_.verify_checksums && t.checksum_type != MegaChecksumType::kNone) {
    MegaChecksum got =
        mega_internal::ChecksumOf(t.checksum_type, std::span<const std::byte>(p, t.logical_nbytes));
    if (got != t.checksum) {
      ReadContext ctx{*file_, options_.read_block_size, true};
      return ChecksumMismatch(ctx, TensorUnit(t), got);
    }
  }
  return Tensor::FromBlob(p, t.dtype, t.shape, std::shared_ptr<void>(file_));
}

Status MegaReader::VerifyTensor(size_t index) const {
  if (index >= tensors_.size()) {
    return NotFoundError(file_name() + ": tensor index " + std::to_string(index) + " out of range");
  }
  const MegaTensorInfo& t = tensors_[index];
  ReadContext ctx{*file_, options_.read_block_size, true};
  if (t.block_size > 0 && t.logical_nbytes > 0) return VerifyWithBlocks(ctx, t);
  if (!t.chunked()) return VerifyUnit(ctx, TensorUnit(t));
  for (const MegaChunkInfo& c : t.chunks) MEGA_RETURN_IF_ERROR(VerifyUnit(ctx, ChunkUnit(t, c)));
  return Status::OK();
}

Status MegaReader::VerifyTensor(std::string_view name) const {
  MEGA_ASSIGN_OR_RETURN(size_t index, IndexOf(name));
  return VerifyTensor(index);
}

Status MegaReader::VerifyAll(ThreadPool* pool) const {
  return ParallelFor(pool, tensors_.size(), [&](size_t i) { return VerifyTensor(i); });
}

}  // namespace megackpt::format
