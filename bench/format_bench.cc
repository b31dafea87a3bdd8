// `megackpt bench format`: MEGA and safetensors write/read throughput next to
// the machine's limits, measured the same way in the same process.
//
// Method (docs/architecture.md, performance model):
//  - ceilings (bench_util.h), each the best of 1, 2 and N plain threads (N =
//    the default pool's size, the parallelism of the MEGA writer and readers):
//    memcpy between the two pre-faulted buffers below; page-cache write of the
//    same bytes (64 MiB pwrites into new files, one per writer, no fsync);
//    warm pread of byte ranges of a cached file into the reused, pre-faulted
//    destination buffer.
//  - ours: the same bytes as N tensors of caller memory (one pre-faulted
//    buffer), written to a new file (no fsync, like the limit); read back into
//    caller-allocated, pre-faulted, reused tensors (opening the file is part of
//    each timed read).
//  - rounds: every configuration runs once per round, limits and ours
//    interleaved, so that the machine's drift (it is shared and noisy) hits
//    both alike; round 0 is a dropped warm-up; min/median/max of the rest.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/safetensors.h"

namespace megackpt::bench {
namespace {

constexpr int kWarmup = 1;
constexpr int kOpenTensors = 10000;

struct Row {
  std::string key;    // JSON key prefix, e.g. "mega_write"
  std::string label;  // table label
  Summary gbps;       // or milliseconds for *_ms rows
  double limit = 0;   // median of the matching limit (0 = none)
  bool ms = false;
  bool json_only = false;  // not a table row
};

Result<Summary> TimeMs(int reps, const std::function<Status()>& fn) {
  MEGA_ASSIGN_OR_RETURN(auto secs, TimeRuns(kWarmup, reps, fn));
  for (double& s : secs) s *= 1e3;
  return Summarize(secs);
}

Status CheckSame(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                 const std::string& what) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!TensorBytesEqual(a[i], b[i])) {
      return InternalError(what + ": tensor " + std::to_string(i) +
                           " read back differs from what was written");
    }
  }
  return Status::OK();
}

