// A benchmark state: `tensors` F32 matrices of `cols` columns whose rows are
// split evenly over the ranks (rank r holds rows [rows*r/world, rows*(r+1)/world)),
// each rank's piece in one pre-faulted buffer, filled with deterministic random
// bytes; plus a same-shaped, pre-faulted destination for loads. Used by the
// benches that save from one world size and load at another.
#ifndef MEGACKPT_BENCH_ROW_SHARDED_STATE_H_
#define MEGACKPT_BENCH_ROW_SHARDED_STATE_H_

#include <cstdint>
#include <string_view>
#include <vector>

#include "bench_util.h"  // StatePages
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/state_dict.h"

namespace megackpt::bench {

struct RowShardedLayout {
  int tensors = 16;
  int64_t cols = 1024;                   // F32: 4 KiB rows
  StatePages pages = StatePages::kHuge;  // of the state and the load destinations
  // Rows per tensor for a state of about `size` bytes (at least 1).
  int64_t RowsFor(uint64_t size) const;
  // The exact state bytes for `size` (rows rounded down).
  uint64_t BytesFor(uint64_t size) const;
};

struct RowShardedRank {
  dcp::StateDict save;  // this rank's pieces, holding the data
  dcp::StateDict load;  // the same pieces' destinations (AddLoadDestinations)
  std::vector<Tensor> save_shards, load_shards;
  std::vector<int64_t> first_row;  // per tensor: the global row of the piece's row 0
  RowShardedLayout layout;
  int64_t rows = 0;  // global rows per tensor
  // Allocates `load` / `load_shards` (pre-faulted) once; later calls return at
  // once. BuildRowShardedRank leaves them to the load rows, so the save rows
  // run without that much memory held (less free memory lowers the kernel's
  // dirty-page limits, which a no-sync save of a few GiB then meets).
  Status AddLoadDestinations();
  // The value check after a load, of every bench that loads this state: OK
  // when every destination holds the bytes the state has at those global rows
  // (regenerated, not compared with a copy); else an Internal error that
  // starts with `who` (e.g. "bench mega: rank 1") and names the first tensor
  // and global row that differ.
  Status CheckLoaded(std::string_view who) const;
};

// Names "layers.<t>.weight". The bytes depend on (t, global row), not on the
// world size, so a state built at one world size can check a load at another.
Result<RowShardedRank> BuildRowShardedRank(const RowShardedLayout& layout, uint64_t size, int world,
                                           int rank);

}  // namespace megackpt::bench

#endif  // MEGACKPT_BENCH_ROW_SHARDED_STATE_H_
