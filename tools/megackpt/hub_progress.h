// Progress of the CLI's hub transfers (push, pull): byte-level, with rate
// and ETA, shown as one redrawn line on a terminal, one line per file
// otherwise, or NDJSON events on stderr for scripts (--json). Also where a
// hub command talks to (the endpoint and why that one). docs/hub.md §8.
#ifndef MEGACKPT_TOOLS_MEGACKPT_HUB_PROGRESS_H_
#define MEGACKPT_TOOLS_MEGACKPT_HUB_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>

namespace megackpt::cli {

// The endpoint a hub command uses and where it came from.
struct EndpointChoice {
  std::string endpoint;  // "http://..." or "file:///..."
  std::string source;    // "--endpoint", "MEGA_ENDPOINT" or "default"
  bool embedded = false;
};
// `flag` (--endpoint), else $MEGA_ENDPOINT, else the default embedded hub.
EndpointChoice ChooseEndpoint(const std::string& flag);
// "megahub at http://127.0.0.1:8080 (MEGA_ENDPOINT)", or for the default:
// "the embedded hub at /home/u/.cache/mega/hub (default: MEGA_ENDPOINT is not
// set; set MEGA_ENDPOINT=http://HOST:PORT to use a megahub)".
std::string DescribeEndpoint(const EndpointChoice& e);

class TransferProgress {
 public:
  enum class Mode {
    kQuiet,  // nothing
    kLines,  // one line per finished file (not a terminal)
    kTty,    // one line redrawn in place, at most 10 times a second
    kJson,   // NDJSON events: start, progress (2 per second), file, done
  };
  // kQuiet when quiet; kJson when json; kTty when stderr is a terminal; else kLines.
  static Mode ModeFor(bool quiet, bool json);

  // `verb`: "push" / "pull". Emits the start (the endpoint line, or the
  // "start" event) at once.
  TransferProgress(Mode mode, std::string verb, const EndpointChoice& endpoint, size_t total_files,
                   uint64_t total_bytes);

  // Bytes moved (read and handed to the upload, or written after download).
  // Any thread.
  void AddBytes(uint64_t n);
  // A file is done; `status` is "uploaded", "downloaded" or "skipped"
  // (skipped files count their bytes as done). Any thread.
  void FileDone(const std::string& path, uint64_t size, const char* status);
  // The final progress state (TTY: the line ends with a newline).
  void Finish();

 private:
  void Render(bool final);        // REQUIRES: mu_ held
  double Rate(double now) const;  // bytes per second over the last few seconds

  const Mode mode_;
  const std::string verb_;
  const size_t total_files_;
  const uint64_t total_bytes_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  uint64_t bytes_ = 0;
  size_t files_ = 0, skipped_ = 0;
  double last_render_ = -1;
  std::deque<std::pair<double, uint64_t>> samples_;  // (seconds since start, bytes)
};

}  // namespace megackpt::cli

#endif  // MEGACKPT_TOOLS_MEGACKPT_HUB_PROGRESS_H_
