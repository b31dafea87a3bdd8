// Picks a storage backend by name, for tools (`megackpt demo --storage ...`).
#ifndef MEGACKPT_DCP_STORAGE_FACTORY_H_
#define MEGACKPT_DCP_STORAGE_FACTORY_H_

#include <memory>
#include <string>
#include <string_view>

#include "megackpt/core/status.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/storage.h"

namespace megackpt::dcp {

// Backend-independent knobs; each backend maps what it supports.
struct StorageFactoryOptions {
  int thread_count = 2;
  bool sync = true;
  bool overwrite = true;
  // With sync: data files skip the page cache (O_DIRECT where the file system
  // takes it): FileSystemWriterOptions::direct_io / MegaStorageWriterOptions::
  // direct_io. Faster durable saves where the page cache supplies new pages
  // slowly (a save loop on a VM), but a load right after reads the device.
  bool direct_io = false;
};

// The FileSystemWriter options MakeStorageWriter("fs", ...) uses: thread_count,
// sync, overwrite and direct_io from `options`, the rest at their defaults. For
// callers that set more (e.g. the checkpoint manager's incremental saves, which
// add hash_block_size) on top of the factory's choices.
FileSystemWriterOptions FileSystemWriterOptionsFrom(const StorageFactoryOptions& options);

// kind: "fs" (FileSystemWriter/Reader) or "mega" (MegaStorageWriter/Reader).
// InvalidArgument for an unknown kind; Unimplemented when the backend is not
// built in.
Result<std::unique_ptr<StorageWriter>> MakeStorageWriter(std::string_view kind,
                                                         const std::string& path,
                                                         const StorageFactoryOptions& options = {});
Result<std::unique_ptr<StorageReader>> MakeStorageReader(std::string_view kind,
                                                         const std::string& path,
                                                         const StorageFactoryOptions& options = {});

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_STORAGE_FACTORY_H_
