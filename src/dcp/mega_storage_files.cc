// Locating a checkpoint, rebuilding Metadata from shard headers, reading boxes.
#include "dcp/mega_storage_files.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "dcp/f4_box.h"
#include "dcp/mega_storage_shard.h"
#include "megackpt/core/box_runs.h"
#include "megackpt/core/file.h"  // BaseName, ParentOf
#include "megackpt/core/path_safety.h"
#include "megackpt/dcp/index_io.h"
#include "megackpt/format/index_file.h"

namespace megackpt::dcp::mega_storage {
namespace {

using json = nlohmann::json;

// One stored piece found in a shard header.
struct FoundPiece {
  std::string fqn;
  ShardEntry entry;
  Shape sizes;  // the stored shape (chunk sizes)
  StorageInfo info;
};

// Reads one shard's header and appends its pieces. Also collects save ids and
// object paths.
Status ScanShard(const CheckpointPaths& p, const std::string& file, std::vector<FoundPiece>* out,
                 std::map<std::string, std::string>* save_ids,
                 std::map<std::string, ObjectPath>* object_paths) {
  const std::string full = fs::JoinPath(p.dir, file);
  auto opened = p.fs->OpenForRead(full);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) {
      return NotFoundError(full +
                           ": shard listed by the checkpoint is missing (incomplete checkpoint)");
    }
    return opened.status();
  }
  std::string entries_json, save_id, paths_json;
  struct Raw {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t offset, length;
    std::string checksum;
  };
  std::vector<Raw> raws;
  if (file.ends_with(".safetensors")) {
    std::shared_ptr<RandomAccessFile> f(std::move(*opened));
    MEGA_ASSIGN_OR_RETURN(auto reader, format::SafetensorsReader::Open(f));
    const auto& md = reader->metadata();
    if (auto it = md.find(std::string(kDcpEntriesKey)); it != md.end()) entries_json = it->second;
    if (auto it = md.find(std::string(kDcpSaveIdKey)); it != md.end()) save_id = it->second;
    if (auto it = md.find(std::string(kDcpObjectPathsKey)); it != md.end()) paths_json = it->second;
    for (const auto& t : reader->tensors()) {
      raws.push_back({t.name, t.dtype, t.shape, reader->header().data_offset() + t.data_begin,
                      t.nbytes(), ""});
    }
  } else {
    format::MegaReaderOptions ro;
    ro.verify_checksums = false;
    MEGA_ASSIGN_OR_RETURN(auto reader, format::MegaReader::Open(std::move(*opened), ro));
    MEGA_RETURN_IF_ERROR(CheckShardIntegrity(full, *reader));
    const format::MegaMetadata& md = reader->metadata();
    if (auto v = md.GetString(kDcpEntriesKey); v.ok()) entries_json = std::string(*v);
    if (auto v = md.GetString(kDcpSaveIdKey); v.ok()) save_id = std::string(*v);
    if (auto v = md.GetString(kDcpObjectPathsKey); v.ok()) paths_json = std::string(*v);
    for (const auto& t : reader->tensors()) {
      raws.push_back(
          {t.name, t.dtype, t.shape, t.file_offset, t.logical_nbytes, MegaChecksumString(t)});
    }
  }
  std::map<std::string, ShardEntry> entries;
  if (!entries_json.empty()) {
    MEGA_ASSIGN_OR_RETURN(entries, DecodeShardEntries(full, entries_json));
  }
  if (!save_id.empty()) (*save_ids)[file] = save_id;
  if (!paths_json.empty()) {
    MEGA_ASSIGN_OR_RETURN(auto paths, DecodeObjectPaths(full, paths_json));
    for (auto& [fqn, path] : paths) (*object_paths)[fqn] = std::move(path);
  }
  for (Raw& r : raws) {
    FoundPiece piece;
    piece.fqn = r.name;
    auto it = entries.find(r.name);
    if (it != entries.end()) {
      piece.entry = it->second;
      if (piece.entry.is_bytes) {
        if (r.dtype != DType::kU8 || r.shape.size() != 1) {
          return DataLossError(full + ": bytes entry " + Quote(r.name) + " is stored as " +
                               std::string(DTypeName(r.dtype)) + ShapeToString(r.shape) +
                               ", expected a 1-d U8 tensor");
        }
      } else {
        if (piece.entry.dtype != r.dtype || piece.entry.offsets.size() != r.shape.size()) {
          return DataLossError(full + ": tensor " + Quote(r.name) + " is " +
                               std::string(DTypeName(r.dtype)) + ShapeToString(r.shape) +
                               " but its " + std::string(kDcpEntriesKey) + " entry says " +
                               std::string(DTypeName(piece.entry.dtype)) + " with " +
                               std::to_string(piece.entry.offsets.size()) + "-d offsets");
        }
      }
    } else {
      // A file without our keys (TensorPlay, Hugging Face): a whole tensor.
      piece.entry.dtype = r.dtype;
      piece.entry.global_shape = r.shape;
      piece.entry.offsets = Shape(r.shape.size(), 0);
    }
    piece.info.relative_path = file;
    piece.info.offset = r.offset;
    piece.info.length = r.length;
    piece.info.checksum = r.checksum;
    piece.sizes = r.shape;
    out->push_back(std::move(piece));
  }
  return Status::OK();
}

