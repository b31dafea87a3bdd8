// Name and message safety (megackpt/core/path_safety.h).
#include "megackpt/core/path_safety.h"

#include <climits>
#include <cstdlib>
#include <cstring>

#include "megackpt/core/path_components.h"

namespace megackpt::inline core {
namespace {

std::string RealPath(const std::string& p) {
  char* r = realpath(p.c_str(), nullptr);
  if (!r) return std::string();
  std::string out(r);
  std::free(r);
  return out;
}

}  // namespace

Status ValidateRelativePath(std::string_view name) {
  auto bad = [&](std::string_view why) {
    // Appended piece by piece (GCC 12 reports a false -Wrestrict on chained +).
    std::string msg = "file name ";
    msg.append(Quote(name)).append(" ").append(why);
    return DataLossError(std::move(msg));
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > kMaxRelativePathBytes) {
    return bad("is longer than " + std::to_string(kMaxRelativePathBytes) + " bytes");
  }
  if (name.front() == '/')
    return bad("is absolute (names must be relative to the checkpoint folder)");
  for (unsigned char c : name) {
    if (c == 0) return bad("holds a NUL byte");
    if (c < 0x20 || c == 0x7F) return bad("holds a control byte");
    if (c == '\\') return bad("holds a backslash");
  }
  if (!IsValidUtf8(name)) return bad("is not valid UTF-8");
  for (std::string_view part : PathComponents(name)) {
    if (part.empty()) return bad("has an empty path component");
    if (part == ".") return bad("has a '.' component");
    if (part == "..") return bad("has a '..' component (it would leave the checkpoint folder)");
    if (part.size() > kMaxPathComponentBytes) {
      return bad("has a component longer than " + std::to_string(kMaxPathComponentBytes) +
                 " bytes");
    }
  }
  return Status::OK();
}

Status CheckResolvesInside(const std::string& dir, const std::string& path) {
  if (dir.find("://") != std::string::npos || path.find("://") != std::string::npos) {
    return Status::OK();
  }
  const std::string real = RealPath(path);
  if (real.empty()) return Status::OK();  // missing: the open says NotFound
  std::string root = RealPath(dir.empty() ? "." : dir);
  if (root.empty()) return Status::OK();
  if (root != "/") root += '/';
  if (!real.starts_with(root)) {
    std::string msg = Quote(path);
    msg.append(" resolves outside the checkpoint folder (a symlink leaves ")
        .append(Quote(dir))
        .append("); refusing to open it");
    return DataLossError(std::move(msg));
  }
  return Status::OK();
}

}  // namespace megackpt::inline core
