// Small text helper shared by the format readers/writers and the MEGA storage
// layer for error messages (internal).
#ifndef MEGACKPT_SRC_FORMAT_QUOTE_H_
#define MEGACKPT_SRC_FORMAT_QUOTE_H_

#include <string>
#include <string_view>

#include "megackpt/core/path_safety.h"

namespace megackpt::format_internal {

// `s` in single quotes, as error messages name keys and tensors: 'name'.
// Non-printable bytes are escaped (core/path_safety.h, QuoteForMessage).
inline std::string Quote(std::string_view s) { return QuoteForMessage(s); }

}  // namespace megackpt::format_internal

#endif  // MEGACKPT_SRC_FORMAT_QUOTE_H_
