// Checkpoint folders as a whole (megackpt/dcp/checkpoint_folder.h).
//
// Verification reads every stored piece through the storage's own reader (the
// load path users take), one batch of pieces at a time into reused buffers; a
// failing batch is re-read piece by piece so every damaged piece is reported.
#include "megackpt/dcp/checkpoint_folder.h"

#include <algorithm>
#include <map>
#include <set>

#include "dcp/whole_pieces.h"
#include "megackpt/core/file.h"  // BaseName, ParentOf
#include "megackpt/core/path_safety.h"
#include "megackpt/core/text.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp {
namespace {

constexpr uint64_t kVerifyBatchBytes = 64ull << 20;
constexpr std::string_view kDistcpSuffix = ".distcp";

bool IsShardName(std::string_view name) {
  return name.ends_with(".mega") || name.ends_with(".safetensors");
}

struct Piece {
  MetadataIndex index;
  bool is_bytes = false;
  DType dtype = DType::kU8;
  Shape sizes;
  uint64_t nbytes = 0;
  std::string file;
};

std::unique_ptr<StorageReader> ReaderFor(StorageLayout layout, const std::string& dir,
                                         std::shared_ptr<fs::FileSystem> fs) {
  if (layout == StorageLayout::kFileSystem) {
    FileSystemReaderOptions o;
    o.fs = std::move(fs);
    o.verify = VerifyMode::kAll;
    return NewFileSystemReader(dir, o);
  }
  MegaStorageReaderOptions o;
  o.fs = std::move(fs);
  return std::make_unique<MegaStorageReader>(dir, o);
}

// Reads `pieces` whole through `reader` into `buffer` (>= their bytes).
Status ReadPieces(StorageReader& reader, const std::vector<const Piece*>& pieces,
                  std::byte* buffer) {
  std::vector<internal::WholePieceRead> reads;
  uint64_t at = 0;
  for (const Piece* p : pieces) {
    internal::WholePieceRead r;
    r.index = p->index;
    r.is_bytes = p->is_bytes;
    if (!p->is_bytes) {
      MEGA_ASSIGN_OR_RETURN(r.dest, Tensor::FromBlob(buffer + at, p->dtype, p->sizes));
      at += (p->nbytes + 63) / 64 * 64;
    }
    reads.push_back(std::move(r));
  }
  return internal::ReadWholePieces(reader, reads);
}

}  // namespace

bool ParseDistcpFileName(std::string_view name, int* rank) {
  if (!name.starts_with("__") || !name.ends_with(kDistcpSuffix)) return false;
  name.remove_prefix(2);
  name.remove_suffix(kDistcpSuffix.size());
  size_t a = name.find('_');
  if (a != 16) return false;
  if (!IsHex(name.substr(0, 16))) return false;
  size_t b = name.find('_', a + 1);
  if (b == std::string_view::npos || b == a + 1 || b + 1 >= name.size()) return false;
  int r = 0;
  for (size_t i = a + 1; i < b; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || r > 1'000'000) return false;
    r = r * 10 + (name[i] - '0');
  }
  for (size_t i = b + 1; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  *rank = r;
  return true;
}

const char* StorageLayoutName(StorageLayout layout) {
  switch (layout) {
    case StorageLayout::kNone:
      return "none";
    case StorageLayout::kFileSystem:
      return "dcp-fs";
    case StorageLayout::kMega:
      return "dcp-mega";
    case StorageLayout::kIndexOnly:
      return "hf";
  }
  return "?";
}

Result<FolderListing> ListCheckpointFolder(fs::FileSystem& fs, const std::string& dir) {
  MEGA_ASSIGN_OR_RETURN(std::vector<fs::FileInfo> listing, fs.List(dir));
  FolderListing out;
  for (const fs::FileInfo& fi : listing) {
    if (fi.is_directory) continue;
    const std::string name = BaseName(fi.path);
    int rank = -1;
    if (name == kMetadataFileName) {
      out.has_metadata = true;
    } else if (name.starts_with(std::string(kMetadataFileName) + ".rank")) {
      out.rank_metadata.push_back(name);
    } else if (ParseDistcpFileName(name, &rank)) {
      out.distcp_files.push_back(name);
    } else if (name.ends_with(".index.json")) {
      out.index_files.push_back(name);
    } else if (IsShardName(name)) {
      out.shard_files.push_back(name);
    }
  }
  for (auto* v : {&out.rank_metadata, &out.distcp_files, &out.index_files, &out.shard_files}) {
    std::sort(v->begin(), v->end());
  }
  return out;
}

bool HasForeignMetadata(fs::FileSystem& fs, const std::string& dir) {
  const std::string full = fs::JoinPath(dir, std::string(kMetadataFileName));
  if (!CheckResolvesInside(dir, full).ok()) return false;
  auto file = fs.OpenForRead(full);
  if (!file.ok() || (*file)->size() == 0) return false;
  std::byte first{0};
  if (!(*file)->ReadExactlyAt(0, std::span<std::byte>(&first, 1)).ok()) return false;
  return first == std::byte{0x80};
}

