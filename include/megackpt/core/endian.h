// Little-endian fixed-width integers: how every megackpt file format (MEGA,
// safetensors' header length, Xet xorbs and shards) and wire message (the MPI
// and threads process groups) stores them. The one set of byte coding helpers
// of the project; loads and stores take any byte pointer and need no alignment.
#ifndef MEGACKPT_CORE_ENDIAN_H_
#define MEGACKPT_CORE_ENDIAN_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace megackpt::inline core {

namespace endian_internal {
template <typename T>
inline T FromLittle(T v) {
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(v));
    if constexpr (sizeof(T) == 4) return static_cast<T>(__builtin_bswap32(v));
    if constexpr (sizeof(T) == 8) return static_cast<T>(__builtin_bswap64(v));
  }
  return v;
}
template <typename T>
inline T Load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return FromLittle(v);
}
template <typename T>
inline void Store(void* p, T v) {
  v = FromLittle(v);  // the swap is its own inverse
  std::memcpy(p, &v, sizeof v);
}
}  // namespace endian_internal

// The value stored little-endian at p. REQUIRES: p points at 2 / 3 / 4 / 8 readable bytes.
inline uint16_t LoadLE16(const void* p) { return endian_internal::Load<uint16_t>(p); }
inline uint32_t LoadLE24(const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  return b[0] | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16);
}
inline uint32_t LoadLE32(const void* p) { return endian_internal::Load<uint32_t>(p); }
inline uint64_t LoadLE64(const void* p) { return endian_internal::Load<uint64_t>(p); }
// The same for an unsigned T of 1, 2, 4 or 8 bytes (LoadLE<uint32_t> is LoadLE32).
template <typename T>
inline T LoadLE(const void* p) {
  static_assert(std::is_unsigned_v<T> &&
                (sizeof(T) == 1 || sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8));
  return endian_internal::Load<T>(p);
}

// Stores v little-endian at p (24: the low 3 bytes). REQUIRES: that many writable bytes.
inline void StoreLE16(void* p, uint16_t v) { endian_internal::Store(p, v); }
inline void StoreLE24(void* p, uint32_t v) {
  auto* b = static_cast<unsigned char*>(p);
  b[0] = static_cast<unsigned char>(v);
  b[1] = static_cast<unsigned char>(v >> 8);
  b[2] = static_cast<unsigned char>(v >> 16);
}
inline void StoreLE32(void* p, uint32_t v) { endian_internal::Store(p, v); }
inline void StoreLE64(void* p, uint64_t v) { endian_internal::Store(p, v); }

// Appends v little-endian to *out.
inline void AppendLE16(std::string* out, uint16_t v) {
  char b[2];
  StoreLE16(b, v);
  out->append(b, 2);
}
inline void AppendLE32(std::string* out, uint32_t v) {
  char b[4];
  StoreLE32(b, v);
  out->append(b, 4);
}
inline void AppendLE64(std::string* out, uint64_t v) {
  char b[8];
  StoreLE64(b, v);
  out->append(b, 8);
}

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_ENDIAN_H_
