// The CAS benchmark. Every rate is decimal GB/s of input bytes; each row is
// min / median / max over `reps` runs after `warmup` dropped runs, and the
// limits (memcpy, page-cache write and read) are measured the same way, in
// the same process, on the same size.
#include "cas_bench.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "bench_util.h"
#include "cas/dedup_scenario.h"
#include "megackpt/cas/chunker.h"
#include "megackpt/cas/hash.h"
#include "megackpt/cas/store.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/core/tensor.h"

namespace megackpt::bench {

namespace {

using cas::CasBackend;
using cas::ChunkLocation;
using cas::FileReconstruction;
using cas::MerkleHash;
using cas::XorbLayout;

// Checkpoint-like bytes: float32 weights with random sign and mantissa and an
// exponent in a narrow band (what trained weights look like to a compressor).
void FillWeights(std::byte* p, size_t n, uint64_t seed) {
  FillRandom(p, n, seed);
  for (size_t i = 0; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, p + i, 4);
    w = (w & 0x807FFFFFu) | ((117u + ((w >> 23) & 7u)) << 23);
    std::memcpy(p + i, &w, 4);
  }
}

// A backend that keeps nothing: measures the upload pipeline alone.
class NullBackend final : public CasBackend {
 public:
  std::string Describe() const override { return "null backend"; }
  Result<bool> PutXorb(std::string_view, const XorbLayout&) override { return true; }
  Result<bool> HasXorb(const MerkleHash&) override { return false; }
  Result<std::string> GetXorbRange(const MerkleHash&, uint64_t, uint64_t) override {
    return UnimplementedError("null backend");
  }
  Result<std::string> GetXorb(const MerkleHash&) override {
    return UnimplementedError("null backend");
  }
  Result<XorbLayout> GetXorbLayout(const MerkleHash&) override {
    return UnimplementedError("null backend");
  }
  Result<std::vector<MerkleHash>> ListXorbs() override { return std::vector<MerkleHash>{}; }
  Status DeleteXorbs(std::span<const MerkleHash>) override { return Status::OK(); }
  Result<uint64_t> XorbSize(const MerkleHash&) override {
    return UnimplementedError("null backend");
  }
  Status PutFile(const FileReconstruction&) override { return Status::OK(); }
  Result<FileReconstruction> GetFile(const MerkleHash&) override {
    return UnimplementedError("null backend");
  }
  Result<bool> HasFile(const MerkleHash&) override { return false; }
  Result<std::vector<MerkleHash>> ListFiles() override { return std::vector<MerkleHash>{}; }
  Status DeleteFiles(std::span<const MerkleHash>) override { return Status::OK(); }
  Result<std::vector<std::optional<ChunkLocation>>> LookupChunks(
      std::span<const MerkleHash> hashes) override {
    return std::vector<std::optional<ChunkLocation>>(hashes.size());
  }
};

struct Row {
  std::string key;  // JSON key (median) and label
  std::string label;
  Summary s;
  std::string ratio_to;  // key of the limit this row is compared with
};

}  // namespace