Result<Metadata> ReadMetadataFile(fs::FileSystem& fs, const std::string& dir,
                                  const std::string& name) {
  const std::string path = fs::JoinPath(dir, name);
  auto text = fs.ReadWhole(path, kMaxMetadataBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFoundError("no checkpoint at " + dir + ": " + name + " not found");
    }
    return text.status();
  }
  auto md = DecodeMetadata(*text);
  if (!md.ok()) return Status(md.status().code(), path + ": " + md.status().message());
  return std::move(*md);
}

Result<StorageLayout> DetectLayout(fs::FileSystem& fs, const std::string& dir) {
  MEGA_ASSIGN_OR_RETURN(FolderListing l, ListCheckpointFolder(fs, dir));
  if (l.has_metadata && !HasForeignMetadata(fs, dir)) {
    auto summary =
        DescribeDcpCheckpoint(dir, std::shared_ptr<fs::FileSystem>(&fs, [](fs::FileSystem*) {}));
    if (summary.ok()) return summary->layout;
    // An undecodable .metadata: judge by the files beside it.
    return l.distcp_files.empty() ? StorageLayout::kMega : StorageLayout::kFileSystem;
  }
  if (!l.shard_files.empty() || !l.index_files.empty()) return StorageLayout::kIndexOnly;
  return StorageLayout::kNone;
}

Result<CheckpointSummary> DescribeDcpCheckpoint(const std::string& dir,
                                                std::shared_ptr<fs::FileSystem> fs) {
  if (!fs) {
    MEGA_ASSIGN_OR_RETURN(fs, fs::FileSystemForPath(dir));
  }
  const std::string full = fs::JoinPath(dir, std::string(kMetadataFileName));
  MEGA_RETURN_IF_ERROR(CheckResolvesInside(dir, full));
  auto text = fs->ReadWhole(full, kMaxMetadataBytes);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return NotFoundError(dir + ": no " + std::string(kMetadataFileName) +
                           " (not a DCP checkpoint)");
    }
    return text.status();
  }
  auto md = DecodeMetadata(*text);
  if (!md.ok()) return Status(md.status().code(), full + ": " + md.status().message());
  CheckpointSummary s;
  s.path = dir;
  s.metadata = std::move(*md);
  std::set<std::string> all_files;
  bool any_distcp = false, any_shard = false;
  for (const auto& [idx, info] : s.metadata.storage_data) {
    all_files.insert(info.relative_path);
    int rank = -1;
    if (ParseDistcpFileName(info.relative_path, &rank) || info.relative_path.ends_with(".distcp")) {
      any_distcp = true;
    } else {
      any_shard = true;
    }
  }
  if (any_distcp && any_shard) {
    return DataLossError(full + ": references both .distcp data files and shard files");
  }
  s.layout = any_shard ? StorageLayout::kMega : StorageLayout::kFileSystem;
  s.files.assign(all_files.begin(), all_files.end());
  for (const auto& [fqn, value] : s.metadata.state_dict_metadata) {
    EntrySummary e;
    e.fqn = fqn;
    std::set<std::string> files;
    if (std::holds_alternative<BytesStorageMetadata>(value)) {
      e.is_bytes = true;
      auto it = s.metadata.storage_data.find(MetadataIndex(fqn));
      if (it == s.metadata.storage_data.end()) {
        return DataLossError(full + ": bytes entry " + Quote(fqn) + " has no storage entry");
      }
      e.nbytes = it->second.length;
      e.shape = {static_cast<int64_t>(e.nbytes)};
      e.chunks = 1;
      e.whole = true;
      files.insert(it->second.relative_path);
      ++s.bytes_values;
      s.bytes_value_bytes += e.nbytes;
    } else {
      const auto& t = std::get<TensorStorageMetadata>(value);
      e.dtype = t.properties.dtype;
      e.shape = t.size;
      MEGA_ASSIGN_OR_RETURN(e.nbytes, LogicalNbytes(e.dtype, e.shape));
      e.chunks = t.chunks.size();
      e.whole = t.chunks.size() == 1 && t.chunks[0].sizes == t.size;
      for (const auto& c : t.chunks) {
        auto it = s.metadata.storage_data.find(MetadataIndex(fqn, c.offsets));
        if (it == s.metadata.storage_data.end()) {
          return DataLossError(full + ": chunk " + ShapeToString(c.offsets) + " of " + Quote(fqn) +
                               " has no storage entry");
        }
        files.insert(it->second.relative_path);
      }
      if (!e.whole) ++s.sharded_tensors;
      ++s.tensors;
      s.tensor_bytes += e.nbytes;
    }
    e.files.assign(files.begin(), files.end());
    s.entries.push_back(std::move(e));
  }
  return s;
}