// Chunks of one tensor must lie inside the global shape, be pairwise disjoint and
// cover it exactly.
Status CheckCoverage(const std::string& fqn, const TensorStorageMetadata& t) {
  const size_t nd = t.size.size();
  unsigned __int128 global = 1, covered = 0;
  for (int64_t d : t.size) global *= static_cast<uint64_t>(d);
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const auto& c = t.chunks[i];
    if (c.offsets.size() != nd || c.sizes.size() != nd) {
      return DataLossError("tensor " + Quote(fqn) + ": chunk rank differs from the global shape " +
                           ShapeToString(t.size));
    }
    unsigned __int128 vol = 1;
    for (size_t d = 0; d < nd; ++d) {
      if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] + c.sizes[d] > t.size[d]) {
        return DataLossError("tensor " + Quote(fqn) + ": chunk at " + ShapeToString(c.offsets) +
                             " of size " + ShapeToString(c.sizes) + " exceeds the global shape " +
                             ShapeToString(t.size));
      }
      vol *= static_cast<uint64_t>(c.sizes[d]);
    }
    covered += vol;
    if (vol == 0) continue;
    for (size_t j = 0; j < i; ++j) {
      const auto& o = t.chunks[j];
      bool overlap = true;
      for (size_t d = 0; d < nd && overlap; ++d) {
        overlap =
            c.offsets[d] < o.offsets[d] + o.sizes[d] && o.offsets[d] < c.offsets[d] + c.sizes[d];
      }
      bool empty = false;
      for (int64_t s : o.sizes) empty = empty || s == 0;
      if (overlap && !empty) {
        return DataLossError("tensor " + Quote(fqn) + ": chunks at " + ShapeToString(c.offsets) +
                             " and " + ShapeToString(o.offsets) + " overlap");
      }
    }
  }
  if (covered != global) {
    return DataLossError("tensor " + Quote(fqn) + ": stored chunks cover " +
                         std::to_string(static_cast<uint64_t>(covered)) + " of " +
                         std::to_string(static_cast<uint64_t>(global)) +
                         " elements (incomplete checkpoint)");
  }
  return Status::OK();
}

// Plain F4 box that is not the whole piece: spans of at most 8 MiB (runs joined
// while the span reads at most 5% more than they need) through one staging
// buffer, copied nibble-exactly into dst (contiguous, as every F4 tensor).
Status ReadF4BoxSpans(const RandomAccessFile& file, uint64_t base, const Shape& stored,
                      const Shape& start, const Tensor& dst, const std::string& what) {
  constexpr uint64_t kMaxSpan = 8ull << 20;
  std::shared_ptr<std::byte> staging;
  return ForEachF4Span(
      stored, start, dst.shape(), kMaxSpan, 0.05, [&](const F4Span& span) -> Status {
        if (!staging) {
          MEGA_ASSIGN_OR_RETURN(staging, AllocateBuffer(kMaxSpan));
        }
        MEGA_RETURN_IF_ERROR(
            file.ReadExactlyAt(base + span.begin,
                               std::span<std::byte>(staging.get(), span.end - span.begin))
                .WithContext(what));
        return CopyF4Span(span, staging.get(), span.begin, stored, dst).WithContext(what);
      });
}

}  // namespace

