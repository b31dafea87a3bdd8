// Fuzz target: the Xet MDB shard (v2) parser. Parse, and when it succeeds,
// serialize again and parse the result (it must round-trip).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "megackpt/cas/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megackpt::cas;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto shard = ParseShard(bytes);
  if (!shard.ok()) return 0;
  bool verification = true;
  for (const auto& f : shard->files) {
    for (const auto& t : f.reconstruction.terms) verification &= !t.verification_hash.IsZero();
  }
  std::string again =
      SerializeShard(*shard, {.with_verification = verification, .with_footer = true});
  auto reparsed = ParseShard(std::as_bytes(std::span(again)));
  if (!reparsed.ok()) std::abort();
  return 0;
}
