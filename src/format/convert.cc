// Checkpoint opening and MEGA <-> safetensors conversion (include/megackpt/format/convert.h).
#include "megackpt/format/convert.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "megackpt/core/file.h"
#include "megackpt/core/path_safety.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/text.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace megackpt::format {
namespace {

namespace stdfs = std::filesystem;

// The folder of `path` for creating siblings: "." when it has none.
std::string ParentDir(const std::string& path) {
  std::string dir = stdfs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  return stdfs::exists(a, ec) && stdfs::exists(b, ec) && stdfs::equivalent(a, b, ec);
}

// A reusable, pre-faulted staging buffer that grows on demand.
class StagingBuffer {
 public:
  Result<std::byte*> Get(size_t n) {
    if (n > cap_) {
      MEGA_ASSIGN_OR_RETURN(buf_, AllocateBuffer(n, /*prefault=*/true));
      cap_ = n;
    }
    return buf_.get();
  }

 private:
  std::shared_ptr<std::byte> buf_;
  size_t cap_ = 0;
};

constexpr size_t kCopyChunk = 64u << 20;

// Memory for decoded tensors that the MEGA writer must reference until it
// finishes: an unlinked temp file mapped shared, so the pages are page cache
// the kernel can write back rather than anonymous memory (bounded RSS).
class SpillArena {
 public:
  static Result<std::shared_ptr<SpillArena>> Create(const std::string& dir, uint64_t bytes) {
    auto arena = std::shared_ptr<SpillArena>(new SpillArena());
    if (bytes == 0) return arena;
    std::string tmpl = dir + "/.megackpt-spill-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int fd = mkstemp(buf.data());
    if (fd < 0) return ErrnoToStatus(tmpl + ": create spill file", errno);
    unlink(buf.data());
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int err = errno;
      close(fd);
      return ErrnoToStatus(std::string(buf.data()) + ": size spill file", err);
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) return ErrnoToStatus("mmap spill file", err);
    arena->base_ = static_cast<std::byte*>(p);
    arena->size_ = bytes;
    return arena;
  }
  ~SpillArena() {
    if (base_) munmap(base_, size_);
  }
  // REQUIRES: total allocations <= the size given to Create.
  std::byte* Allocate(uint64_t n) {
    std::byte* p = base_ + used_;
    used_ += n;
    return p;
  }

 private:
  SpillArena() = default;
  std::byte* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t used_ = 0;
};

// Forwards to a listener that may be null.
struct Events {
  ConvertListener* listener;
  void Bytes(uint64_t n) const {
    if (listener) listener->OnBytesWritten(n);
  }
  void Begin(const std::string& path) const {
    if (listener) listener->OnFileWriteBegin(path);
  }
  void End(const std::string& path) const {
    if (listener) listener->OnFileWriteEnd(path);
  }
};

Status WriteSafetensorsShard(const OpenedCheckpoint& src, const std::vector<size_t>& ids,
                             const std::string& path,
                             const std::map<std::string, std::string>& metadata,
                             const ConvertOptions& o, const Events& events,
                             StagingBuffer& staging) {
  std::vector<SafetensorsTensorSpec> specs;
  std::map<std::string_view, const CheckpointTensor*> by_name;
  for (size_t id : ids) {
    const CheckpointTensor& t = src.tensors[id];
    specs.push_back({t.name, t.dtype, t.shape});
    by_name.emplace(t.name, &t);
  }
  MEGA_ASSIGN_OR_RETURN(auto out, CreateLocalFile(path));
  MEGA_ASSIGN_OR_RETURN(auto writer,
                        SafetensorsWriter::Start(out.get(), std::move(specs), metadata));
  for (const auto& info : writer->layout()) {
    const CheckpointTensor& t = *by_name.at(info.name);
    const CheckpointFile& f = src.files[t.file];
    if (f.safetensors) {
      // Raw bytes: chunked pread into a reused buffer, appended as they come.
      for (uint64_t off = 0; off < t.nbytes; off += kCopyChunk) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(kCopyChunk, t.nbytes - off));
        MEGA_ASSIGN_OR_RETURN(std::byte * buf,
                              staging.Get(std::min<uint64_t>(kCopyChunk, t.nbytes)));
        MEGA_RETURN_IF_ERROR(f.safetensors->ReadRange(t.name, off, std::span<std::byte>(buf, n)));
        MEGA_RETURN_IF_ERROR(writer->AppendData(std::span<const std::byte>(buf, n)));
        events.Bytes(n);
      }
    } else {
      // MEGA: decode (and verify the checksum) into a buffer of the tensor's size.
      MEGA_ASSIGN_OR_RETURN(std::byte * buf, staging.Get(std::max<uint64_t>(t.nbytes, 1)));
      MEGA_ASSIGN_OR_RETURN(Tensor dst, Tensor::FromBlob(buf, t.dtype, t.shape));
      MEGA_RETURN_IF_ERROR(f.mega->ReadTensor(t.index, dst));
      MEGA_RETURN_IF_ERROR(writer->WriteTensor(dst));
      events.Bytes(t.nbytes);
    }
  }
  MEGA_RETURN_IF_ERROR(writer->Finish());
  if (o.sync) MEGA_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

