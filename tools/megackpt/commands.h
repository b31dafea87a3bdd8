// Command groups of the megackpt CLI. Each group lives in its own cmd_<group>.cc
// and adds its subcommands to `app` (and benchmark subcommands to `bench`, the
// `megackpt bench` command). A subcommand's callback stores the process exit code
// in *exit_code: 0 success, 1 failure (corrupt data, failed check), 2 usage error.
#ifndef MEGACKPT_TOOLS_COMMANDS_H_
#define MEGACKPT_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string_view>

#include "megackpt/core/status.h"

namespace megackpt::cli {

void RegisterFormatCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // inspect verify convert
void RegisterDcpCommands(CLI::App& app, CLI::App& bench, int* exit_code);     // demo
void RegisterMegaStorageCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // consolidate
void RegisterCasCommands(CLI::App& app, CLI::App& bench, int* exit_code);     // cas
void RegisterHubCommands(CLI::App& app, CLI::App& bench, int* exit_code);     // push pull ls rm log

// A byte count as users write it, case-insensitive, '_' and ' ' ignored:
// "1000000", "1.5MB" / "1.5M" (decimal: k, M, G, T = 1e3, 1e6, 1e9, 1e12),
// "2GiB" (binary: KiB, MiB, GiB, TiB). InvalidArgument naming the text otherwise
// (negative, not a number, unknown unit, >= 1.8e19).
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace megackpt::cli

#endif  // MEGACKPT_TOOLS_COMMANDS_H_
