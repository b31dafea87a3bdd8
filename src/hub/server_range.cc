// Range requests (RFC 7233 §2.1, §3.1, §4.4) for megahub's downloads.
#include "hub/server_internal.h"

namespace megackpt::hub {
namespace {

// 1*DIGIT that fits in 63 bits.
bool ParseDigits(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

RangeRequest ParseRange(std::string_view header, uint64_t size) {
  RangeRequest whole;
  // Only the "bytes" unit; anything unknown or malformed is ignored (§3.1:
  // "a server MAY ignore the Range header field").
  constexpr std::string_view kUnit = "bytes=";
  if (header.size() <= kUnit.size() || header.substr(0, kUnit.size()) != kUnit) return whole;
  std::string_view spec = header.substr(kUnit.size());
  while (!spec.empty() && (spec.front() == ' ' || spec.front() == '\t')) spec.remove_prefix(1);
  while (!spec.empty() && (spec.back() == ' ' || spec.back() == '\t')) spec.remove_suffix(1);
  // Several ranges (multipart/byteranges) are not served: the whole
  // representation is (allowed by §3.1).
  if (spec.find(',') != std::string_view::npos) return whole;
  size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return whole;
  std::string_view a = spec.substr(0, dash), b = spec.substr(dash + 1);
  RangeRequest r;
  r.kind = RangeRequest::Kind::kRange;
  if (a.empty()) {
    // suffix-byte-range-spec: the last n bytes.
    uint64_t n = 0;
    if (!ParseDigits(b, &n)) return whole;
    if (n == 0 || size == 0) return {RangeRequest::Kind::kUnsatisfiable, {}};
    r.range.first = n >= size ? 0 : size - n;
    r.range.last = size - 1;
    return r;
  }
  if (!ParseDigits(a, &r.range.first)) return whole;
  if (b.empty()) {
    r.range.last = UINT64_MAX;
  } else if (!ParseDigits(b, &r.range.last) || r.range.last < r.range.first) {
    return whole;  // syntactically invalid (§2.1): ignored
  }
  if (r.range.first >= size) return {RangeRequest::Kind::kUnsatisfiable, {}};
  if (r.range.last >= size) r.range.last = size - 1;
  return r;
}

Response RangeNotSatisfiable(uint64_t size) {
  Response r = ErrorResponse(
      416, "range not satisfiable (the representation has " + std::to_string(size) + " bytes)");
  r.SetHeader("Content-Range", "bytes */" + std::to_string(size));
  return r;
}

}  // namespace megackpt::hub