Status CheckShardIntegrity(const std::string& file, const format::MegaReader& reader) {
  const format::MetaValue* v = reader.header_metadata().Find(kDcpVersionKey);
  if (v == nullptr) return Status::OK();  // not written by us: whatever the file has
  auto version = v->AsUint64();
  if (!version.ok()) {
    return DataLossError(file + ": " + std::string(kDcpVersionKey) + " is not an unsigned integer");
  }
  if (*version < 2) return Status::OK();  // shards of earlier releases: tensor checksums only
  if (*version > kDcpShardVersion) {
    return DataLossError(file + ": " + std::string(kDcpVersionKey) + " " +
                         std::to_string(*version) + " is newer than this reader (" +
                         std::to_string(kDcpShardVersion) + ")");
  }
  if (!reader.header_checksummed()) {
    return DataLossError(file + ": shard of " + std::string(kDcpVersionKey) + " " +
                         std::to_string(*version) + " has no " +
                         std::string(format::kMegaHeaderCrcKey));
  }
  for (const format::MegaTensorInfo& t : reader.tensors()) {
    if (t.block_size == 0 && t.logical_nbytes > 0 &&
        t.checksum_type != format::MegaChecksumType::kNone) {
      return DataLossError(file + ": tensor " + Quote(t.name) + " has no block CRCs (" +
                           std::string(format::kMegaBlockSizesKey) + ")");
    }
  }
  return Status::OK();
}

Status ReadUnverifiedBox(const RandomAccessFile& file, uint64_t base, DType dtype,
                         const Shape& stored, const Shape& start, const Tensor& dst,
                         const std::string& what) {
  const size_t nd = stored.size();
  if (start.size() != nd || dst.ndim() != static_cast<int>(nd)) {
    return InvalidArgumentError(what + ": box rank differs from the tensor's");
  }
  MEGA_RETURN_IF_ERROR(CheckBox(stored, {}, start, dst.shape()).WithContext(what));
  if (dst.numel() == 0) return Status::OK();
  if (dtype == DType::kF4) {
    bool whole = dst.shape() == stored;
    for (int64_t s : start) whole = whole && s == 0;
    if (whole && dst.is_contiguous())
      return file.ReadExactlyAt(base, dst.Bytes()).WithContext(what);
    return ReadF4BoxSpans(file, base, stored, start, dst, what);
  }
  Tensor target = dst;
  if (!dst.is_contiguous()) {
    MEGA_ASSIGN_OR_RETURN(target, Tensor::Empty(dtype, dst.shape()));
  }
  std::vector<BoxRun> runs;
  MEGA_RETURN_IF_ERROR(
      ForEachBoxByteRun(dtype, stored, start, target.shape(), [&](const BoxRun& r) {
        runs.push_back(r);
        return Status::OK();
      }));
  MEGA_RETURN_IF_ERROR(ReadBoxRuns(file, base, runs, target.Bytes()).WithContext(what));
  if (!dst.is_contiguous()) return CopyTensor(target, dst);
  return Status::OK();
}

Result<CheckpointPaths> ResolveCheckpointPath(const std::string& path,
                                              std::shared_ptr<fs::FileSystem> fs) {
  if (path.empty()) return InvalidArgumentError("empty checkpoint path");
  CheckpointPaths p;
  p.path = path;
  if (fs) {
    p.fs = std::move(fs);
  } else {
    MEGA_ASSIGN_OR_RETURN(p.fs, fs::FileSystemForPath(path));
  }
  std::string clean = path;
  while (clean.size() > 1 && clean.back() == '/' && !clean.ends_with("://")) clean.pop_back();
  if (clean.ends_with(".index.json")) {
    p.dir = ParentOf(clean);
    p.index_file = BaseName(clean);
  } else if (clean.ends_with(".mega") || clean.ends_with(".safetensors")) {
    p.dir = ParentOf(clean);
    p.single_file = BaseName(clean);
  } else {
    p.dir = clean;
  }
  return p;
}

std::set<std::string> ReferencedFiles(const Metadata& metadata) {
  std::set<std::string> out;
  for (const auto& [idx, info] : metadata.storage_data) out.insert(info.relative_path);
  return out;
}

