// The rules every `megackpt` command follows (README "Command-line
// interfaces"), checked across the whole command tree as the built binary
// shows it, not command by command:
//   - every command and subcommand accepts --json and then prints valid JSON
//     on stdout;
//   - an error under --json is one object {"error": {"code", "message"}} on
//     stdout, with a non-zero exit code (2 for usage errors), and the human
//     line "megackpt: error: ..." on stderr;
//   - a typo'd command word is a usage error naming the closest command;
//   - every --help states the exit codes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dcp/test_util.h"
#include "test_util.h"

namespace megackpt {
namespace {

using nlohmann::json;
using test_util::CommandResult;
using ::testing::HasSubstr;
using ::testing::StartsWith;

CommandResult Cli(const std::string& args,
                  const std::vector<std::pair<std::string, std::string>>& env = {}) {
  return test_util::RunMegackpt(
      args, {.stderr_to = test_util::StderrTo::kErr, .env = env, .stdin_data = ""});
}

// The subcommand names listed under "SUBCOMMANDS:" in `megackpt PATH --help`.
std::vector<std::string> Subcommands(const std::string& path) {
  CommandResult r = Cli(path + " --help");
  EXPECT_EQ(r.code, 0) << path << ": " << r.out << r.err;
  std::vector<std::string> names;
  std::istringstream lines(r.out);
  bool in_list = false;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("SUBCOMMANDS:", 0) == 0 || line.rfind("Subcommands:", 0) == 0) {
      in_list = true;
    } else if (in_list && line.size() > 2 && line[0] == ' ' && line[1] == ' ' && line[2] != ' ') {
      names.push_back(line.substr(2, line.find(' ', 2) - 2));
    } else if (in_list && !line.empty() && line[0] != ' ') {
      in_list = false;
    }
  }
  return names;
}

// Every leaf command of the CLI ("inspect", "cas put", "bench dcp", ...).
std::vector<std::string> LeafCommands(const std::string& path = "") {
  std::vector<std::string> leaves;
  for (const std::string& name : Subcommands(path)) {
    const std::string full = path.empty() ? name : path + " " + name;
    std::vector<std::string> below = LeafCommands(full);
    if (below.empty()) {
      leaves.push_back(full);
    } else {
      leaves.insert(leaves.end(), below.begin(), below.end());
    }
  }
  return leaves;
}

// stdout as JSON: one document, or NDJSON (one document per line).
bool IsJsonOutput(const std::string& out) {
  if (json::accept(out)) return true;
  std::istringstream lines(out);
  size_t documents = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    if (!json::accept(line)) return false;
    ++documents;
  }
  return documents > 0;
}

TEST(CliRules, EveryCommandHasJsonAndExitCodesInHelp) {
  const std::vector<std::string> leaves = LeafCommands();
  // The tree as README lists it (a command added later is checked too).
  for (const char* expected :
       {"inspect",     "verify",  "convert", "consolidate", "demo",     "diff",   "ckpt ls",
        "ckpt latest", "ckpt gc", "cas put", "cas get",     "cas stat", "cas gc", "cas chunk",
        "cas verify",  "push",    "pull",    "ls",          "rm",       "log",    "bench dcp"}) {
    EXPECT_NE(std::find(leaves.begin(), leaves.end(), expected), leaves.end()) << expected;
  }
  for (const std::string& cmd : leaves) {
    CommandResult help = Cli(cmd + " --help");
    ASSERT_EQ(help.code, 0) << cmd;
    EXPECT_THAT(help.out, HasSubstr("--json")) << cmd;
    EXPECT_THAT(help.out, HasSubstr("Exit codes: 0 success; 1 failure")) << cmd;
  }
  EXPECT_THAT(Cli("--help").out, HasSubstr("2 usage error"));
}

