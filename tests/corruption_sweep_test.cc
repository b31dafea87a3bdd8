// The corruption sweep over fs- and MEGA-storage checkpoints
// (tests/corruption_sweep.h): every single-bit flip either fails the load /
// verify naming the file (and the tensor), or cannot change what is loaded.
// Zero silent loads at load world sizes 1, 2, 3.
#include "corruption_sweep.h"

#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/mega_storage.h"

namespace megackpt::dcp::sweep {
namespace {

TEST(CorruptionSweep, FileSystemStorage) {
  Storage fs{"fs", [](const std::string& dir) { return NewFileSystemWriter(dir); },
             [](const std::string& dir) { return NewFileSystemReader(dir); }};
  const size_t flips = RunSweep(fs, 2 << 20, 6);
  EXPECT_GT(flips, 100u);
  std::printf("fs corruption sweep: %zu flips, each loaded at 1, 2, 3 ranks and verified\n", flips);
}

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
  std::printf("mega corruption sweep: %zu flips, each loaded at 1, 2, 3 ranks and verified\n",
              flips);
}

}  // namespace
}  // namespace megackpt::dcp::sweep