Result<Metadata> RebuildMetadata(const CheckpointPaths& p, CheckpointSource* source) {
  std::vector<std::string> files;
  std::optional<format::ShardIndex> index;
  std::string index_name = p.index_file;
  if (index_name.empty() && p.single_file.empty()) {
    auto listing = p.fs->List(p.dir);
    if (!listing.ok()) {
      if (listing.status().code() == StatusCode::kNotFound) {
        return NotFoundError("no checkpoint at " + p.path + ": folder not found");
      }
      return listing.status();
    }
    std::vector<std::string> mega_idx, st_idx, st_files, mega_files;
    std::set<std::string> names;
    for (const fs::FileInfo& fi : *listing) {
      if (fi.is_directory) continue;
      std::string b = BaseName(fi.path);
      names.insert(b);
      if (b.ends_with(format::kMegaIndexSuffix))
        mega_idx.push_back(b);
      else if (b.ends_with(format::kSafetensorsIndexSuffix))
        st_idx.push_back(b);
      else if (b.ends_with(".safetensors"))
        st_files.push_back(b);
      else if (b.ends_with(".mega"))
        mega_files.push_back(b);
    }
    auto pick = [&](std::string_view preferred,
                    const std::vector<std::string>& all) -> std::string {
      if (names.count(std::string(preferred))) return std::string(preferred);
      return all.size() == 1 ? all[0] : std::string();
    };
    index_name = pick(kMegaStorageIndexName, mega_idx);
    if (index_name.empty()) index_name = pick(kSafetensorsStorageIndexName, st_idx);
    if (index_name.empty()) {
      std::string single = pick("model.safetensors", st_files);
      if (single.empty()) single = pick("model.mega", mega_files);
      if (single.empty()) {
        if (mega_idx.size() + st_idx.size() + st_files.size() + mega_files.size() > 0) {
          return InvalidArgumentError("checkpoint at " + p.path +
                                      " is ambiguous: several index or shard files and no "
                                      ".metadata; name the index file instead");
        }
        return NotFoundError("no checkpoint at " + p.path +
                             ": no .metadata, index (*.mega.index.json, "
                             "*.safetensors.index.json) or shard file");
      }
      files.push_back(single);
    }
  } else if (!p.single_file.empty()) {
    files.push_back(p.single_file);
  }
  bool safetensors = false;
  if (!index_name.empty()) {
    auto kind = format::IndexKindFromPath(index_name);
    if (!kind) return InvalidArgumentError(index_name + ": not a .mega or .safetensors index");
    safetensors = *kind == format::IndexKind::kSafetensors;
    auto read = ReadShardIndex(*p.fs, fs::JoinPath(p.dir, index_name));
    if (!read.ok()) {
      if (read.status().code() == StatusCode::kNotFound) {
        return NotFoundError("no checkpoint at " + p.path + ": " + index_name + " not found");
      }
      return read.status();
    }
    index = std::move(*read);
    // Errors name the index by its path (the folder, for a corrupt reference).
    const std::string index_path = fs::JoinPath(p.dir, index_name);
    std::set<std::string> fs_set;
    for (const auto& [fqn, f] : index->weight_map) fs_set.insert(f);
    if (auto it = index->extra_fields.find(std::string(kDcpIndexShardedKey));
        it != index->extra_fields.end()) {
      json j = json::parse(it->second, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        return DataLossError(index_path + ": " + std::string(kDcpIndexShardedKey) +
                             " is not an object");
      }
      for (auto e = j.begin(); e != j.end(); ++e) {
        if (!e.value().is_object() || !e.value().contains("chunks") ||
            !e.value()["chunks"].is_array()) {
          return DataLossError(index_path + ": sharded entry " + Quote(e.key()) + " has no chunks");
        }
        for (const json& c : e.value()["chunks"]) {
          if (!c.is_object() || !c.contains("file") || !c["file"].is_string()) {
            return DataLossError(index_path + ": sharded entry " + Quote(e.key()) +
                                 " has a chunk without a file");
          }
          std::string f = c["file"].get<std::string>();
          MEGA_RETURN_IF_ERROR(format::ValidateShardFileName(f).WithContext(index_path));
          fs_set.insert(f);
        }
      }
    }
    files.assign(fs_set.begin(), fs_set.end());
  } else {
    safetensors = files[0].ends_with(".safetensors");
  }
  *source = safetensors ? CheckpointSource::kSafetensors : CheckpointSource::kMegaShardHeaders;

  std::vector<FoundPiece> pieces;
  std::map<std::string, std::string> save_ids;
  Metadata md;
  for (const std::string& f : files) {
    MEGA_RETURN_IF_ERROR(ScanShard(p, f, &pieces, &save_ids, &md.planner_data.object_paths));
  }
  std::set<std::string> distinct;
  for (const auto& [f, id] : save_ids) distinct.insert(id);
  if (distinct.size() > 1) {
    auto a = save_ids.begin();
    auto b = std::find_if(save_ids.begin(), save_ids.end(),
                          [&](const auto& kv) { return kv.second != a->second; });
    return DataLossError("checkpoint at " + p.path +
                         " mixes shards of different saves: " + a->first + " (save " + a->second +
                         ") and " + b->first + " (save " + b->second + ")");
  }
  // fqn -> file of each piece, for the weight_map check.
  std::map<std::string, std::vector<std::string>> files_of;
  for (FoundPiece& piece : pieces) {
    const Shape& sizes = piece.sizes;
    files_of[piece.fqn].push_back(piece.info.relative_path);
    const std::string where = fs::JoinPath(p.dir, piece.info.relative_path);
    auto it = md.state_dict_metadata.find(piece.fqn);
    if (piece.entry.is_bytes) {
      if (it != md.state_dict_metadata.end()) {
        return DataLossError(where + ": " + Quote(piece.fqn) + " is stored more than once");
      }
      md.state_dict_metadata.emplace(piece.fqn, BytesStorageMetadata{});
      md.storage_data.emplace(MetadataIndex(piece.fqn), std::move(piece.info));
      continue;
    }
    if (it == md.state_dict_metadata.end()) {
      TensorStorageMetadata t;
      t.properties.dtype = piece.entry.dtype;
      t.size = piece.entry.global_shape;
      it = md.state_dict_metadata.emplace(piece.fqn, t).first;
    }
    auto* t = std::get_if<TensorStorageMetadata>(&it->second);
    if (!t)
      return DataLossError(where + ": " + Quote(piece.fqn) + " is stored as bytes and as a tensor");
    if (t->properties.dtype != piece.entry.dtype || t->size != piece.entry.global_shape) {
      return DataLossError(where + ": chunk of " + Quote(piece.fqn) + " says " +
                           std::string(DTypeName(piece.entry.dtype)) +
                           ShapeToString(piece.entry.global_shape) + ", another says " +
                           std::string(DTypeName(t->properties.dtype)) + ShapeToString(t->size));
    }
    MetadataIndex key(piece.fqn, piece.entry.offsets);
    if (md.storage_data.count(key)) {
      return DataLossError(where + ": chunk " + ToString(key) + " is stored more than once");
    }
    t->chunks.push_back({piece.entry.offsets, sizes});
    md.storage_data.emplace(std::move(key), std::move(piece.info));
  }
  for (const auto& [fqn, value] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&value)) {
      MEGA_RETURN_IF_ERROR(CheckCoverage(fqn, *t).WithContext("checkpoint at " + p.path));
    }
  }
  if (index) {
    for (const auto& [fqn, f] : index->weight_map) {
      auto it = files_of.find(fqn);
      if (it == files_of.end() ||
          std::find(it->second.begin(), it->second.end(), f) == it->second.end()) {
        return DataLossError(fs::JoinPath(p.dir, index_name) + ": weight_map maps " + Quote(fqn) +
                             " to " + f + ", which holds no such tensor");
      }
    }
  }
  // Drop object paths of fqns that are not stored (stale).
  for (auto it = md.planner_data.object_paths.begin(); it != md.planner_data.object_paths.end();) {
    it = md.state_dict_metadata.count(it->first) ? std::next(it)
                                                 : md.planner_data.object_paths.erase(it);
  }
  StorageMeta sm;
  sm.checkpoint_id = p.path;
  if (distinct.size() == 1) sm.save_id = *distinct.begin();
  md.storage_meta = sm;
  md.version = "rebuilt from shard headers";
  MEGA_RETURN_IF_ERROR(ValidateMetadata(md).WithContext("checkpoint at " + p.path));
  return md;
}