// Runs every command with --json on real inputs made by the commands
// themselves, and parses what each printed.
TEST(CliRules, EveryCommandPrintsValidJson) {
  dcp::testing::TempDir dir("cli-rules");
  const std::string d = dir.path("");
  const std::vector<std::pair<std::string, std::string>> hub_env = {
      {"MEGA_ENDPOINT", "file://" + d + "hub"}, {"MEGA_HOME", d + "home"}};
  const std::string data = d + "data.bin";
  test_util::WriteFileCreatingDirs(data, test_util::RandomData(300000, 7));
  test_util::WriteFileCreatingDirs(d + "up/a.bin", test_util::RandomData(1000, 1));
  test_util::WriteFileCreatingDirs(d + "up/b/c.bin", test_util::RandomData(2000, 2));

  // In order: later commands read what earlier ones wrote.
  const std::vector<std::string> runs = {
      "demo --out " + d + "fs --size 1MB",
      "demo --out " + d + "mega --storage mega --size 1MB",
      "demo --out " + d + "run --steps 2 --size 1MB",
      "inspect " + d + "fs",
      "verify " + d + "fs",
      "verify " + d + "mega",
      "consolidate " + d + "mega " + d + "whole",
      "convert " + d + "whole " + d + "model.safetensors",
      "inspect " + d + "model.safetensors",
      "verify " + d + "model.safetensors",
      "ckpt ls " + d + "run",
      "ckpt latest " + d + "run",
      "ckpt latest " + d + "run --valid",
      "ckpt gc " + d + "run --keep-last 1",
      "diff " + d + "fs " + d + "fs",
      "cas put --store " + d + "cas " + data,
      "cas stat --store " + d + "cas",
      "cas chunk " + data,
      "cas verify --store " + d + "cas",
      "cas export-shard --store " + d + "cas " + d + "files.shard",
      "cas import-shard --store " + d + "cas " + d + "files.shard",
      "cas gc --store " + d + "cas --dry-run",
      "push -q " + d + "up mega://org/model",
      "ls -r mega://org/model",
      "log mega://org/model",
      "pull -q mega://org/model " + d + "down",
      "rm mega://org/model/a.bin",
      "bench format --size 1MB --reps 1 --tensors 2 --dir " + d + "bf",
      "bench dcp --size 1MB --reps 1 --dir " + d + "bd",
      "bench mega --size 1MB --reps 1 --dir " + d + "bm",
      "bench incremental --size 1MB --reps 1 --dir " + d + "bi",
      "bench reshard --size 1MB --reps 1 --dir " + d + "br",
      "bench cas --size 1MiB --reps 1 --warmup 0 --dir " + d + "bc",
  };
  std::set<std::string> ran;
  for (const std::string& args : runs) {
    CommandResult r = Cli(args + " --json", hub_env);
    EXPECT_EQ(r.code, 0) << args << "\n" << r.out << r.err;
    EXPECT_TRUE(IsJsonOutput(r.out)) << args << " printed:\n" << r.out;
    std::istringstream words(args);
    std::string first, second;
    words >> first >> second;
    ran.insert(first == "cas" || first == "ckpt" || first == "bench" ? first + " " + second
                                                                     : first);
  }
  // cas get needs the hash `cas put` printed.
  json put = json::parse(Cli("cas put --store " + d + "cas " + data + " --json").out);
  CommandResult get = Cli("cas get --store " + d + "cas " + put["file_hash"].get<std::string>() +
                          " " + d + "data.out --json");
  EXPECT_EQ(get.code, 0) << get.err;
  ASSERT_TRUE(json::accept(get.out)) << get.out;
  EXPECT_EQ(json::parse(get.out)["bytes"], 300000);
  ran.insert("cas get");
  // Every leaf command ran, except the hub benchmarks (they start a megahub
  // and run for seconds; their --json is in their --help above).
  for (const std::string& cmd : LeafCommands()) {
    if (cmd == "bench hub" || cmd == "bench hub-load") continue;
    EXPECT_TRUE(ran.count(cmd)) << cmd << " has no --json run in this test";
  }
}

// The same key for the same quantity: "bytes" (payload bytes), "files"
// (a count), "tensors", "seconds", "gbps".
TEST(CliRules, OneKeyVocabulary) {
  dcp::testing::TempDir dir("cli-keys");
  const std::string d = dir.path("");
  const std::vector<std::pair<std::string, std::string>> hub_env = {
      {"MEGA_ENDPOINT", "file://" + d + "hub"}, {"MEGA_HOME", d + "home"}};
  test_util::WriteFileCreatingDirs(d + "up/a.bin", test_util::RandomData(1000, 1));
  ASSERT_EQ(Cli("demo --out " + d + "mega --storage mega --size 1MB").code, 0);

  json push = json::parse(Cli("push -q " + d + "up mega://org/m --json", hub_env).out);
  json pull = json::parse(Cli("pull -q mega://org/m " + d + "down --json", hub_env).out);
  for (const json& j : {push, pull}) {
    EXPECT_EQ(j["bytes"], 1000) << j;
    EXPECT_EQ(j["files"], 1) << j;
    EXPECT_TRUE(j["seconds"].is_number()) << j;
    EXPECT_TRUE(j["gbps"].is_number()) << j;
  }
  json cons = json::parse(Cli("consolidate " + d + "mega " + d + "whole --json").out);
  json conv = json::parse(Cli("convert " + d + "whole " + d + "m.safetensors --json").out);
  json ver = json::parse(Cli("verify " + d + "m.safetensors --json").out);
  EXPECT_EQ(cons["bytes"], conv["bytes"]);
  EXPECT_EQ(conv["bytes"], ver["bytes"]);
  EXPECT_EQ(cons["tensors"], conv["tensors"]);
  EXPECT_EQ(conv["tensors"], ver["tensors"]);
  EXPECT_EQ(conv["files"], 1);
  EXPECT_TRUE(conv["seconds"].is_number() && conv["gbps"].is_number()) << conv;
  EXPECT_EQ(ver["ok"], true);
}

