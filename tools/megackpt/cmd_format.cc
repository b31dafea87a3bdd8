// Placeholder until the format commands land.
#include "megackpt/commands.h"

namespace megackpt::cli {

void RegisterFormatCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  (void)app;
  (void)bench;
  (void)exit_code;
}

}  // namespace megackpt::cli
