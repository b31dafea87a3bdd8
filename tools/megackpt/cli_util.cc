// Helpers shared by the command groups (declared in commands.h).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "megackpt/commands.h"

namespace megackpt::cli {

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (c == ' ' || c == '_') continue;
    s.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  // Longest suffixes first: "kib" before "b", "kb" before "k".
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
      {"kb", 1e3},     {"mb", 1e6},        {"gb", 1e9},           {"tb", 1e12},
      {"k", 1e3},      {"m", 1e6},         {"g", 1e9},            {"t", 1e12},
      {"b", 1.0}};
  double scale = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (s.size() >= suffix.size() && std::string_view(s).substr(s.size() - suffix.size()) == suffix) {
      s.resize(s.size() - suffix.size());
      scale = factor;
      break;
    }
  }
  char* end = nullptr;
  const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0) || !std::isfinite(v) || v * scale >= 1.8e19) {
    return InvalidArgumentError("'" + std::string(text) +
                                "' is not a byte size like 2GiB, 500MB or 1000000");
  }
  return static_cast<uint64_t>(v * scale);
}

std::string HumanBytes(uint64_t n) {
  char buf[64];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f GB", n / 1e9);
  } else if (n >= 1000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f MB", n / 1e6);
  } else if (n >= 1000ull) {
    std::snprintf(buf, sizeof buf, "%.2f kB", n / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  }
  return buf;
}

}  // namespace megackpt::cli
