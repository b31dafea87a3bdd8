// Fuzz target for the DCP decoders: Metadata (the .metadata file) and the plans,
// write results and envelopes exchanged between ranks. Any input must produce a
// value or an error, never a crash; a decoded Metadata must re-encode to an
// equal value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "dcp/codec.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/state_dict.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megackpt::dcp;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  auto md = DecodeMetadata(in);
  if (md.ok()) {
    auto again = DecodeMetadata(EncodeMetadata(*md));
    if (!again.ok() || !(*again == *md)) std::abort();
    // Rebuilding the nesting must not crash either (only for small tensors).
    uint64_t total = 0;
    for (const auto& [fqn, v] : md->state_dict_metadata) {
      if (const auto* t = std::get_if<TensorStorageMetadata>(&v)) {
        auto n = megackpt::LogicalNbytes(t->properties.dtype, t->size);
        total += n.ok() ? *n : (1ull << 40);
      }
    }
    if (total < (1u << 20)) BuildStateDictFromMetadata(*md).status().IgnoreError();
  }
  internal::DecodeSavePlan(in).status().IgnoreError();
  internal::DecodeLoadPlan(in).status().IgnoreError();
  internal::DecodeWriteResults(in).status().IgnoreError();
  internal::DecodeEnvelope(in).status().IgnoreError();
  return 0;
}
