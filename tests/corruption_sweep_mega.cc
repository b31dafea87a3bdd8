// The corruption sweep over MEGA-storage checkpoints (tests/corruption_sweep.h).
// Built and registered only with -DMEGACKPT_MEGA_SWEEP=ON
// (tests/cmake/corruption_sweep_mega.cmake): it needs verified partial reads in
// MegaStorageReader (the MEGA block-verification work of issue 11); the lead
// turns it on when that lands.
#include "corruption_sweep.h"

#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp::sweep {
namespace {

TEST(CorruptionSweep, MegaStorage) {
  Storage mega{"mega",
               [](const std::string& dir) -> std::unique_ptr<StorageWriter> {
                 return std::make_unique<MegaStorageWriter>(dir);
               },
               [](const std::string& dir) -> std::unique_ptr<StorageReader> {
                 return std::make_unique<MegaStorageReader>(dir);
               }};
  const size_t flips = RunSweep(mega, 2 << 20, 6);
  EXPECT_GT(flips, 100u);
  std::printf("mega corruption sweep: %zu flips, each loaded at 1, 2, 3 ranks and verified\n", flips);
}

}  // namespace
}  // namespace megackpt::dcp::sweep
