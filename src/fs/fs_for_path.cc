// Routes a path to its filesystem: mega:// URIs to the mega:// filesystem of
// the environment's hub endpoint (MEGA_ENDPOINT / MEGA_HOME), everything else
// to the local POSIX filesystem.
#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/mega_uri.h"

namespace megackpt::fs {

Result<std::shared_ptr<FileSystem>> FileSystemForPath(std::string_view path) {
  if (hub::IsMegaUri(path)) {
    MEGA_RETURN_IF_ERROR(hub::ParseMegaUri(path).status());
    MEGA_ASSIGN_OR_RETURN(auto fs, hub::MegaFileSystemFor());
    return std::shared_ptr<FileSystem>(std::move(fs));
  }
  return LocalFileSystem();
}

}  // namespace megackpt::fs