Status Run(uint64_t size_bytes, int reps, int num_tensors, const std::string& dir,
           std::vector<Row>* rows, std::vector<Ceiling>* ceilings, uint64_t* actual_bytes) {
  // Tensor layout: num_tensors F32 tensors of equal size.
  const uint64_t elems = std::max<uint64_t>(1, size_bytes / 4 / num_tensors);
  const uint64_t bytes = elems * 4 * static_cast<uint64_t>(num_tensors);
  *actual_bytes = bytes;
  const std::string mega = dir + "/bench.mega";
  const std::string st = dir + "/bench.safetensors";

  // Caller memory: source tensors and reused destination tensors, pre-faulted.
  MEGA_ASSIGN_OR_RETURN(auto src_buf, AllocateBuffer(bytes, true));
  MEGA_ASSIGN_OR_RETURN(auto dst_buf, AllocateBuffer(bytes, true));
  FillRandom(src_buf.get(), bytes, 42);
  std::vector<Tensor> src, dst;
  std::vector<std::pair<std::string, Tensor>> named;
  for (int i = 0; i < num_tensors; ++i) {
    const uint64_t off = static_cast<uint64_t>(i) * elems * 4;
    MEGA_ASSIGN_OR_RETURN(Tensor s, Tensor::FromBlob(src_buf.get() + off, DType::kF32,
                                                     {static_cast<int64_t>(elems)}));
    MEGA_ASSIGN_OR_RETURN(Tensor d, Tensor::FromBlob(dst_buf.get() + off, DType::kF32,
                                                     {static_cast<int64_t>(elems)}));
    char name[64];
    std::snprintf(name, sizeof name, "layers.%04d.weight", i);
    named.emplace_back(name, s);
    src.push_back(s);
    dst.push_back(d);
  }

  auto mega_write = [&](format::MegaChecksumType checksum, size_t block) {
    return [&, checksum, block]() -> Status {
      format::MegaWriterOptions o;
      o.checksum = checksum;
      o.io_block_size = block;
      format::MegaWriter writer(o);
      for (const auto& [name, t] : named) MEGA_RETURN_IF_ERROR(writer.AddTensor(name, t));
      return writer.WriteFile(mega, /*sync=*/false).status();
    };
  };
  auto mega_read = [&](bool verify, ThreadPool* pool, size_t block) {
    return [&, verify, pool, block]() -> Status {
      format::MegaReaderOptions o;
      o.verify_checksums = verify;
      o.read_block_size = block;
      MEGA_ASSIGN_OR_RETURN(auto reader, format::MegaReader::OpenFile(mega, o));
      std::vector<format::MegaReadRequest> requests;
      for (size_t i = 0; i < dst.size(); ++i) {
        MEGA_ASSIGN_OR_RETURN(size_t index, reader->IndexOf(named[i].first));
        requests.push_back({index, dst[i]});
      }
      return reader->ReadTensors(requests, pool);
    };
  };
  ThreadPool* pool = &ThreadPool::Default();
  // The 1 MiB-block variants show the effect of checksumming blocks that are
  // still in the CPU cache (the default 16 MiB blocks are not).
  constexpr size_t kSmallBlock = 1u << 20;

  struct Config {
    std::string key, label, limit_key;  // limit_key empty for the limits
    std::function<Status()> run;
    bool reads = false;  // fills dst: checked against src in the last round
    std::string writes;  // the file a write config creates: PrepareFreshWrite'd first
    std::function<void()> prepare = nullptr;  // or this untimed preparation
  };
  // The ceilings, as the best of 1, 2 and N plain threads (N = the pool's
  // size, the parallelism of the MEGA writer and the pool readers) and of the
  // I/O sizes (bench_util.h CeilingConfigs): one config per parallelism and
  // size, interleaved with ours in the rounds; the best median wins.
  PlainIo plain_io(dir + "/plain", bytes, src_buf.get(), dst_buf.get());
  struct CeilingKey {
    std::string key;
    CeilingKind kind;
  };
  const std::vector<CeilingKey> ceiling_keys = {{"memcpy", CeilingKind::kMemcpy},
                                                {"pagecache_write", CeilingKind::kPageCacheWrite},
                                                {"pagecache_read", CeilingKind::kWarmRead}};
  // "<key>_<P>t" at the default size (kept for scripts that read it), else
  // "<key>_<P>t_<MiB>m".
  auto ceiling_key = [&](const CeilingKey& ck, const CeilingConfig& cfg) {
    const std::vector<uint64_t> sizes = CeilingIoSizes(ck.kind);
    std::string key = ck.key + "_" + std::to_string(cfg.parallelism) + "t";
    if (cfg.io_bytes != sizes.back()) key += "_" + std::to_string(cfg.io_bytes >> 20) + "m";
    return key;
  };
  auto ceiling_config = [&](const CeilingKey& ck, const CeilingConfig& cfg) {
    Config c;
    c.key = ceiling_key(ck, cfg);
    c.label = std::string(CeilingName(ck.kind)) + ", " + ConfigText(cfg);
    c.reads = ck.kind == CeilingKind::kMemcpy || ck.kind == CeilingKind::kWarmRead;
    c.run = [&, kind = ck.kind, cfg] { return plain_io.Run(kind, cfg); };
    if (ck.kind == CeilingKind::kPageCacheWrite) {
      c.prepare = [&, p = cfg.parallelism] { plain_io.PrepareWrite(p); };
    }
    return c;
  };
  std::vector<Config> configs;
  for (const CeilingKey& ck : ceiling_keys) {
    if (ck.kind == CeilingKind::kWarmRead) continue;  // with the reads below
    for (const CeilingConfig& cfg : CeilingConfigs(ck.kind, pool->size())) {
      configs.push_back(ceiling_config(ck, cfg));
    }
  }
  std::vector<Config> ours = {
      {"mega_write_nochecksum", "MEGA write (no checksum)", "pagecache_write",
       mega_write(format::MegaChecksumType::kNone, 0), false, mega},
      {"mega_write_block1m", "MEGA write (CRC32, 1 MiB blocks)", "pagecache_write",
       mega_write(format::MegaChecksumType::kCrc32, kSmallBlock), false, mega},
      // Last MEGA write: the default file the reads below use.
      {"mega_write", "MEGA write (CRC32, default)", "pagecache_write",
       mega_write(format::MegaChecksumType::kCrc32, 0), false, mega},
      {"safetensors_write", "safetensors write", "pagecache_write",
       [&]() -> Status { return format::SaveSafetensorsFile(st, named, {}, {}, /*sync=*/false); },
       false, st},
      {"mega_read", "MEGA read (CRC32 verified, pool)", "pagecache_read", mega_read(true, pool, 0),
       true},
      {"mega_read_1thread", "MEGA read (CRC32 verified, 1 thr)", "pagecache_read",
       mega_read(true, nullptr, 0), true},
      {"mega_read_block1m", "MEGA read (CRC32, 1 MiB blocks)", "pagecache_read",
       mega_read(true, pool, kSmallBlock), true},
      {"mega_read_noverify", "MEGA read (no verify, pool)", "pagecache_read",
       mega_read(false, pool, 0), true},
      {"safetensors_read", "safetensors read (pread)", "pagecache_read",
       [&]() -> Status {
         MEGA_ASSIGN_OR_RETURN(auto reader, format::SafetensorsReader::Open(st, {.mmap = false}));
         for (size_t i = 0; i < dst.size(); ++i) {
           MEGA_RETURN_IF_ERROR(reader->ReadTensor(named[i].first, dst[i]));
         }
         return Status::OK();
       },
       true},
      // The mmap trap, for reference: zero-copy views copied into the destination.
      {"safetensors_mmap_copy", "safetensors mmap view + copy", "pagecache_read",
       [&]() -> Status {
         MEGA_ASSIGN_OR_RETURN(auto reader, format::SafetensorsReader::Open(st));
         for (size_t i = 0; i < dst.size(); ++i) {
           MEGA_ASSIGN_OR_RETURN(Tensor v, reader->View(named[i].first));
           MEGA_RETURN_IF_ERROR(CopyTensor(v, dst[i]));
         }
         return Status::OK();
       },
       true},
  };

  // Writes run in a fixed order (the default MEGA file must be the last MEGA
  // write of each round); the reads rotate their order every round so that no
  // reader always runs right after the same neighbour.
  size_t first_read = 0;
  while (first_read < ours.size() && !ours[first_read].reads) ++first_read;
  for (size_t i = 0; i < first_read; ++i) configs.push_back(std::move(ours[i]));
  const size_t first_read_config = configs.size();
  for (const CeilingConfig& cfg : CeilingConfigs(ceiling_keys[2].kind, pool->size())) {
    configs.push_back(ceiling_config(ceiling_keys[2], cfg));
  }
  for (size_t i = first_read; i < ours.size(); ++i) configs.push_back(std::move(ours[i]));
  MEGA_RETURN_IF_ERROR(plain_io.EnsureReadFile());
  first_read = first_read_config;
  const size_t num_reads = configs.size() - first_read;
  std::map<std::string, std::vector<double>> secs;
  for (int round = 0; round < kWarmup + reps; ++round) {
    const bool last = round == kWarmup + reps - 1;
    for (size_t k = 0; k < configs.size(); ++k) {
      const size_t i = k < first_read ? k : first_read + (k - first_read + round) % num_reads;
      const Config& c = configs[i];
      if (c.reads && last) std::memset(dst_buf.get(), 0, bytes);
      if (!c.writes.empty()) PrepareFreshWrite(c.writes, bytes);
      if (c.prepare) c.prepare();
      double t0 = NowSeconds();
      MEGA_RETURN_IF_ERROR(c.run().WithContext(c.key));
      double dt = NowSeconds() - t0;
      if (round >= kWarmup) secs[c.key].push_back(dt);
      if (c.reads && last) MEGA_RETURN_IF_ERROR(CheckSame(src, dst, c.key));
    }
  }
  std::map<std::string, Summary> gbps;
  for (const auto& c : configs) gbps[c.key] = Summarize(ToGbps(secs[c.key], bytes));
  for (const CeilingKey& ck : ceiling_keys) {
    const std::vector<CeilingConfig> cfgs = CeilingConfigs(ck.kind, pool->size());
    std::vector<std::vector<double>> by_config;
    for (const CeilingConfig& cfg : cfgs) by_config.push_back(secs[ceiling_key(ck, cfg)]);
    Ceiling c = CeilingFromSeconds(ck.kind, cfgs, by_config, bytes);
    gbps[ck.key] = c.best;
    rows->push_back(
        {ck.key, "ceiling: " + std::string(CeilingName(ck.kind)) + " (" + BestConfigText(c) + ")",
         c.best, 0});
    ceilings->push_back(c);
  }
  // Kept for scripts that read it: the 2-thread read.
  if (gbps.count("pagecache_read_2t")) gbps["pagecache_read_2threads"] = gbps["pagecache_read_2t"];
  for (const auto& c : configs) {
    if (c.limit_key.empty()) {  // a ceiling's part: JSON only (footnotes in the table)
      rows->push_back({c.key, c.label, gbps[c.key], 0, false, true});
      continue;
    }
    rows->push_back(
        {c.key, c.label, gbps[c.key], c.limit_key.empty() ? 0.0 : gbps[c.limit_key].median});
  }
  rows->push_back({"pagecache_read_2threads", "", gbps["pagecache_read_2threads"], 0, false, true});
  unlink(mega.c_str());
  unlink(st.c_str());
  src_buf.reset();
  dst_buf.reset();

  // Opening a 10,000-tensor file (mmap), headers only.
  {
    std::vector<float> small(64 * kOpenTensors, 1.0f);
    std::vector<std::pair<std::string, Tensor>> many;
    format::MegaWriter writer;
    for (int i = 0; i < kOpenTensors; ++i) {
      MEGA_ASSIGN_OR_RETURN(Tensor t, Tensor::FromBlob(small.data() + 64 * i, DType::kF32, {8, 8}));
      std::string name =
          "model.layers." + std::to_string(i / 10) + ".mlp.w" + std::to_string(i % 10);
      MEGA_RETURN_IF_ERROR(writer.AddTensor(name, t));
      many.emplace_back(name, t);
    }
    MEGA_RETURN_IF_ERROR(writer.WriteFile(mega, false).status());
    MEGA_RETURN_IF_ERROR(format::SaveSafetensorsFile(st, many, {}, {}, false));
    MEGA_ASSIGN_OR_RETURN(Summary mo, TimeMs(reps, [&]() -> Status {
                            format::MegaReaderOptions o;
                            o.use_mmap = true;
                            MEGA_ASSIGN_OR_RETURN(auto r, format::MegaReader::OpenFile(mega, o));
                            if (r->tensors().size() != kOpenTensors) return InternalError("count");
                            return Status::OK();
                          }));
    MEGA_ASSIGN_OR_RETURN(Summary so, TimeMs(reps, [&]() -> Status {
                            MEGA_ASSIGN_OR_RETURN(auto r, format::SafetensorsReader::Open(st));
                            if (r->tensors().size() != kOpenTensors) return InternalError("count");
                            return Status::OK();
                          }));
    rows->push_back({"mega_open_10k_tensors", "MEGA open, 10k tensors (mmap)", mo, 0, true});
    rows->push_back({"safetensors_open_10k_tensors", "safetensors open, 10k tensors", so, 0, true});
    unlink(mega.c_str());
    unlink(st.c_str());
  }
  return Status::OK();
}

}  // namespace

