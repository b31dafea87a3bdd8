// Quoting of names and keys in the format layer's error messages (internal):
// the one escaping helper of core (megackpt/core/text.h), so bytes read from a
// file are shown escaped ('a\x00b'), never raw.
#ifndef MEGACKPT_SRC_FORMAT_QUOTE_H_
#define MEGACKPT_SRC_FORMAT_QUOTE_H_

#include <string>
#include <string_view>

#include "megackpt/core/text.h"

namespace megackpt::format_internal {

// EscapeBytes(s) in single quotes, as error messages name keys and tensors: 'name'.
inline std::string Quote(std::string_view s) { return core::Quote(s); }

}  // namespace megackpt::format_internal

#endif  // MEGACKPT_SRC_FORMAT_QUOTE_H_
