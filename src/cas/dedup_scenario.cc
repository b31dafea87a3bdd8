#include "cas/dedup_scenario.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

namespace megackpt::cas::scenario {

namespace {

struct Tensor {
  std::string name;
  uint64_t nbytes = 0;
  int version = 1;  // content generation
};

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// float32 values shaped like trained weights: random sign and mantissa, an
// exponent within a narrow band (|w| in ~[1e-3, 0.12)).
void FillTensor(uint64_t seed, int tensor, int version, uint64_t offset, char* out, size_t n) {
  // offset and n are multiples of 4 (payloads are 64-byte aligned pieces).
  uint64_t s = Mix(seed * 1000003 + tensor * 7919 + version);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t r = Mix(s + (offset + i) / 8);
    uint32_t w[2];
    for (int k = 0; k < 2; ++k) {
      uint32_t bits = static_cast<uint32_t>(r >> (32 * k));
      uint32_t exponent = 117 + (bits >> 29);  // 117..124
      w[k] = (bits & 0x80000000u) | (exponent << 23) | (bits & 0x7FFFFFu);
    }
    std::memcpy(out + i, w, std::min<size_t>(8, n - i));
  }
}

std::vector<Tensor> MakeTensors(const Options& o) {
  // Sizes cycle through a spread typical of a transformer block
  // (embeddings, attention, MLP, norms).
  static const uint64_t kPattern[] = {4 << 20, 1 << 20, 1 << 20,  1 << 20,  1 << 20,
                                      4 << 20, 4 << 20, 16 << 10, 16 << 10, 2 << 20};
  std::vector<Tensor> t;
  uint64_t total = 0;
  for (int i = 0; total < o.total_bytes; ++i) {
    uint64_t n = std::min<uint64_t>(kPattern[i % 10], o.total_bytes - total);
    n = std::max<uint64_t>(64, n / 64 * 64);
    t.push_back({"layers." + std::to_string(i / 10) + ".w" + std::to_string(i % 10), n, 1});
    total += n;
  }
  return t;
}

// A shard: 8-byte magic, u64 header length, JSON header, zero padding to 64,
// then payloads (each padded to 64 bytes).
struct ShardPlan {
  std::string header;  // magic + length + json + padding
  std::vector<int> tensors;
};

ShardPlan PlanShard(const std::vector<Tensor>& all, const std::vector<int>& ids, int step,
                    int shard, int nshards) {
  nlohmann::json j;
  j["format"] = "mega-synthetic";
  j["step"] = step;
  j["shard"] = shard;
  j["num_shards"] = nshards;
  uint64_t off = 0;
  for (int id : ids) {
    j["tensors"].push_back({{"name", all[id].name},
                            {"dtype", "float32"},
                            {"shape", {all[id].nbytes / 4}},
                            {"offset", off},
                            {"nbytes", all[id].nbytes}});
    off += (all[id].nbytes + 63) / 64 * 64;
  }
  std::string js = j.dump();
  ShardPlan plan;
  plan.header = "MEGASYN1";
  uint64_t len = js.size();
  plan.header.append(reinterpret_cast<const char*>(&len), 8);
  plan.header += js;
  plan.header.resize((plan.header.size() + 63) / 64 * 64, '\0');
  plan.tensors = ids;
  return plan;
}

// Streams a shard's bytes to `sink` in pieces of at most 4 MiB.
Status EmitShard(const Options& o, const std::vector<Tensor>& all, const ShardPlan& plan,
                 const std::function<Status(std::span<const std::byte>)>& sink) {
  MEGA_RETURN_IF_ERROR(sink(std::as_bytes(std::span(plan.header))));
  std::string buf;
  for (int id : plan.tensors) {
    const Tensor& t = all[id];
    uint64_t padded = (t.nbytes + 63) / 64 * 64;
    for (uint64_t off = 0; off < padded; off += 4 << 20) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(4 << 20, padded - off));
      buf.assign(n, '\0');
      size_t data = static_cast<size_t>(std::min<uint64_t>(n, t.nbytes > off ? t.nbytes - off : 0));
      FillTensor(o.seed, id, t.version, off, buf.data(), data);
      MEGA_RETURN_IF_ERROR(sink(std::as_bytes(std::span(buf))));
    }
  }
  return Status::OK();
}

std::vector<std::vector<int>> Split(int n, int parts) {
  std::vector<std::vector<int>> out(parts);
  for (int i = 0; i < n; ++i) out[static_cast<size_t>(i) * parts / n].push_back(i);
  return out;
}

std::string Human(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof(buf), "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof(buf), "%.1f MiB", b / double(1ull << 20));
  else
    std::snprintf(buf, sizeof(buf), "%.1f KiB", b / 1024.0);
  return buf;
}

}  // namespace

