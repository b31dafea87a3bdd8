// Storage writers/readers built from Python keyword options (docs on
// megackpt.save / megackpt.load in megackpt/_api.py).
#include <map>
#include <optional>
#include <set>
#include <string>

#include "common.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::python {
namespace {

const std::set<std::string> kWriterOptions = {"thread_count",         "sync",     "overwrite",
                                              "fqn_to_index_mapping", "checksum", "consolidate",
                                              "files_per_rank",       "direct_io"};
const std::set<std::string> kReaderOptions = {"thread_count", "verify"};

Status CheckKeys(nb::dict options, const std::set<std::string>& known, const std::string& what) {
  for (auto [k, v] : options) {
    std::string key = nb::cast<std::string>(nb::str(k));
    if (!known.count(key)) return InvalidArgumentError(what + ": unknown option '" + key + "'");
  }
  return Status::OK();
}

template <typename T>
T Get(nb::dict options, const char* key, T fallback) {
  if (!options.contains(key) || options[key].is_none()) return fallback;
  return nb::cast<T>(options[key]);
}

// Checks the keys of `options` against `known` and returns its thread_count
// (default 2; >= 1). `what`: "save" or "load", for the messages.
Result<int> ThreadCountOption(nb::dict options, const std::set<std::string>& known,
                              const std::string& what) {
  MEGA_RETURN_IF_ERROR(CheckKeys(options, known, what));
  const int threads = Get<int>(options, "thread_count", 2);
  if (threads < 1) return InvalidArgumentError(what + ": thread_count must be >= 1");
  return threads;
}

// "mega" or "fs" for a checkpoint at `path` (see MakeReader).
Result<std::string> DetectKind(const std::string& path) {
  if (std::string_view(path).ends_with(".mega") ||
      std::string_view(path).ends_with(".safetensors") ||
      std::string_view(path).ends_with(".index.json")) {
    return std::string("mega");
  }
  MEGA_ASSIGN_OR_RETURN(auto fs, fs::FileSystemForPath(path));
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  for (std::string_view index : {dcp::kMegaStorageIndexName, dcp::kSafetensorsStorageIndexName}) {
    MEGA_ASSIGN_OR_RETURN(bool there, fs->Exists(dir + "/" + std::string(index)));
    if (there) return std::string("mega");
  }
  MEGA_ASSIGN_OR_RETURN(bool metadata, fs->Exists(dir + "/" + std::string(dcp::kMetadataFileName)));
  if (metadata) return std::string("fs");
  return NotFoundError(path + ": no checkpoint here (no " + std::string(dcp::kMetadataFileName) +
                       ", " + std::string(dcp::kMegaStorageIndexName) + " or " +
                       std::string(dcp::kSafetensorsStorageIndexName) + ")");
}

}  // namespace

Result<format::MegaChecksumType> ChecksumFromName(const std::string& name) {
  if (name == "none") return format::MegaChecksumType::kNone;
  if (name == "crc32") return format::MegaChecksumType::kCrc32;
  if (name == "sha256") return format::MegaChecksumType::kSha256;
  return InvalidArgumentError("checksum must be 'none', 'crc32' or 'sha256' (got '" + name + "')");
}

Result<std::unique_ptr<dcp::StorageWriter>> MakeWriter(const std::string& kind,
                                                       const std::string& path, nb::dict options) {
  MEGA_ASSIGN_OR_RETURN(const int threads, ThreadCountOption(options, kWriterOptions, "save"));
  const bool sync = Get<bool>(options, "sync", true);
  const bool overwrite = Get<bool>(options, "overwrite", true);
  const bool direct_io = Get<bool>(options, "direct_io", false);
  if (kind == "fs") {
    for (const char* only_mega :
         {"fqn_to_index_mapping", "checksum", "consolidate", "files_per_rank"}) {
      if (options.contains(only_mega) && !options[only_mega].is_none()) {
        return InvalidArgumentError(std::string("save: option '") + only_mega +
                                    "' needs storage='mega'");
      }
    }
    dcp::FileSystemWriterOptions o;
    o.thread_count = threads;
    o.sync = sync;
    o.overwrite = overwrite;
    o.direct_io = direct_io;
    return dcp::NewFileSystemWriter(path, o);
  }
  if (kind == "mega") {
    dcp::MegaStorageWriterOptions o;
    o.thread_count = threads;
    o.sync = sync;
    o.overwrite = overwrite;
    o.direct_io = direct_io;
    MEGA_ASSIGN_OR_RETURN(o.checksum,
                          ChecksumFromName(Get<std::string>(options, "checksum", "crc32")));
    o.consolidate = Get<bool>(options, "consolidate", false);
    // Shard files per rank without a mapping (0: thread_count; MegaStorageWriterOptions).
    o.files_per_rank = Get<int>(options, "files_per_rank", 0);
    if (o.files_per_rank < 0) return InvalidArgumentError("save: files_per_rank must be >= 0");
    std::optional<dcp::FqnToIndexMapping> mapping;
    if (options.contains("fqn_to_index_mapping") && !options["fqn_to_index_mapping"].is_none()) {
      mapping = nb::cast<std::map<std::string, int>>(options["fqn_to_index_mapping"]);
    }
    return std::unique_ptr<dcp::StorageWriter>(
        new dcp::MegaStorageWriter(path, std::move(mapping), o));
  }
  return InvalidArgumentError("storage must be 'mega' or 'fs' (got '" + kind + "')");
}

Result<std::unique_ptr<dcp::StorageReader>> MakeReader(const std::string& kind_in,
                                                       const std::string& path, nb::dict options) {
  MEGA_ASSIGN_OR_RETURN(const int threads, ThreadCountOption(options, kReaderOptions, "load"));
  const bool verify = Get<bool>(options, "verify", true);
  std::string kind = kind_in;
  if (kind == "auto") {
    nb::gil_scoped_release release;  // may ask a hub
    MEGA_ASSIGN_OR_RETURN(kind, DetectKind(path));
  }
  if (kind == "fs") {
    dcp::FileSystemReaderOptions o;
    o.thread_count = threads;
    o.verify = verify ? dcp::VerifyMode::kReadBlocks : dcp::VerifyMode::kOff;
    return dcp::NewFileSystemReader(path, o);
  }
  if (kind == "mega") {
    dcp::MegaStorageReaderOptions o;
    o.thread_count = threads;
    o.verify_checksums = verify;
    return std::unique_ptr<dcp::StorageReader>(new dcp::MegaStorageReader(path, o));
  }
  return InvalidArgumentError("storage must be 'auto', 'mega' or 'fs' (got '" + kind + "')");
}

}  // namespace megackpt::python