Status WriteMegaShard(const OpenedCheckpoint& src, const std::vector<size_t>& ids,
                      const std::string& path, const std::map<std::string, std::string>& metadata,
                      const ConvertOptions& o, const Events& events) {
  MegaWriterOptions wo;
  wo.alignment = o.alignment;
  wo.checksum = o.checksum;
  wo.compression = o.compression;
  wo.zstd_level = o.zstd_level;
  wo.byte_shuffle = o.shuffle;
  MegaWriter writer(wo);
  for (const auto& [k, v] : metadata) {
    MEGA_RETURN_IF_ERROR(
        writer.AddMetadata(std::string(kSafetensorsMetadataPrefix) + k, MetaValue::String(v)));
  }
  // Decoded MEGA tensors (compressed/shuffled/chunked sources) go to a spill arena.
  uint64_t spill_bytes = 0;
  for (size_t id : ids) {
    const CheckpointTensor& t = src.tensors[id];
    const CheckpointFile& f = src.files[t.file];
    if (f.mega && !f.mega->tensors()[t.index].is_plain()) spill_bytes += t.nbytes;
  }
  MEGA_ASSIGN_OR_RETURN(auto arena, SpillArena::Create(ParentDir(path), spill_bytes));
  uint64_t shard_bytes = 0;
  std::vector<std::pair<void*, size_t>> mapped_ranges;
  for (size_t id : ids) {
    const CheckpointTensor& t = src.tensors[id];
    const CheckpointFile& f = src.files[t.file];
    Tensor view;
    if (f.safetensors) {
      MEGA_ASSIGN_OR_RETURN(view, f.safetensors->View(t.name));
    } else if (f.mega->tensors()[t.index].is_plain()) {
      MEGA_ASSIGN_OR_RETURN(view, f.mega->MappedTensor(t.name));  // checksum verified
    } else {
      MEGA_ASSIGN_OR_RETURN(view, Tensor::FromBlob(arena->Allocate(t.nbytes), t.dtype, t.shape,
                                                   std::shared_ptr<void>(arena)));
      MEGA_RETURN_IF_ERROR(f.mega->ReadTensor(t.index, view));
    }
    // Populate the page tables of a mapped source range in one call: copying
    // out of a mapping page fault by page fault is several times slower.
    const bool mapped_source = f.safetensors || f.mega->tensors()[t.index].is_plain();
    if (t.nbytes > 0 && mapped_source) {
      uintptr_t start = reinterpret_cast<uintptr_t>(view.data()) & ~uintptr_t{4095};
      uintptr_t end = reinterpret_cast<uintptr_t>(view.data()) + t.nbytes;
      madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_READ);
      mapped_ranges.emplace_back(reinterpret_cast<void*>(start), end - start);
    }
    MEGA_RETURN_IF_ERROR(writer.AddTensor(t.name, view));
    shard_bytes += t.nbytes;
  }
  events.Begin(path);
  auto result = writer.WriteFile(path, o.sync);
  events.End(path);
  // Drop this shard's source pages from our page tables (they stay in the page
  // cache): the process then maps at most one output shard of source at a time.
  for (const auto& [start, len] : mapped_ranges) madvise(start, len, MADV_DONTNEED);
  MEGA_RETURN_IF_ERROR(result.status());
  events.Bytes(shard_bytes);
  return Status::OK();
}

}  // namespace

// ---- names ---------------------------------------------------------------------------

std::string_view ModelFormatName(ModelFormat f) {
  return f == ModelFormat::kMega ? "mega" : "safetensors";
}

