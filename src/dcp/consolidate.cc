// Consolidation (see consolidate.h and docs/mega-storage.md, "Consolidation").
//
// Every rank computes the same output plan from the source Metadata (entries in
// fqn order, packed into files by bucket and max_shard_size). Rank r writes
// files r, r + world, ...; each file is written by one thread, one entry at a
// time: the whole tensor is assembled in a reusable buffer from its stored chunks
// (each chunk read whole, so its checksum is verified), written, and the buffer
// reused. Rank 0 then commits like a save: index, then .metadata (commit point),
// then removal of the source's files when consolidating in place.
#include "megackpt/dcp/consolidate.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "dcp/mega_storage_commit.h"
#include "dcp/mega_storage_files.h"
#include "dcp/mega_storage_shard.h"
#include "dcp/whole_pieces.h"
#include "megackpt/core/packed.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/format/safetensors.h"

namespace megackpt::dcp {

using json = nlohmann::json;

namespace {

struct OutEntry {
  std::string fqn;
  bool is_bytes = false;
  DType dtype = DType::kU8;
  Shape shape;  // global shape (bytes: {n}, known only after reading for bytes)
  uint64_t nbytes = 0;
};

struct OutFile {
  std::string name;
  std::vector<size_t> entries;  // indices into the entry list
};

// A growable, reused assembly buffer.
class Buffer {
 public:
  Result<std::byte*> Get(uint64_t n) {
    if (n > cap_) {
      buf_.reset();
      cap_ = 0;
      MEGA_ASSIGN_OR_RETURN(buf_, AllocateBuffer(std::max<uint64_t>(n, 64), /*prefault=*/false));
      cap_ = std::max<uint64_t>(n, 64);
    }
    return buf_.get();
  }

 private:
  std::shared_ptr<std::byte> buf_;
  uint64_t cap_ = 0;
};

// Where the stored pieces come from: MEGA shards, or the .distcp data files of
// an fs checkpoint (read through FileSystemReader, every block verified).
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Reads stored chunk `c` of `fqn` whole into dst (shape c.sizes, any strides).
  virtual Status ReadChunk(const Metadata& md, const std::string& fqn, DType dtype,
                           const ChunkStorageMetadata& c, const Tensor& dst) = 0;
  virtual Result<std::string> ReadBytes(const Metadata& md, const std::string& fqn) = 0;
};

class ShardChunkSource final : public ChunkSource {
 public:
  explicit ShardChunkSource(std::unique_ptr<mega_storage::ShardFiles> files)
      : files_(std::move(files)) {}
  Status ReadChunk(const Metadata& md, const std::string& fqn, DType dtype,
                   const ChunkStorageMetadata& c, const Tensor& dst) override {
    const StorageInfo& info = md.storage_data.at(MetadataIndex(fqn, c.offsets));
    const auto& t = std::get<TensorStorageMetadata>(md.state_dict_metadata.at(fqn));
    return files_->ReadBox(info, fqn, dtype, c.sizes, c.offsets, t.size, Shape(c.sizes.size(), 0),
                           dst, false);
  }
  Result<std::string> ReadBytes(const Metadata& md, const std::string& fqn) override {
    return files_->ReadBytes(md.storage_data.at(MetadataIndex(fqn)), fqn);
  }

 private:
  std::unique_ptr<mega_storage::ShardFiles> files_;
};

class DistcpChunkSource final : public ChunkSource {
 public:
  DistcpChunkSource(const std::string& src, const Metadata& md,
                    std::shared_ptr<fs::FileSystem> fs) {
    FileSystemReaderOptions o;
    o.fs = std::move(fs);
    reader_ = NewFileSystemReader(src, o);
    setup_ = reader_->SetUpStorageReader(md, StorageSetUp{});
  }
  Status ReadChunk(const Metadata&, const std::string& fqn, DType, const ChunkStorageMetadata& c,
                   const Tensor& dst) override {
    internal::WholePieceRead r;
    r.index = MetadataIndex(fqn, c.offsets);
    r.dest = dst;
    return Read(r);
  }
  Result<std::string> ReadBytes(const Metadata&, const std::string& fqn) override {
    std::string value;
    internal::WholePieceRead r;
    r.index = MetadataIndex(fqn);
    r.is_bytes = true;
    r.bytes = &value;
    MEGA_RETURN_IF_ERROR(Read(r));
    return value;
  }