int RunFormatBench(uint64_t size_bytes, int reps, int num_tensors, bool json,
                   const std::string& dir) {
  if (!dir.empty()) {
    // The temp folder goes inside --dir, which may not exist yet.
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    setenv("TMPDIR", dir.c_str(), 1);
  }
  TempDir tmp("megackpt-bench-format");
  std::vector<Row> rows;
  std::vector<Ceiling> ceilings;
  uint64_t bytes = 0;
  Status s = Run(size_bytes, reps, num_tensors, tmp.path(), &rows, &ceilings, &bytes);
  if (!s.ok()) {
    std::fprintf(stderr, "megackpt bench format: %s\n", s.ToString().c_str());
    return 1;
  }
  if (json) {
    nlohmann::ordered_json doc;
    doc["size_bytes"] = bytes;
    doc["tensors"] = num_tensors;
    doc["reps"] = reps;
    doc["warmup"] = kWarmup;
    for (const auto& r : rows) {
      const std::string unit = r.ms ? "_ms" : "_gbps";
      doc[r.key + unit] = r.gbps.median;
      doc[r.key + unit + "_min"] = r.gbps.min;
      doc[r.key + unit + "_max"] = r.gbps.max;
      if (r.limit > 0) {
        const double ratio = r.gbps.median / r.limit;
        doc[r.key + "_ratio"] = ratio;
        if (ratio > kCeilingSlack) {
          doc[r.key + "_ratio_ceiling_too_low"] = true;
          doc["ceiling_too_low"].push_back(r.key + "_ratio");
        }
      }
    }
    for (const Ceiling& c : ceilings) {
      const std::string stem = c.kind == CeilingKind::kMemcpy     ? "memcpy"
                               : c.kind == CeilingKind::kWarmRead ? "pagecache_read"
                                                                  : "pagecache_write";
      doc[stem + "_parallelism"] = c.best_parallelism;
      if (*CeilingIoName(c.kind)) doc[stem + "_" + CeilingIoName(c.kind)] = c.best_io_bytes;
      for (const auto& [p, sum] : c.by_parallelism)
        doc[stem + "_gbps_by_parallelism"][std::to_string(p)] = sum.median;
    }
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  std::printf(
      "megackpt bench format: %.3f GB of tensor data (%d F32 tensors), %d runs after %d "
      "dropped warm-up, decimal GB/s\n",
      bytes / 1e9, num_tensors, reps, kWarmup);
  std::printf("%-34s %8s %8s %8s   %s\n", "", "min", "median", "max", "vs limit");
  for (const auto& r : rows) {
    if (r.ms || r.json_only) continue;
    std::printf("%s\n", FormatRow(r.label, r.gbps, r.limit).c_str());
  }
  std::printf("ceilings, best of 1, 2 and N (the pool's %d threads) plain threads:\n",
              ThreadPool::Default().size());
  for (const Ceiling& c : ceilings) std::printf("  %s\n", DescribeCeiling(c).c_str());
  std::printf("%-34s %8s %8s %8s\n", "(milliseconds)", "min", "median", "max");
  for (const auto& r : rows) {
    if (r.ms) std::printf("%s\n", FormatRow(r.label, r.gbps).c_str());
  }
  return 0;
}

}  // namespace megackpt::bench
