#include "dcp/entry_io.h"

#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

std::string StorageKindOf(const Metadata& metadata, std::string_view fallback) {
  for (const auto& [index, info] : metadata.storage_data) {
    return info.relative_path.ends_with(".distcp") ? "fs" : "mega";
  }
  return std::string(fallback);
}

Result<Metadata> ReadCheckpointMetadata(const std::string& dir) {
  MEGA_ASSIGN_OR_RETURN(auto fs, fs::FileSystemForPath(dir));
  return ReadMetadataFile(*fs, dir, std::string(kMetadataFileName));
}

Result<StateValue> LoadEntryWhole(const std::string& kind, const std::string& dir,
                                  const Metadata& metadata, const std::string& fqn,
                                  const StorageFactoryOptions& options) {
  auto entry = metadata.state_dict_metadata.find(fqn);
  if (entry == metadata.state_dict_metadata.end()) {
    return NotFoundError(dir + ": no entry '" + fqn + "'");
  }
  Metadata one;
  one.state_dict_metadata.emplace(fqn, entry->second);
  auto path = metadata.planner_data.object_paths.find(fqn);
  if (path != metadata.planner_data.object_paths.end()) one.planner_data.object_paths.insert(*path);
  MEGA_ASSIGN_OR_RETURN(StateDict sd, BuildStateDictFromMetadata(one));
  MEGA_ASSIGN_OR_RETURN(auto reader, MakeStorageReader(kind, dir, options));
  MEGA_RETURN_IF_ERROR(dcp::Load(sd, *reader).WithContext(dir + ", entry '" + fqn + "'"));
  MEGA_ASSIGN_OR_RETURN(auto flat, FlattenStateDict(sd, nullptr));
  if (flat.size() != 1)
    return InternalError("entry '" + fqn + "' rebuilt as " + std::to_string(flat.size()) +
                         " leaves");
  return *flat[0].value;
}

}  // namespace megackpt::dcp
