// Fuzz target for the MEGA v1 reader: parse from a memory buffer, then read and
// verify every tensor. Any result is fine; crashes, sanitizer reports and huge
// allocations are not.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "megackpt/core/memory_file.h"
#include "megackpt/format/mega.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megackpt;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  for (bool mapped : {false, true}) {
    format::MegaReaderOptions options;
    options.read_block_size = 4096;  // exercise block boundaries on small inputs
    auto reader = format::MegaReader::Open(NewMemoryFile("fuzz.mega", bytes, mapped), options);
    if (!reader.ok()) continue;
    const format::MegaReader& r = **reader;
    for (const format::MetaEntry& e : r.metadata().entries()) (void)e.value.ToJson();
    for (size_t i = 0; i < r.tensors().size(); ++i) {
      const format::MegaTensorInfo& t = r.tensors()[i];
      r.VerifyTensor(i).IgnoreError();
      // Decoding allocates the logical size the file declares: keep it bounded.
      if (t.logical_nbytes <= (16u << 20)) {
        auto dst = Tensor::Empty(t.dtype, t.shape);
        if (dst.ok()) r.ReadTensor(i, *dst).IgnoreError();
        std::vector<std::byte> part(std::min<uint64_t>(t.logical_nbytes, 64));
        if (!part.empty()) r.ReadRange(i, t.logical_nbytes - part.size(), part).IgnoreError();
      }
      if (mapped) (void)r.MappedTensor(t.name);
    }
    break;  // one successful parse is enough
  }
  return 0;
}
