// Fuzz target: the xorb chunk-record decoder (all schemes), whole-xorb decoding
// and the stored-xorb footer parser. Any input must give a value or a Status,
// never a crash, hang or out-of-bounds access.
#include <cstddef>
#include <cstdint>
#include <string>

#include "megackpt/cas/xorb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megackpt::cas;
  // LZ4 expands up to ~255x: cap the input so one run stays small.
  if (size > (64u << 10)) return 0;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);

  // Record by record, as a range reader does.
  std::string out;
  size_t offset = 0;
  for (int i = 0; i < 1024 && offset < size; ++i) {
    auto next = DecodeChunkRecord(bytes, offset, &out);
    if (!next.ok()) break;
    offset = *next;
    out.clear();
  }
  // The whole buffer as a xorb.
  (void)DecodeXorb(bytes).status();

  // The buffer as a stored xorb: records + footer.
  if (size >= kXorbFooterTrailerSize) {
    auto trailer = ParseXorbFooterTrailer(bytes.last(kXorbFooterTrailerSize));
    if (trailer.ok()) {
      uint64_t footer = uint64_t{trailer->first} * kXorbFooterEntrySize + kXorbFooterTrailerSize;
      if (footer <= size) {
        MerkleHash name;
        auto layout = ParseXorbFooter(bytes.last(footer), name);
        if (layout.ok() && layout->serialized_bytes == size - footer) {
          (void)DecodeXorb(bytes.first(size - footer), &*layout).status();
        }
      }
    }
  }
  return 0;
}
