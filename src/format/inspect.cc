// Inspect and verify (include/megackpt/format/inspect.h). Moved out of the CLI so
// the Python package reports exactly what `megackpt inspect --json` / `verify` do.
#include "megackpt/format/inspect.h"

#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "megackpt/core/path_safety.h"
#include "megackpt/core/text.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/safetensors.h"

namespace megackpt::format {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

json MetadataObject(const OpenedCheckpoint& model) {
  json out = json::object();
  if (model.index) {
    for (const auto& [k, text] : model.index->extra_metadata) {
      out[k] = json::parse(text, nullptr, false);
    }
    if (model.index->total_size) out["total_size"] = *model.index->total_size;
    return out;
  }
  if (model.files.empty()) return out;
  const CheckpointFile& f = model.files[0];
  if (f.safetensors) {
    for (const auto& [k, v] : f.safetensors->metadata()) out[k] = v;
  } else {
    for (const auto& e : f.mega->metadata().entries()) {
      json v = json::parse(e.value.ToJson(), nullptr, false);
      out[e.key] = v.is_discarded() ? json(e.value.ToJson()) : v;
    }
  }
  return out;
}

// Problems found by verification, from several threads.
class ProblemList {
 public:
  void Add(std::string msg) {
    std::lock_guard<std::mutex> lock(mu_);
    problems_.push_back(std::move(msg));
  }
  void Add(const Status& s) { Add(s.ToString()); }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return problems_.size();
  }
  std::vector<std::string> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(problems_);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> problems_;
};

// Verifies one opened file: every MEGA tensor's checksum (all tensors are
// checked, every failure is reported). safetensors has no checksums: its
// header was fully validated when it was opened.
void VerifyModelFile(const CheckpointFile& f, ProblemList& problems, uint64_t* checked_tensors) {
  if (!f.mega) {
    *checked_tensors += f.safetensors->tensors().size();
    return;
  }
  const size_t n = f.mega->tensors().size();
  Status s = ParallelFor(&ThreadPool::Default(), n, [&](size_t i) {
    Status v = f.mega->VerifyTensor(i);
    if (!v.ok()) problems.Add(v);
    return Status::OK();
  });
  if (!s.ok()) problems.Add(s);
  *checked_tensors += n;
}

void VerifyIndex(const CheckpointPath& input, const OpenCheckpointOptions& options,
                 ProblemList& problems, VerifyReport* report) {
  auto index = ReadShardIndexFile(input.path);
  if (!index.ok()) {
    problems.Add(index.status());
    return;
  }
  const std::string folder = stdfs::path(input.path).parent_path().string();
  uint64_t mapped_bytes = 0;
  // A sharded DCP checkpoint (MegaStorageWriter, docs/mega-storage.md) lists the
  // chunks of sharded tensors under "tensorplay.dcp.sharded": fqn -> {chunks:
  // [{file, offsets, sizes}]}; weight_map then holds only whole entries.
  std::map<std::string, std::set<std::string>> chunk_files;  // fqn -> files
  std::set<std::string> shard_set;
  for (const std::string& shard : index->ShardFiles()) shard_set.insert(shard);
  if (auto it = index->extra_fields.find("tensorplay.dcp.sharded");
      it != index->extra_fields.end()) {
    json sharded = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    if (!sharded.is_object()) {
      problems.Add("DataLoss: " + input.path + ": 'tensorplay.dcp.sharded' is not an object");
    } else {
      for (const auto& [fqn, entry] : sharded.items()) {
        const json* chunks =
            entry.is_object() && entry.contains("chunks") ? &entry["chunks"] : nullptr;
        if (chunks == nullptr || !chunks->is_array()) {
          problems.Add("DataLoss: " + input.path + ": sharded entry " + Quote(fqn) +
                       " has no chunk list");
          continue;
        }
        for (const auto& c : *chunks) {
          if (!c.is_object() || !c.contains("file") || !c["file"].is_string()) {
            problems.Add("DataLoss: " + input.path + ": a chunk of " + Quote(fqn) +
                         " names no file");
            continue;
          }
          std::string file = c["file"].get<std::string>();
          if (Status ok = ValidateShardFileName(file); !ok.ok()) {
            problems.Add(ok.ToString());
            continue;
          }
          chunk_files[fqn].insert(file);
          shard_set.insert(file);
        }
      }
    }
  }
  for (const std::string& shard : shard_set) {
    ++report->files;
    const std::string shard_path = folder.empty() ? shard : folder + "/" + shard;
    // Shard names stay inside the index's folder, symlinks included.
    if (Status inside = CheckResolvesInside(folder.empty() ? "." : folder, shard_path);
        !inside.ok()) {
      problems.Add(inside.ToString());
      continue;
    }
    auto f = OpenCheckpointFile(shard_path, shard, options);
    if (!f.ok()) {
      problems.Add(f.status().code() == StatusCode::kNotFound
                       ? "NotFound: " + input.path + ": shard " + Quote(shard) +
                             " listed in the index is missing (" + shard_path + ")"
                       : f.status().ToString());
      continue;
    }
    size_t before = problems.size();
    // The weight_map must be truthful in both directions.
    std::set<std::string> in_file;
    OpenedCheckpoint m;
    m.files.push_back(std::move(*f));
    AppendCheckpointFileTensors(&m, 0);
    for (const auto& t : m.tensors) {
      in_file.insert(t.name);
      auto it = index->weight_map.find(t.name);
      auto ct = chunk_files.find(t.name);
      if (it == index->weight_map.end() && ct != chunk_files.end() && ct->second.count(shard)) {
        mapped_bytes += t.nbytes;  // a listed chunk of a sharded tensor
      } else if (it == index->weight_map.end()) {
        problems.Add("DataLoss: " + shard_path + ": tensor " + Quote(t.name) +
                     " is not listed in the index's weight_map");
      } else if (it->second != shard) {
        problems.Add("DataLoss: " + shard_path + ": tensor " + Quote(t.name) + " is mapped to " +
                     Quote(it->second) + " by the index");
      } else {
        mapped_bytes += t.nbytes;
      }
    }
    for (const auto& [fqn, files_of_fqn] : chunk_files) {
      if (files_of_fqn.count(shard) && !in_file.count(fqn)) {
        problems.Add("DataLoss: " + input.path + ": index lists a chunk of " + Quote(fqn) +
                     " in shard " + Quote(shard) + " but " + shard_path + " has no such tensor");
      }
    }
    for (const auto& name : index->TensorsInShard(shard)) {
      if (!in_file.count(name)) {
        problems.Add("DataLoss: " + input.path + ": index maps tensor " + Quote(name) +
                     " to shard " + Quote(shard) + " but " + shard_path + " has no such tensor");
      }
    }
    VerifyModelFile(m.files[0], problems, &report->tensors);
    report->bytes += m.total_bytes;
    if (problems.size() == before) ++report->files_ok;
  }
  if (problems.size() == 0 && index->total_size && *index->total_size != mapped_bytes) {
    report->warnings.push_back(
        input.path + ": metadata.total_size is " + std::to_string(*index->total_size) +
        " but the mapped tensors hold " + std::to_string(mapped_bytes) + " bytes");
  }
}

}  // namespace

