// Command groups of the megackpt CLI. Each group lives in its own cmd_<group>.cc
// and adds its subcommands to `app` (and benchmark subcommands to `bench`, the
// `megackpt bench` command). A subcommand's callback stores the process exit code
// in *exit_code: 0 success, 1 failure (corrupt data, failed check), 2 usage error.
#ifndef MEGACKPT_TOOLS_COMMANDS_H_
#define MEGACKPT_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "megackpt/core/status.h"

namespace megackpt::cli {

void RegisterFormatCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // inspect verify convert
void RegisterDcpCommands(CLI::App& app, CLI::App& bench, int* exit_code);     // demo
void RegisterMegaStorageCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // consolidate
void RegisterCasCommands(CLI::App& app, CLI::App& bench, int* exit_code);     // cas
void RegisterHubCommands(CLI::App& app, CLI::App& bench, int* exit_code);     // push pull ls rm log
void RegisterCkptCommands(CLI::App& app, CLI::App& bench, int* exit_code);    // ckpt diff

// `megackpt demo --steps N`: the simulated training loop through the
// CheckpointManager (cmd_ckpt.cc); the demo's other options as given.
struct StepsDemoOptions {
  std::string out;
  std::string storage;  // "" = the manager's default
  std::string backend = "threads";
  int world_size = 2;
  int load_world_size = 0;  // 0: a different one
  int threads = 2;
  uint64_t seed = 1;
  uint64_t size = 256ull << 20;
  int steps = 0;
  double change_fraction = 0.1;
  int keep_last = 3;
  bool incremental = true;  // unchanged entries referenced, not rewritten
};
int RunStepsDemo(const StepsDemoOptions& options);

// "1.50 GB", "12.00 MB", "3.00 kB", "12 B" (decimal units).
std::string HumanBytes(uint64_t n);

// A byte count as users write it, case-insensitive, '_' and ' ' ignored:
// "1000000", "1.5MB" / "1.5M" (decimal: k, M, G, T = 1e3, 1e6, 1e9, 1e12),
// "2GiB" (binary: KiB, MiB, GiB, TiB). InvalidArgument naming the text otherwise
// (negative, not a number, unknown unit, >= 1.8e19).
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace megackpt::cli

#endif  // MEGACKPT_TOOLS_COMMANDS_H_
