#include "hub_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench_util.h"
#include "megackpt/cas/store.h"
#include "megackpt/core/tensor.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/store.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::bench {
namespace {

constexpr int kFiles = 20;  // 10% changed = 2 files
// The I/O threads of every measured path (the ThreadPool of Save, Load and the
// local path), and so the parallelism of the ceilings: best of 1 and 2.
constexpr int kThreads = 2;

// A megahub child process on a loopback port, stopped (SIGTERM) on destruction.
class HubChild {
 public:
  ~HubChild() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st;
      waitpid(pid_, &st, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  Result<std::string> Start(const std::string& binary, const std::string& root) {
    int fds[2];
    if (pipe(fds) != 0) return ErrnoToStatus("pipe", errno);
    pid_ = fork();
    if (pid_ < 0) return ErrnoToStatus("fork", errno);
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      execl(binary.c_str(), binary.c_str(), "serve", "--root", root.c_str(), "--port", "0",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
    std::string line;
    for (int waited = 0; waited < 200;) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) {
        ++waited;
        continue;
      }
      char c;
      if (read(fd_, &c, 1) <= 0) break;
      if (c != '\n') {
        line += c;
        continue;
      }
      if (line.rfind("listening on ", 0) == 0) return "http://" + line.substr(13);
      line.clear();
    }
    return UnavailableError("megahub did not start: " + binary);
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

struct Row {
  std::string name;
  Summary gbps;
  const Ceiling* limit = nullptr;  // what the row is divided by; null: a ceiling's row
};

// Saves kFiles files (slices of `data`) as one transaction.
Result<hub::TransactionStats> Save(std::shared_ptr<hub::HubConnection> hub, const std::string& uri,
                                   const std::byte* data, uint64_t bytes) {
  MEGA_ASSIGN_OR_RETURN(hub::MegaUri root, hub::ParseMegaUri(uri));
  MEGA_ASSIGN_OR_RETURN(auto txn, hub::HubTransaction::Begin(hub, root));
  uint64_t per = bytes / kFiles;
  ThreadPool pool(kThreads);
  MEGA_RETURN_IF_ERROR(ParallelFor(&pool, kFiles, [&](size_t i) -> Status {
    MEGA_ASSIGN_OR_RETURN(auto f, txn->OpenForWrite("shard-" + std::to_string(i) + ".bin"));
    MEGA_RETURN_IF_ERROR(f->Append(std::span<const std::byte>(data + i * per, per)));
    return f->Close();
  }));
  MEGA_RETURN_IF_ERROR(txn->Commit().status());
  return txn->stats();
}

Status Load(fs::FileSystem& fs, const std::string& uri, std::byte* dst, uint64_t bytes) {
  uint64_t per = bytes / kFiles;
  ThreadPool pool(kThreads);
  return ParallelFor(&pool, kFiles, [&](size_t i) -> Status {
    MEGA_ASSIGN_OR_RETURN(auto f,
                          fs.OpenForRead(fs::JoinPath(uri, "shard-" + std::to_string(i) + ".bin")));
    return f->ReadExactlyAt(0, std::span<std::byte>(dst + i * per, per));
  });
}

}  // namespace

Result<std::string> RunHubBench(const HubBenchOptions& o) {
  uint64_t bytes = o.bytes / kFiles * kFiles;
  if (bytes == 0) return InvalidArgumentError("bench hub: --bytes too small");
  TempDir tmp("megackpt-hub-bench");
  MEGA_ASSIGN_OR_RETURN(auto src, AllocatePageAligned(bytes));  // the limit's O_DIRECT writers
  MEGA_ASSIGN_OR_RETURN(auto dst, AllocatePageAligned(bytes));
  std::byte* data = static_cast<std::byte*>(src.get());
  std::byte* out = static_cast<std::byte*>(dst.get());
  std::memset(out, 0, bytes);
  std::vector<Row> rows;

  // Machine limits, same sizes, with the paths' parallelism (bench_util.h,
  // parallel ceilings): best of 1 and kThreads plain threads and of the I/O
  // sizes. mega:// saves are durable (xorbs, reconstructions and the commit
  // are fsynced before the commit is visible): their limit is write + fdatasync.
  FillRandom(data, bytes, 99);
  // The mega:// loads read xorbs that their saves wrote with O_DIRECT (not
  // cached): their limit is a read from the device, not a warm read.
  Ceiling wlimit, dlimit, rlimit, clim;
  {
    PlainIo io(tmp.path() + "/limit", bytes, data, out);
    MEGA_ASSIGN_OR_RETURN(
        wlimit, MeasureCeiling(io, CeilingKind::kPageCacheWrite, kThreads, o.warmup, o.reps));
    MEGA_ASSIGN_OR_RETURN(
        dlimit, MeasureCeiling(io, CeilingKind::kDurableWrite, kThreads, o.warmup, o.reps));
    MEGA_ASSIGN_OR_RETURN(rlimit,
                          MeasureCeiling(io, CeilingKind::kWarmRead, kThreads, o.warmup, o.reps));
    MEGA_ASSIGN_OR_RETURN(clim,
                          MeasureCeiling(io, CeilingKind::kColdRead, kThreads, o.warmup, o.reps));
  }  // removes the limit files
  rows.push_back({"page-cache write (limit)", wlimit.best});
  rows.push_back({"write + fdatasync (limit)", dlimit.best});
  rows.push_back({"page-cache read (limit)", rlimit.best});
  rows.push_back({"device read, cold (limit)", clim.best});

  // Local path through the filesystem seam.
  {
    std::vector<double> save, load;
    auto fs = fs::LocalFileSystem();
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      FillRandom(data, bytes, 1000 + r);
      std::string dir = tmp.path() + "/local-" + std::to_string(r);
      PrepareFreshWrite(dir, bytes);  // as before every write of the limits
      double t0 = NowSeconds();
      uint64_t per = bytes / kFiles;
      ThreadPool pool(kThreads);
      MEGA_RETURN_IF_ERROR(ParallelFor(&pool, kFiles, [&](size_t i) -> Status {
        MEGA_ASSIGN_OR_RETURN(auto f,
                              fs->OpenForWrite(dir + "/shard-" + std::to_string(i) + ".bin"));
        MEGA_RETURN_IF_ERROR(f->Append(std::span<const std::byte>(data + i * per, per)));
        return f->Close();
      }));
      double t1 = NowSeconds();
      MEGA_RETURN_IF_ERROR(Load(*fs, dir, out, bytes));
      double t2 = NowSeconds();
      if (std::memcmp(out, data, bytes) != 0)
        return DataLossError("bench hub: local load mismatch");
      if (r >= o.warmup) {
        save.push_back(bytes / (t1 - t0) / 1e9);
        load.push_back(bytes / (t2 - t1) / 1e9);
      }
      std::filesystem::remove_all(dir);
    }
    rows.push_back({"local path save", Summarize(save), &wlimit});
    rows.push_back({"local path load", Summarize(load), &rlimit});
  }

