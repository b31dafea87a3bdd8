#include "bench_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "megackpt/core/file.h"
#include "megackpt/core/tensor.h"

namespace megackpt::bench {

Summary Summarize(std::vector<double> v) {
  Summary s;
  s.runs = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<std::vector<double>> TimeRuns(int warmup, int reps, const std::function<Status()>& fn,
                                     const std::function<void()>& setup) {
  std::vector<double> out;
  for (int i = 0; i < warmup + reps; ++i) {
    if (setup) setup();
    double t0 = NowSeconds();
    MEGA_RETURN_IF_ERROR(fn());
    double dt = NowSeconds() - t0;
    if (i >= warmup) out.push_back(dt);
  }
  return out;
}

void PrepareFreshWrite(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  sync();
}

std::vector<double> ToGbps(const std::vector<double>& seconds, uint64_t bytes) {
  std::vector<double> out;
  for (double s : seconds) out.push_back(s > 0 ? bytes / s / 1e9 : 0);
  return out;
}

Result<Summary> MemcpyGbps(uint64_t bytes, int warmup, int reps) {
  MEGA_ASSIGN_OR_RETURN(auto a, AllocateBuffer(bytes, true));
  MEGA_ASSIGN_OR_RETURN(auto b, AllocateBuffer(bytes, true));
  FillRandom(a.get(), bytes, 1);
  MEGA_ASSIGN_OR_RETURN(auto secs, TimeRuns(warmup, reps, [&] {
                          std::memcpy(b.get(), a.get(), bytes);
                          return Status::OK();
                        }));
  return Summarize(ToGbps(secs, bytes));
}

namespace {

Status WriteAll(int fd, const std::byte* p, uint64_t n, const std::string& path) {
  const uint64_t kBlock = 64ull << 20;
  uint64_t off = 0;
  while (off < n) {
    size_t len = static_cast<size_t>(std::min(kBlock, n - off));
    ssize_t w = pwrite(fd, p + off, len, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(path + ": pwrite", errno);
    }
    off += static_cast<uint64_t>(w);
  }
  return Status::OK();
}

}  // namespace

Result<Summary> FileWriteGbps(const std::string& path, uint64_t bytes, bool sync, int warmup,
                              int reps) {
  MEGA_ASSIGN_OR_RETURN(auto buf, AllocateBuffer(bytes, true));
  FillRandom(buf.get(), bytes, 2);
  MEGA_ASSIGN_OR_RETURN(auto secs, TimeRuns(warmup, reps, [&]() -> Status {
                          int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                          if (fd < 0) return ErrnoToStatus(path + ": create", errno);
                          Status s = WriteAll(fd, buf.get(), bytes, path);
                          if (s.ok() && sync && fdatasync(fd) != 0) {
                            s = ErrnoToStatus(path + ": fdatasync", errno);
                          }
                          close(fd);
                          return s;
                        },
                        [&] { PrepareFreshWrite(path); }));
  unlink(path.c_str());
  return Summarize(ToGbps(secs, bytes));
}

Result<Summary> FileReadGbps(const std::string& path, uint64_t bytes, int warmup, int reps) {
  MEGA_ASSIGN_OR_RETURN(auto buf, AllocateBuffer(bytes, true));
  FillRandom(buf.get(), bytes, 3);
  {
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoToStatus(path + ": create", errno);
    Status s = WriteAll(fd, buf.get(), bytes, path);
    close(fd);
    MEGA_RETURN_IF_ERROR(s);
  }
  MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(path, false));
  MEGA_ASSIGN_OR_RETURN(auto secs, TimeRuns(warmup, reps, [&]() -> Status {
                          return file->ReadExactlyAt(
                              0, std::span<std::byte>(buf.get(), static_cast<size_t>(bytes)));
                        }));
  file.reset();
  unlink(path.c_str());
  return Summarize(ToGbps(secs, bytes));
}

namespace {
uint64_t ReadStatusKb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0) return std::strtoull(line.c_str() + klen + 1, nullptr, 10);
  }
  return 0;
}
}  // namespace

uint64_t PeakRssBytes() { return ReadStatusKb("VmHWM") * 1024; }
uint64_t CurrentRssBytes() { return ReadStatusKb("VmRSS") * 1024; }

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

void FillRandom(void* data, size_t n, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(data);
  uint64_t s = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(s >> (8 * (i % 8)));
}

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* p = mkdtemp(buf.data());
  path_ = p ? p : "/tmp";
}

TempDir::~TempDir() {
  if (path_ != "/tmp") {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

std::string FormatRow(const std::string& name, const Summary& s, double ratio_to) {
  char buf[256];
  if (ratio_to > 0) {
    std::snprintf(buf, sizeof buf, "%-34s %8.3f %8.3f %8.3f   %6.2fx", name.c_str(), s.min, s.median,
                  s.max, s.median / ratio_to);
  } else {
    std::snprintf(buf, sizeof buf, "%-34s %8.3f %8.3f %8.3f", name.c_str(), s.min, s.median, s.max);
  }
  return buf;
}

}  // namespace megackpt::bench
