#include "megackpt/cas/shard.h"

#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "cas/bytes.h"
#include "megackpt/cas/store.h"

namespace megackpt::cas {

namespace {

constexpr uint8_t kShardTag[32] = {'H', 'F', 'R', 'e', 'p', 'o', 'M', 'e', 't', 'a', 'D',
                                   'a', 't', 'a', 0,   85,  105, 103, 69,  106, 123, 129,
                                   87,  131, 165, 189, 217, 92,  205, 209, 74,  169};
constexpr uint32_t kKnownFileFlags = kShardFileFlagWithVerification | kShardFileFlagWithMetadataExt;

void AppendHash(std::string* out, const MerkleHash& h) {
  out->append(reinterpret_cast<const char*>(h.bytes.data()), 32);
}
void AppendZeros(std::string* out, size_t n) { out->append(n, '\0'); }

// FileMetadataExt holds the SHA-256 as Xet holds every hash: a MerkleHash
// parsed from the SHA-256's hex digits with Xet's hash-hex convention (four
// little-endian u64 groups), so each 8-byte group of the digest is stored
// byte-reversed (hf_xet's shards; `MerkleHash::ToHex()` of the stored bytes is
// the SHA-256 hex). The same swap converts in both directions.
std::array<uint8_t, 32> SwapSha256Groups(const uint8_t* in) {
  std::array<uint8_t, 32> out;
  for (size_t g = 0; g < 4; ++g) {
    for (size_t i = 0; i < 8; ++i) out[8 * g + i] = in[8 * g + 7 - i];
  }
  return out;
}
void AppendBookend(std::string* out) {
  out->append(32, '\xff');
  AppendZeros(out, 16);
}

bool IsBookendHash(const uint8_t* p) {
  for (int i = 0; i < 32; ++i) {
    if (p[i] != 0xFF) return false;
  }
  return true;
}

// A bounds-checked cursor over the shard bytes.
class Reader {
 public:
  Reader(std::span<const std::byte> data, size_t end) : p_(internal::U8(data.data())), end_(end) {}
  size_t offset() const { return off_; }
  size_t remaining() const { return end_ - off_; }
  Status Need(size_t n, const char* what) const {
    if (remaining() < n) {
      return DataLossError("shard offset " + std::to_string(off_) + ": truncated " + what +
                           " (need " + std::to_string(n) + " bytes, " +
                           std::to_string(remaining()) + " left)");
    }
    return Status::OK();
  }
  const uint8_t* Take(size_t n) {
    const uint8_t* q = p_ + off_;
    off_ += n;
    return q;
  }

