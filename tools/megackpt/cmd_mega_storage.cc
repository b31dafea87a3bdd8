// Placeholder until the mega_storage commands land.
#include "megackpt/commands.h"

namespace megackpt::cli {

void RegisterMegaStorageCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  (void)app;
  (void)bench;
  (void)exit_code;
}

}  // namespace megackpt::cli
