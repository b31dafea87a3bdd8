// Storage backends by name: "fs" (FileSystemWriter/Reader) and "mega"
// (MegaStorageWriter/Reader, mega_storage.h).
#include "megackpt/dcp/storage_factory.h"

#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"

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
    MegaStorageWriterOptions o;
    o.thread_count = options.thread_count;
    o.sync = options.sync;
    o.overwrite = options.overwrite;
    return std::unique_ptr<StorageWriter>(new MegaStorageWriter(path, std::nullopt, o));
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
    MegaStorageReaderOptions o;
    o.thread_count = options.thread_count;
    return std::unique_ptr<StorageReader>(new MegaStorageReader(path, o));
  }
  return InvalidArgumentError("unknown storage \"" + std::string(kind) + "\" (expected fs or mega)");
}

}  // namespace megackpt::dcp