std::string_view ModelFormatExtension(ModelFormat f) {
  return f == ModelFormat::kMega ? ".mega" : ".safetensors";
}

std::string_view CheckpointKindName(CheckpointKind k) {
  switch (k) {
    case CheckpointKind::kMegaFile:
      return "mega";
    case CheckpointKind::kSafetensorsFile:
      return "safetensors";
    case CheckpointKind::kMegaIndex:
      return "mega-index";
    case CheckpointKind::kSafetensorsIndex:
      return "safetensors-index";
  }
  return "?";
}

bool IsIndexKind(CheckpointKind k) {
  return k == CheckpointKind::kMegaIndex || k == CheckpointKind::kSafetensorsIndex;
}

// ---- inputs --------------------------------------------------------------------------

Result<ModelFormat> SniffModelFormat(const std::string& path) {
  if (std::string_view(path).ends_with(".mega")) return ModelFormat::kMega;
  if (std::string_view(path).ends_with(".safetensors")) return ModelFormat::kSafetensors;
  MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(path));
  std::byte head[9] = {};
  MEGA_ASSIGN_OR_RETURN(size_t n, file->ReadAt(0, head));
  if (n >= 4 && std::memcmp(head, "MEGA", 4) == 0) return ModelFormat::kMega;
  if (n >= 9 && head[8] == std::byte{'{'}) return ModelFormat::kSafetensors;
  return InvalidArgumentError(path + ": neither a MEGA nor a safetensors file");
}

Result<CheckpointPath> ResolveCheckpointPath(const std::string& path) {
  std::error_code ec;
  auto st = stdfs::status(path, ec);
  if (ec || !stdfs::exists(st)) return NotFoundError(path + ": no such file or directory");
  if (stdfs::is_directory(st)) {
    std::vector<std::string> indexes, models;
    for (const auto& e : stdfs::directory_iterator(path, ec)) {
      if (!e.is_regular_file()) continue;
      std::string name = e.path().filename().string();
      if (IndexKindFromPath(name)) {
        indexes.push_back(e.path().string());
      } else if (std::string_view(name).ends_with(".mega") ||
                 std::string_view(name).ends_with(".safetensors")) {
        models.push_back(e.path().string());
      }
    }
    std::sort(indexes.begin(), indexes.end());
    std::sort(models.begin(), models.end());
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& p : v) s += (s.empty() ? "" : ", ") + stdfs::path(p).filename().string();
      return s;
    };
    if (indexes.size() > 1) {
      return InvalidArgumentError(path + ": several index files (" + list(indexes) +
                                  "); pass the one you mean");
    }
    if (indexes.size() == 1) return ResolveCheckpointPath(indexes[0]);
    if (models.size() == 1) return ResolveCheckpointPath(models[0]);
    if (models.empty()) {
      if (stdfs::exists(stdfs::path(path) / ".metadata", ec)) {
        return InvalidArgumentError(
            path +
            ": folder holds a DCP checkpoint in fs layout (.metadata + .distcp data "
            "files), no *.index.json, .mega or .safetensors file; `megackpt consolidate "
            "SRC DST` turns it into whole tensors");
      }
      return InvalidArgumentError(path +
                                  ": folder has no *.index.json, .mega or .safetensors file");
    }
    return InvalidArgumentError(path + ": folder has several model files (" + list(models) +
                                ") and no index; pass one file");
  }
  if (auto kind = IndexKindFromPath(path)) {
    return CheckpointPath{
        *kind == IndexKind::kMega ? CheckpointKind::kMegaIndex : CheckpointKind::kSafetensorsIndex,
        path};
  }
  if (std::string_view(path).ends_with(".index.json")) {
    // An index without the usual double extension: decide by its shard names.
    MEGA_ASSIGN_OR_RETURN(ShardIndex index, ReadShardIndexFile(path));
    bool mega = !index.weight_map.empty() && index.weight_map.begin()->second.ends_with(".mega");
    return CheckpointPath{mega ? CheckpointKind::kMegaIndex : CheckpointKind::kSafetensorsIndex,
                          path};
  }
  MEGA_ASSIGN_OR_RETURN(ModelFormat f, SniffModelFormat(path));
  return CheckpointPath{
      f == ModelFormat::kMega ? CheckpointKind::kMegaFile : CheckpointKind::kSafetensorsFile, path};
}