  struct Mode {
    std::string name;
    std::shared_ptr<hub::HubConnection> hub;
  };
  std::vector<Mode> modes;
  MEGA_ASSIGN_OR_RETURN(auto embedded, hub::OpenEmbeddedHub(tmp.path() + "/embedded"));
  modes.push_back({"mega:// embedded", embedded});
  HubChild child;
  if (!o.megahub.empty()) {
    std::string root = tmp.path() + "/remote";
    std::string token;
    {
      MEGA_ASSIGN_OR_RETURN(auto store, hub::HubStore::Open(root));
      MEGA_ASSIGN_OR_RETURN(token, store->CreateToken(hub::TokenScope::kWrite, std::nullopt));
    }
    MEGA_ASSIGN_OR_RETURN(std::string endpoint, child.Start(o.megahub, root));
    MEGA_ASSIGN_OR_RETURN(auto remote, hub::OpenRemoteHub(endpoint, token));
    modes.push_back({"mega:// megahub loopback", remote});
  }

  // Xorb writes with O_DIRECT (docs/cas.md §4): changes what the save rows
  // cost and where the load rows read from (the device: divided by the cold
  // read), so the output says which.
  const bool direct_io = cas::LocalXorbWritesUseDirectIo();
  nlohmann::json second = nlohmann::json::array();
  for (auto& m : modes) {
    auto fs = hub::NewMegaFileSystem(m.hub);
    std::vector<double> save, load;
    for (int r = 0; r < o.warmup + o.reps; ++r) {
      FillRandom(data, bytes, 2000 + r);  // new content every repetition: no dedup
      std::string uri = "mega://bench/run" + std::to_string(r) + "@main/ckpt";
      // As before every write of the limits: no dirty pages of earlier runs.
      sync();
      SettleDevice(tmp.path());
      double t0 = NowSeconds();
      MEGA_RETURN_IF_ERROR(Save(m.hub, uri, data, bytes).status());
      double t1 = NowSeconds();
      MEGA_RETURN_IF_ERROR(Load(*fs, uri, out, bytes));
      double t2 = NowSeconds();
      if (std::memcmp(out, data, bytes) != 0)
        return DataLossError("bench hub: " + m.name + " load mismatch");
      if (r >= o.warmup) {
        save.push_back(bytes / (t1 - t0) / 1e9);
        load.push_back(bytes / (t2 - t1) / 1e9);
      }
    }
    rows.push_back({m.name + " save", Summarize(save), &dlimit});
    rows.push_back({m.name + " load", Summarize(load), direct_io ? &clim : &rlimit});

    // Second version: 10% of the files (2 of 20) changed, on top of the last run.
    std::string uri = "mega://bench/run" + std::to_string(o.warmup + o.reps - 1) + "@main/ckpt";
    uint64_t per = bytes / kFiles;
    FillRandom(data + 3 * per, per, 777);
    FillRandom(data + 11 * per, per, 778);
    double t0 = NowSeconds();
    MEGA_ASSIGN_OR_RETURN(auto st, Save(m.hub, uri, data, bytes));
    double dt = NowSeconds() - t0;
    second.push_back({{"mode", m.name},
                      {"bytes", bytes},
                      {"uploaded_bytes", st.new_bytes},
                      {"uploaded_fraction", static_cast<double>(st.new_bytes) / bytes},
                      {"seconds", dt}});
  }