std::string CheckpointMetadataJson(const OpenedCheckpoint& model) {
  return MetadataObject(model).dump();
}

std::string InspectJson(const OpenedCheckpoint& model, int indent) {
  ordered_json doc = ordered_json::object();
  doc["format"] = std::string(CheckpointKindName(model.input.kind));
  doc["path"] = model.input.path;
  doc["metadata"] = ordered_json::parse(MetadataObject(model).dump());
  ordered_json tensors = ordered_json::array();
  for (const auto& t : model.tensors) {
    const CheckpointFile& f = model.files[t.file];
    ordered_json e = ordered_json::object();
    e["name"] = t.name;
    e["dtype"] = std::string(DTypeName(t.dtype));
    e["shape"] = t.shape;
    e["nbytes"] = t.nbytes;
    e["file"] = f.name;
    if (f.mega) {
      const MegaTensorInfo& info = f.mega->tensors()[t.index];
      e["stored_nbytes"] = info.stored_nbytes;
      e["offset"] = info.file_offset;
      e["storage_format"] = std::string(MegaStorageFormatName(info.storage_format));
      e["compression"] = std::string(MegaCodecName(info.codec));
      e["byte_shuffle"] = info.byte_shuffled();
      e["checksum"] = std::string(MegaChecksumTypeName(info.checksum_type));
    } else {
      const SafetensorsTensorInfo& info = f.safetensors->tensors()[t.index];
      e["offset"] = f.safetensors->header().data_offset() + info.data_begin;
    }
    tensors.push_back(std::move(e));
  }
  doc["tensors"] = std::move(tensors);
  ordered_json files = ordered_json::array();
  for (const auto& f : model.files) {
    std::error_code ec;
    files.push_back({{"name", f.name},
                     {"format", std::string(ModelFormatName(f.format))},
                     {"size", static_cast<uint64_t>(stdfs::file_size(f.path, ec))}});
  }
  doc["files"] = std::move(files);
  doc["total_nbytes"] = model.total_bytes;
  return doc.dump(indent);
}

Result<std::string> InspectCheckpoint(const std::string& path, int indent) {
  MEGA_ASSIGN_OR_RETURN(CheckpointPath input, ResolveCheckpointPath(path));
  MEGA_ASSIGN_OR_RETURN(OpenedCheckpoint model,
                        OpenCheckpoint(input, {.mmap = false, .verify_checksums = false}));
  return InspectJson(model, indent);
}

Result<VerifyReport> VerifyCheckpoint(const std::string& path) {
  MEGA_ASSIGN_OR_RETURN(CheckpointPath input, ResolveCheckpointPath(path));
  VerifyReport report;
  report.input = input;
  ProblemList problems;
  const OpenCheckpointOptions options{.mmap = false, .verify_checksums = true};
  if (!IsIndexKind(input.kind)) {
    ++report.files;
    auto f = OpenCheckpointFile(input.path, stdfs::path(input.path).filename().string(), options);
    if (!f.ok()) {
      problems.Add(f.status());
    } else {
      size_t before = problems.size();
      VerifyModelFile(*f, problems, &report.tensors);
      if (problems.size() == before) ++report.files_ok;
      OpenedCheckpoint m;
      m.files.push_back(std::move(*f));
      AppendCheckpointFileTensors(&m, 0);
      report.bytes = m.total_bytes;
    }
  } else {
    VerifyIndex(input, options, problems, &report);
  }
  report.problems = problems.Take();
  return report;
}

}  // namespace megackpt::format
