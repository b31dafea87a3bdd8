// Routes a path to its filesystem: "scheme://..." paths to the factory
// registered for the scheme (the hub layer registers "mega"), everything else
// to the local POSIX filesystem. This layer never names a scheme's
// implementation, so linking it does not pull in the hub.
#include <cctype>
#include <map>
#include <mutex>

#include "megackpt/core/text.h"  // ToLower
#include "megackpt/fs/filesystem.h"

namespace megackpt::fs {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, FileSystemFactory> factories;  // lower-case scheme -> factory
};

// Function-local static: safe to use from other translation units' static
// initializers, whatever their order.
Registry& TheRegistry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

std::string_view PathScheme(std::string_view path) {
  // RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ), then "://".
  if (path.empty() || !std::isalpha(static_cast<unsigned char>(path[0]))) return {};
  size_t i = 1;
  while (i < path.size()) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (!(std::isalnum(c) || c == '+' || c == '-' || c == '.')) break;
    ++i;
  }
  if (path.substr(i, 3) != "://") return {};
  return path.substr(0, i);
}

void RegisterFileSystemScheme(std::string_view scheme, FileSystemFactory factory) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[ToLower(scheme)] = std::move(factory);
}

bool IsFileSystemSchemeRegistered(std::string_view scheme) {
  Registry& r = TheRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factories.count(ToLower(scheme)) > 0;
}

Result<std::shared_ptr<FileSystem>> FileSystemForPath(std::string_view path) {
  const std::string_view scheme = PathScheme(path);
  if (scheme.empty()) return LocalFileSystem();
  FileSystemFactory factory;
  {
    Registry& r = TheRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(ToLower(scheme));
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    return FailedPreconditionError(std::string(path) + ": no filesystem is registered for " +
                                   std::string(scheme) +
                                   ":// paths (mega:// needs the hub layer: "
                                   "link megackpt::hub, which registers it)");
  }
  return factory(path);
}

}  // namespace megackpt::fs
