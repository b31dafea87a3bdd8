// Splitting a '/'-separated path into its components: the one walk behind
// every check of a relative name (core/path_safety.h, shard index names,
// transaction paths, hub repo paths) and the hub's URL path segments.
#ifndef MEGACKPT_CORE_PATH_COMPONENTS_H_
#define MEGACKPT_CORE_PATH_COMPONENTS_H_

#include <string_view>
#include <vector>

namespace megackpt::inline core {

// The '/'-separated components of `path`, in order, empty ones included: n
// slashes give n + 1 components ("" gives {""}, "a//b/" gives {"a", "", "b",
// ""}, "/a" gives {"", "a"}). They view `path`.
std::vector<std::string_view> PathComponents(std::string_view path);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_PATH_COMPONENTS_H_
