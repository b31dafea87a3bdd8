// Reading a box of a stored F4 chunk (docs/dcp.md "F4 resharding").
//
// A stored chunk is the packed row-major F4 bytes of its shape (two elements per
// byte, element i in byte i / 2, low nibble for even i; include/megackpt/core/packed.h).
// A box of it is a sequence of runs that are contiguous in the chunk's flat order
// (all dims after the last partially read dim are whole). Runs are grouped into
// spans: byte ranges of the chunk read in one go into a staging buffer, from which
// every run is copied nibble-exactly into the contiguous destination with
// CopyF4Box. Used by FileSystemReader and the MEGA storage reader for every F4
// box that is not byte-aligned (whole-chunk reads keep their direct path).
#ifndef MEGACKPT_SRC_DCP_F4_BOX_H_
#define MEGACKPT_SRC_DCP_F4_BOX_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"

namespace megackpt::dcp {

// `n` elements starting at flat element `src_elem` of the stored chunk go to
// flat element `dst_elem` of the destination (shape = the box lengths).
struct F4Piece {
  uint64_t src_elem = 0;
  uint64_t dst_elem = 0;
  uint64_t n = 0;
};

// Bytes [begin, end) of the stored chunk and the pieces they hold.
struct F4Span {
  uint64_t begin = 0;
  uint64_t end = 0;
  std::vector<F4Piece> pieces;
};

// Calls fn for every span of the box [start, start + lengths) of a chunk of
// shape `stored`, in file order. A run longer than max_span_bytes is split;
// neighbouring runs share a span while the span stays <= max_span_bytes and
// reads at most (1 + max_overhead) x the bytes of its runs (pass infinity to
// get one span covering the box from its first to its last element).
// REQUIRES: the box lies inside `stored`, max_span_bytes >= 2. Stops at and
// returns fn's first error. Nothing is called for an empty box.
Status ForEachF4Span(const Shape& stored, const Shape& start, const Shape& lengths,
                     uint64_t max_span_bytes, double max_overhead,
                     const std::function<Status(const F4Span&)>& fn);

// Copies the pieces of `span` from `buf`, which holds the chunk's bytes from
// `buf_first_byte` on (at least up to span.end), into `dst`: a contiguous F4
// tensor of the box's shape. Writes only the pieces' nibbles.
Status CopyF4Span(const F4Span& span, const std::byte* buf, uint64_t buf_first_byte,
                  const Shape& stored, const Tensor& dst);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_SRC_DCP_F4_BOX_H_
