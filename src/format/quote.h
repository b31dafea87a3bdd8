// Small text helper shared by the format readers/writers and the MEGA storage
// layer for error messages (internal).
#ifndef MEGACKPT_SRC_FORMAT_QUOTE_H_
#define MEGACKPT_SRC_FORMAT_QUOTE_H_

#include <string>
#include <string_view>

namespace megackpt::format_internal {

// `s` in single quotes, as error messages name keys and tensors: 'name'.
inline std::string Quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('\'');
  out.append(s);
  out.push_back('\'');
  return out;
}

}  // namespace megackpt::format_internal

#endif  // MEGACKPT_SRC_FORMAT_QUOTE_H_
