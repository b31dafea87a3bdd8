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
  if (!s.ok()) {
    std::fprintf(stderr, "megackpt bench %.*s: %s\n", static_cast<int>(name.size()), name.data(),
                 s.ToString().c_str());
    return 1;
  }
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::fputs(table.c_str(), stdout);
  }
  return 0;
}

}  // namespace megackpt::bench