TEST(CliRules, ErrorsUnderJsonAreOneJsonObject) {
  dcp::testing::TempDir dir("cli-errors");
  const std::string d = dir.path("");
  test_util::WriteFileCreatingDirs(d + "junk.mega", "not a mega file at all");
  struct Case {
    std::string args;
    int code;
    std::string error_code;
  };
  const std::vector<Case> cases = {
      {"inspect " + d + "missing.mega", 1, "NotFound"},
      {"verify " + d + "missing", 1, "NotFound"},
      {"convert " + d + "missing.mega " + d + "out", 1, "NotFound"},
      {"consolidate " + d + "missing " + d + "out", 1, "NotFound"},
      {"ckpt latest " + d + "missing", 1, "NotFound"},
      {"cas stat --store " + d + "missing", 1, "FailedPrecondition"},
      {"cas get --store " + d + "cas nothex " + d + "o", 2, "usage"},
      {"demo --out " + d + "x --size lots", 2, "usage"},
      {"inspect", 2, "usage"},                    // a missing argument (CLI11)
      {"inspect --frobnicate " + d, 2, "usage"},  // an unknown flag (CLI11)
      {"inpsect " + d, 2, "usage"},               // a typo'd command
      {"pull mega://org/none " + d + "down", 1, "NotFound"},
  };
  for (const Case& c : cases) {
    CommandResult r = Cli(c.args + " --json",
                          {{"MEGA_ENDPOINT", "file://" + d + "hub"}, {"MEGA_HOME", d + "home"}});
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out << r.err;
    ASSERT_TRUE(json::accept(r.out)) << c.args << " printed:\n" << r.out;
    json j = json::parse(r.out);
    ASSERT_TRUE(j.contains("error")) << c.args << ": " << j;
    EXPECT_EQ(j["error"]["code"], c.error_code) << c.args << ": " << j;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty()) << c.args;
    EXPECT_THAT(r.err, StartsWith("megackpt: error: ")) << c.args;
  }
  // Damage found by verify is a result with "ok": false and the error.
  test_util::WriteFileCreatingDirs(d + "junk.safetensors",
                                   std::string("\x10\0\0\0\0\0\0\0{\"a\":", 13));
  CommandResult bad = Cli("verify " + d + "junk.safetensors --json");
  EXPECT_NE(bad.code, 0);
  ASSERT_TRUE(json::accept(bad.out)) << bad.out;
  EXPECT_TRUE(json::parse(bad.out).contains("error")) << bad.out;
}

TEST(CliRules, ErrorsWithoutJsonHaveOnePrefix) {
  dcp::testing::TempDir dir("cli-prefix");
  for (const std::string& args : std::vector<std::string>{
           "inspect " + dir.path("missing"), "cas stat --store " + dir.path("none"),
           "ckpt latest " + dir.path("none"), "inspect", "demo --out x --size lots"}) {
    CommandResult r = Cli(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_THAT(r.err, StartsWith("megackpt: error: ")) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

TEST(CliRules, TypoedCommandSaysDidYouMean) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"inpsect model.mega", "unknown command 'inpsect'; did you mean 'inspect'?"},
           {"verfy x", "unknown command 'verfy'; did you mean 'verify'?"},
           {"cas pt --store s f", "unknown command 'cas pt'; did you mean 'cas put'?"},
           {"ckpt lastest root", "unknown command 'ckpt lastest'; did you mean 'ckpt latest'?"},
           {"bench dpc", "unknown command 'bench dpc'; did you mean 'bench dcp'?"},
       }) {
    CommandResult r = Cli(c.args);
    EXPECT_EQ(r.code, 2) << c.args;
    EXPECT_EQ(r.err, "megackpt: error: " + c.message + "\n") << c.args;
  }
  CommandResult far = Cli("frobnicate");
  EXPECT_EQ(far.code, 2);
  EXPECT_THAT(far.err, HasSubstr("unknown command 'frobnicate'"));
  EXPECT_THAT(far.err, ::testing::Not(HasSubstr("did you mean")));
}

}  // namespace
}  // namespace megackpt
