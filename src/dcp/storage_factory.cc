// Storage backends by name. "mega" is wired by the MEGA storage backend (issue:
// MegaStorageWriter/Reader); until then it reports Unimplemented.
#include "megackpt/dcp/storage_factory.h"

#include "megackpt/dcp/filesystem.h"

namespace megackpt::dcp {

Result<std::unique_ptr<StorageWriter>> MakeStorageWriter(std::string_view kind,
                                                         const std::string& path,
                                                         const StorageFactoryOptions& options) {
  if (kind == "fs") {
    FileSystemWriterOptions o;
    o.thread_count = options.thread_count;
    o.sync = options.sync;
    o.overwrite = options.overwrite;
    return NewFileSystemWriter(path, o);
  }
  if (kind == "mega") {
    return UnimplementedError("storage \"mega\" (MegaStorageWriter) is not built in yet");
  }
  return InvalidArgumentError("unknown storage \"" + std::string(kind) + "\" (expected fs or mega)");
}

Result<std::unique_ptr<StorageReader>> MakeStorageReader(std::string_view kind,
                                                         const std::string& path,
                                                         const StorageFactoryOptions& options) {
  if (kind == "fs") {
    FileSystemReaderOptions o;
    o.thread_count = options.thread_count;
    return NewFileSystemReader(path, o);
  }
  if (kind == "mega") {
    return UnimplementedError("storage \"mega\" (MegaStorageReader) is not built in yet");
  }
  return InvalidArgumentError("unknown storage \"" + std::string(kind) + "\" (expected fs or mega)");
}

}  // namespace megackpt::dcp
