// Streaming MEGA shard writer, shard entries codec and naming (see the header).
//
// Why not MegaWriter: it needs every tensor of a file in memory at Finish. The
// storage writer receives a shard's items in waves (async_save stages in pieces)
// and consolidation assembles one tensor at a time; both need to write a tensor
// and forget it. The layout only depends on names, dtypes and shapes, so it is
// fixed first; checksums are filled into the header at the end. The header is
// encoded by the format layer's own encoder (format/mega_internal.h) and the
// profile keys follow MegaWriter's TensorPlay profile; a unit test checks the
// bytes are identical to MegaWriter's.
#include "dcp/mega_storage_shard.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "format/mega_internal.h"
#include "format/quote.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/core/checksum.h"

namespace megackpt::dcp::mega_storage {
namespace {

using json = nlohmann::json;

constexpr uint64_t kWritePiece = 1ull << 20;  // CRC + pwrite granularity (bytes stay in cache)

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

// Writes `nbytes` bytes at file offset `base` in pieces of at most `piece_max`
// bytes; `piece(off, n)` yields the n bytes at tensor offset off, `write_at`
// stores them. Returns the checksum of all bytes (`type`).
template <typename PieceFn, typename WriteFn>
Result<format::MegaChecksum> WriteChecksummed(format::MegaChecksumType type, uint64_t base, uint64_t nbytes,
                                      uint64_t piece_max, PieceFn piece, WriteFn write_at) {
  format::mega_internal::Checker checker(type);
  for (uint64_t off = 0; off < nbytes; off += piece_max) {
    std::span<const std::byte> bytes = piece(off, std::min(piece_max, nbytes - off));
    checker.Update(bytes);
    MEGA_RETURN_IF_ERROR(write_at(base + off, bytes));
  }
  return checker.Finish();
}

}  // namespace

// ---- ShardFileWriter --------------------------------------------------------------

Result<std::unique_ptr<ShardFileWriter>> ShardFileWriter::Create(
    std::unique_ptr<WritableFile> file, std::vector<ShardTensorSpec> specs,
    format::MegaMetadata user_metadata, const ShardWriterOptions& options) {
  if (!file) return InvalidArgumentError("ShardFileWriter: no file");
  const std::string fname = file->name();
  if (!file->supports_write_at()) {
    return InvalidArgumentError(fname + ": shard writer needs a file with positioned writes");
  }
  if (options.alignment == 0 || options.tensor_alignment == 0) {
    return InvalidArgumentError(fname + ": alignment must be > 0");
  }
  std::unique_ptr<ShardFileWriter> w(new ShardFileWriter());
  w->file_ = std::move(file);
  w->options_ = options;
  w->user_metadata_ = std::move(user_metadata);
  std::set<std::string_view> names;
  uint64_t cursor = 0;
  for (const ShardTensorSpec& s : specs) {
    if (s.name.empty() || !names.insert(s.name).second) {
      return InvalidArgumentError(fname + ": empty or duplicate tensor name " + Quote(s.name));
    }
    if (s.dtype == DType::kF4) {
      // F4 is fine as long as the writer gets contiguous bytes.
    }
    MEGA_ASSIGN_OR_RETURN(uint64_t nbytes, LogicalNbytes(s.dtype, s.shape));
    if (format::mega_internal::AlignUp(cursor, options.tensor_alignment, &cursor)) {
      return InvalidArgumentError(fname + ": payload size overflows");
    }
    w->offsets_.push_back(cursor);
    w->nbytes_.push_back(nbytes);
    if (format::mega_internal::AddOverflows(cursor, nbytes, &cursor)) {
      return InvalidArgumentError(fname + ": payload size overflows");
    }
  }
  // `names` views into `specs`; done with it before moving specs.
  names.clear();
  w->specs_ = std::move(specs);
  w->checksums_.assign(w->specs_.size(), format::MegaChecksum{});
  w->written_.assign(w->specs_.size(), 0);
  // Header size with placeholder checksums (fixed width whatever their value).
  MEGA_ASSIGN_OR_RETURN(std::string header, w->EncodeFinalHeader());
  w->header_length_ = header.size();
  w->file_end_ = w->header_length_ + cursor;
  if (w->file_end_ >= format::kMegaFooterTrailerSize) w->probe_at_ = w->file_end_ - format::kMegaFooterTrailerSize;
  return w;
}

ShardFileWriter::~ShardFileWriter() {
  if (!closed_ && file_) file_->Close().IgnoreError();
}

Result<std::string> ShardFileWriter::EncodeFinalHeader() {
  std::vector<format::MegaTensorInfo> infos(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    format::MegaTensorInfo& t = infos[i];
    t.tensor_id = static_cast<uint32_t>(i);
    t.name = specs_[i].name;
    t.dtype = specs_[i].dtype;
    t.shape = specs_[i].shape;
    t.logical_nbytes = nbytes_[i];
    t.stored_nbytes = nbytes_[i];
    t.payload_offset = offsets_[i];
    t.checksum_type = options_.checksum;
    t.checksum = checksums_[i];
    t.dir_flags = format::mega_internal::DirFlagsFor(t);
  }
  // The TensorPlay profile, exactly as MegaWriter writes it.
  for (const format::MegaTensorInfo& t : infos) {
    if (!format::mega_internal::IsValidUtf8(t.name)) {
      return InvalidArgumentError(file_->name() + ": tensor name is not valid UTF-8");
    }
  }
  format::MegaMetadata md;
  MEGA_RETURN_IF_ERROR(format::mega_internal::AddTensorplayProfile(infos, options_.alignment, "dict",
                                                           options_.checksum, &md));
  for (const format::MetaEntry& e : user_metadata_.entries()) {
    MEGA_RETURN_IF_ERROR(md.Add(e.key, e.value).WithContext(file_->name()));
  }
  return format::mega_internal::EncodeHeader(md, infos, {}, {}, options_.alignment);
}

void ShardFileWriter::Probe(uint64_t file_offset, std::span<const std::byte> bytes) {
  if (probe_at_ == UINT64_MAX) return;
  const uint64_t b = std::max(file_offset, probe_at_);
  const uint64_t e = std::min<uint64_t>(file_offset + bytes.size(), probe_at_ + 4);
  if (b >= e) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t x = b; x < e; ++x) probe_[x - probe_at_] = bytes[x - file_offset];
}