// ---- ShardFiles -------------------------------------------------------------------

Result<ShardFiles::Shard*> ShardFiles::Open(const std::string& relative_path) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shards_.find(relative_path);
  if (it != shards_.end()) return it->second.get();
  // Names come from .metadata or an index: relative, inside the folder.
  MEGA_RETURN_IF_ERROR(ValidateRelativePath(relative_path).WithContext(dir_));
  const std::string full = fs::JoinPath(dir_, relative_path);
  MEGA_RETURN_IF_ERROR(CheckResolvesInside(dir_, full));
  auto opened = fs_->OpenForRead(full);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) {
      return NotFoundError(full + ": shard referenced by the checkpoint is missing");
    }
    return opened.status();
  }
  auto shard = std::make_unique<Shard>();
  if (relative_path.ends_with(".safetensors")) {
    std::shared_ptr<RandomAccessFile> f(std::move(*opened));
    MEGA_ASSIGN_OR_RETURN(shard->st, format::SafetensorsReader::Open(f));
    const auto& smd = shard->st->metadata();
    if (auto it = smd.find(std::string(kDcpEntriesKey)); it != smd.end()) {
      MEGA_ASSIGN_OR_RETURN(shard->entries, DecodeShardEntries(full, it->second));
    }
  } else if (relative_path.ends_with(".mega")) {
    format::MegaReaderOptions ro;
    ro.verify_checksums = verify_;
    // read_block_size stays the default: the item size of ReadTensors (one
    // large piece on every thread) and of unverified preads. Verified reads
    // check their CRCs in 256 KiB pieces, each right after it lands.
    MEGA_ASSIGN_OR_RETURN(shard->mega, format::MegaReader::Open(std::move(*opened), ro));
    MEGA_RETURN_IF_ERROR(CheckShardIntegrity(full, *shard->mega));
    if (auto v = shard->mega->metadata().GetString(kDcpEntriesKey); v.ok()) {
      MEGA_ASSIGN_OR_RETURN(shard->entries, DecodeShardEntries(full, *v));
    }
  } else {
    return InvalidArgumentError(full +
                                ": not a .mega or .safetensors file (is this a "
                                "FileSystemWriter checkpoint? read it with the fs reader)");
  }
  Shard* raw = shard.get();
  shards_.emplace(relative_path, std::move(shard));
  return raw;
}

