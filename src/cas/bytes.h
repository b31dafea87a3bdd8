// Internal helpers of the cas layer (little-endian fields: megackpt/core/endian.h): a large,
// reusable byte buffer that asks for transparent huge pages (first-touch page
// faults on 4 KiB pages are the slowest thing on this machine, docs/architecture.md).
#ifndef MEGACKPT_SRC_CAS_BYTES_H_
#define MEGACKPT_SRC_CAS_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "megackpt/core/endian.h"

namespace megackpt::cas::internal {

inline const uint8_t* U8(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }
inline const uint8_t* U8(const char* p) { return reinterpret_cast<const uint8_t*>(p); }

// A growable byte buffer whose memory is kept between uses (no zero fill on
// growth) and backed by huge pages when large.
class ByteBuffer {
 public:
  ByteBuffer() = default;
  ~ByteBuffer();
  ByteBuffer(ByteBuffer&& other) noexcept { *this = std::move(other); }
  ByteBuffer& operator=(ByteBuffer&& other) noexcept;
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;

  // Ensures capacity() >= n, keeping the first size() bytes.
  void Reserve(size_t n);
  // Sets the size (growing capacity as needed; new bytes are uninitialised).
  void Resize(size_t n) {
    Reserve(n);
    size_ = n;
  }
  void Append(const void* data, size_t n) {
    Reserve(size_ + n);
    std::memcpy(data_ + size_, data, n);
    size_ += n;
  }
  void Clear() { size_ = 0; }
  // Drops the first n bytes (moves the rest to the front).
  void Consume(size_t n);

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  std::span<const std::byte> span() const { return {data_, size_}; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// A process-wide cache of large ByteBuffers. Touching fresh memory costs far
// more than the work done with it here (page faults run at ~0.1-2 GB/s on this
// machine, docs/architecture.md), so upload and download buffers are recycled across
// streams and CasStore objects. Thread-safe.
class BufferCache {
 public:
  // A buffer with capacity >= min_capacity when the cache has one (else the
  // largest cached one, or an empty buffer). Its size is 0.
  static ByteBuffer Take(size_t min_capacity = 0);
  // Returns a buffer for reuse; dropped when the cache is full.
  static void Give(ByteBuffer buffer);
};

// A ByteBuffer borrowed from the BufferCache for the lifetime of this object.
class CachedBuffer {
 public:
  explicit CachedBuffer(size_t min_capacity = 0) : buf_(BufferCache::Take(min_capacity)) {}
  ~CachedBuffer() { BufferCache::Give(std::move(buf_)); }
  CachedBuffer(const CachedBuffer&) = delete;
  CachedBuffer& operator=(const CachedBuffer&) = delete;
  ByteBuffer& operator*() { return buf_; }
  ByteBuffer* operator->() { return &buf_; }
  const ByteBuffer* operator->() const { return &buf_; }

 private:
  ByteBuffer buf_;
};

}  // namespace megackpt::cas::internal

#endif  // MEGACKPT_SRC_CAS_BYTES_H_
