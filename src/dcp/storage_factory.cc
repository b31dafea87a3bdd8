// Storage backends by name: "fs" (FileSystemWriter/Reader) and "mega"
// (MegaStorageWriter/Reader, mega_storage.h).
#include "megackpt/dcp/storage_factory.h"

#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp {
namespace {

// The writer options of either storage with the factory's choices applied.
template <typename WriterOptions>
WriterOptions WriterOptionsFrom(const StorageFactoryOptions& options) {
  WriterOptions o;
  o.thread_count = options.thread_count;
  o.sync = options.sync;
  o.overwrite = options.overwrite;
  o.direct_io = options.direct_io;
  return o;
}

}  // namespace

FileSystemWriterOptions FileSystemWriterOptionsFrom(const StorageFactoryOptions& options) {
  return WriterOptionsFrom<FileSystemWriterOptions>(options);
}

Result<std::unique_ptr<StorageWriter>> MakeStorageWriter(std::string_view kind,
                                                         const std::string& path,
                                                         const StorageFactoryOptions& options) {
  if (kind == "fs") return NewFileSystemWriter(path, FileSystemWriterOptionsFrom(options));
  if (kind == "mega") {
    return std::unique_ptr<StorageWriter>(new MegaStorageWriter(
        path, std::nullopt, WriterOptionsFrom<MegaStorageWriterOptions>(options)));
  }
  return InvalidArgumentError("unknown storage \"" + std::string(kind) +
                              "\" (expected fs or mega)");
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
  return InvalidArgumentError("unknown storage \"" + std::string(kind) +
                              "\" (expected fs or mega)");
}

}  // namespace megackpt::dcp