Result<VerifyReport> VerifyDcpCheckpoint(const std::string& dir,
                                         std::shared_ptr<fs::FileSystem> fs) {
  if (!fs) {
    MEGA_ASSIGN_OR_RETURN(fs, fs::FileSystemForPath(dir));
  }
  VerifyReport report;
  MEGA_ASSIGN_OR_RETURN(report.summary, DescribeDcpCheckpoint(dir, fs));
  const Metadata& md = report.summary.metadata;
  std::vector<Piece> pieces;
  for (const auto& [idx, info] : md.storage_data) {
    Piece p;
    p.index = idx;
    p.file = info.relative_path;
    const auto& value = md.state_dict_metadata.at(idx.fqn);
    if (std::holds_alternative<BytesStorageMetadata>(value)) {
      p.is_bytes = true;
      p.nbytes = info.length;
    } else {
      const auto& t = std::get<TensorStorageMetadata>(value);
      p.dtype = t.properties.dtype;
      for (const auto& c : t.chunks) {
        if (idx.offset && c.offsets == *idx.offset) p.sizes = c.sizes;
      }
      MEGA_ASSIGN_OR_RETURN(p.nbytes, LogicalNbytes(p.dtype, p.sizes));
    }
    pieces.push_back(std::move(p));
  }
  auto reader = ReaderFor(report.summary.layout, dir, fs);
  MEGA_RETURN_IF_ERROR(reader->SetUpStorageReader(md, StorageSetUp{}));
  // Batches of whole pieces into one reused buffer.
  std::shared_ptr<std::byte> buffer;
  uint64_t capacity = 0;
  size_t next = 0;
  while (next < pieces.size()) {
    std::vector<const Piece*> batch;
    uint64_t bytes = 0;
    while (next < pieces.size() &&
           (batch.empty() || bytes + pieces[next].nbytes + 64 <= kVerifyBatchBytes)) {
      batch.push_back(&pieces[next]);
      bytes += (pieces[next].nbytes + 63) / 64 * 64;
      ++next;
    }
    if (bytes > capacity) {
      buffer.reset();
      MEGA_ASSIGN_OR_RETURN(buffer,
                            AllocateBuffer(std::max<uint64_t>(bytes, 64), /*prefault=*/false));
      capacity = std::max<uint64_t>(bytes, 64);
    }
    Status s = ReadPieces(*reader, batch, buffer.get());
    if (!s.ok() && batch.size() > 1) {
      // Name every damaged piece, not only the first one.
      for (const Piece* p : batch) {
        Status one = ReadPieces(*reader, {p}, buffer.get());
        if (!one.ok()) report.problems.push_back(one);
      }
    } else if (!s.ok()) {
      report.problems.push_back(s);
    }
    for (const Piece* p : batch) {
      ++report.chunks_checked;
      report.bytes_checked += p->nbytes;
    }
  }
  return report;
}

Result<std::vector<std::string>> OtherLayoutFiles(fs::FileSystem& fs, const std::string& dir,
                                                  StorageLayout kept) {
  MEGA_ASSIGN_OR_RETURN(FolderListing listing, ListCheckpointFolder(fs, dir));
  std::vector<std::string> other;
  if (kept == StorageLayout::kFileSystem) {
    other = listing.shard_files;
    other.insert(other.end(), listing.index_files.begin(), listing.index_files.end());
  } else if (kept == StorageLayout::kMega) {
    other = listing.distcp_files;
  }
  return other;
}

void WriteOutNewEntries(fs::FileSystem& fs, const std::string& dir,
                        const std::vector<std::string>& commit_names) {
  fs.SyncDirectory(dir).IgnoreError();
  if (!fs.capabilities().cached_name_lookups) return;  // a lookup would buy nothing
  for (const std::string& name : commit_names) (void)fs.Exists(fs::JoinPath(dir, name));
}

void RemoveOtherLayouts(fs::FileSystem& fs, const std::string& dir, StorageLayout kept) {
  auto other = OtherLayoutFiles(fs, dir, kept);
  if (!other.ok()) return;
  std::vector<std::string> garbage;
  for (const std::string& name : *other) garbage.push_back(fs::JoinPath(dir, name));
  fs.RemoveGarbage(garbage);
}

Status CheckNoOtherLayout(fs::FileSystem& fs, const std::string& dir, StorageLayout kept) {
  auto other = OtherLayoutFiles(fs, dir, kept);
  if (!other.ok() || other->empty()) return Status::OK();  // no folder yet, or nothing else
  std::string names;
  for (size_t i = 0; i < other->size() && i < 3; ++i) names += (i ? ", " : "") + Quote((*other)[i]);
  if (other->size() > 3) names += ", ...";
  return AlreadyExistsError(dir + " holds files of another checkpoint layout (" + names + "); a " +
                            StorageLayoutName(kept) +
                            " save would remove them after its commit: set overwrite to allow it");
}

}  // namespace megackpt::dcp
