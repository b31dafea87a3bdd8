// Command groups of the megackpt CLI. Each group lives in its own cmd_<group>.cc
// and adds its subcommands to `app` (and benchmark subcommands to `bench`, the
// `megackpt bench` command). A subcommand's callback stores the process exit code
// in *exit_code: 0 success, 1 failure (corrupt data, failed check), 2 usage error.
#ifndef MEGACKPT_TOOLS_COMMANDS_H_
#define MEGACKPT_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"

namespace megackpt::bench {
enum class StatePages;  // bench/bench_util.h
}  // namespace megackpt::bench

namespace megackpt::cli {

void RegisterFormatCommands(CLI::App& app, CLI::App& bench,
                            int* exit_code);                               // inspect verify convert
void RegisterDcpCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // demo
void RegisterMegaStorageCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // consolidate
void RegisterCasCommands(CLI::App& app, CLI::App& bench, int* exit_code);          // cas
void RegisterHubCommands(CLI::App& app, CLI::App& bench, int* exit_code);   // push pull ls rm log
void RegisterCkptCommands(CLI::App& app, CLI::App& bench, int* exit_code);  // ckpt diff

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
  bool direct_io = false;   // StorageFactoryOptions::direct_io
};
int RunStepsDemo(const StepsDemoOptions& options);

// Exit codes of every command (stated in `megackpt --help`).
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // failure, or damage found (corrupt data, failed check)
constexpr int kExitUsage = 2;    // bad flags or arguments
inline constexpr const char* kExitCodesHelp =
    "Exit codes: 0 success; 1 failure or damage found (corrupt or malformed input, a failed "
    "check); 2 usage error. With --json, results and errors are JSON on stdout (an error is "
    "{\"error\": {\"code\", \"message\"}}).";

// --json output mode of this process: main() sets it when the command line has
// --json, before any command runs; errors and results then are JSON on stdout.
void SetJsonOutput(bool on);
bool JsonOutput();

// Adds the --json flag to `cmd` (the process-wide JsonOutput() mode; a command
// that keeps its own bool may bind it as usual). `description` names the keys.
void AddJsonFlag(CLI::App* cmd, const std::string& description);

// Adds the required positional argument `name` to `cmd`, bound to the string
// returned (which the command's callback captures).
std::shared_ptr<std::string> AddRequiredArg(CLI::App* cmd, const std::string& name,
                                            const std::string& description);
// Adds the flag `name` ("--verify", "-q,--quiet") to `cmd`, bound to the bool
// returned (false unless given; the command's callback captures it).
std::shared_ptr<bool> AddSharedFlag(CLI::App* cmd, const std::string& name,
                                    const std::string& description);

// kExitUsage for InvalidArgument (a bad flag value or argument), else kExitFailure.
int ExitCodeFor(const Status& s);

// Reports the failure of `command` ("verify", "cas get", ...; "" for none): a
// line "megackpt: error: COMMAND: Code: message" on stderr, and under --json
// also {"error": {"code": "DataLoss", "message": "COMMAND: message"}} on stdout.
// Returns `exit_code` (REQUIRES: non-zero) for `return ReportError(...)`.
int ReportError(std::string_view command, const Status& s, int exit_code = kExitFailure);
// The same for a usage error: code "usage", exit code kExitUsage.
int ReportUsage(std::string_view command, std::string_view message);
// "megackpt: warning: COMMAND: message" on stderr (never stdout).
void ReportWarning(std::string_view command, std::string_view message);

// One JSON document (or NDJSON line when indent < 0) on stdout, invalid UTF-8 replaced.
void PrintJson(const nlohmann::ordered_json& j, int indent = 2);

// The name in `names` closest to `word` by edit distance (insertions,
// deletions, substitutions and adjacent transpositions), when
// close enough to be a typo (at most 2 edits, and fewer than half the
// letters); "" otherwise.
std::string ClosestName(std::string_view word, const std::vector<std::string>& names);

// Parses the byte size `text` of option `flag` (ParseByteSize) into *out. A
// usage error of `command` naming the flag otherwise (*exit_code = kExitUsage,
// returns false).
bool ParseSizeFlag(std::string_view command, std::string_view flag, const std::string& text,
                   uint64_t* out, int* exit_code);

