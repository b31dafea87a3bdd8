// '/'-separated path components (megackpt/core/path_components.h).
#include "megackpt/core/path_components.h"

namespace megackpt::inline core {

std::vector<std::string_view> PathComponents(std::string_view path) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    if (slash == std::string_view::npos) {
      out.push_back(path.substr(start));
      return out;
    }
    out.push_back(path.substr(start, slash - start));
    start = slash + 1;
  }
}

}  // namespace megackpt::inline core