  if (o.json) {
    nlohmann::json j = {{"bytes", bytes},
                        {"files", kFiles},
                        {"rows", nlohmann::json::array()},
                        {"second_version", second},
                        {"cas_direct_io", direct_io}};
    for (const auto& r : rows) {
      nlohmann::json row = {{"name", r.name},
                            {"min_gbps", r.gbps.min},
                            {"median_gbps", r.gbps.median},
                            {"max_gbps", r.gbps.max},
                            {"ratio_to_limit", 0}};
      if (r.limit && r.limit->best.median > 0) {
        row["ratio_to_limit"] = r.gbps.median / r.limit->best.median;
        row["limit"] = CeilingName(r.limit->kind);
        row["limit_parallelism"] = r.limit->best_parallelism;
        row[std::string("limit_") + CeilingIoName(r.limit->kind)] = r.limit->best_io_bytes;
      }
      j["rows"].push_back(row);
    }
    nlohmann::json limits = nlohmann::json::object();
    PutCeiling(&limits, "pagecache_write_gbps", wlimit);
    PutCeiling(&limits, "durable_write_gbps", dlimit);
    PutCeiling(&limits, "pagecache_read_gbps", rlimit);
    PutCeiling(&limits, "cold_read_gbps", clim);
    j["ceilings"] = limits;
    j["ceiling_parallelism"] = kThreads;
    return j.dump(2) + "\n";
  }
  std::string text;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "hub bench: %llu bytes in %d files, median of %d runs after %d warm-up (GB/s)\n",
                static_cast<unsigned long long>(bytes), kFiles, o.reps, o.warmup);
  text += buf;
  text += direct_io ? "xorb writes: O_DIRECT (the default; MEGACKPT_CAS_DIRECT_IO=0 for buffered)\n"
                    : "xorb writes: buffered (MEGACKPT_CAS_DIRECT_IO=0)\n";
  std::snprintf(buf, sizeof buf, "%-34s %8s %8s %8s   %s\n", "", "min", "median", "max",
                "vs limit");
  text += buf;
  for (const auto& r : rows) {
    text += FormatRow(r.name, r.gbps, r.limit ? r.limit->best.median : 0) + "\n";
  }
  text += "ceilings, best of 1 and " + std::to_string(kThreads) +
          " (the paths' I/O threads) plain threads:\n";
  for (const Ceiling* c : {&wlimit, &dlimit, &rlimit, &clim})
    text += "  " + DescribeCeiling(*c) + "\n";
  text += "\nsecond version (2 of 20 files changed):\n";
  for (const auto& s : second) {
    std::snprintf(buf, sizeof buf, "  %-30s uploaded %llu of %llu bytes (%.1f%%) in %.3f s\n",
                  s["mode"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(s["uploaded_bytes"].get<uint64_t>()),
                  static_cast<unsigned long long>(bytes),
                  100 * s["uploaded_fraction"].get<double>(), s["seconds"].get<double>());
    text += buf;
  }
  return text;
}

Result<std::string> RunHubLoad(const HubLoadOptions& o) {
  if (o.megahub.empty()) return InvalidArgumentError("bench hub-load: megahub binary not found");
  TempDir tmp("megackpt-hub-load");
  std::string root = tmp.path() + "/hub";
  std::string token;
  {
    MEGA_ASSIGN_OR_RETURN(auto store, hub::HubStore::Open(root));
    MEGA_ASSIGN_OR_RETURN(token, store->CreateToken(hub::TokenScope::kWrite, std::nullopt));
  }
  HubChild child;
  MEGA_ASSIGN_OR_RETURN(std::string endpoint, child.Start(o.megahub, root));
  std::atomic<uint64_t> pushes{0}, pulls{0}, bytes{0}, errors{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> threads;
  double t0 = NowSeconds();
  for (int c = 0; c < o.clients; ++c) {
    threads.emplace_back([&, c] {
      auto h = hub::OpenRemoteHub(endpoint, token);
      if (!h.ok()) {
        ++errors;
        return;
      }
      auto fs = hub::NewMegaFileSystem(*h);
      std::string data(o.file_bytes, '\0');
      std::string uri = "mega://load/client" + std::to_string(c) + "@main";
      for (int round = 0; !stop; ++round) {
        FillRandom(data.data(), data.size(), static_cast<uint64_t>(c) * 1000003 + round);
        std::string path = "f" + std::to_string(round % 8);
        auto txn = hub::HubTransaction::Begin(*h, *hub::ParseMegaUri(uri));
        Status s = txn.status();
        if (s.ok()) s = (*txn)->Put(path, data);
        if (s.ok()) s = (*txn)->Commit().status();
        if (s.ok()) {
          ++pushes;
          auto back = fs->ReadWhole(uri + "/" + path);
          if (!back.ok()) {
            s = back.status();
          } else if (*back != data) {
            s = DataLossError("pulled bytes differ");
          } else {
            ++pulls;
          }
        }
        if (s.ok()) {
          bytes += 2 * data.size();
        } else {
          ++errors;
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.empty()) first_error = s.ToString();
        }
      }
    });
  }
  while (NowSeconds() - t0 < o.seconds) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stop = true;
  for (auto& t : threads) t.join();
  double dt = NowSeconds() - t0;
  MEGA_ASSIGN_OR_RETURN(std::string stats_text, hub::FetchServerStats(endpoint));
  auto stats = nlohmann::json::parse(stats_text, nullptr, false);
  uint64_t peak = stats.is_object() ? stats.value("peak_rss_bytes", uint64_t{0}) : 0;
  uint64_t s5xx = stats.is_object() ? stats.value("responses_5xx", uint64_t{0}) : 0;
  nlohmann::json j = {{"clients", o.clients},
                      {"seconds", dt},
                      {"pushes", pushes.load()},
                      {"pulls", pulls.load()},
                      {"ops_per_second", (pushes + pulls) / dt},
                      {"mb_per_second", bytes / dt / 1e6},
                      {"errors", errors.load()},
                      {"server_5xx", s5xx},
                      {"server_peak_rss_bytes", peak}};
  if (!first_error.empty()) j["first_error"] = first_error;
  std::string out;
  if (o.json) {
    out = j.dump(2) + "\n";
  } else {
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "hub load: %d clients for %.1f s: %llu pushes + %llu pulls (%.0f ops/s, %.1f MB/s), "
        "errors %llu, server 5xx %llu, server peak RSS %.1f MiB\n",
        o.clients, dt, (unsigned long long)pushes.load(), (unsigned long long)pulls.load(),
        (pushes + pulls) / dt, bytes / dt / 1e6, (unsigned long long)errors.load(),
        (unsigned long long)s5xx, peak / 1048576.0);
    out = buf;
    if (!first_error.empty()) out += "first error: " + first_error + "\n";
  }
  if (errors > 0 || s5xx > 0) {
    std::fputs(out.c_str(), stdout);
    return InternalError("bench hub-load: " + std::to_string(errors.load()) + " operations failed");
  }
  return out;
}

}  // namespace megackpt::bench
