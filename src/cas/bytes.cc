#include "cas/bytes.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace megackpt::cas::internal {

namespace {
constexpr size_t kHugePage = 2u << 20;
}

ByteBuffer::~ByteBuffer() { std::free(data_); }

ByteBuffer& ByteBuffer::operator=(ByteBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void ByteBuffer::Reserve(size_t n) {
  if (n <= capacity_) return;
  size_t cap = std::max(n, capacity_ + capacity_ / 2);
  std::byte* p;
  if (cap >= kHugePage) {
    cap = (cap + kHugePage - 1) / kHugePage * kHugePage;
    p = static_cast<std::byte*>(std::aligned_alloc(kHugePage, cap));
    if (p) madvise(p, cap, MADV_HUGEPAGE);  // advisory; failure is harmless
  } else {
    p = static_cast<std::byte*>(std::malloc(cap));
  }
  if (!p) throw std::bad_alloc();
  if (size_) std::memcpy(p, data_, size_);
  std::free(data_);
  data_ = p;
  capacity_ = cap;
}

void ByteBuffer::Consume(size_t n) {
  n = std::min(n, size_);
  if (n < size_) std::memmove(data_, data_ + n, size_ - n);
  size_ -= n;
}

namespace {
constexpr size_t kMaxCachedBuffers = 24;
constexpr size_t kMaxCachedBytes = 768u << 20;

struct Cache {
  std::mutex mu;
  std::vector<ByteBuffer> buffers;
  size_t bytes = 0;
};
Cache& TheCache() {
  static Cache* cache = new Cache;  // never destroyed: used from any thread until exit
  return *cache;
}
}  // namespace

ByteBuffer BufferCache::Take(size_t min_capacity) {
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.buffers.empty()) return ByteBuffer();
  size_t best = 0;
  for (size_t i = 0; i < c.buffers.size(); ++i) {
    size_t cap = c.buffers[i].capacity(), best_cap = c.buffers[best].capacity();
    // The smallest buffer that is big enough, else the biggest.
    bool fits = cap >= min_capacity, best_fits = best_cap >= min_capacity;
    if ((fits && (!best_fits || cap < best_cap)) || (!fits && !best_fits && cap > best_cap))
      best = i;
  }
  ByteBuffer out = std::move(c.buffers[best]);
  c.buffers.erase(c.buffers.begin() + static_cast<ptrdiff_t>(best));
  c.bytes -= out.capacity();
  out.Clear();
  return out;
}

void BufferCache::Give(ByteBuffer buffer) {
  if (buffer.capacity() < (1u << 20)) return;  // small ones are cheap to make
  Cache& c = TheCache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.buffers.size() >= kMaxCachedBuffers || c.bytes + buffer.capacity() > kMaxCachedBytes)
    return;
  c.bytes += buffer.capacity();
  c.buffers.push_back(std::move(buffer));
}

}  // namespace megackpt::cas::internal
