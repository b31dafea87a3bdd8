// Fuzz target: what megahub parses from a request line and headers before
// routing. Input = "<target>\n<Range header value>\n<decimal size>". Checks:
// ParseTarget never accepts a target that does not start with '/', decoded
// segments never hold an empty last segment, and a parsed Range always lies
// inside the representation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "hub/http_server.h"
#include "hub/server_internal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  size_t nl = text.find('\n');
  std::string_view target = text.substr(0, nl);
  std::string_view rest = nl == std::string_view::npos ? "" : text.substr(nl + 1);
  size_t nl2 = rest.find('\n');
  std::string_view range = rest.substr(0, nl2);
  uint64_t length = 0;
  if (nl2 != std::string_view::npos) {
    for (char c : rest.substr(nl2 + 1, 12)) {
      if (c < '0' || c > '9') break;
      length = length * 10 + static_cast<uint64_t>(c - '0');
    }
  }
  megackpt::hub::httpd::Request req;
  req.target = std::string(target);
  if (megackpt::hub::httpd::ParseTarget(&req).ok()) {
    if (req.target.empty() || req.target[0] != '/') std::abort();
    if (!req.segments.empty() && req.segments.back().empty()) std::abort();
    (void)req.Param("q");
  }
  auto r = megackpt::hub::ParseRange(range, length);
  if (r.kind == megackpt::hub::RangeRequest::Kind::kRange) {
    if (r.range.first > r.range.last || r.range.last >= length) std::abort();
  }
  return 0;
}
