#include "megackpt/core/packed.h"

#include <cstring>
#include <string>
#include <vector>

#include "megackpt/core/tensor.h"

namespace megackpt::inline core {
namespace {

inline uint8_t GetNibble(const uint8_t* p, uint64_t i) {
  return static_cast<uint8_t>((p[i >> 1] >> ((i & 1) * 4)) & 0x0F);
}

inline void PutNibble(uint8_t* p, uint64_t i, uint8_t v) {
  uint8_t& b = p[i >> 1];
  b = (i & 1) ? static_cast<uint8_t>((b & 0x0F) | (v << 4)) : static_cast<uint8_t>((b & 0xF0) | v);
}

// Copies n elements from flat element si of s to flat element di of d.
void CopyNibbles(const uint8_t* s, uint64_t si, uint8_t* d, uint64_t di, uint64_t n) {
  if (n == 0) return;
  if (((si ^ di) & 1) == 0) {
    // Same nibble phase: whole bytes in the middle.
    if (si & 1) {
      PutNibble(d, di, GetNibble(s, si));
      ++si, ++di, --n;
    }
    std::memcpy(d + di / 2, s + si / 2, n / 2);
    if (n & 1) PutNibble(d, di + n - 1, GetNibble(s, si + n - 1));
    return;
  }
  // Opposite phases: every output byte combines two source bytes.
  if (di & 1) {
    PutNibble(d, di, GetNibble(s, si));
    ++si, ++di, --n;
  }
  // Now di is even and si is odd.
  const uint8_t* sp = s + si / 2;
  uint8_t* dp = d + di / 2;
  const uint64_t pairs = n / 2;
  for (uint64_t k = 0; k < pairs; ++k) {
    dp[k] = static_cast<uint8_t>((sp[k] >> 4) | (sp[k + 1] << 4));
  }
  if (n & 1) PutNibble(d, di + n - 1, GetNibble(s, si + n - 1));
}

Status CheckBox(const char* side, std::span<const int64_t> shape, std::span<const int64_t> start,
                std::span<const int64_t> lengths) {
  for (size_t k = 0; k < lengths.size(); ++k) {
    if (start[k] < 0 || lengths[k] < 0 || shape[k] < 0 || start[k] > shape[k] ||
        lengths[k] > shape[k] - start[k]) {
      return InvalidArgumentError(std::string("CopyF4Box: ") + side + " box " +
                                  ShapeToString(start) + "+" + ShapeToString(lengths) +
                                  " exceeds the shape " + ShapeToString(shape));
    }
  }
  return Status::OK();
}

}  // namespace

Status CopyF4Box(const F4ConstArray& src, std::span<const int64_t> src_start, const F4Array& dst,
                 std::span<const int64_t> dst_start, std::span<const int64_t> lengths) {
  const size_t nd = lengths.size();
  if (src.shape.size() != nd || dst.shape.size() != nd || src_start.size() != nd ||
      dst_start.size() != nd) {
    return InvalidArgumentError(
        "CopyF4Box: ranks differ (source " + std::to_string(src.shape.size()) + ", destination " +
        std::to_string(dst.shape.size()) + ", box " + std::to_string(nd) + ")");
  }
  MEGA_RETURN_IF_ERROR(CheckBox("source", src.shape, src_start, lengths));
  MEGA_RETURN_IF_ERROR(CheckBox("destination", dst.shape, dst_start, lengths));
  for (int64_t l : lengths) {
    if (l == 0) return Status::OK();
  }
  const auto* s = reinterpret_cast<const uint8_t*>(src.data);
  auto* d = reinterpret_cast<uint8_t*>(dst.data);
  const uint64_t window = 2 * src.first_byte;  // first element the source window holds
  if (nd == 0) {
    if (window > 0) return InvalidArgumentError("CopyF4Box: source box starts before the window");
    CopyNibbles(s, 0, d, 0, 1);
    return Status::OK();
  }
  if (nd == 1) {
    const uint64_t first = static_cast<uint64_t>(src_start[0]);
    if (first < window) {
      return InvalidArgumentError("CopyF4Box: source box starts at element " +
                                  std::to_string(first) + ", before the window at byte " +
                                  std::to_string(src.first_byte));
    }
    CopyNibbles(s, first - window, d, static_cast<uint64_t>(dst_start[0]),
                static_cast<uint64_t>(lengths[0]));
    return Status::OK();
  }
  // Dims [k, nd) form one run in both arrays (dims after k whole in both).
  size_t k = nd - 1;
  while (k > 0 && lengths[k] == src.shape[k] && lengths[k] == dst.shape[k]) --k;
  uint64_t run = 1;
  for (size_t i = k; i < nd; ++i) run *= static_cast<uint64_t>(lengths[i]);
  std::vector<uint64_t> sstride(nd), dstride(nd);
  uint64_t ss = 1, ds = 1;
  for (size_t i = nd; i-- > 0;) {
    sstride[i] = ss;
    dstride[i] = ds;
    ss *= static_cast<uint64_t>(src.shape[i]);
    ds *= static_cast<uint64_t>(dst.shape[i]);
  }
  uint64_t soff = 0, doff = 0;
  for (size_t i = 0; i < nd; ++i) {
    soff += static_cast<uint64_t>(src_start[i]) * sstride[i];
    doff += static_cast<uint64_t>(dst_start[i]) * dstride[i];
  }
  if (soff < window) {
    return InvalidArgumentError("CopyF4Box: source box starts at element " + std::to_string(soff) +
                                ", before the window at byte " + std::to_string(src.first_byte));
  }
  soff -= window;
  // Odometer over the outer dims [0, k).
  std::vector<int64_t> idx(k, 0);
  while (true) {
    CopyNibbles(s, soff, d, doff, run);
    size_t dim = k;
    while (dim > 0) {
      --dim;
      ++idx[dim];
      soff += sstride[dim];
      doff += dstride[dim];
      if (idx[dim] < lengths[dim]) break;
      soff -= sstride[dim] * static_cast<uint64_t>(lengths[dim]);
      doff -= dstride[dim] * static_cast<uint64_t>(lengths[dim]);
      idx[dim] = 0;
      if (dim == 0) return Status::OK();
    }
    if (k == 0) return Status::OK();
  }
}

std::pair<uint64_t, uint64_t> F4BoxByteRange(std::span<const int64_t> shape,
                                             std::span<const int64_t> start,
                                             std::span<const int64_t> lengths) {
  const size_t nd = shape.size();
  for (int64_t l : lengths) {
    if (l <= 0) return {0, 0};
  }
  uint64_t first = 0, last = 0, stride = 1;
  for (size_t i = nd; i-- > 0;) {
    first += static_cast<uint64_t>(start[i]) * stride;
    last += static_cast<uint64_t>(start[i] + lengths[i] - 1) * stride;
    stride *= static_cast<uint64_t>(shape[i]);
  }
  return {first / 2, last / 2 + 1};
}

}  // namespace megackpt::inline core