 private:
  // The reader is one object (its file cache is not shared across calls):
  // output files written in parallel take turns; each read is itself parallel.
  Status Read(const internal::WholePieceRead& r) {
    MEGA_RETURN_IF_ERROR(setup_);
    std::lock_guard<std::mutex> lock(mu_);
    return internal::ReadWholePieces(*reader_, {r});
  }
  std::unique_ptr<StorageReader> reader_;
  Status setup_;
  std::mutex mu_;
};

// Assembles entry `e` (a whole tensor) from its stored chunks into `buf`.
Result<Tensor> Assemble(const Metadata& md, const OutEntry& e, ChunkSource& files, Buffer& buf) {
  const auto& t = std::get<TensorStorageMetadata>(md.state_dict_metadata.at(e.fqn));
  MEGA_ASSIGN_OR_RETURN(std::byte * mem, buf.Get(e.nbytes));
  MEGA_ASSIGN_OR_RETURN(Tensor whole, Tensor::FromBlob(mem, e.dtype, e.shape));
  // The padding nibble of an odd-length F4 tensor (the buffer is reused).
  if (e.dtype == DType::kF4 && e.nbytes > 0) mem[e.nbytes - 1] = std::byte{0};
  for (const auto& c : t.chunks) {
    if (e.dtype == DType::kF4) {
      // F4 chunks need not start or end on a byte of the whole tensor: read the
      // chunk whole (verified) and copy its nibbles in (docs/dcp.md, F4 resharding).
      MEGA_ASSIGN_OR_RETURN(Tensor chunk, Tensor::Empty(DType::kF4, c.sizes));
      MEGA_RETURN_IF_ERROR(files.ReadChunk(md, e.fqn, e.dtype, c, chunk));
      MEGA_RETURN_IF_ERROR(CopyF4Box({static_cast<const std::byte*>(chunk.data()), c.sizes},
                                     Shape(c.sizes.size(), 0), {mem, e.shape}, c.offsets, c.sizes));
      continue;
    }
    Tensor view = whole;
    for (size_t d = 0; d < c.offsets.size(); ++d) {
      MEGA_ASSIGN_OR_RETURN(view, view.Narrow(static_cast<int>(d), c.offsets[d], c.sizes[d]));
    }
    MEGA_RETURN_IF_ERROR(files.ReadChunk(md, e.fqn, e.dtype, c, view));
  }
  return whole;
}

// What the DCP keys of one output file record: each entry stored whole (offsets
// 0, global shape = its shape), and the object paths the planner recorded.
struct OutFileKeys {
  std::map<std::string, mega_storage::ShardEntry> entries;
  std::map<std::string, ObjectPath> paths;