Status ShardFiles::CheckInfo(const Shard& shard, const StorageInfo& info, const std::string& name,
                             DType dtype, const Shape& sizes, size_t* mega_index) const {
  const std::string full = fs::JoinPath(dir_, info.relative_path);
  DType have_dtype;
  Shape have_shape;
  uint64_t have_offset = 0, have_length = 0;
  std::string have_checksum;
  bool plain = true;
  if (shard.mega) {
    auto idx = shard.mega->IndexOf(name);
    if (!idx.ok()) {
      return DataLossError(full + ": no tensor " + Quote(name) +
                           " although the checkpoint metadata places it there");
    }
    *mega_index = *idx;
    const format::MegaTensorInfo& t = shard.mega->tensors()[*idx];
    have_dtype = t.dtype;
    have_shape = t.shape;
    have_offset = t.file_offset;
    have_length = t.logical_nbytes;
    have_checksum = MegaChecksumString(t);
    plain = t.is_plain();
  } else {
    const format::SafetensorsTensorInfo* t = shard.st->Find(name);
    if (!t) {
      return DataLossError(full + ": no tensor " + Quote(name) +
                           " although the checkpoint metadata places it there");
    }
    have_dtype = t->dtype;
    have_shape = t->shape;
    have_offset = shard.st->header().data_offset() + t->data_begin;
    have_length = t->nbytes();
  }
  if (have_dtype != dtype || have_shape != sizes) {
    return DataLossError(full + ": tensor " + Quote(name) + " is " +
                         std::string(DTypeName(have_dtype)) + ShapeToString(have_shape) +
                         ", the checkpoint metadata says " + std::string(DTypeName(dtype)) +
                         ShapeToString(sizes));
  }
  if ((info.length != 0 && info.length != have_length) ||
      (plain && info.offset != 0 && info.offset != have_offset) ||
      (!info.checksum.empty() && !have_checksum.empty() && info.checksum != have_checksum)) {
    return DataLossError(full + ": tensor " + Quote(name) +
                         " differs from what the checkpoint metadata recorded (offset " +
                         std::to_string(info.offset) + " vs " + std::to_string(have_offset) +
                         ", length " + std::to_string(info.length) + " vs " +
                         std::to_string(have_length) + ", checksum " + info.checksum + " vs " +
                         have_checksum + "): the shard was replaced after the commit");
  }
  return Status::OK();
}