 private:
  const uint8_t* p_;
  size_t off_ = 0;
  size_t end_;
};

Status Bad(size_t offset, const std::string& what) {
  return DataLossError("shard offset " + std::to_string(offset) + ": " + what);
}

MerkleHash HashAt(const uint8_t* p) {
  MerkleHash h;
  std::memcpy(h.bytes.data(), p, 32);
  return h;
}

// Calls `fn(at, e)` for each entry `e` (at offset `at`) of a section ("file
// info", "CAS info") up to its bookend, whose bytes 32..47 must be zero. A
// record past the `max` the limits allow fails, naming them `records`
// ("files", "xorbs"); so does the first error `fn` returns.
template <typename Fn>
Status ForEachSectionEntry(Reader& r, const char* section, uint64_t max, const char* records,
                           Fn&& fn) {
  for (uint64_t count = 0;; ++count) {
    if (r.remaining() < kShardEntrySize) {  // the message is built only then
      return r.Need(kShardEntrySize, (std::string(section) + " entry (no bookend?)").c_str());
    }
    const size_t at = r.offset();
    const uint8_t* e = r.Take(kShardEntrySize);
    if (IsBookendHash(e)) {
      for (int i = 32; i < 48; ++i) {
        if (e[i] != 0) return Bad(at, std::string("malformed ") + section + " bookend");
      }
      return Status::OK();
    }
    if (count >= max) return Bad(at, "more than " + std::to_string(max) + " " + records);
    MEGA_RETURN_IF_ERROR(fn(at, e));
  }
}

}  // namespace

std::string SerializeShard(const Shard& shard, const ShardWriteOptions& options) {
  std::string out;
  size_t entries = 2;
  for (const auto& f : shard.files) entries += 2 + 2 * f.reconstruction.terms.size();
  for (const auto& x : shard.xorbs) entries += 1 + x.chunks.size();
  out.reserve(kShardHeaderSize + entries * kShardEntrySize + kShardFooterSize);

  out.append(reinterpret_cast<const char*>(kShardTag), 32);
  AppendLE64(&out, kShardHeaderVersion);
  AppendLE64(&out, options.with_footer ? kShardFooterSize : 0);

  uint64_t materialized = 0;
  for (const ShardFileInfo& f : shard.files) {
    const FileReconstruction& r = f.reconstruction;
    uint32_t flags = (options.with_verification ? kShardFileFlagWithVerification : 0) |
                     (f.sha256 ? kShardFileFlagWithMetadataExt : 0);
    AppendHash(&out, r.file_hash);
    AppendLE32(&out, flags);
    AppendLE32(&out, static_cast<uint32_t>(r.terms.size()));
    AppendZeros(&out, 8);
    for (const ReconstructionTerm& t : r.terms) {
      AppendHash(&out, t.xorb_hash);
      AppendLE32(&out, 0);  // cas flags
      AppendLE32(&out, static_cast<uint32_t>(t.unpacked_bytes));
      AppendLE32(&out, t.chunk_start);
      AppendLE32(&out, t.chunk_end);
    }
    if (options.with_verification) {
      for (const ReconstructionTerm& t : r.terms) {
        AppendHash(&out, t.verification_hash);
        AppendZeros(&out, 16);
      }
    }
    if (f.sha256) {
      std::array<uint8_t, 32> stored = SwapSha256Groups(f.sha256->data());
      out.append(reinterpret_cast<const char*>(stored.data()), 32);
      AppendZeros(&out, 16);
    }
    materialized += r.size;
  }
  AppendBookend(&out);

  const uint64_t cas_info_offset = out.size();
  uint64_t stored_on_disk = 0, stored = 0;
  for (const ShardXorbInfo& x : shard.xorbs) {
    AppendHash(&out, x.xorb_hash);
    AppendLE32(&out, 0);  // cas flags
    AppendLE32(&out, static_cast<uint32_t>(x.chunks.size()));
    AppendLE32(&out, x.unpacked_bytes);
    AppendLE32(&out, x.bytes_on_disk);
    for (const ShardXorbChunk& c : x.chunks) {
      AppendHash(&out, c.hash);
      AppendLE32(&out, c.unpacked_offset);
      AppendLE32(&out, c.unpacked_bytes);
      AppendZeros(&out, 8);
    }
    stored_on_disk += x.bytes_on_disk;
    stored += x.unpacked_bytes;
  }
  AppendBookend(&out);

  if (options.with_footer) {
    // No lookup tables are written: their offsets point at the footer with 0
    // entries.
    const uint64_t footer_offset = out.size();
    AppendLE64(&out, kShardFooterVersion);
    AppendLE64(&out, kShardHeaderSize);  // file_info_offset
    AppendLE64(&out, cas_info_offset);
    for (int i = 0; i < 3; ++i) {  // file, cas and chunk lookup tables
      AppendLE64(&out, footer_offset);
      AppendLE64(&out, 0);
    }
    AppendHash(&out, shard.chunk_hash_hmac_key);
    AppendLE64(&out, shard.creation_timestamp);
    AppendLE64(&out, shard.key_expiry);
    AppendZeros(&out, 48);
    AppendLE64(&out, stored_on_disk);
    AppendLE64(&out, materialized);
    AppendLE64(&out, stored);
    AppendLE64(&out, footer_offset);
  }
  return out;
}

Result<Shard> ParseShard(std::span<const std::byte> data, const ShardParseLimits& limits) {
  const uint8_t* base = internal::U8(data.data());
  if (data.size() < kShardHeaderSize) {
    return Bad(0, "truncated header (" + std::to_string(data.size()) + " bytes, need 48)");
  }
  if (std::memcmp(base, kShardTag, 32) != 0) return Bad(0, "not an MDB shard (bad magic tag)");
  uint64_t version = LoadLE64(base + 32);
  if (version != kShardHeaderVersion) {
    return Bad(32, "unsupported header version " + std::to_string(version) + " (expected 2)");
  }
  uint64_t footer_size = LoadLE64(base + 40);
  if (footer_size != 0 && footer_size != kShardFooterSize) {
    return Bad(40, "footer size " + std::to_string(footer_size) + " (expected 0 or 200)");
  }
  if (footer_size > data.size() - kShardHeaderSize) {
    return Bad(40, "footer of " + std::to_string(footer_size) + " bytes does not fit");
  }
  const size_t body_end = data.size() - footer_size;

  Shard shard;
  uint64_t footer_cas_offset = 0, footer_offset = body_end;
  if (footer_size) {
    const uint8_t* f = base + body_end;
    if (LoadLE64(f) != kShardFooterVersion) {
      return Bad(body_end, "unsupported footer version " + std::to_string(LoadLE64(f)));
    }
    if (LoadLE64(f + 8) != kShardHeaderSize) {
      return Bad(body_end + 8,
                 "file info offset " + std::to_string(LoadLE64(f + 8)) + " (expected 48)");
    }
    footer_cas_offset = LoadLE64(f + 16);
    footer_offset = LoadLE64(f + 192);
    if (footer_offset != body_end) {
      return Bad(body_end + 192, "footer offset " + std::to_string(footer_offset) +
                                     " does not point at the footer (" + std::to_string(body_end) +
                                     ")");
    }
    for (int i = 0; i < 3; ++i) {
      uint64_t table = LoadLE64(f + 24 + 16 * i);
      if (table > body_end) {
        return Bad(body_end + 24 + 16 * i,
                   "lookup table offset " + std::to_string(table) + " is past the footer");
      }
    }
    std::memcpy(shard.chunk_hash_hmac_key.bytes.data(), f + 72, 32);
    shard.creation_timestamp = LoadLE64(f + 104);
    shard.key_expiry = LoadLE64(f + 112);
  }

  Reader r(data, body_end);
  r.Take(kShardHeaderSize);
  // ---- file info section ----
  MEGA_RETURN_IF_ERROR(ForEachSectionEntry(
      r, "file info", limits.max_files, "files", [&](size_t at, const uint8_t* e) -> Status {
        ShardFileInfo info;
        FileReconstruction& rec = info.reconstruction;
        rec.file_hash = HashAt(e);
        uint32_t flags = LoadLE32(e + 32);
        uint32_t n = LoadLE32(e + 36);
        const std::string file = "file " + rec.file_hash.ToHex();
        if (flags & ~kKnownFileFlags) {
          return Bad(
              at + 32, file + ": unsupported flags 0x" + [&] {
                char b[16];
                std::snprintf(b, sizeof(b), "%08x", flags);
                return std::string(b);
              }());
        }
        if (n > limits.max_entries_per_record) {
          return Bad(at + 36, file + ": " + std::to_string(n) + " entries exceeds the limit");
        }
        uint64_t sections = uint64_t{n} * ((flags & kShardFileFlagWithVerification) ? 2 : 1) +
                            ((flags & kShardFileFlagWithMetadataExt) ? 1 : 0);
        if (sections > r.remaining() / kShardEntrySize) {
          return Bad(at + 36, file + ": " + std::to_string(n) + " entries do not fit in the shard");
        }
        rec.terms.resize(n);
        uint64_t size = 0;
        for (uint32_t i = 0; i < n; ++i) {
          size_t eat = r.offset();
          const uint8_t* t = r.Take(kShardEntrySize);
          ReconstructionTerm& term = rec.terms[i];
          term.xorb_hash = HashAt(t);
          term.unpacked_bytes = LoadLE32(t + 36);
          term.chunk_start = LoadLE32(t + 40);
          term.chunk_end = LoadLE32(t + 44);
          if (term.chunk_end <= term.chunk_start) {
            return Bad(eat, file + " term " + std::to_string(i) + ": empty chunk range [" +
                                std::to_string(term.chunk_start) + ", " +
                                std::to_string(term.chunk_end) + ")");
          }
          if (term.unpacked_bytes == 0) {
            return Bad(eat, file + " term " + std::to_string(i) + ": 0 unpacked bytes");
          }
          size += term.unpacked_bytes;
        }
        rec.size = size;
        if (flags & kShardFileFlagWithVerification) {
          for (uint32_t i = 0; i < n; ++i) {
            rec.terms[i].verification_hash = HashAt(r.Take(kShardEntrySize));
          }
        }
        if (flags & kShardFileFlagWithMetadataExt) {
          info.sha256 = SwapSha256Groups(r.Take(kShardEntrySize));
        }
        shard.files.push_back(std::move(info));
        return Status::OK();
      }));
  // ---- CAS info section ----
  if (footer_size && r.offset() != footer_cas_offset) {
    return Bad(r.offset(), "CAS info section starts here but the footer says " +
                               std::to_string(footer_cas_offset));
  }
  MEGA_RETURN_IF_ERROR(ForEachSectionEntry(
      r, "CAS info", limits.max_xorbs, "xorbs", [&](size_t at, const uint8_t* e) -> Status {
        ShardXorbInfo x;
        x.xorb_hash = HashAt(e);
        uint32_t n = LoadLE32(e + 36);
        x.unpacked_bytes = LoadLE32(e + 40);
        x.bytes_on_disk = LoadLE32(e + 44);
        if (n > limits.max_entries_per_record || n > r.remaining() / kShardEntrySize) {
          return Bad(at + 36, "xorb " + x.xorb_hash.ToHex() + ": " + std::to_string(n) +
                                  " chunk entries do not fit in the shard");
        }
        x.chunks.resize(n);
        for (uint32_t i = 0; i < n; ++i) {
          const uint8_t* c = r.Take(kShardEntrySize);
          x.chunks[i].hash = HashAt(c);
          x.chunks[i].unpacked_offset = LoadLE32(c + 32);
          x.chunks[i].unpacked_bytes = LoadLE32(c + 36);
        }
        shard.xorbs.push_back(std::move(x));
        return Status::OK();
      }));
  if (!footer_size && r.remaining() != 0) {
    return Bad(r.offset(),
               std::to_string(r.remaining()) + " unexpected bytes after the CAS info bookend");
  }
  if (footer_size) {
    // Lookup tables (not interpreted) must lie between the CAS bookend and the footer.
    const uint8_t* f = base + body_end;
    for (int i = 0; i < 3; ++i) {
      uint64_t table = LoadLE64(f + 24 + 16 * i);
      if (table < r.offset()) {
        return Bad(body_end + 24 + 16 * i, "lookup table offset " + std::to_string(table) +
                                               " points inside the CAS info section");
      }
    }
  }
  return shard;
}

ShardXorbInfo ShardXorbInfoFromLayout(const XorbLayout& layout) {
  ShardXorbInfo x;
  x.xorb_hash = layout.xorb_hash;
  x.bytes_on_disk = layout.serialized_bytes;
  uint64_t pos = 0;
  x.chunks.reserve(layout.chunks.size());
  for (const XorbChunk& c : layout.chunks) {
    x.chunks.push_back({c.hash, static_cast<uint32_t>(pos), c.unpacked_bytes});
    pos += c.unpacked_bytes;
  }
  x.unpacked_bytes = static_cast<uint32_t>(pos);
  return x;
}

Result<std::string> ExportShard(CasBackend& backend, std::span<const MerkleHash> file_hashes,
                                bool include_xorbs) {
  Shard shard;
  std::vector<MerkleHash> xorb_order;
  std::unordered_set<MerkleHash> seen;
  for (const MerkleHash& fh : file_hashes) {
    MEGA_ASSIGN_OR_RETURN(FileReconstruction rec, backend.GetFile(fh));
    for (const ReconstructionTerm& t : rec.terms) {
      if (seen.insert(t.xorb_hash).second) xorb_order.push_back(t.xorb_hash);
    }
    shard.files.push_back({std::move(rec), std::nullopt});
  }
  if (include_xorbs) {
    for (const MerkleHash& xh : xorb_order) {
      MEGA_ASSIGN_OR_RETURN(XorbLayout layout, backend.GetXorbLayout(xh));
      shard.xorbs.push_back(ShardXorbInfoFromLayout(layout));
    }
  }
  return SerializeShard(shard);
}

Result<ShardImportResult> ImportShard(CasBackend& backend, std::span<const std::byte> bytes,
                                      const MerkleHash& file_hash_salt) {
  MEGA_ASSIGN_OR_RETURN(Shard shard, ParseShard(bytes));
  std::unordered_map<MerkleHash, XorbLayout> layouts;
  for (const ShardFileInfo& f : shard.files) {
    const FileReconstruction& rec = f.reconstruction;
    const std::string file = "shard file " + rec.file_hash.ToHex();
    std::vector<HashAndSize> leaves;
    for (size_t i = 0; i < rec.terms.size(); ++i) {
      const ReconstructionTerm& t = rec.terms[i];
      auto it = layouts.find(t.xorb_hash);
      if (it == layouts.end()) {
        Result<XorbLayout> layout = backend.GetXorbLayout(t.xorb_hash);
        if (layout.status().code() == StatusCode::kNotFound) {
          return FailedPreconditionError(file + ": references xorb " + t.xorb_hash.ToHex() +
                                         " which is not stored (upload xorbs first)");
        }
        if (!layout.ok()) return layout.status();
        it = layouts.emplace(t.xorb_hash, std::move(*layout)).first;
      }
      const XorbLayout& l = it->second;
      const std::string where = file + " term " + std::to_string(i);
      if (t.chunk_end > l.chunks.size()) {
        return DataLossError(where + ": chunk range [" + std::to_string(t.chunk_start) + ", " +
                             std::to_string(t.chunk_end) + ") exceeds the " +
                             std::to_string(l.chunks.size()) + " chunks of xorb " +
                             t.xorb_hash.ToHex());
      }
      uint64_t bytes_in_range = 0;
      std::vector<MerkleHash> hashes;
      for (uint32_t c = t.chunk_start; c < t.chunk_end; ++c) {
        bytes_in_range += l.chunks[c].unpacked_bytes;
        hashes.push_back(l.chunks[c].hash);
        leaves.push_back({l.chunks[c].hash, l.chunks[c].unpacked_bytes});
      }
      if (bytes_in_range != t.unpacked_bytes) {
        return DataLossError(where + ": says " + std::to_string(t.unpacked_bytes) +
                             " bytes, the xorb's chunks hold " + std::to_string(bytes_in_range));
      }
      if (!t.verification_hash.IsZero() && t.verification_hash != RangeVerificationHash(hashes)) {
        return DataLossError(where + ": verification hash does not match the xorb's chunks");
      }
    }
    MerkleHash computed = FileHash(leaves, file_hash_salt);
    if (computed != rec.file_hash) {
      return DataLossError(file + ": its chunks hash to " + computed.ToHex());
    }
  }
  ShardImportResult result;
  for (const ShardFileInfo& f : shard.files) {
    MEGA_ASSIGN_OR_RETURN(bool present, backend.HasFile(f.reconstruction.file_hash));
    if (present) {
      ++result.files_already_present;
      continue;
    }
    FileReconstruction rec = f.reconstruction;
    // Fill in verification hashes the shard left out.
    for (ReconstructionTerm& t : rec.terms) {
      if (!t.verification_hash.IsZero()) continue;
      const XorbLayout& l = layouts.at(t.xorb_hash);
      std::vector<MerkleHash> hashes;
      for (uint32_t c = t.chunk_start; c < t.chunk_end; ++c) hashes.push_back(l.chunks[c].hash);
      t.verification_hash = RangeVerificationHash(hashes);
    }
    MEGA_RETURN_IF_ERROR(backend.PutFile(rec));
    ++result.files_imported;
  }
  return result;
}

}  // namespace megackpt::cas
