// Fuzz target for the safetensors parser: parse a file image from memory, and
// when it is valid, read every tensor through the reader (pread and view paths).
// Any crash, sanitizer report or abort is a bug; errors are expected.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "megackpt/core/memory_file.h"
#include "megackpt/format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace megackpt;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto header = format::ParseSafetensors("fuzz.safetensors", bytes);
  if (!header.ok()) return 0;
  // A valid header covers the data buffer exactly, so the tensors' total size
  // is bounded by the input size: loading them all is cheap.
  for (bool mapped : {true, false}) {
    auto reader = format::SafetensorsReader::Open(std::shared_ptr<RandomAccessFile>(NewMemoryFile(
        "fuzz.safetensors", std::string(reinterpret_cast<const char*>(data), size), mapped)));
    if (!reader.ok()) std::abort();  // in-memory parse said OK: the reader must agree
    for (const auto& info : (*reader)->tensors()) {
      auto t = (*reader)->Load(info.name);
      if (!t.ok() || t->nbytes() != info.nbytes()) std::abort();
      if (mapped && !(*reader)->View(info.name).ok()) std::abort();
    }
  }
  return 0;
}