Status ShardFileWriter::WriteAt(uint64_t file_offset, std::span<const std::byte> bytes) {
  Probe(file_offset, bytes);
  MEGA_RETURN_IF_ERROR(file_->WriteAt(file_offset, bytes));
  const uint64_t end = file_offset + bytes.size();
  uint64_t cur = end_written_.load();
  while (end > cur && !end_written_.compare_exchange_weak(cur, end)) {
  }
  return Status::OK();
}

Status ShardFileWriter::WriteBytes(size_t i, std::span<const std::byte> bytes) {
  if (i >= specs_.size()) return InvalidArgumentError(file_name() + ": tensor index out of range");
  if (bytes.size() != nbytes_[i]) {
    return InvalidArgumentError(file_name() + ": tensor " + Quote(specs_[i].name) + " needs " +
                                std::to_string(nbytes_[i]) + " bytes, got " +
                                std::to_string(bytes.size()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (written_[i]) {
      return FailedPreconditionError(file_name() + ": tensor " + Quote(specs_[i].name) +
                                     " written twice");
    }
  }
  MEGA_ASSIGN_OR_RETURN(
      format::MegaChecksum sum,
      WriteChecksummed(
          options_.checksum, tensor_file_offset(i), bytes.size(), kWritePiece,
          [&](uint64_t off, uint64_t n) { return bytes.subspan(off, n); },
          [&](uint64_t at, std::span<const std::byte> piece) { return WriteAt(at, piece); }));
  std::lock_guard<std::mutex> lock(mu_);
  checksums_[i] = sum;
  written_[i] = 1;
  return Status::OK();
}

Status ShardFileWriter::WriteTensor(size_t i, const Tensor& t) {
  if (i >= specs_.size()) return InvalidArgumentError(file_name() + ": tensor index out of range");
  const ShardTensorSpec& s = specs_[i];
  if (!t.defined() || t.dtype() != s.dtype || t.shape() != s.shape) {
    return InvalidArgumentError(file_name() + ": tensor " + Quote(s.name) + " planned as " +
                                std::string(DTypeName(s.dtype)) + ShapeToString(s.shape) +
                                ", got " +
                                (t.defined() ? std::string(DTypeName(t.dtype())) + ShapeToString(t.shape())
                                             : std::string("undefined")));
  }
  if (t.is_contiguous()) {
    return WriteBytes(i, std::span<const std::byte>(static_cast<const std::byte*>(t.data()),
                                                    t.nbytes()));
  }
  if (t.dtype() == DType::kF4) {
    return InvalidArgumentError(file_name() + ": F4 tensor " + Quote(s.name) + " must be contiguous");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (written_[i]) {
      return FailedPreconditionError(file_name() + ": tensor " + Quote(s.name) + " written twice");
    }
  }
  std::byte* scratch = ThreadScratch();
  if (!scratch) return ResourceExhaustedError(file_name() + ": no memory for a staging buffer");
  const uint64_t es = DTypeSize(t.dtype());
  const uint64_t piece_max = kWritePiece / es * es;
  MEGA_ASSIGN_OR_RETURN(
      format::MegaChecksum sum,
      WriteChecksummed(
          options_.checksum, tensor_file_offset(i), nbytes_[i], piece_max,
          [&](uint64_t off, uint64_t n) {
            std::span<std::byte> piece(scratch, n);
            format::mega_internal::GatherBytes(t, off, piece);
            return std::span<const std::byte>(piece);
          },
          [&](uint64_t at, std::span<const std::byte> piece) { return WriteAt(at, piece); }));
  std::lock_guard<std::mutex> lock(mu_);
  checksums_[i] = sum;
  written_[i] = 1;
  return Status::OK();
}

std::string ShardFileWriter::checksum_string(size_t i) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.checksum == format::MegaChecksumType::kCrc32) {
    uint32_t v;
    std::memcpy(&v, checksums_[i].data(), 4);
    return CrcString(v);
  }
  if (options_.checksum == format::MegaChecksumType::kSha256) return "sha256:" + ToHex(checksums_[i]);
  return "";
}

