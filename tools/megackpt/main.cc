// megackpt: inspect, verify, convert and consolidate checkpoints; run the demo;
// talk to a CAS store or a MEGA hub; benchmark against the machine's limits.
#include <cstdio>
#include <exception>

#include "megackpt/commands.h"  // tools/megackpt/commands.h

int main(int argc, char** argv) {
  CLI::App app{
      "megackpt: distributed checkpoints in MEGA (.mega) and safetensors format, with\n"
      "content-addressed storage and mega:// hub paths.\n\n"
      "Examples:\n"
      "  megackpt demo --out /tmp/ckpt --world-size 2      save + resharded load of a synthetic model\n"
      "  megackpt inspect model.mega                       tensors, dtypes, shapes, metadata\n"
      "  megackpt verify ckpt/model.mega.index.json        check every checksum\n"
      "  megackpt convert model.safetensors out_dir/       safetensors -> MEGA\n"
      "Run `megackpt COMMAND --help` for each command's options.",
      "megackpt"};
  // MEGACKPT_VERSION is CMake's project(VERSION): the one version of the CLI and the Python package.
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;  // usage error
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megackpt: internal error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
