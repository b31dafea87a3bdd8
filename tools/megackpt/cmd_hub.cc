// Placeholder until the hub commands land.
#include "megackpt/commands.h"

namespace megackpt::cli {

void RegisterHubCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  (void)app;
  (void)bench;
  (void)exit_code;
}

}  // namespace megackpt::cli
