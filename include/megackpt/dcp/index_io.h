// Shard index files (megackpt/format/index_file.h) read and written through the
// filesystem seam, so the same call serves local folders and mega:// paths.
// (format parses and serializes bytes only; it knows nothing of FileSystems.)
#ifndef MEGACKPT_DCP_INDEX_IO_H_
#define MEGACKPT_DCP_INDEX_IO_H_

#include <string>

#include "megackpt/core/status.h"
#include "megackpt/format/index_file.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

// Reads and parses `path`. NotFound when missing; ResourceExhausted above
// format::kMaxIndexFileBytes; DataLoss as format::ParseShardIndex.
Result<format::ShardIndex> ReadShardIndex(fs::FileSystem& fs, const std::string& path);

// Serializes `index` and writes it with FileSystem::WriteAtomically (readers see
// the old or the new document). InvalidArgument as format::SerializeShardIndex.
Status WriteShardIndex(fs::FileSystem& fs, const std::string& path, const format::ShardIndex& index,
                       bool sync = true);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_INDEX_IO_H_