// ---- opened checkpoints --------------------------------------------------------------

ModelFormat OpenedCheckpoint::format() const {
  return files.empty() ? ModelFormat::kSafetensors : files[0].format;
}

Result<CheckpointFile> OpenCheckpointFile(const std::string& path, const std::string& name,
                                          const OpenCheckpointOptions& options) {
  CheckpointFile f;
  f.path = path;
  f.name = name;
  MEGA_ASSIGN_OR_RETURN(f.format, SniffModelFormat(path));
  if (f.format == ModelFormat::kMega) {
    MegaReaderOptions mo;
    mo.use_mmap = options.mmap;
    mo.verify_checksums = options.verify_checksums;
    MEGA_ASSIGN_OR_RETURN(f.mega, MegaReader::OpenFile(path, mo));
  } else {
    MEGA_ASSIGN_OR_RETURN(f.safetensors, SafetensorsReader::Open(path, {.mmap = options.mmap}));
  }
  return f;
}

void AppendCheckpointFileTensors(OpenedCheckpoint* checkpoint, size_t file_id,
                                 const std::set<std::string>* only) {
  const CheckpointFile& f = checkpoint->files[file_id];
  auto add = [&](const std::string& name, DType dtype, const Shape& shape, uint64_t nbytes,
                 size_t i) {
    if (only && !only->count(name)) return;
    checkpoint->tensors.push_back({name, dtype, shape, nbytes, file_id, i});
    checkpoint->total_bytes += nbytes;
  };
  if (f.mega) {
    const auto& ts = f.mega->tensors();
    for (size_t i = 0; i < ts.size(); ++i)
      add(ts[i].name, ts[i].dtype, ts[i].shape, ts[i].logical_nbytes, i);
  } else {
    const auto& ts = f.safetensors->tensors();
    for (size_t i = 0; i < ts.size(); ++i)
      add(ts[i].name, ts[i].dtype, ts[i].shape, ts[i].nbytes(), i);
  }
}

Result<OpenedCheckpoint> OpenCheckpoint(const CheckpointPath& input,
                                        const OpenCheckpointOptions& options) {
  OpenedCheckpoint model;
  model.input = input;
  if (!IsIndexKind(input.kind)) {
    MEGA_ASSIGN_OR_RETURN(
        CheckpointFile f,
        OpenCheckpointFile(input.path, stdfs::path(input.path).filename().string(), options));
    model.files.push_back(std::move(f));
    AppendCheckpointFileTensors(&model, 0);
    return model;
  }
  MEGA_ASSIGN_OR_RETURN(ShardIndex index, ReadShardIndexFile(input.path));
  const std::string folder = stdfs::path(input.path).parent_path().string();
  model.has_sharded_entries = index.extra_fields.count("tensorplay.dcp.sharded") > 0;
  for (const std::string& shard : index.ShardFiles()) {
    const std::string path = folder.empty() ? shard : folder + "/" + shard;
    MEGA_RETURN_IF_ERROR(CheckResolvesInside(folder.empty() ? "." : folder, path));
    auto f = OpenCheckpointFile(path, shard, options);
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return NotFoundError(input.path + ": shard '" + shard +
                             "' listed in the index is missing (" + path + ")");
      }
      return f.status();
    }
    model.files.push_back(std::move(*f));
    auto names = index.TensorsInShard(shard);
    std::set<std::string> wanted(names.begin(), names.end());
    size_t before = model.tensors.size();
    {
      const CheckpointFile& cf = model.files.back();
      auto note = [&](const std::string& name) {
        if (!wanted.count(name)) model.unlisted_tensors.push_back(shard + ":" + name);
      };
      if (cf.mega) {
        for (const auto& t : cf.mega->tensors()) note(t.name);
      } else {
        for (const auto& t : cf.safetensors->tensors()) note(t.name);
      }
    }
    AppendCheckpointFileTensors(&model, model.files.size() - 1, &wanted);
    if (model.tensors.size() - before != wanted.size()) {
      std::set<std::string> found;
      for (size_t i = before; i < model.tensors.size(); ++i) found.insert(model.tensors[i].name);
      for (const auto& n : wanted) {
        if (!found.count(n)) {
          return DataLossError(input.path + ": index maps tensor '" + n + "' to shard '" + shard +
                               "' but " + path + " has no such tensor");
        }
      }
    }
  }
  model.index = std::move(index);
  return model;
}

