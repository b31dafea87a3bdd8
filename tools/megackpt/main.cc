// megackpt: inspect, verify, convert and consolidate checkpoints; run the demo;
// talk to a CAS store or a MEGA hub; benchmark against the machine's limits.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "megackpt/commands.h"  // tools/megackpt/commands.h
#include "megackpt/config.h"    // MEGACKPT_VERSION

namespace {

using megackpt::cli::ClosestName;
using megackpt::cli::ReportUsage;

// Every command's help ends with the exit codes.
void AddExitCodesFooter(CLI::App* app) {
  app->footer(megackpt::cli::kExitCodesHelp);
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; }))
    AddExitCodesFooter(sub);
}

// Follows the command words of argv down the subcommand tree; a word that is
// not a subcommand where one is expected is a usage error with the closest
// name ("unknown command 'inpsect'; did you mean 'inspect'?"). Returns 0 when
// every command word is known (CLI11 then parses), else the exit code.
int CheckCommandWords(CLI::App& app, int argc, char** argv) {
  CLI::App* current = &app;
  std::string path;  // "cas " for a word below `megackpt cas`
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (!word.empty() && word[0] == '-') continue;  // groups take flags only
    std::vector<std::string> names;
    for (CLI::App* sub : current->get_subcommands([](CLI::App*) { return true; })) {
      names.push_back(sub->get_name());
    }
    if (names.empty()) return 0;  // a leaf command: the rest are its arguments
    CLI::App* next = nullptr;
    for (CLI::App* sub : current->get_subcommands([](CLI::App*) { return true; })) {
      if (sub->check_name(word)) next = sub;
    }
    if (next == nullptr) {
      std::string message = "unknown command '" + path + word + "'";
      if (std::string close = ClosestName(word, names); !close.empty()) {
        message += "; did you mean '" + path + close + "'?";
      } else {
        message += " (run 'megackpt " + path + "--help' for the list)";
      }
      return ReportUsage("", message);
    }
    current = next;
    path += word + " ";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "megackpt: distributed checkpoints in MEGA (.mega) and safetensors format, with\n"
      "content-addressed storage and mega:// hub paths.\n\n"
      "Examples:\n"
      "  megackpt demo --out /tmp/ckpt --world-size 2      save + resharded load of a synthetic "
      "model\n"
      "  megackpt inspect model.mega                       tensors, dtypes, shapes, metadata\n"
      "  megackpt verify ckpt/model.mega.index.json        check every checksum\n"
      "  megackpt convert model.safetensors out_dir/       safetensors -> MEGA\n"
      "Run `megackpt COMMAND --help` for each command's options.",
      "megackpt"};
  // MEGACKPT_VERSION (megackpt/config.h) is CMake's project(VERSION): the one version of the
  // library, the CLIs and the Python package.
  app.set_version_flag("--version", "megackpt " MEGACKPT_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  int exit_code = 0;
  CLI::App* bench = app.add_subcommand(
      "bench", "Benchmarks: measure megackpt next to the machine's limits in the same run");
  bench->require_subcommand(1);
  megackpt::cli::RegisterFormatCommands(app, *bench, &exit_code);
  megackpt::cli::RegisterDcpCommands(app, *bench, &exit_code);
  megackpt::cli::RegisterMegaStorageCommands(app, *bench, &exit_code);
  megackpt::cli::RegisterCasCommands(app, *bench, &exit_code);
  megackpt::cli::RegisterHubCommands(app, *bench, &exit_code);
  megackpt::cli::RegisterCkptCommands(app, *bench, &exit_code);
  megackpt::cli::AddJsonFlag(&app, "JSON results and errors on stdout (as after the command)");
  AddExitCodesFooter(&app);
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) megackpt::cli::SetJsonOutput(true);
  }
  if (int rc = CheckCommandWords(app, argc, argv); rc != 0) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success))
      return app.exit(e);  // --help, --version
    return ReportUsage("", std::string(e.what()) + " (run with --help for the options)");
  } catch (const std::exception& e) {
    return megackpt::cli::ReportError("", megackpt::InternalError(e.what()));
  }
  return exit_code;
}