std::string Report::ToString() const {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%-22s %5s %12s %12s %8s %12s %8s %8s\n", "phase", "files",
                "bytes", "new bytes", "new %", "stored", "chunks", "GB/s");
  out += line;
  for (const PhaseReport& p : phases) {
    std::snprintf(line, sizeof(line), "%-22s %5d %12s %12s %7.2f%% %12s %8llu %8.2f\n",
                  p.name.c_str(), p.files, Human(p.bytes).c_str(), Human(p.new_bytes).c_str(),
                  100 * p.new_fraction(), Human(p.stored_bytes).c_str(),
                  static_cast<unsigned long long>(p.chunks),
                  p.seconds > 0 ? p.bytes / p.seconds / 1e9 : 0.0);
    out += line;
  }
  std::snprintf(line, sizeof(line), "changed tensors: %s of payload\n",
                Human(changed_tensor_bytes).c_str());
  out += line;
  return out;
}

Result<Report> Run(CasStore& store, const Options& o, bool verify,
                   const std::function<void(const std::string&)>& progress) {
  Report report;
  std::vector<Tensor> tensors = MakeTensors(o);
  report.tensors = static_cast<int>(tensors.size());

  auto run_phase = [&](const std::string& name, int step,
                       const std::vector<std::vector<int>>& groups) -> Status {
    PhaseReport p;
    p.name = name;
    std::vector<MerkleHash> files;
    auto t0 = std::chrono::steady_clock::now();
    for (size_t s = 0; s < groups.size(); ++s) {
      ShardPlan plan =
          PlanShard(tensors, groups[s], step, static_cast<int>(s), static_cast<int>(groups.size()));
      MEGA_ASSIGN_OR_RETURN(auto stream,
                            store.BeginUpload({.name = name + " shard " + std::to_string(s)}));
      MEGA_RETURN_IF_ERROR(EmitShard(o, tensors, plan, [&](std::span<const std::byte> piece) {
        return stream->Append(piece);
      }));
      MEGA_ASSIGN_OR_RETURN(FileUploadResult r, stream->Finish());
      p.files++;
      p.bytes += r.size;
      p.new_bytes += r.new_bytes;
      p.stored_bytes += r.stored_bytes;
      p.chunks += r.chunks;
      p.new_chunks += r.new_chunks;
      files.push_back(r.file_hash);
    }
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (verify) {
      for (size_t s = 0; s < groups.size(); ++s) {
        ShardPlan plan = PlanShard(tensors, groups[s], step, static_cast<int>(s),
                                   static_cast<int>(groups.size()));
        std::string want;
        MEGA_RETURN_IF_ERROR(EmitShard(o, tensors, plan, [&](std::span<const std::byte> piece) {
          want.append(reinterpret_cast<const char*>(piece.data()), piece.size());
          return Status::OK();
        }));
        MEGA_ASSIGN_OR_RETURN(std::string got, store.Read(files[s]));
        if (got != want) {
          return DataLossError(name + " shard " + std::to_string(s) + ": read-back differs");
        }
      }
    }
    report.files.push_back(files);
    report.phases.push_back(p);
    if (progress) progress(name + ": " + Human(p.bytes) + ", new " + Human(p.new_bytes));
    return Status::OK();
  };

  MEGA_RETURN_IF_ERROR(run_phase("v1", 1, Split(report.tensors, o.shards)));
  // Change a pseudo-random set of tensors holding `changed_fraction` of the
  // payload bytes.
  std::vector<int> order(report.tensors);
  for (int i = 0; i < report.tensors; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int a, int b) { return Mix(o.seed ^ (a * 31 + 7)) < Mix(o.seed ^ (b * 31 + 7)); });
  uint64_t total = 0;
  for (const Tensor& t : tensors) total += t.nbytes;
  for (int i : order) {
    if (report.changed_tensor_bytes + tensors[i].nbytes / 2 > o.changed_fraction * total) continue;
    tensors[i].version = 2;
    report.changed_tensor_bytes += tensors[i].nbytes;
  }
  char pct[32];
  std::snprintf(pct, sizeof(pct), "%d%%", static_cast<int>(o.changed_fraction * 100 + 0.5));
  MEGA_RETURN_IF_ERROR(
      run_phase(std::string("v2 (") + pct + " changed)", 2, Split(report.tensors, o.shards)));
  MEGA_RETURN_IF_ERROR(run_phase("v3 (re-sharded " + std::to_string(o.reshards) + ")", 2,
                                 Split(report.tensors, o.reshards)));
  return report;
}

}  // namespace megackpt::cas::scenario
