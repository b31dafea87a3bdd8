// Plug-ins (planners, storage) are user code and may throw, also on our worker
// threads where an exception cannot cross back to the caller: Guard runs one
// and turns what it throws into an Internal status naming `what`.
#ifndef MEGACKPT_SRC_DCP_GUARD_H_
#define MEGACKPT_SRC_DCP_GUARD_H_

#include <exception>
#include <string>

#include "megackpt/core/status.h"

namespace megackpt::dcp {

// REQUIRES: f() returns Status or Result<T>.
template <typename F>
auto Guard(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return InternalError(std::string(what) + " threw an exception: " + e.what());
  } catch (...) {
    return InternalError(std::string(what) + " threw a non-standard exception");
  }
}

}  // namespace megackpt::dcp

#endif  // MEGACKPT_SRC_DCP_GUARD_H_
