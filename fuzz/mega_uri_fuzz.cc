// Fuzz target: mega:// URI parsing. Parse, and when it succeeds, check that the
// canonical form parses back to the same URI.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "megackpt/hub/mega_uri.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto uri = megackpt::hub::ParseMegaUri(text);
  if (uri.ok()) {
    auto again = megackpt::hub::ParseMegaUri(uri->ToString());
    if (!again.ok() || !(*again == *uri)) std::abort();
  }
  (void)megackpt::hub::ValidateRepoPath(text);
  (void)megackpt::hub::ValidateRevision(text);
  (void)megackpt::hub::PercentDecode(text);
  return 0;
}