std::map<std::string, std::string> PortableMetadata(const OpenedCheckpoint& checkpoint) {
  std::map<std::string, std::string> out;
  for (const auto& f : checkpoint.files) {
    if (f.safetensors) {
      for (const auto& [k, v] : f.safetensors->metadata()) out.emplace(k, v);
    } else {
      for (const auto& e : f.mega->metadata().entries()) {
        if (e.key.rfind(kSafetensorsMetadataPrefix, 0) != 0 || !e.value.is_string()) continue;
        out.emplace(e.key.substr(kSafetensorsMetadataPrefix.size()),
                    std::string(*e.value.AsString()));
      }
    }
  }
  return out;
}

// ---- planning ------------------------------------------------------------------------

Result<ConvertDestination> PlanDestination(const std::string& dst, ModelFormat source_format,
                                           const ConvertOptions& o) {
  ConvertDestination plan;
  auto contradicts = [&](ModelFormat f, std::string_view what) -> Status {
    if (!o.format || *o.format == f) return Status::OK();
    return InvalidArgumentError(dst + ": --format " + std::string(ModelFormatName(*o.format)) +
                                " contradicts the " + std::string(what));
  };
  auto single = [&](ModelFormat f) -> Result<ConvertDestination> {
    MEGA_RETURN_IF_ERROR(contradicts(f, "file extension"));
    if (o.max_shard_size) {
      return InvalidArgumentError("--max-shard-size needs a folder destination (" + dst +
                                  " is a single file)");
    }
    plan.format = f;
    plan.single_path = dst;
    return plan;
  };
  if (std::string_view(dst).ends_with(".safetensors")) return single(ModelFormat::kSafetensors);
  if (std::string_view(dst).ends_with(".mega")) return single(ModelFormat::kMega);
  plan.folder = true;
  if (auto kind = IndexKindFromPath(dst)) {
    ModelFormat f = *kind == IndexKind::kMega ? ModelFormat::kMega : ModelFormat::kSafetensors;
    MEGA_RETURN_IF_ERROR(contradicts(f, "index name"));
    plan.format = f;
    plan.index_path = dst;
    plan.dir = ParentDir(dst);
    std::string file = stdfs::path(dst).filename().string();
    plan.base =
        file.substr(0, file.size() - (f == ModelFormat::kMega ? kMegaIndexSuffix.size()
                                                              : kSafetensorsIndexSuffix.size()));
    if (plan.base.empty()) return InvalidArgumentError(dst + ": index name has no base name");
    return plan;
  }
  std::error_code ec;
  if (stdfs::exists(dst, ec) && !stdfs::is_directory(dst, ec)) {
    return InvalidArgumentError(dst +
                                ": exists and is not a folder (use a .mega or .safetensors "
                                "name for a single-file output)");
  }
  plan.format = o.format ? *o.format
                         : (source_format == ModelFormat::kMega ? ModelFormat::kSafetensors
                                                                : ModelFormat::kMega);
  plan.dir = dst;
  plan.index_path =
      dst + "/" + plan.base + std::string(ModelFormatExtension(plan.format)) + ".index.json";
  return plan;
}

std::string ConvertShardFileName(const std::string& base, size_t i, size_t n, ModelFormat f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu", i + 1, n);
  return base + buf + std::string(ModelFormatExtension(f));
}