Status ShardFiles::CheckEntry(const Shard& shard, const StorageInfo& info, const std::string& name,
                              bool is_bytes, const Shape* chunk_offsets,
                              const Shape* global_shape) const {
  if (shard.entries.empty()) return Status::OK();  // a file without our keys: a whole tensor
  const std::string full = fs::JoinPath(dir_, info.relative_path);
  auto it = shard.entries.find(name);
  if (it == shard.entries.end()) {
    return DataLossError(full + ": tensor " + Quote(name) + " has no " +
                         std::string(kDcpEntriesKey) + " record");
  }
  const ShardEntry& e = it->second;
  if (e.is_bytes != is_bytes) {
    return DataLossError(full + ": " + Quote(name) + " is stored as " +
                         (e.is_bytes ? "bytes" : "a tensor") + ", the checkpoint metadata says " +
                         (is_bytes ? "bytes" : "a tensor"));
  }
  if (!is_bytes && ((chunk_offsets && *chunk_offsets != e.offsets) ||
                    (global_shape && *global_shape != e.global_shape))) {
    return DataLossError(full + ": tensor " + Quote(name) + " holds the chunk at " +
                         ShapeToString(e.offsets) + " of a " + ShapeToString(e.global_shape) +
                         " tensor, the checkpoint metadata says " +
                         (chunk_offsets ? ShapeToString(*chunk_offsets) : std::string("?")) +
                         " of " + (global_shape ? ShapeToString(*global_shape) : std::string("?")));
  }
  return Status::OK();
}

Status ShardFiles::ReadBox(const StorageInfo& info, const std::string& name, DType dtype,
                           const Shape& stored_sizes, const Shape& chunk_offsets,
                           const Shape& global_shape, const Shape& start, const Tensor& dst,
                           bool verify_partial) {
  MEGA_ASSIGN_OR_RETURN(Shard * shard, Open(info.relative_path));
  size_t mi = 0;
  MEGA_RETURN_IF_ERROR(CheckInfo(*shard, info, name, dtype, stored_sizes, &mi));
  MEGA_RETURN_IF_ERROR(CheckEntry(*shard, info, name, false, &chunk_offsets, &global_shape));
  const size_t nd = stored_sizes.size();
  const std::string what = fs::JoinPath(dir_, info.relative_path) + ": tensor " + Quote(name);
  if (start.size() != nd || dst.ndim() != static_cast<int>(nd) || dst.dtype() != dtype) {
    return InvalidArgumentError(what + ": read has the wrong rank or dtype");
  }
  bool whole = dst.shape() == stored_sizes;
  for (int64_t s : start) whole = whole && s == 0;
  if (shard->mega) {
    const format::MegaReader& mega = *shard->mega;
    if (whole) return mega.ReadTensor(mi, dst);
    if (dtype == DType::kF4 &&
        !ForEachBoxByteRun(dtype, stored_sizes, start, dst.shape(), [](const BoxRun&) {
           return Status::OK();
         }).ok()) {
      // A box that does not map onto whole bytes: spans of the stored bytes
      // (ReadRange verifies them: block CRCs, or the decoded chunks), copied
      // nibble-exactly into dst.
      std::shared_ptr<std::byte> staging;
      uint64_t staging_size = 0;
      MEGA_RETURN_IF_ERROR(ForEachF4Span(
          stored_sizes, start, dst.shape(), 8ull << 20, 0.05, [&](const F4Span& span) -> Status {
            const uint64_t n = span.end - span.begin;
            if (staging_size < n) {
              MEGA_ASSIGN_OR_RETURN(staging, AllocateBuffer(n));
              staging_size = n;
            }
            MEGA_RETURN_IF_ERROR(
                mega.ReadRange(mi, span.begin, std::span<std::byte>(staging.get(), n)));
            return CopyF4Span(span, staging.get(), span.begin, stored_sizes, dst).WithContext(what);
          }));
    } else {
      MEGA_RETURN_IF_ERROR(mega.ReadSlice(mi, start, dst));
    }
    if (verify_partial && verify_) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (verified_.count({info.relative_path, name})) return Status::OK();
      }
      MEGA_RETURN_IF_ERROR(mega.VerifyTensor(mi));
      std::lock_guard<std::mutex> lock(mu_);
      verified_.insert({info.relative_path, name});
    }
    return Status::OK();
  }
  // safetensors (no checksums): only the runs of the box.
  const format::SafetensorsReader& st = *shard->st;
  if (whole) return st.ReadTensor(name, dst);
  const format::SafetensorsTensorInfo* ti = st.Find(name);
  return ReadUnverifiedBox(*st.file(), st.header().data_offset() + ti->data_begin, dtype,
                           stored_sizes, start, dst, what);
}

