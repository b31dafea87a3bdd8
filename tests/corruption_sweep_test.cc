// The corruption sweep over fs-storage checkpoints (tests/corruption_sweep.h):
// every single-bit flip either fails the load / verify naming the file, or
// cannot change what is loaded. Zero silent loads at load world sizes 1, 2, 3.
#include "corruption_sweep.h"

#include "megackpt/dcp/filesystem.h"

namespace megackpt::dcp::sweep {
namespace {

TEST(CorruptionSweep, FileSystemStorage) {
  Storage fs{"fs",
             [](const std::string& dir) { return NewFileSystemWriter(dir); },
             [](const std::string& dir) { return NewFileSystemReader(dir); }};
  const size_t flips = RunSweep(fs, 2 << 20, 6);
  EXPECT_GT(flips, 100u);
  std::printf("fs corruption sweep: %zu flips, each loaded at 1, 2, 3 ranks and verified\n", flips);
}

}  // namespace
}  // namespace megackpt::dcp::sweep