Result<std::string> RunCasBench(const CasBenchOptions& o) {
  if (o.size < (1u << 20)) return InvalidArgumentError("--size must be at least 1 MiB");
  if (o.reps < 1 || o.warmup < 0) return InvalidArgumentError("--reps must be >= 1");
  std::unique_ptr<TempDir> tmp;
  std::string dir = o.dir;
  if (dir.empty()) {
    tmp = std::make_unique<TempDir>("megackpt-cas-bench");
    dir = tmp->path();
  } else {
    MEGA_RETURN_IF_ERROR(CreateDirectories(dir));
  }
  const uint64_t size = o.size;
  const size_t n = static_cast<size_t>(size);
  MEGA_ASSIGN_OR_RETURN(auto data, AllocateBuffer(n, true));
  FillWeights(data.get(), n, 42);
  const std::span<const std::byte> bytes(data.get(), n);
  std::vector<Row> rows;
  auto add = [&](std::string key, std::string label, const std::vector<double>& secs,
                 std::string ratio_to = "") {
    rows.push_back(
        {std::move(key), std::move(label), Summarize(ToGbps(secs, size)), std::move(ratio_to)});
  };

  // ---- machine limits ----
  MEGA_ASSIGN_OR_RETURN(Summary memcpy_s, MemcpyGbps(size, o.warmup, o.reps));
  rows.push_back({"memcpy_gbps", "memcpy (1 thread)", memcpy_s, ""});
  const std::string src_path = dir + "/source.bin";
  MEGA_ASSIGN_OR_RETURN(Summary write_s,
                        FileWriteGbps(dir + "/limit.bin", size, false, o.warmup, o.reps));
  rows.push_back({"page_cache_write_gbps", "page-cache write", write_s, ""});
  if (o.sync) {
    MEGA_ASSIGN_OR_RETURN(Summary fsync_s,
                          FileWriteGbps(dir + "/limit.bin", size, true, o.warmup, o.reps));
    rows.push_back({"write_fsync_gbps", "write + fsync", fsync_s, ""});
  }
  MEGA_ASSIGN_OR_RETURN(Summary read_s, FileReadGbps(dir + "/limit.bin", size, o.warmup, o.reps));
  rows.push_back({"page_cache_read_gbps", "page-cache read (warm buffer)", read_s, ""});

  // ---- chunking / hashing / compression, one thread ----
  std::vector<uint64_t> ends;
  ends.reserve(n / cas::kMinChunkSize + 2);
  MEGA_ASSIGN_OR_RETURN(auto secs, TimeRuns(o.warmup, o.reps, [&] {
                          ends.clear();
                          cas::Chunker c;
                          c.Feed(bytes, &ends);
                          if (auto last = c.Finish()) ends.push_back(*last);
                          return Status::OK();
                        }));
  add("chunk_gbps", "chunk (gear CDC, 1 thread)", secs, "memcpy_gbps");
  std::vector<MerkleHash> hashes(ends.size());
  MEGA_ASSIGN_OR_RETURN(secs, TimeRuns(o.warmup, o.reps, [&] {
                          uint64_t prev = 0;
                          for (size_t i = 0; i < ends.size(); ++i) {
                            hashes[i] = cas::ChunkHash(bytes.subspan(prev, ends[i] - prev));
                            prev = ends[i];
                          }
                          return Status::OK();
                        }));
  add("hash_gbps", "chunk hash (BLAKE3 keyed, 1 thread)", secs, "memcpy_gbps");
  std::vector<std::byte> record(cas::kMaxChunkSize + cas::kChunkRecordHeaderSize);
  uint64_t compressed = 0;
  MEGA_ASSIGN_OR_RETURN(secs, TimeRuns(o.warmup, o.reps, [&] {
                          uint64_t prev = 0;
                          compressed = 0;
                          for (size_t i = 0; i < ends.size(); ++i) {
                            compressed += cas::EncodeChunkRecord(
                                bytes.subspan(prev, ends[i] - prev), cas::CompressionPolicy::kAuto,
                                record.data());
                            prev = ends[i];
                          }
                          return Status::OK();
                        }));
  add("compress_gbps", "compress (auto LZ4/BG4, 1 thread)", secs, "memcpy_gbps");

  // ---- the upload pipeline without storage, 1 and 2 threads ----
  ThreadPool pool(2);
  for (int threads : {1, 2}) {
    auto null_store = cas::CasStore::Open(std::make_shared<NullBackend>(),
                                          {.pool = &pool, .upload_threads = threads});
    if (!null_store.ok()) return null_store.status();
    MEGA_ASSIGN_OR_RETURN(
        secs, TimeRuns(o.warmup, o.reps, [&] { return (*null_store)->Upload(bytes).status(); }));
    add("chunk_hash_compress_" + std::to_string(threads) + "t_gbps",
        "chunk+hash+compress (" + std::to_string(threads) + " thread" + (threads > 1 ? "s" : "") +
            ")",
        secs, "memcpy_gbps");
  }

  // ---- put / get through the local store ----
  MEGA_RETURN_IF_ERROR(WriteLocalFileAtomically(
      src_path, std::string_view(reinterpret_cast<const char*>(data.get()), n), false));
  const std::string store_dir = dir + "/store";
  cas::LocalBackendOptions local{.create = true, .sync = o.sync};
  cas::CasStoreOptions store_opts{.pool = &pool, .upload_threads = 2};
  MerkleHash file_hash;
  uint64_t stored = 0;
  std::vector<double> put_secs;
  for (int i = 0; i < o.warmup + o.reps; ++i) {
    std::filesystem::remove_all(store_dir);  // each run stores everything anew
    MEGA_ASSIGN_OR_RETURN(auto store, cas::CasStore::OpenLocal(store_dir, store_opts, local));
    double t0 = NowSeconds();
    MEGA_ASSIGN_OR_RETURN(cas::FileUploadResult r, store->UploadFile(src_path));
    double dt = NowSeconds() - t0;
    if (i >= o.warmup) put_secs.push_back(dt);
    file_hash = r.file_hash;
    stored = r.stored_bytes;
  }
  add("put_gbps", std::string("put (file -> local store") + (o.sync ? ", fsync)" : ")"), put_secs,
      o.sync ? "write_fsync_gbps" : "page_cache_write_gbps");
  MEGA_ASSIGN_OR_RETURN(auto store, cas::CasStore::OpenLocal(store_dir, store_opts, local));
  MEGA_ASSIGN_OR_RETURN(auto out, AllocateBuffer(n, true));
  MEGA_ASSIGN_OR_RETURN(
      secs, TimeRuns(o.warmup, o.reps, [&]() -> Status {
        size_t pos = 0;
        MEGA_RETURN_IF_ERROR(store->Download(file_hash, {}, [&](std::span<const std::byte> piece) {
          std::memcpy(out.get() + pos, piece.data(), piece.size());
          pos += piece.size();
          return Status::OK();
        }));
        return pos == n ? Status::OK() : DataLossError("short download");
      }));
  add("get_gbps", "get (local store -> warm buffer)", secs, "page_cache_read_gbps");
  if (std::memcmp(out.get(), data.get(), n) != 0) return DataLossError("bench: download differs");
  std::filesystem::remove(src_path);

  // ---- dedup scenario ----
  std::optional<cas::scenario::Report> dedup;
  if (o.dedup_size > 0) {
    const std::string dd = dir + "/dedup-store";
    std::filesystem::remove_all(dd);
    MEGA_ASSIGN_OR_RETURN(auto dstore, cas::CasStore::OpenLocal(dd, store_opts, local));
    cas::scenario::Options so;
    so.total_bytes = o.dedup_size;
    MEGA_ASSIGN_OR_RETURN(
        auto report,
        cas::scenario::Run(*dstore, so, /*verify=*/false, [&](const std::string& line) {
          if (!o.json) std::fprintf(stderr, "  %s\n", line.c_str());
        }));
    dedup = std::move(report);
    std::filesystem::remove_all(dd);
  }

  std::map<std::string, double> median;
  for (const Row& r : rows) median[r.key] = r.s.median;
  if (o.json) {
    nlohmann::json j;
    j["size"] = size;
    j["reps"] = o.reps;
    j["warmup"] = o.warmup;
    j["sync"] = o.sync;
    j["chunks"] = ends.size();
    j["compression_ratio"] = compressed ? static_cast<double>(size) / compressed : 0.0;
    j["stored_bytes"] = stored;
    for (const Row& r : rows) {
      j[r.key] = r.s.median;
      j["details"][r.key] = {{"min", r.s.min}, {"median", r.s.median}, {"max", r.s.max}};
      if (!r.ratio_to.empty())
        j["ratios"][r.key + "/" + r.ratio_to] = r.s.median / median[r.ratio_to];
    }
    if (dedup) {
      for (const auto& p : dedup->phases) {
        j["dedup"].push_back({{"phase", p.name},
                              {"files", p.files},
                              {"bytes", p.bytes},
                              {"new_bytes", p.new_bytes},
                              {"new_fraction", p.new_fraction()},
                              {"stored_bytes", p.stored_bytes},
                              {"seconds", p.seconds}});
      }
    }
    return j.dump(2) + "\n";
  }
  std::string text;
  char line[256];
  std::snprintf(line, sizeof(line),
                "CAS benchmark: %.1f MiB of float32-like data, %zu chunks (mean %.1f KiB), "
                "compressed to %.3f of its size; %d runs after %d warm-up\n",
                size / 1048576.0, ends.size(), size / 1024.0 / std::max<size_t>(1, ends.size()),
                compressed ? static_cast<double>(compressed) / size : 1.0, o.reps, o.warmup);
  text += line;
  std::snprintf(line, sizeof(line), "%-34s %8s %8s %8s   %s\n", "GB/s", "min", "median", "max",
                "ratio (median)");
  text += line;
  for (const Row& r : rows) {
    text += FormatRow(r.label, r.s, r.ratio_to.empty() ? 0 : median[r.ratio_to]);
    if (!r.ratio_to.empty()) text += " of " + r.ratio_to.substr(0, r.ratio_to.size() - 5);
    text += "\n";
  }
  if (dedup)
    text += "\nDedup scenario (" + std::to_string(o.dedup_size >> 20) + " MiB per version):\n" +
            dedup->ToString();
  return text;
}

}  // namespace megackpt::bench
