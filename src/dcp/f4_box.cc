#include "dcp/f4_box.h"

#include <algorithm>

#include "megackpt/core/packed.h"

namespace megackpt::dcp {
namespace {

// Many tiny runs in one span would make the piece list huge; cut spans there.
constexpr size_t kMaxPiecesPerSpan = 1u << 16;

}  // namespace

Status ForEachF4Span(const Shape& stored, const Shape& start, const Shape& lengths,
                     uint64_t max_span_bytes, double max_overhead,
                     const std::function<Status(const F4Span&)>& fn) {
  const size_t nd = stored.size();
  for (int64_t l : lengths) {
    if (l <= 0) return Status::OK();
  }
  max_span_bytes = std::max<uint64_t>(max_span_bytes, 2);
  // Dims [k, nd) are whole in the chunk; dim r = k - 1 is the partial one.
  size_t k = nd;
  while (k > 0 && lengths[k - 1] == stored[k - 1]) --k;
  const std::vector<int64_t> strides = ContiguousStrides(stored);
  uint64_t run_elems = 1, nruns = 1, base = 0;
  size_t r = 0;
  if (k > 0) {
    r = k - 1;
    run_elems = static_cast<uint64_t>(lengths[r]);
    for (size_t d = r + 1; d < nd; ++d) run_elems *= static_cast<uint64_t>(stored[d]);
    for (size_t d = 0; d < r; ++d) nruns *= static_cast<uint64_t>(lengths[d]);
    base = static_cast<uint64_t>(start[r]) * static_cast<uint64_t>(strides[r]);
  } else {
    for (int64_t s : stored) run_elems *= static_cast<uint64_t>(s);
  }
  // Odometer over dims [0, r): the flat start of the current run.
  std::vector<int64_t> idx(r, 0);
  uint64_t run_start = base;
  for (size_t d = 0; d < r; ++d) run_start += static_cast<uint64_t>(start[d]) * strides[d];
  const uint64_t max_piece =
      max_span_bytes > (UINT64_MAX >> 2) ? UINT64_MAX : 2 * (max_span_bytes - 1);

  F4Span cur;
  uint64_t needed = 0;
  bool open = false;
  for (uint64_t q = 0; q < nruns; ++q) {
    for (uint64_t off = 0; off < run_elems; off += max_piece) {
      F4Piece p{run_start + off, q * run_elems + off, std::min(max_piece, run_elems - off)};
      const uint64_t pb = p.src_elem / 2, pe = (p.src_elem + p.n - 1) / 2 + 1;
      if (open) {
        const uint64_t end = std::max(cur.end, pe);
        const double span = static_cast<double>(end - cur.begin);
        if (end - cur.begin <= max_span_bytes && cur.pieces.size() < kMaxPiecesPerSpan &&
            span <= static_cast<double>(needed + (pe - pb)) * (1.0 + max_overhead)) {
          cur.end = end;
          cur.pieces.push_back(p);
          needed += pe - pb;
          continue;
        }
        MEGA_RETURN_IF_ERROR(fn(cur));
      }
      cur.begin = pb;
      cur.end = pe;
      cur.pieces.assign(1, p);
      needed = pe - pb;
      open = true;
    }
    // Next run.
    for (size_t d = r; d-- > 0;) {
      ++idx[d];
      run_start += strides[d];
      if (idx[d] < lengths[d]) break;
      run_start -= static_cast<uint64_t>(strides[d]) * static_cast<uint64_t>(lengths[d]);
      idx[d] = 0;
    }
  }
  if (open) MEGA_RETURN_IF_ERROR(fn(cur));
  return Status::OK();
}

Status CopyF4Span(const F4Span& span, const std::byte* buf, uint64_t buf_first_byte,
                  const Shape& stored, const Tensor& dst) {
  if (dst.dtype() != DType::kF4 || !dst.is_contiguous()) {
    return InvalidArgumentError("F4 box copy: the destination must be a contiguous F4 tensor");
  }
  int64_t chunk_elems = 1;
  for (int64_t s : stored) chunk_elems *= s;
  const int64_t src_shape[1] = {chunk_elems};
  const int64_t dst_shape[1] = {static_cast<int64_t>(dst.numel())};
  const F4ConstArray src{buf, src_shape, buf_first_byte};
  const F4Array out{static_cast<std::byte*>(dst.data()), dst_shape};
  for (const F4Piece& p : span.pieces) {
    const int64_t s0[1] = {static_cast<int64_t>(p.src_elem)};
    const int64_t d0[1] = {static_cast<int64_t>(p.dst_elem)};
    const int64_t len[1] = {static_cast<int64_t>(p.n)};
    MEGA_RETURN_IF_ERROR(CopyF4Box(src, s0, out, d0, len));
  }
  return Status::OK();
}

}  // namespace megackpt::dcp