Status ShardFiles::ReadWhole(std::span<const WholeRead> reads, ThreadPool* pool) {
  // Shard by shard, in the order they first appear.
  std::vector<std::string> order;
  std::map<std::string, std::vector<size_t>> by_shard;
  for (size_t i = 0; i < reads.size(); ++i) {
    std::vector<size_t>& v = by_shard[reads[i].info->relative_path];
    if (v.empty()) order.push_back(reads[i].info->relative_path);
    v.push_back(i);
  }
  for (const std::string& path : order) {
    MEGA_ASSIGN_OR_RETURN(Shard * shard, Open(path));
    std::vector<format::MegaReadRequest> mega;
    std::vector<format::SafetensorsReadRequest> st;
    for (size_t i : by_shard[path]) {
      const WholeRead& r = reads[i];
      size_t mi = 0;
      MEGA_RETURN_IF_ERROR(CheckInfo(*shard, *r.info, *r.name, r.dtype, *r.stored_sizes, &mi));
      MEGA_RETURN_IF_ERROR(
          CheckEntry(*shard, *r.info, *r.name, false, r.chunk_offsets, r.global_shape));
      if (shard->mega) {
        mega.push_back({mi, r.dst});
      } else {
        st.push_back({*r.name, r.dst});
      }
    }
    if (shard->mega) {
      MEGA_RETURN_IF_ERROR(shard->mega->ReadTensors(mega, pool));
    } else {
      MEGA_RETURN_IF_ERROR(shard->st->ReadTensors(st, pool));
    }
  }
  return Status::OK();
}

Result<std::string> ShardFiles::ReadBytes(const StorageInfo& info, const std::string& name) {
  MEGA_ASSIGN_OR_RETURN(Shard * shard, Open(info.relative_path));
  const std::string full = fs::JoinPath(dir_, info.relative_path);
  Shape shape;
  if (shard->mega) {
    const format::MegaTensorInfo* t = shard->mega->Find(name);
    if (!t) return DataLossError(full + ": no bytes entry " + Quote(name));
    shape = t->shape;
  } else {
    const format::SafetensorsTensorInfo* t = shard->st->Find(name);
    if (!t) return DataLossError(full + ": no bytes entry " + Quote(name));
    shape = t->shape;
  }
  if (shape.size() != 1) {
    return DataLossError(full + ": bytes entry " + Quote(name) + " is not a 1-d U8 tensor");
  }
  size_t mi = 0;
  MEGA_RETURN_IF_ERROR(CheckInfo(*shard, info, name, DType::kU8, shape, &mi));
  MEGA_RETURN_IF_ERROR(CheckEntry(*shard, info, name, true, nullptr, nullptr));
  std::string value(static_cast<size_t>(shape[0]), '\0');
  MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBlob(value.data(), DType::kU8, shape));
  if (shard->mega) {
    MEGA_RETURN_IF_ERROR(shard->mega->ReadTensor(mi, t));
  } else {
    MEGA_RETURN_IF_ERROR(shard->st->ReadTensor(name, t));
  }
  return value;
}

Status ShardFiles::Verify(const StorageInfo& info, const std::string& name) {
  MEGA_ASSIGN_OR_RETURN(Shard * shard, Open(info.relative_path));
  if (!shard->mega) return Status::OK();
  MEGA_ASSIGN_OR_RETURN(size_t idx, shard->mega->IndexOf(name));
  return shard->mega->VerifyTensor(idx);
}

}  // namespace megackpt::dcp::mega_storage