// Adds --reps, --threads, --dir and --json of a state benchmark to `cmd`, bound
// to those fields of *o (bench/bench_report.h: StateBenchOptions).
template <typename Options>
void AddStateBenchRunFlags(CLI::App* cmd, Options* o) {
  cmd->add_option("--reps", o->reps, "Measured repetitions (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--threads", o->threads, "I/O threads per rank (default 2)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--dir", o->dir, "Folder for the checkpoints (default $TMPDIR or /tmp)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
}

// Adds --state-pages huge|4k (the page size of the state's memory and of the
// ceilings' buffers) to `cmd`, bound to *pages; defined with `bench mega`.
void AddStatePagesFlag(CLI::App* cmd, bench::StatePages* pages);
// Adds --over-previous (every save of the bench writes over the previous one,
// in its folder, instead of into an emptied one) to `cmd`, bound to *on;
// defined with `bench mega`.
void AddOverPreviousFlag(CLI::App* cmd, bool* on);

// Adds `megackpt bench NAME`, a benchmark of a state of --size bytes saved and
// loaded from --world-size ranks (bench/*_bench.h: an Options struct with size,
// world_size, reps, threads, dir and json, and `int run(const Options&)`
// returning the exit code). Returns the command for its own extra options.
template <typename Options>
CLI::App* AddStateBench(CLI::App& bench, const std::string& name, const std::string& description,
                        std::shared_ptr<Options> o, int (*run)(const Options&), int* exit_code) {
  auto size = std::make_shared<std::string>("2GiB");
  CLI::App* cmd = bench.add_subcommand(name, description);
  cmd->add_option("--size", *size, "State bytes, e.g. 2GiB (default), 256MB");
  cmd->add_option("--world-size", o->world_size, "Ranks (default 1)")->check(CLI::Range(1, 64));
  AddStateBenchRunFlags(cmd, o.get());
  cmd->callback([o, size, run, name, exit_code] {
    if (!ParseSizeFlag("bench " + name, "--size", *size, &o->size, exit_code)) return;
    *exit_code = run(*o);
  });
  return cmd;
}

// Seconds on the steady clock: the one clock of the CLI's timings (subtract two).
double NowSeconds();

// Reads `file` from offset 0 to its end in blocks of up to 8 MiB and calls
// fn(block) on each in order (the span is valid during the call only). Returns
// the first read error or the first error fn returns.
Status ForEachBlock(const RandomAccessFile& file,
                    const std::function<Status(std::span<std::byte>)>& fn);

// "1.50 GB", "12.00 MB", "3.00 kB", "12 B" (decimal units): every size the CLI prints.
std::string HumanBytes(uint64_t n);
// "1.50 GB/s", "0.02 GB/s" (decimal GB per second, as the benchmarks print
// them): every rate the CLI prints.
std::string HumanRate(double bytes_per_second);
// "LABEL:  42%  1.50 GB / 3.00 GB  1.20 GB/s": the one progress line of the CLI.
std::string ProgressLine(std::string_view label, uint64_t done, uint64_t total, double seconds);

// Byte progress of one transfer on stderr: ProgressLine redrawn in place (at
// most 5 times a second) on a terminal, one line per 10% otherwise. Silent
// when not enabled or under --json. Not thread-safe.
class ByteProgress {
 public:
  ByteProgress(std::string label, uint64_t total, bool enabled);
  void Update(uint64_t done);  // bytes done so far

 private:
  std::string label_;
  uint64_t total_;
  bool enabled_, tty_;
  double start_, last_ = 0;
  int last_decile_ = 0;
};

// A byte count as users write it, case-insensitive, '_' and ' ' ignored:
// "1000000", "1.5MB" / "1.5M" (decimal: k, M, G, T = 1e3, 1e6, 1e9, 1e12),
// "2GiB" (binary: KiB, MiB, GiB, TiB). InvalidArgument naming the text otherwise
// (negative, not a number, unknown unit, >= 1.8e19).
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace megackpt::cli

#endif  // MEGACKPT_TOOLS_COMMANDS_H_