  void Add(const OutEntry& e, const Metadata& md) {
    mega_storage::ShardEntry se;
    se.is_bytes = e.is_bytes;
    se.dtype = e.dtype;
    if (!e.is_bytes) {
      se.global_shape = e.shape;
      se.offsets = Shape(e.shape.size(), 0);
    }
    entries[e.fqn] = se;
    auto p = md.planner_data.object_paths.find(e.fqn);
    if (p != md.planner_data.object_paths.end()) paths[e.fqn] = p->second;
  }
};

Status WriteMegaFile(fs::FileSystem& fs, const std::string& dir, const OutFile& f,
                     const std::vector<OutEntry>& entries, const Metadata& md,
                     const std::string& save_id, const ConsolidateOptions& o, ChunkSource& files) {
  std::vector<format::MegaEncoderTensor> specs;
  OutFileKeys keys;
  for (size_t k = 0; k < f.entries.size(); ++k) {
    const OutEntry& e = entries[f.entries[k]];
    keys.Add(e, md);
    specs.push_back({e.fqn, e.dtype, e.shape, o.checksum});
  }
  format::MegaMetadata meta;
  MEGA_RETURN_IF_ERROR(
      meta.Add(std::string(kDcpVersionKey), format::MetaValue::U32(kDcpShardVersion)));
  MEGA_RETURN_IF_ERROR(meta.Add(std::string(kDcpSaveIdKey), format::MetaValue::String(save_id)));
  MEGA_RETURN_IF_ERROR(
      meta.Add(std::string(kDcpEntriesKey),
               format::MetaValue::String(mega_storage::EncodeShardEntries(keys.entries))));
  if (!keys.paths.empty()) {
    MEGA_RETURN_IF_ERROR(
        meta.Add(std::string(kDcpObjectPathsKey),
                 format::MetaValue::String(mega_storage::EncodeObjectPaths(keys.paths))));
  }
  const std::string full = fs::JoinPath(dir, f.name);
  MEGA_ASSIGN_OR_RETURN(auto file, fs.OpenForWrite(full));
  if (!file->supports_write_at()) {
    return InvalidArgumentError(full +
                                ": consolidated output needs a filesystem with positioned writes");
  }
  MEGA_ASSIGN_OR_RETURN(
      auto writer, format::MegaEncoder::Plan(full, std::move(specs), std::move(meta),
                                             mega_storage::ShardEncoderOptions(64, o.checksum)));
  Buffer buf;
  for (size_t k = 0; k < f.entries.size(); ++k) {
    const OutEntry& e = entries[f.entries[k]];
    if (e.is_bytes) {
      MEGA_ASSIGN_OR_RETURN(std::string v, files.ReadBytes(md, e.fqn));
      MEGA_RETURN_IF_ERROR(writer->WriteTensorBytes(*file, k, AsBytes(v)));
      continue;
    }
    MEGA_ASSIGN_OR_RETURN(Tensor whole, Assemble(md, e, files, buf));
    MEGA_RETURN_IF_ERROR(writer->WriteTensor(*file, k, whole));
  }
  MEGA_RETURN_IF_ERROR(writer->FinishPositioned(*file));
  if (o.sync) MEGA_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

Status WriteSafetensorsFile(fs::FileSystem& fs, const std::string& dir, const OutFile& f,
                            const std::vector<OutEntry>& entries, const Metadata& md,
                            const std::string& save_id, const ConsolidateOptions& o,
                            ChunkSource& files) {
  std::vector<format::SafetensorsTensorSpec> specs;
  OutFileKeys keys;
  std::map<std::string, size_t> by_name;
  for (size_t idx : f.entries) {
    const OutEntry& e = entries[idx];
    specs.push_back({e.fqn, e.dtype, e.shape});
    by_name[e.fqn] = idx;
    keys.Add(e, md);
  }
  std::map<std::string, std::string> meta;
  meta["format"] = "pt";  // what transformers expects in __metadata__
  meta[std::string(kDcpVersionKey)] = std::to_string(kDcpShardVersion);
  meta[std::string(kDcpSaveIdKey)] = save_id;
  meta[std::string(kDcpEntriesKey)] = mega_storage::EncodeShardEntries(keys.entries);
  if (!keys.paths.empty()) {
    meta[std::string(kDcpObjectPathsKey)] = mega_storage::EncodeObjectPaths(keys.paths);
  }
  const std::string full = fs::JoinPath(dir, f.name);
  MEGA_ASSIGN_OR_RETURN(auto file, fs.OpenForWrite(full));
  MEGA_ASSIGN_OR_RETURN(auto writer, format::SafetensorsWriter::Start(file.get(), specs, meta));
  Buffer buf;
  for (const format::SafetensorsTensorInfo& info : writer->layout()) {
    const OutEntry& e = entries[by_name.at(info.name)];
    if (e.is_bytes) {
      MEGA_ASSIGN_OR_RETURN(std::string v, files.ReadBytes(md, e.fqn));
      MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBlob(v.data(), DType::kU8, e.shape));
      MEGA_RETURN_IF_ERROR(writer->WriteTensor(t));
      continue;
    }
    MEGA_ASSIGN_OR_RETURN(Tensor whole, Assemble(md, e, files, buf));
    MEGA_RETURN_IF_ERROR(writer->WriteTensor(whole));
  }
  MEGA_RETURN_IF_ERROR(writer->Finish());
  if (o.sync) MEGA_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// Storage info of every entry of the written files (read back from their headers).
Status DescribeOutputs(fs::FileSystem& fs, const std::string& dir,
                       const std::vector<OutFile>& files, const std::vector<OutEntry>& entries,
                       bool safetensors, Metadata* out) {
  for (const OutFile& f : files) {
    const std::string full = fs::JoinPath(dir, f.name);
    MEGA_ASSIGN_OR_RETURN(auto opened, fs.OpenForRead(full));
    std::map<std::string, StorageInfo> infos;
    if (safetensors) {
      std::shared_ptr<RandomAccessFile> rf(std::move(opened));
      MEGA_ASSIGN_OR_RETURN(auto reader, format::SafetensorsReader::Open(rf));
      for (const auto& t : reader->tensors()) {
        infos[t.name] = {
            f.name, reader->header().data_offset() + t.data_begin, t.nbytes(), "", 0, {}, ""};
      }
    } else {
      format::MegaReaderOptions ro;
      ro.verify_checksums = false;
      MEGA_ASSIGN_OR_RETURN(auto reader, format::MegaReader::Open(std::move(opened), ro));
      for (const auto& t : reader->tensors()) {
        std::string sum = mega_storage::MegaChecksumString(t);
        infos[t.name] = {f.name, t.file_offset, t.logical_nbytes, sum, 0, {}, ""};
      }
    }
    for (size_t idx : f.entries) {
      const OutEntry& e = entries[idx];
      auto it = infos.find(e.fqn);
      if (it == infos.end())
        return InternalError(full + ": consolidated entry " + e.fqn + " missing");
      if (e.is_bytes) {
        out->storage_data[MetadataIndex(e.fqn)] = it->second;
      } else {
        out->storage_data[MetadataIndex(e.fqn, Shape(e.shape.size(), 0))] = it->second;
      }
    }
  }
  return Status::OK();
}

}  // namespace

Result<ConsolidateResult> Consolidate(const std::string& src, const std::string& dst,
                                      const ConsolidateOptions& options,
                                      dist::ProcessGroup* group) {
  const int world = group ? group->world_size() : 1;
  const int rank = group ? group->rank() : 0;
  const bool collective = group && world > 1;
  const bool safetensors = options.format == ConsolidateFormat::kSafetensors;
  const std::string ext = safetensors ? ".safetensors" : ".mega";
  ConsolidateResult result;

  // Everything up to the write is local and deterministic; errors are agreed on.
  Metadata md;
  std::shared_ptr<fs::FileSystem> dst_fs;
  std::unique_ptr<ChunkSource> files;
  std::vector<OutEntry> entries;
  std::vector<OutFile> outs;
  Status local = [&]() -> Status {
    // An fs checkpoint (.metadata + .distcp) is read through FileSystemReader;
    // anything else through the MEGA storage reader.
    auto dcp = DescribeDcpCheckpoint(src, options.fs);
    if (dcp.ok() && dcp->layout == StorageLayout::kFileSystem) {
      md = std::move(dcp->metadata);
      std::shared_ptr<fs::FileSystem> src_fs = options.fs;
      if (!src_fs) {
        MEGA_ASSIGN_OR_RETURN(src_fs, fs::FileSystemForPath(src));
      }
      files = std::make_unique<DistcpChunkSource>(src, md, src_fs);
    } else {
      MegaStorageReaderOptions ro;
      ro.fs = options.fs;
      MegaStorageReader reader(src, ro);
      MEGA_ASSIGN_OR_RETURN(md, reader.ReadMetadata());
      MEGA_ASSIGN_OR_RETURN(auto src_paths, mega_storage::ResolveCheckpointPath(src, options.fs));
      files = std::make_unique<ShardChunkSource>(
          std::make_unique<mega_storage::ShardFiles>(src_paths.fs, src_paths.dir, true));
    }
    if (options.fs) {
      dst_fs = options.fs;
    } else {
      MEGA_ASSIGN_OR_RETURN(dst_fs, fs::FileSystemForPath(dst));
    }
    // Entries in fqn order, grouped by bucket, packed by max_shard_size.
    std::map<int, std::vector<size_t>> buckets;
    for (const auto& [fqn, value] : md.state_dict_metadata) {
      OutEntry e;
      e.fqn = fqn;
      if (std::holds_alternative<BytesStorageMetadata>(value)) {
        e.is_bytes = true;
        e.dtype = DType::kU8;
        const StorageInfo& info = md.storage_data.at(MetadataIndex(fqn));
        e.nbytes = info.length;
        e.shape = {static_cast<int64_t>(info.length)};
      } else {
        const auto& t = std::get<TensorStorageMetadata>(value);
        e.dtype = t.properties.dtype;
        e.shape = t.size;
        MEGA_ASSIGN_OR_RETURN(e.nbytes, LogicalNbytes(e.dtype, e.shape));
      }
      int bucket = 1;
      if (options.fqn_to_index_mapping) {
        auto it = options.fqn_to_index_mapping->find(fqn);
        if (it != options.fqn_to_index_mapping->end()) bucket = it->second;
      }
      if (bucket < 1) {
        return InvalidArgumentError("fqn_to_index_mapping maps " + fqn + " to " +
                                    std::to_string(bucket) + "; buckets start at 1");
      }
      buckets[bucket].push_back(entries.size());
      entries.push_back(std::move(e));
    }
    for (const auto& [bucket, members] : buckets) {
      uint64_t in_file = 0;
      bool open = false;
      for (size_t idx : members) {
        const uint64_t n = entries[idx].nbytes;
        if (!open ||
            (options.max_shard_size > 0 && in_file > 0 && in_file + n > options.max_shard_size)) {
          outs.emplace_back();
          in_file = 0;
          open = true;
        }
        outs.back().entries.push_back(idx);
        in_file += n;
      }
    }
    return Status::OK();
  }();
  if (collective) local = group->AllReduceStatus(local);
  MEGA_RETURN_IF_ERROR(local);

  // Names: plain unless taken in DST (decided by rank 0 for everyone).
  std::string save_id = mega_storage::NewSaveId();
  std::vector<std::string> plain;
  for (size_t n = 1; n <= outs.size(); ++n)
    plain.push_back(mega_storage::ShardFileName(ext, n, outs.size(), ""));
  std::string decision;
  if (rank == 0) {
    Status s = dst_fs->CreateDirectories(dst);
    auto taken = s.ok() ? mega_storage::AnyExists(*dst_fs, dst, plain) : Result<bool>(s);
    decision = taken.ok() ? ((*taken ? "I" : "P") + save_id) : "E" + taken.status().ToString();
  }
  if (collective) {
    MEGA_ASSIGN_OR_RETURN(decision, group->Broadcast(decision, 0));
  }
  if (decision.empty() || decision[0] == 'E') {
    return InternalError("consolidation: cannot prepare " + dst + ": " + decision.substr(1));
  }
  save_id = decision.substr(1);
  const std::string id_in_name = decision[0] == 'I' ? save_id : "";
  for (size_t n = 0; n < outs.size(); ++n) {
    outs[n].name = mega_storage::ShardFileName(ext, n + 1, outs.size(), id_in_name);
  }

  // Write this rank's files.
  std::vector<size_t> mine;
  for (size_t f = rank; f < outs.size(); f += world) mine.push_back(f);
  std::vector<std::string> written;
  std::mutex mu;
  std::unique_ptr<ThreadPool> pool;
  const int par = std::max(options.thread_count, 1);
  if (par > 1) pool = std::make_unique<ThreadPool>(par - 1);
  local = ParallelFor(
      pool.get(), mine.size(),
      [&](size_t k) -> Status {
        const OutFile& f = outs[mine[k]];
        {
          std::lock_guard<std::mutex> lock(mu);
          written.push_back(fs::JoinPath(dst, f.name));
        }
        return safetensors
                   ? WriteSafetensorsFile(*dst_fs, dst, f, entries, md, save_id, options, *files)
                   : WriteMegaFile(*dst_fs, dst, f, entries, md, save_id, options, *files);
      },
      par);
  if (collective) local = group->AllReduceStatus(local);
  if (!local.ok()) {
    for (const auto& w : written) dst_fs->Remove(w).IgnoreError();
    return local;
  }

  // Commit (rank 0), then agree.
  Status outcome;
  if (rank == 0) {
    outcome = [&]() -> Status {
      Metadata out;
      for (const OutEntry& e : entries) {
        if (e.is_bytes) {
          out.state_dict_metadata[e.fqn] = BytesStorageMetadata{};
        } else {
          TensorStorageMetadata t;
          t.properties.dtype = e.dtype;
          t.size = e.shape;
          t.chunks.push_back({Shape(e.shape.size(), 0), e.shape});
          out.state_dict_metadata[e.fqn] = std::move(t);
        }
      }
      out.planner_data = md.planner_data;
      StorageMeta sm;
      sm.checkpoint_id = dst;
      sm.save_id = save_id;
      if (md.storage_meta) sm.modules = md.storage_meta->modules;
      out.storage_meta = sm;
      out.version = md.version;
      MEGA_RETURN_IF_ERROR(DescribeOutputs(*dst_fs, dst, outs, entries, safetensors, &out));
      MEGA_RETURN_IF_ERROR(ValidateMetadata(out));
      mega_storage::CommitRequest req;
      req.dir = dst;
      req.metadata_name = std::string(kMetadataFileName);
      req.index_name =
          std::string(safetensors ? kSafetensorsStorageIndexName : kMegaStorageIndexName);
      req.other_index_name =
          std::string(safetensors ? kMegaStorageIndexName : kSafetensorsStorageIndexName);
      req.sync = options.sync;
      MEGA_ASSIGN_OR_RETURN(req.index, mega_storage::BuildIndex(out, !safetensors));
      req.metadata = std::move(out);
      auto prev = mega_storage::ReadPreviousState(*dst_fs, dst, req.metadata_name, req.index_name);
      return mega_storage::Commit(*dst_fs, req, prev);
    }();
  }
  // A failed commit (rank 0) leaves the previous content of DST; rank 0 removes
  // every rank's outputs (names are known to all). Other ranks never remove
  // anything at this point: they cannot tell a failed commit from a broken group
  // after a successful one.
  if (rank == 0 && !outcome.ok()) {
    for (const OutFile& f : outs) dst_fs->Remove(fs::JoinPath(dst, f.name)).IgnoreError();
  }
  if (collective) outcome = group->AllReduceStatus(outcome);
  MEGA_RETURN_IF_ERROR(outcome);
  for (const OutFile& f : outs) result.files.push_back(f.name);
  for (const OutEntry& e : entries) result.total_size += e.nbytes;
  result.entries = entries.size();
  result.index_file =
      std::string(safetensors ? kSafetensorsStorageIndexName : kMegaStorageIndexName);
  return result;
}

}  // namespace megackpt::dcp
