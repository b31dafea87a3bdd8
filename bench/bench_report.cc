#include "bench_report.h"

#include <cstdio>

namespace megackpt::bench {

std::string BenchDir(const std::string& dir, const std::string& prefix,
                     std::unique_ptr<TempDir>* holder) {
  if (!dir.empty()) return dir;
  *holder = std::make_unique<TempDir>(prefix);
  return (*holder)->path();
}

int PrintBenchResult(std::string_view name, const Status& s, const nlohmann::json& out,
                     const std::string& table, bool json) {
  const std::string command = "bench " + std::string(name);
  if (!s.ok()) {
    const std::string code(StatusCodeName(s.code()));
    std::fprintf(stderr, "megackpt: error: %s: %s: %s\n", command.c_str(), code.c_str(),
                 s.message().c_str());
    if (json) {  // the CLI's error object (tools/megackpt/cli_util.h)
      nlohmann::json j;
      j["error"] = {{"code", code}, {"message", command + ": " + s.message()}};
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    std::fflush(stdout);
    return 1;
  }
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::fputs(table.c_str(), stdout);
  }
  // Out before the caller ends an MPI group: mpirun need not forward what a
  // rank writes after MPI_Finalize.
  std::fflush(stdout);
  return 0;
}

}  // namespace megackpt::bench
