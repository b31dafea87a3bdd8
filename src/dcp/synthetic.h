// Deterministic synthetic model states for the demo, the benchmark and tests.
//
// A Spec lists entries (nested names, dtypes, shapes, bytes values) derived from
// a seed and a target size. The content of every global tensor is a pure
// function of (seed, fqn, byte position), so any rank can build or check any box
// of it without the others. Layouts say how a tensor is split over ranks:
// replicated whole tensors, row-wise, column-wise, uneven rows (several chunks
// per rank, some ranks empty), 2-D blocks, and rows replicated on pairs of ranks.
#ifndef MEGACKPT_SRC_DCP_SYNTHETIC_H_
#define MEGACKPT_SRC_DCP_SYNTHETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/state_dict.h"

namespace megackpt::dcp::synthetic {

enum class Layout { kReplicated, kRows, kCols, kUnevenRows, kBlocks2D, kReplicatedRows };
inline constexpr int kNumLayouts = 6;
const char* LayoutName(Layout layout);

struct EntrySpec {
  std::string fqn;  // dotted name
  ObjectPath path;  // nesting (keys and list indices)
  bool is_bytes = false;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes_len = 0;               // bytes entries
  Layout layout = Layout::kReplicated;  // layout when saving
  // Version of the content (0: the seed's). A simulated training step that
  // changes the entry bumps it: every byte then differs from other versions'.
  uint64_t generation = 0;
};

struct Spec {
  uint64_t seed = 0;
  std::vector<EntrySpec> entries;
  // Bytes of the global state (each tensor once, bytes values once).
  uint64_t total_bytes = 0;
};

// ~target_bytes of state (at least a few small entries).
Spec MakeSpec(uint64_t seed, uint64_t target_bytes);

// The layout entry uses when loading with `variant` (0 = the save layout).
Layout LoadLayout(const EntrySpec& entry, int variant);

// Chunks of rank `rank` of `world` for a tensor of `shape` under `layout`
// (several or none possible). `salt` varies uneven cuts per tensor.
std::vector<ChunkStorageMetadata> ChunksFor(Layout layout, const Shape& shape, int world, int rank,
                                            uint64_t salt);

// The value of a bytes entry.
std::string BytesValue(const Spec& spec, const EntrySpec& entry);

// Writes the global content of box (offsets, dst.shape()) into dst (contiguous).
Status FillBox(const Spec& spec, const EntrySpec& entry, const Shape& offsets, const Tensor& dst);

// Rank `rank`'s state dict: with `fill`, holding the seed's content; otherwise
// allocated (pre-faulted, filled with 0xCD) ready to be loaded into. `variant`
// picks layouts (LoadLayout). Tensors of one rank are views of one allocation
// per entry.
Result<StateDict> BuildRankState(const Spec& spec, int world, int rank, int variant, bool fill);

// Compares every tensor chunk and bytes value of `state` against the seed's
// content. DataLoss naming the first differing fqn, chunk and byte.
Status VerifyRankState(const Spec& spec, StateDict& state);

// Bytes of tensor data and bytes values a rank holds (replicas counted).
uint64_t RankStateBytes(StateDict& state);

}  // namespace megackpt::dcp::synthetic

#endif  // MEGACKPT_SRC_DCP_SYNTHETIC_H_
