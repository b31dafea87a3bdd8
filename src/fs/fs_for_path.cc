// Routes a path to its filesystem. mega:// support lands with the hub issue (#6).
#include "megackpt/fs.h"

namespace megackpt {

Result<std::shared_ptr<FileSystem>> FileSystemForPath(std::string_view path) {
  if (path.starts_with("mega://")) {
    return FailedPreconditionError("mega:// paths are not supported yet: " + std::string(path));
  }
  return LocalFileSystem();
}

}  // namespace megackpt
