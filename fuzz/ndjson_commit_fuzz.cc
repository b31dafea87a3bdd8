// Fuzz target: the hub's NDJSON bodies (HF-style commit and bucket batch) and
// base64. Parse and ignore the result; a parsed commit's paths must be valid.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "hub/ndjson.h"
#include "megackpt/hub/mega_uri.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto commit = megackpt::hub::ParseNdjsonCommit(text);
  if (commit.ok()) {
    for (const auto& op : commit->ops) {
      if (!megackpt::hub::ValidateRepoPath(op.path).ok()) std::abort();
    }
  }
  auto batch = megackpt::hub::ParseBucketBatch(text);
  if (batch.ok()) {
    for (const auto& op : *batch) {
      if (!megackpt::hub::ValidateRepoPath(op.path).ok()) std::abort();
    }
  }
  auto decoded = megackpt::hub::Base64Decode(text);
  if (decoded.ok()) {
    auto again = megackpt::hub::Base64Decode(megackpt::hub::Base64Encode(*decoded));
    if (!again.ok() || *again != *decoded) std::abort();
  }
  return 0;
}
