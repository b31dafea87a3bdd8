#include "cas/bytes.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <utility>

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

}  // namespace megackpt::cas::internal
