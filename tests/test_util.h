// Helpers shared by the integration tests in tests/ (header-only; tests only).
// Layer fixtures live next to their layer: src/dcp/test_util.h (temp folders,
// MPI shared folders, a throwing planner), src/dist/test_util.h,
// src/format/mega_test_util.h.
#ifndef MEGACKPT_TESTS_TEST_UTIL_H_
#define MEGACKPT_TESTS_TEST_UTIL_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace megackpt::test_util {

// The megackpt CLI of this build.
inline std::string MegackptBinary() { return std::string(MEGACKPT_BINARY_DIR) + "/tools/megackpt"; }

struct CommandResult {
  int code = -1;    // exit code; -1 when the command could not run or was killed
  std::string out;  // what it printed on stdout (and stderr when redirected into it)
};

// Runs `command` through the shell and collects its stdout.
inline CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// `megackpt ARGS`, stdout and stderr together in `out`.
inline CommandResult RunMegackpt(const std::string& args) {
  return RunCommand(MegackptBinary() + " " + args + " 2>&1");
}

}  // namespace megackpt::test_util

#endif  // MEGACKPT_TESTS_TEST_UTIL_H_
