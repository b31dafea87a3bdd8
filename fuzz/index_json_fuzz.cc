// Fuzz target for the shard index parser (`*.mega.index.json`,
// `model.safetensors.index.json`): parse from memory; a document that parses
// must serialize and parse back to the same index (values of unknown members
// may be normalized, e.g. out-of-range numbers become null).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "megackpt/format/index_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megackpt;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto index = format::ParseShardIndex("fuzz.index.json", text);
  if (!index.ok()) return 0;
  auto serialized = format::SerializeShardIndex(*index);
  if (!serialized.ok()) return 0;  // e.g. names that are not valid UTF-8 cannot be written
  auto again = format::ParseShardIndex("fuzz.index.json", *serialized);
  if (!again.ok() || again->weight_map != index->weight_map ||
      again->total_size != index->total_size ||
      again->extra_fields.size() != index->extra_fields.size()) {
    std::abort();
  }
  return 0;
}
