// A sharded save from several MPI processes, and a load back:
//   mpirun -np 2 sharded_mpi_save DIR
// Every rank holds a block of rows of one [rows, cols] tensor (a ShardedTensor);
// the save writes each rank's block once (one .mega shard per rank, one index,
// one .metadata: one commit), and the load reads back the rows of any layout --
// here every rank loads the whole tensor.
#include <cstdio>

#include "megackpt/megackpt.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np N %s DIR\n", argv[0]);
    return 2;
  }
  using namespace megackpt;
  auto group = dist::NewMpiProcessGroup();
  if (!group.ok()) {
    std::fprintf(stderr, "mpi: %s\n", group.status().ToString().c_str());
    return 1;
  }
  dist::ProcessGroup& g = **group;
  const int64_t rows = 64 * g.world_size(), cols = 512;
  auto value = [&](int64_t row, int64_t col) { return static_cast<float>(row * 1000 + col); };

  // This rank's rows [rank*64, rank*64 + 64).
  auto block = Tensor::Empty(DType::kF32, {64, cols});
  if (!block.ok()) return 1;
  float* b = static_cast<float*>(block->data());
  for (int64_t r = 0; r < 64; ++r) {
    for (int64_t c = 0; c < cols; ++c) b[r * cols + c] = value(g.rank() * 64 + r, c);
  }
  dcp::ShardedTensor sharded;
  sharded.dtype = DType::kF32;
  sharded.global_shape = {rows, cols};
  sharded.shards.push_back({{g.rank() * 64, 0}, *block});
  dcp::StateDict state;
  state.Set("layer.weight", dcp::StateValue(std::move(sharded)));

  dcp::MegaStorageWriter writer(argv[1]);
  Status s = dcp::Save(state, writer, &g);  // every rank gets the same status
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: save: %s\n", g.rank(), s.ToString().c_str());
    return 1;
  }

  // Load: every rank reads the whole tensor (a different sharding).
  auto whole = Tensor::Empty(DType::kF32, {rows, cols}, /*zero=*/true);
  dcp::StateDict back;
  back.Set("layer.weight", *whole);
  dcp::MegaStorageReader reader(argv[1]);
  s = dcp::Load(back, reader, &g);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: load: %s\n", g.rank(), s.ToString().c_str());
    return 1;
  }
  const float* w = static_cast<const float*>(whole->data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (w[r * cols + c] != value(r, c)) {
        std::fprintf(stderr, "rank %d: [%lld, %lld] differs\n", g.rank(), static_cast<long long>(r),
                     static_cast<long long>(c));
        return 1;
      }
    }
  }
  if (g.rank() == 0)
    std::printf("%d ranks saved %s sharded and loaded it whole: OK\n", g.world_size(), argv[1]);
  return 0;
}
