// Helpers shared by the integration tests in tests/ (header-only; tests only):
// running a command (the megackpt CLI, megahub, python) and collecting its
// output and exit code, and small file/data helpers.
// Layer fixtures live next to their layer: src/dcp/test_util.h (temp folders,
// MPI shared folders, synthetic save/load per rank, a throwing planner),
// src/dist/test_util.h, src/format/mega_test_util.h; the megahub child process
// and the hub fixtures are in tests/hub_test_server.h.
#ifndef MEGACKPT_TESTS_TEST_UTIL_H_
#define MEGACKPT_TESTS_TEST_UTIL_H_

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace megackpt::test_util {

// The megackpt CLI of this build.
inline std::string MegackptBinary() { return std::string(MEGACKPT_BINARY_DIR) + "/tools/megackpt"; }

struct CommandResult {
  int code = -1;    // exit code; -1 when the command could not run or was killed
  std::string out;  // what it printed on stdout (and stderr with StderrTo::kOut)
  std::string err;  // what it printed on stderr (with StderrTo::kErr only)
};

// Where the command's stderr goes.
enum class StderrTo {
  kInherit,  // the test's own stderr (shows in the test log)
  kOut,      // merged into CommandResult::out (2>&1)
  kErr,      // collected separately into CommandResult::err
  kNull,     // discarded
};

struct RunOptions {
  StderrTo stderr_to = StderrTo::kInherit;
  // Environment variables set for this command only (values are shell-quoted).
  std::vector<std::pair<std::string, std::string>> env;
  // nullopt: the test's stdin; otherwise the command reads these bytes
  // ("" = an empty stdin, like </dev/null).
  std::optional<std::string> stdin_data;
};

// `s` as one single-quoted shell word.
inline std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// The whole content of a file ("" when it cannot be read).
inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `data` to `path`, creating the parent folders.
inline void WriteFileCreatingDirs(const std::string& path, const std::string& data) {
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
}

// `n` deterministic pseudo-random bytes for `seed`.
inline std::string RandomData(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(s.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return s;
}

namespace internal {

// A temp file ("megackpt-cmd-XXXXXX" in the system temp dir), removed at the end.
class ScratchFile {
 public:
  ScratchFile() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "megackpt-cmd-XXXXXX").string();
    int fd = mkstemp(tmpl.data());
    if (fd >= 0) {
      close(fd);
      path_ = tmpl;
    }
  }
  ~ScratchFile() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace internal

// Runs `command` through the shell (sh -c) and collects its stdout, and its
// stderr as `options` says. Safe to call from several threads at once.
inline CommandResult RunCommand(const std::string& command, const RunOptions& options = {}) {
  CommandResult r;
  std::string exports, redirects;
  for (const auto& [name, value] : options.env)
    exports += "export " + name + "=" + ShellQuote(value) + "; ";
  std::optional<internal::ScratchFile> err_file, in_file;
  switch (options.stderr_to) {
    case StderrTo::kInherit:
      break;
    case StderrTo::kOut:
      redirects += " 2>&1";
      break;
    case StderrTo::kErr:
      err_file.emplace();
      if (!err_file->ok()) return r;
      redirects += " 2>" + ShellQuote(err_file->path());
      break;
    case StderrTo::kNull:
      redirects += " 2>/dev/null";
      break;
  }
  if (options.stdin_data) {
    if (options.stdin_data->empty()) {
      redirects += " </dev/null";
    } else {
      in_file.emplace();
      if (!in_file->ok()) return r;
      WriteFileCreatingDirs(in_file->path(), *options.stdin_data);
      redirects += " <" + ShellQuote(in_file->path());
    }
  }
  // A subshell, so that the environment and the redirections cover the whole
  // command line (pipes and lists included).
  const std::string shell =
      exports.empty() && redirects.empty() ? command : "(" + exports + command + ")" + redirects;
  FILE* p = popen(shell.c_str(), "r");
  if (!p) return r;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (err_file) r.err = ReadFileOrEmpty(err_file->path());
  return r;
}

// `megackpt ARGS`, stdout and stderr together in `out`.
inline CommandResult RunMegackpt(const std::string& args) {
  return RunCommand(MegackptBinary() + " " + args, {.stderr_to = StderrTo::kOut});
}

// `megackpt ARGS` with explicit options (stderr, environment, stdin).
inline CommandResult RunMegackpt(const std::string& args, const RunOptions& options) {
  return RunCommand(MegackptBinary() + " " + args, options);
}

}  // namespace megackpt::test_util

#endif  // MEGACKPT_TESTS_TEST_UTIL_H_