bool ShardFileWriter::all_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(written_.begin(), written_.end(), [](uint8_t w) { return w != 0; });
}

Status ShardFileWriter::Finish(bool sync) {
  if (closed_) return FailedPreconditionError(file_name() + ": shard already finished");
  if (!all_written()) {
    return FailedPreconditionError(file_name() + ": not every tensor was written");
  }
  MEGA_ASSIGN_OR_RETURN(std::string header, EncodeFinalHeader());
  if (header.size() != header_length_) {
    return InternalError(file_name() + ": header size changed from " +
                         std::to_string(header_length_) + " to " + std::to_string(header.size()));
  }
  MEGA_RETURN_IF_ERROR(WriteAt(0, AsBytes(header)));
  // Never leave a tail that reads as a footer trailer (a reader would parse it):
  // pad with zeros, which are unused payload.
  if (probe_at_ != UINT64_MAX && format::mega_internal::Load32(probe_.data()) == format::kMegaFooterMagic) {
    std::string zeros(format::kMegaFooterTrailerSize, '\0');
    MEGA_RETURN_IF_ERROR(file_->WriteAt(file_end_, AsBytes(zeros)));
    file_end_ += zeros.size();
  } else if (end_written_.load() < file_end_) {
    // The file ends in an alignment gap before a trailing empty tensor: write
    // its last (zero) byte so the size is exact.
    std::byte zero{0};
    MEGA_RETURN_IF_ERROR(file_->WriteAt(file_end_ - 1, std::span<const std::byte>(&zero, 1)));
  }
  if (sync) MEGA_RETURN_IF_ERROR(file_->Sync());
  closed_ = true;
  return file_->Close();
}

void ShardFileWriter::Abandon() {
  if (closed_) return;
  closed_ = true;
  file_->Close().IgnoreError();
}

// ---- entries --------------------------------------------------------------------

std::string EncodeShardEntries(const std::map<std::string, ShardEntry>& entries) {
  json j = json::object();
  for (const auto& [fqn, e] : entries) {
    json v;
    v["kind"] = e.is_bytes ? "bytes" : "tensor";
    v["dtype"] = std::string(DTypeName(e.dtype));
    v["global_shape"] = e.global_shape;
    v["offsets"] = e.offsets;
    j[fqn] = std::move(v);
  }
  return j.dump();
}

namespace {

Result<Shape> ShapeFrom(const json& v, std::string_view file, const std::string& what) {
  if (!v.is_array()) return DataLossError(std::string(file) + ": " + what + " is not an array");
  Shape out;
  for (const json& d : v) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) {
      return DataLossError(std::string(file) + ": " + what + " has a non-integer or negative value");
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

}  // namespace

Result<std::map<std::string, ShardEntry>> DecodeShardEntries(std::string_view file,
                                                             std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  const std::string f(file);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(f + ": " + std::string(kDcpEntriesKey) + " is not a JSON object");
  }
  std::map<std::string, ShardEntry> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string what = std::string(kDcpEntriesKey) + "[\"" + it.key() + "\"]";
    const json& v = it.value();
    if (!v.is_object() || !v.contains("kind") || !v["kind"].is_string()) {
      return DataLossError(f + ": " + what + " has no kind");
    }
    ShardEntry e;
    const std::string kind = v["kind"].get<std::string>();
    if (kind == "bytes") {
      e.is_bytes = true;
      e.dtype = DType::kU8;
    } else if (kind == "tensor") {
      if (!v.contains("dtype") || !v["dtype"].is_string()) {
        return DataLossError(f + ": " + what + " has no dtype");
      }
      auto dt = DTypeFromName(v["dtype"].get<std::string>());
      if (!dt.ok()) return DataLossError(f + ": " + what + ": " + dt.status().message());
      e.dtype = *dt;
      if (!v.contains("global_shape") || !v.contains("offsets")) {
        return DataLossError(f + ": " + what + " needs global_shape and offsets");
      }
      MEGA_ASSIGN_OR_RETURN(e.global_shape, ShapeFrom(v["global_shape"], file, what + ".global_shape"));
      MEGA_ASSIGN_OR_RETURN(e.offsets, ShapeFrom(v["offsets"], file, what + ".offsets"));
      if (e.offsets.size() != e.global_shape.size()) {
        return DataLossError(f + ": " + what + ": offsets and global_shape differ in rank");
      }
    } else {
      return DataLossError(f + ": " + what + " has unknown kind \"" + kind + "\"");
    }
    out.emplace(it.key(), std::move(e));
  }
  return out;
}

