#include "hub_progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "megackpt/commands.h"
#include "megackpt/hub/client.h"

namespace megackpt::cli {

EndpointChoice ChooseEndpoint(const std::string& flag) {
  EndpointChoice e;
  if (!flag.empty()) {
    e.endpoint = flag;
    e.source = "--endpoint";
  } else if (const char* env = std::getenv("MEGA_ENDPOINT"); env && *env) {
    e.endpoint = env;
    e.source = "MEGA_ENDPOINT";
  } else {
    e.endpoint = hub::DefaultEndpoint();
    e.source = "default";
  }
  e.embedded = e.endpoint.rfind("file://", 0) == 0;
  return e;
}

std::string DescribeEndpoint(const EndpointChoice& e) {
  if (e.source == "default") {
    return "the embedded hub at " + e.endpoint.substr(7) +
           " (default: MEGA_ENDPOINT is not set; set MEGA_ENDPOINT=http://HOST:PORT to use a "
           "megahub)";
  }
  if (e.embedded) return "the embedded hub at " + e.endpoint.substr(7) + " (" + e.source + ")";
  return "megahub at " + e.endpoint + " (" + e.source + ")";
}

TransferProgress::Mode TransferProgress::ModeFor(bool quiet, bool json) {
  if (quiet) return Mode::kQuiet;
  if (json) return Mode::kJson;
  return isatty(STDERR_FILENO) ? Mode::kTty : Mode::kLines;
}

TransferProgress::TransferProgress(Mode mode, std::string verb, const EndpointChoice& endpoint,
                                   size_t total_files, uint64_t total_bytes)
    : mode_(mode), verb_(std::move(verb)), total_files_(total_files), total_bytes_(total_bytes) {
  if (mode_ == Mode::kQuiet) return;
  if (mode_ == Mode::kJson) {
    nlohmann::json ev = {{"event", "start"},
                         {"command", verb_},
                         {"endpoint", endpoint.endpoint},
                         {"endpoint_source", endpoint.source},
                         {"embedded", endpoint.embedded},
                         {"files_total", total_files_},
                         {"bytes_total", total_bytes_}};
    std::fprintf(stderr, "%s\n", ev.dump().c_str());
  } else {
    std::fprintf(stderr, "%s: %zu files, %s, with %s\n", verb_.c_str(), total_files_,
                 HumanBytes(total_bytes_).c_str(), DescribeEndpoint(endpoint).c_str());
  }
  std::fflush(stderr);
}

double TransferProgress::Rate(double now) const {
  // Over the last ~5 s of samples (the whole run before that).
  if (samples_.empty()) return 0;
  const auto& [t0, b0] = samples_.front();
  if (now - t0 < 0.05) return 0;
  return static_cast<double>(bytes_ - b0) / (now - t0);
}

void TransferProgress::AddBytes(uint64_t n) {
  if (mode_ == Mode::kQuiet || n == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  bytes_ += n;
  Render(false);
}

void TransferProgress::FileDone(const std::string& path, uint64_t size, const char* status) {
  if (mode_ == Mode::kQuiet) return;
  std::lock_guard<std::mutex> lock(mu_);
  ++files_;
  bool skipped = std::string_view(status) == "skipped";
  if (skipped) {
    ++skipped_;
    bytes_ += size;
  }
  if (mode_ == Mode::kLines) {
    std::fprintf(stderr, "%s [%zu/%zu] %s (%s)%s — %s / %s\n", verb_.c_str(), files_, total_files_,
                 path.c_str(), HumanBytes(size).c_str(), skipped ? ", unchanged: skipped" : "",
                 HumanBytes(bytes_).c_str(), HumanBytes(total_bytes_).c_str());
  } else if (mode_ == Mode::kJson) {
    nlohmann::json ev = {
        {"event", "file"}, {"command", verb_}, {"path", path}, {"bytes", size}, {"status", status}};
    std::fprintf(stderr, "%s\n",
                 ev.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  Render(false);
}

void TransferProgress::Finish() {
  if (mode_ == Mode::kQuiet) return;
  std::lock_guard<std::mutex> lock(mu_);
  Render(true);
}

void TransferProgress::Render(bool final) {
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  samples_.emplace_back(now, bytes_);
  while (samples_.size() > 2 && now - samples_.front().first > 5.0) samples_.pop_front();
  const double interval = mode_ == Mode::kJson ? 0.5 : 0.1;
  if (!final && (mode_ == Mode::kLines || (last_render_ >= 0 && now - last_render_ < interval)))
    return;
  last_render_ = now;
  const double rate = final && now > 0 ? bytes_ / now : Rate(now);
  const uint64_t left = total_bytes_ > bytes_ ? total_bytes_ - bytes_ : 0;
  const double eta = rate > 0 ? left / rate : -1;
  if (mode_ == Mode::kJson) {
    nlohmann::json ev = {{"event", final ? "done" : "progress"},
                         {"command", verb_},
                         {"bytes_done", bytes_},
                         {"bytes_total", total_bytes_},
                         {"files_done", files_},
                         {"files_total", total_files_},
                         {"files_skipped", skipped_},
                         {"bytes_per_second", static_cast<uint64_t>(rate)},
                         {"elapsed_seconds", now}};
    ev["eta_seconds"] = eta >= 0 ? nlohmann::json(eta) : nlohmann::json(nullptr);
    std::fprintf(stderr, "%s\n", ev.dump().c_str());
  } else if (mode_ == Mode::kTty) {
    char eta_text[32] = "--";
    if (eta >= 0) {
      long s = static_cast<long>(eta + 0.5);
      if (s >= 3600) {
        std::snprintf(eta_text, sizeof(eta_text), "%ldh%02ldm", s / 3600, s / 60 % 60);
      } else {
        std::snprintf(eta_text, sizeof(eta_text), "%ld:%02ld", s / 60, s % 60);
      }
    }
    int pct = total_bytes_ ? static_cast<int>(100.0 * bytes_ / total_bytes_) : 100;
    char when[48];
    if (final) {
      std::snprintf(when, sizeof(when), "in %.1f s", now);
    } else {
      std::snprintf(when, sizeof(when), "ETA %s", eta_text);
    }
    std::string unchanged = skipped_ ? " (" + std::to_string(skipped_) + " unchanged)" : "";
    std::fprintf(stderr, "\r\033[K%s %3d%%  %s / %s  %s  %s  %zu/%zu files%s", verb_.c_str(), pct,
                 HumanBytes(bytes_).c_str(), HumanBytes(total_bytes_).c_str(),
                 HumanRate(rate).c_str(), when, files_, total_files_, unchanged.c_str());
    if (final) std::fprintf(stderr, "\n");
  }
  if (final && mode_ == Mode::kLines) {
    std::fprintf(stderr, "%s: %s in %.1f s (%s)\n", verb_.c_str(), HumanBytes(bytes_).c_str(), now,
                 HumanRate(rate).c_str());
  }
  std::fflush(stderr);
}

}  // namespace megackpt::cli
