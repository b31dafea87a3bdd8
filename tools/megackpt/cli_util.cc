// Helpers shared by the command groups (declared in commands.h).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>

#include "megackpt/commands.h"

namespace megackpt::cli {

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (c == ' ' || c == '_') continue;
    s.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  // Longest suffixes first: "kib" before "b", "kb" before "k".
  static constexpr std::pair<std::string_view, double> kUnits[] = {{"kib", 1024.0},
                                                                   {"mib", 1048576.0},
                                                                   {"gib", 1073741824.0},
                                                                   {"tib", 1099511627776.0},
                                                                   {"kb", 1e3},
                                                                   {"mb", 1e6},
                                                                   {"gb", 1e9},
                                                                   {"tb", 1e12},
                                                                   {"k", 1e3},
                                                                   {"m", 1e6},
                                                                   {"g", 1e9},
                                                                   {"t", 1e12},
                                                                   {"b", 1.0}};
  double scale = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (s.size() >= suffix.size() &&
        std::string_view(s).substr(s.size() - suffix.size()) == suffix) {
      s.resize(s.size() - suffix.size());
      scale = factor;
      break;
    }
  }
  char* end = nullptr;
  const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0) || !std::isfinite(v) ||
      v * scale >= 1.8e19) {
    return InvalidArgumentError("'" + std::string(text) +
                                "' is not a byte size like 2GiB, 500MB or 1000000");
  }
  return static_cast<uint64_t>(v * scale);
}

namespace {
bool g_json_output = false;
}  // namespace

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status ForEachBlock(const RandomAccessFile& file,
                    const std::function<Status(std::span<std::byte>)>& fn) {
  const uint64_t size = file.size();
  std::string buf(static_cast<size_t>(std::min<uint64_t>(size, 8u << 20)), '\0');
  for (uint64_t off = 0; off < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - off));
    const auto block = std::as_writable_bytes(std::span<char>(buf.data(), n));
    MEGA_RETURN_IF_ERROR(file.ReadExactlyAt(off, block));
    MEGA_RETURN_IF_ERROR(fn(block));
    off += n;
  }
  return Status::OK();
}

void SetJsonOutput(bool on) { g_json_output = on; }
bool JsonOutput() { return g_json_output; }

std::shared_ptr<std::string> AddRequiredArg(CLI::App* cmd, const std::string& name,
                                            const std::string& description) {
  auto value = std::make_shared<std::string>();
  cmd->add_option(name, *value, description)->required();
  return value;
}

std::shared_ptr<bool> AddSharedFlag(CLI::App* cmd, const std::string& name,
                                    const std::string& description) {
  auto value = std::make_shared<bool>(false);
  cmd->add_flag(name, *value, description);
  return value;
}

void AddJsonFlag(CLI::App* cmd, const std::string& description) {
  static bool unused = false;  // main() sets JsonOutput() from the command line
  cmd->add_flag("--json", unused, description);
}

int ExitCodeFor(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
}

namespace {
// Both error reporters: the human line on stderr, the JSON object on stdout under --json.
void PrintError(std::string_view command, std::string_view code, std::string_view message) {
  const std::string where = command.empty() ? std::string() : std::string(command) + ": ";
  std::fprintf(stderr, "megackpt: error: %s%s%s%.*s\n", where.c_str(),
               code == "usage" ? "" : std::string(code).c_str(), code == "usage" ? "" : ": ",
               static_cast<int>(message.size()), message.data());
  if (g_json_output) {
    nlohmann::ordered_json j;
    j["error"] = {{"code", std::string(code)}, {"message", where + std::string(message)}};
    PrintJson(j, -1);
  }
}
}  // namespace

int ReportError(std::string_view command, const Status& s, int exit_code) {
  PrintError(command, StatusCodeName(s.code()), s.message());
  return exit_code;
}

int ReportUsage(std::string_view command, std::string_view message) {
  PrintError(command, "usage", message);
  return kExitUsage;
}

void ReportWarning(std::string_view command, std::string_view message) {
  std::fprintf(stderr, "megackpt: warning: %s%s%.*s\n", std::string(command).c_str(),
               command.empty() ? "" : ": ", static_cast<int>(message.size()), message.data());
}

void PrintJson(const nlohmann::ordered_json& j, int indent) {
  std::printf("%s\n", j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::fflush(stdout);
}

std::string ClosestName(std::string_view word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& name : names) {
    // Edit distance with adjacent transpositions ("optimal string alignment":
    // "dpc" is one edit from "dcp"), over a full (|word|+1) x (|name|+1) table.
    const size_t m = word.size(), n = name.size();
    std::vector<std::vector<size_t>> d(m + 1, std::vector<size_t>(n + 1));
    for (size_t i = 0; i <= m; ++i) d[i][0] = i;
    for (size_t j = 0; j <= n; ++j) d[0][j] = j;
    for (size_t i = 1; i <= m; ++i) {
      for (size_t j = 1; j <= n; ++j) {
        const size_t cost = word[i - 1] == name[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && word[i - 1] == name[j - 2] && word[i - 2] == name[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    const size_t distance = d[m][n];
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  const size_t longest = std::max(word.size(), best.size());
  return best_distance <= 2 && 2 * best_distance < longest ? best : std::string();
}

std::string HumanRate(double bytes_per_second) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GB/s", std::max(0.0, bytes_per_second) / 1e9);
  return buf;
}

std::string ProgressLine(std::string_view label, uint64_t done, uint64_t total, double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%3d%%", total ? static_cast<int>(100.0 * done / total) : 100);
  return std::string(label) + ": " + buf + "  " + HumanBytes(done) + " / " + HumanBytes(total) +
         "  " + HumanRate(seconds > 0 ? done / seconds : 0.0);
}

ByteProgress::ByteProgress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled && !JsonOutput()),
      tty_(::isatty(STDERR_FILENO)),
      start_(NowSeconds()) {}

void ByteProgress::Update(uint64_t done) {
  if (!enabled_ || total_ == 0) return;
  const int pct = static_cast<int>(100.0 * done / total_);
  const std::string line = ProgressLine(label_, done, total_, NowSeconds() - start_);
  if (tty_) {
    if (NowSeconds() - last_ < 0.2 && done < total_) return;
    last_ = NowSeconds();
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), done >= total_ ? "\n" : "");
  } else if (pct / 10 > last_decile_) {
    last_decile_ = pct / 10;
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

bool ParseSizeFlag(std::string_view command, std::string_view flag, const std::string& text,
                   uint64_t* out, int* exit_code) {
  auto bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    *exit_code = ReportUsage(command, std::string(flag) + ": " + bytes.status().message());
    return false;
  }
  *out = *bytes;
  return true;
}

std::string HumanBytes(uint64_t n) {
  char buf[64];
  if (n >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f GB", n / 1e9);
  } else if (n >= 1000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f MB", n / 1e6);
  } else if (n >= 1000ull) {
    std::snprintf(buf, sizeof buf, "%.2f kB", n / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  }
  return buf;
}

}  // namespace megackpt::cli
