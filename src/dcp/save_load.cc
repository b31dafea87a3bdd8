// dcp::Save(state_dict, path) / dcp::Load(path, state_dict): one process, the
// storage backend by name (storage_factory.h), the filesystem by the path.
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/storage_factory.h"

namespace megackpt::dcp {

Status Save(const StateDict& state_dict, const std::string& path, const PathSaveOptions& options) {
  StorageFactoryOptions o;
  o.thread_count = options.thread_count;
  o.sync = options.sync;
  o.overwrite = options.overwrite;
  o.direct_io = options.direct_io;
  MEGA_ASSIGN_OR_RETURN(auto writer, MakeStorageWriter(options.storage, path, o));
  return Save(state_dict, *writer);
}

Status Load(const std::string& path, StateDict& state_dict, const PathLoadOptions& options) {
  StorageFactoryOptions o;
  o.thread_count = options.thread_count;
  MEGA_ASSIGN_OR_RETURN(auto reader, MakeStorageReader(options.storage, path, o));
  return Load(state_dict, *reader);
}

}  // namespace megackpt::dcp
