#include "megackpt/dcp/index_io.h"

namespace megackpt::dcp {

Result<format::ShardIndex> ReadShardIndex(fs::FileSystem& fs, const std::string& path) {
  MEGA_ASSIGN_OR_RETURN(std::string text, fs.ReadWhole(path, format::kMaxIndexFileBytes));
  return format::ParseShardIndex(path, text);
}

Status WriteShardIndex(fs::FileSystem& fs, const std::string& path, const format::ShardIndex& index,
                       bool sync) {
  MEGA_ASSIGN_OR_RETURN(std::string text, format::SerializeShardIndex(index));
  return fs.WriteAtomically(path, text, sync);
}

}  // namespace megackpt::dcp