std::vector<std::vector<size_t>> PlanShards(const std::vector<CheckpointTensor>& tensors,
                                            uint64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  uint64_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t n = tensors[i].nbytes;
    if (shards.empty() || (!shards.back().empty() && current + n > max_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += n;
  }
  if (shards.empty()) shards.emplace_back();
  return shards;
}

Result<ConvertPlan> PlanConversion(const OpenedCheckpoint& source,
                                   const ConvertDestination& destination,
                                   const ConvertOptions& options) {
  // Never drop an entry: chunks of sharded tensors are not tensors of the
  // output; they must be assembled first.
  if (source.has_sharded_entries || !source.unlisted_tensors.empty()) {
    std::string what = source.has_sharded_entries
                           ? "its index lists tensors stored in chunks (\"tensorplay.dcp.sharded\")"
                           : std::to_string(source.unlisted_tensors.size()) +
                                 " tensors in its shards are not in the weight_map (first: " +
                                 Quote(source.unlisted_tensors[0]) + ")";
    return FailedPreconditionError(
        source.input.path + " is a sharded checkpoint: " + what +
        "; convert would drop them. Run `megackpt consolidate SRC DST` first (whole tensors, "
        "MEGA or --format safetensors), then convert the result");
  }
  ConvertPlan plan;
  plan.destination = destination;
  std::vector<std::vector<size_t>> groups;
  if (destination.folder) {
    groups = PlanShards(source.tensors, options.max_shard_size.value_or(kDefaultMaxShardSize));
  } else {
    groups.emplace_back();
    for (size_t i = 0; i < source.tensors.size(); ++i) groups[0].push_back(i);
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    ConvertShard shard;
    if (destination.folder) {
      shard.name = ConvertShardFileName(destination.base, i, groups.size(), destination.format);
      shard.path = destination.dir + "/" + shard.name;
    } else {
      shard.name = stdfs::path(destination.single_path).filename().string();
      shard.path = destination.single_path;
    }
    shard.tensor_ids = std::move(groups[i]);
    plan.shards.push_back(std::move(shard));
  }
  if (destination.folder && SameFile(destination.index_path, source.input.path)) {
    return InvalidArgumentError(destination.index_path + " would overwrite its own source index");
  }
  for (const auto& shard : plan.shards) {
    for (const auto& f : source.files) {
      if (SameFile(shard.path, f.path)) {
        return InvalidArgumentError(shard.path + " would overwrite its own source " + f.path);
      }
    }
  }
  return plan;
}

// ---- writing -------------------------------------------------------------------------

Status WriteConversion(const OpenedCheckpoint& source, const ConvertPlan& plan,
                       const ConvertOptions& options, ConvertListener* listener) {
  const ConvertDestination& dest = plan.destination;
  if (dest.folder) MEGA_RETURN_IF_ERROR(CreateDirectories(dest.dir));
  const auto metadata = PortableMetadata(source);
  const Events events{listener};
  StagingBuffer staging;
  ShardIndex index;
  for (const ConvertShard& shard : plan.shards) {
    // Each shard is written under a temp name and renamed when complete, so an
    // interrupted convert never leaves a truncated file under a final name.
    const std::string tmp = shard.path + ".tmp-" + std::to_string(getpid());
    Status status = dest.format == ModelFormat::kSafetensors
                        ? WriteSafetensorsShard(source, shard.tensor_ids, tmp, metadata, options,
                                                events, staging)
                        : WriteMegaShard(source, shard.tensor_ids, tmp, metadata, options, events);
    if (status.ok() && std::rename(tmp.c_str(), shard.path.c_str()) != 0) {
      status = ErrnoToStatus(shard.path + ": rename from " + tmp, errno);
    }
    if (!status.ok()) {
      unlink(tmp.c_str());
      return status;
    }
    for (size_t id : shard.tensor_ids) index.weight_map[source.tensors[id].name] = shard.name;
  }
  if (!dest.folder) return options.sync ? SyncDirectory(ParentDir(dest.single_path)) : Status::OK();
  index.total_size = source.total_bytes;
  if (dest.format == ModelFormat::kMega) AddMegatensorsFields(&index);
  if (options.sync) MEGA_RETURN_IF_ERROR(SyncDirectory(dest.dir));
  return WriteShardIndexFile(dest.index_path, index, options.sync);
}

Result<ConvertSummary> ConvertCheckpoint(const std::string& src, const std::string& dst,
                                         const ConvertOptions& options, ConvertListener* listener) {
  MEGA_ASSIGN_OR_RETURN(CheckpointPath input, ResolveCheckpointPath(src));
  MEGA_ASSIGN_OR_RETURN(OpenedCheckpoint source,
                        OpenCheckpoint(input, {.mmap = true, .verify_checksums = true}));
  MEGA_ASSIGN_OR_RETURN(ConvertDestination dest, PlanDestination(dst, source.format(), options));
  MEGA_ASSIGN_OR_RETURN(ConvertPlan plan, PlanConversion(source, dest, options));
  MEGA_RETURN_IF_ERROR(WriteConversion(source, plan, options, listener));
  ConvertSummary summary;
  summary.source_kind = input.kind;
  summary.num_tensors = source.tensors.size();
  summary.total_bytes = source.total_bytes;
  summary.destination = std::move(plan.destination);
  for (const auto& shard : plan.shards) summary.files.push_back(shard.path);
  return summary;
}

}  // namespace megackpt::format