std::string EncodeObjectPaths(const std::map<std::string, ObjectPath>& paths) {
  json j = json::object();
  for (const auto& [fqn, path] : paths) {
    json arr = json::array();
    for (const PathKey& k : path) {
      if (const auto* s = std::get_if<std::string>(&k.key)) {
        arr.push_back(*s);
      } else {
        arr.push_back(std::get<int64_t>(k.key));
      }
    }
    j[fqn] = std::move(arr);
  }
  return j.dump();
}

Result<std::map<std::string, ObjectPath>> DecodeObjectPaths(std::string_view file,
                                                            std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(std::string(file) + ": " + std::string(kDcpObjectPathsKey) +
                         " is not a JSON object");
  }
  std::map<std::string, ObjectPath> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it.value().is_array()) {
      return DataLossError(std::string(file) + ": object path of " + it.key() + " is not an array");
    }
    ObjectPath p;
    for (const json& k : it.value()) {
      if (k.is_string()) {
        p.push_back(PathKey{k.get<std::string>()});
      } else if (k.is_number_integer()) {
        p.push_back(PathKey{k.get<int64_t>()});
      } else {
        return DataLossError(std::string(file) + ": object path of " + it.key() +
                             " has a bad element");
      }
    }
    out.emplace(it.key(), std::move(p));
  }
  return out;
}

// ---- naming ---------------------------------------------------------------------

std::string ShardFileName(std::string_view ext, size_t number, size_t count,
                          std::string_view save_id, int rank_tag) {
  std::string name = "model";
  if (rank_tag >= 0) name += "-rank" + std::to_string(rank_tag);
  if (!save_id.empty()) {
    name += "-";
    name += save_id;
  }
  if (count > 1 || rank_tag >= 0) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", number, count);
    name += buf;
  }
  name += ext;
  return name;
}

namespace {

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}
bool AllHex(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

}  // namespace

bool IsShardFileName(std::string_view name, int* rank_tag) {
  if (rank_tag) *rank_tag = -1;
  std::string_view rest;
  if (name.ends_with(".mega")) {
    rest = name.substr(0, name.size() - 5);
  } else if (name.ends_with(".safetensors")) {
    rest = name.substr(0, name.size() - 12);
  } else {
    return false;
  }
  if (!rest.starts_with("model")) return false;
  rest.remove_prefix(5);
  if (rest.starts_with("-rank")) {
    rest.remove_prefix(5);
    size_t n = 0;
    while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
    if (n == 0 || n > 7) return false;
    if (rank_tag) *rank_tag = std::stoi(std::string(rest.substr(0, n)));
    rest.remove_prefix(n);
  }
  // -<12 hex> id?
  if (rest.size() >= 13 && rest[0] == '-' && AllHex(rest.substr(1, 12)) &&
      (rest.size() == 13 || rest[13] == '-')) {
    rest.remove_prefix(13);
  }
  if (rest.empty()) return true;
  // -NNNNN-of-MMMMM
  if (rest.size() != 15 || rest[0] != '-' || rest.substr(6, 4) != "-of-") return false;
  return AllDigits(rest.substr(1, 5)) && AllDigits(rest.substr(10, 5));
}

std::string NewSaveId() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  char buf[24];
  std::snprintf(buf, sizeof buf, "%012llx",
                static_cast<unsigned long long>(v & 0xFFFFFFFFFFFFull));
  return buf;
}

std::string CrcString(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "crc32:%08x", crc);
  return buf;
}

std::string MegaChecksumString(const format::MegaTensorInfo& t) {
  std::string out;
  switch (t.checksum_type) {
    case format::MegaChecksumType::kCrc32: return CrcString(t.crc32());
    case format::MegaChecksumType::kSha256:
      out = "sha256:";
      out += t.checksum_hex();
      return out;
    case format::MegaChecksumType::kNone: return out;
  }
  return out;
}

std::string Quote(std::string_view s) { return format_internal::Quote(s); }

}  // namespace megackpt::dcp::mega_storage
