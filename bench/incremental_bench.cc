// Incremental checkpoint saves through the CheckpointManager, durable (fsync):
// per repetition, in two fresh roots (one manager each),
//   plain full save     step 1 of a manager without incremental saves
//   full save           step 1 of an incremental manager (hashes recorded)
//   plain step 2        step 2 of the plain manager (its step 1 on disk)
//   incremental save    step 2 of the incremental manager, after `changed` of
//                       the tensors got new content
// next to the machine's durable write ceiling (the best of 1, 2 and ranks x
// threads plain writers: write + fdatasync of the same bytes, bench_util.h),
// measured the same way in the same run. Each save starts after sync() and a
// barrier; the plain and the incremental save of a step see the same disk
// state, and which of them goes first alternates between repetitions (so
// neither always pays for the other's writeback). The state: 64 F32 tensors,
// row-sharded over the ranks. Medians after a dropped warm-up repetition.
#include "incremental_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_report.h"
#include "bench_util.h"
#include "megackpt/dcp/checkpoint_manager.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::bench {
namespace {

using dcp::CheckpointManager;
using dcp::CheckpointManagerOptions;
using dcp::StateDict;

constexpr int kTensors = 64;

struct RankState {
  std::vector<std::shared_ptr<std::byte>> buffers;
  std::vector<Tensor> tensors;
  uint64_t rows = 0, cols = 0;
};

Result<RankState> MakeRankState(uint64_t size, int world, int rank) {
  RankState st;
  st.cols = 4096;  // 16 KiB rows
  st.rows = std::max<uint64_t>(world, size / kTensors / (st.cols * 4) / world * world);
  const uint64_t my_rows = st.rows / world;
  for (int i = 0; i < kTensors; ++i) {
    const uint64_t n = my_rows * st.cols * 4;
    MEGA_ASSIGN_OR_RETURN(auto buf, AllocateBuffer(n, /*prefault=*/true));
    FillRandom(buf.get(), n, 1000 + i * 64 + rank);
    MEGA_ASSIGN_OR_RETURN(
        Tensor t, Tensor::FromBlob(buf.get(), DType::kF32,
                                   {static_cast<int64_t>(my_rows), static_cast<int64_t>(st.cols)}));
    st.buffers.push_back(std::move(buf));
    st.tensors.push_back(t);
  }
  return st;
}

StateDict AsStateDict(const RankState& st, int world, int rank) {
  StateDict sd;
  for (int i = 0; i < kTensors; ++i) {
    dcp::ShardedTensor s;
    s.dtype = DType::kF32;
    s.global_shape = {static_cast<int64_t>(st.rows), static_cast<int64_t>(st.cols)};
    s.shards.push_back({{static_cast<int64_t>(st.rows / world * rank), 0}, st.tensors[i]});
    sd.Set("t" + std::to_string(i), dcp::StateValue(std::move(s)));
  }
  return sd;
}

struct Rep {
  double plain = 0, full = 0, plain_second = 0, incremental = 0;
  uint64_t bytes_written = 0;
};

}  // namespace

int RunIncrementalBench(const IncrementalBenchOptions& o) {
  if (!(o.changed >= 0 && o.changed <= 1)) {
    std::fprintf(stderr, "megackpt bench incremental: --changed must be in [0, 1]\n");
    return 2;
  }
  std::unique_ptr<TempDir> tmp;
  const std::string dir = BenchDir(o.dir, "megackpt-bench-incr", &tmp);
  const int world = o.world_size;
  const int nchanged = static_cast<int>(std::llround(o.changed * kTensors));
  std::vector<Rep> reps(o.reps + 1);
  uint64_t state_bytes = 0, changed_bytes = 0;
  std::vector<Status> statuses = dist::RunThreadRanks(world, [&](dist::ProcessGroup& g) -> Status {
    MEGA_ASSIGN_OR_RETURN(RankState st, MakeRankState(o.size, world, g.rank()));
    const uint64_t tensor_bytes = st.rows * st.cols * 4;
    if (g.rank() == 0) {
      state_bytes = tensor_bytes * kTensors;
      changed_bytes = tensor_bytes * nchanged;
    }
    for (int r = 0; r <= o.reps; ++r) {
      const std::string plain_root = dir + "/plain", root = dir + "/incremental";
      if (g.rank() == 0) {
        PrepareFreshWrite(plain_root, 0);
        PrepareFreshWrite(root, o.size);
      }
      CheckpointManagerOptions mo;
      mo.group = &g;
      mo.storage_options.thread_count = o.threads;
      mo.storage_options.sync = true;
      MEGA_ASSIGN_OR_RETURN(auto plain, CheckpointManager::Open(plain_root, mo));
      mo.incremental.enabled = true;
      MEGA_ASSIGN_OR_RETURN(auto m, CheckpointManager::Open(root, mo));
      // Every timed save starts from written-back page cache (sync), after a barrier.
      auto timed = [&](CheckpointManager& mgr, int64_t step, double* out) -> Status {
        if (g.rank() == 0) sync();
        MEGA_RETURN_IF_ERROR(g.Barrier());
        const double t0 = NowSeconds();
        StateDict sd = AsStateDict(st, world, g.rank());
        MEGA_RETURN_IF_ERROR(mgr.Save(step, sd));
        if (g.rank() == 0) *out = NowSeconds() - t0;
        return Status::OK();
      };
      // Like with like: the plain and the incremental save of a step see the
      // same disk state (a fresh root for step 1, its step 1 on disk for
      // step 2); which of the two goes first alternates between repetitions.
      auto pair = [&](int64_t step, double* plain_s, double* incr_s) -> Status {
        if (r % 2 == 0) {
          MEGA_RETURN_IF_ERROR(timed(*plain, step, plain_s));
          return timed(*m, step, incr_s);
        }
        MEGA_RETURN_IF_ERROR(timed(*m, step, incr_s));
        return timed(*plain, step, plain_s);
      };
      MEGA_RETURN_IF_ERROR(pair(1, &reps[r].plain, &reps[r].full));
      // New content for the first `nchanged` tensors (untimed), then the next step.
      for (int i = 0; i < nchanged; ++i) {
        FillRandom(st.buffers[i].get(), tensor_bytes / world, 7777 + r * 1000 + i * 64 + g.rank());
      }
      MEGA_RETURN_IF_ERROR(pair(2, &reps[r].plain_second, &reps[r].incremental));
      if (g.rank() == 0) {
        MEGA_ASSIGN_OR_RETURN(auto steps, m->Steps());
        for (const auto& s : steps) {
          if (s.step == 2) reps[r].bytes_written = s.bytes_written;
        }
      }
    }
    return Status::OK();
  });
  for (const Status& s : statuses) {
    if (!s.ok()) {
      std::fprintf(stderr, "megackpt bench incremental: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  // The durable-write ceiling with the saves' parallelism: best of 1, 2 and
  // ranks x threads plain writers.
  const int parallelism = world * std::max(1, o.threads);
  Result<Ceiling> ceiling = [&]() -> Result<Ceiling> {
    MEGA_ASSIGN_OR_RETURN(auto io, PlainIo::Create(dir + "/limit", state_bytes));
    return MeasureCeiling(*io, CeilingKind::kDurableWrite, parallelism, 1, o.reps);
  }();
  if (!ceiling.ok()) {
    std::fprintf(stderr, "megackpt bench incremental: %s\n", ceiling.status().ToString().c_str());
    return 1;
  }
  const Summary* limit = &ceiling->best;
  std::vector<double> plain, full, plain2, incr, written;
  for (int r = 1; r <= o.reps; ++r) {  // rep 0 is the warm-up
    plain.push_back(reps[r].plain);
    full.push_back(reps[r].full);
    plain2.push_back(reps[r].plain_second);
    incr.push_back(reps[r].incremental);
    written.push_back(static_cast<double>(reps[r].bytes_written));
  }
  const Summary sp = Summarize(plain), sf = Summarize(full), sp2 = Summarize(plain2),
                si = Summarize(incr), sw = Summarize(written);
  const uint64_t bytes_written = static_cast<uint64_t>(sw.median);
  nlohmann::json j = {
      {"size", state_bytes},
      {"world_size", world},
      {"changed", o.changed},
      {"changed_tensors", nchanged},
      {"tensors", kTensors},
      {"reps", o.reps},
      {"plain_full_save_seconds", sp.median},
      {"full_save_seconds", sf.median},
      {"plain_second_save_seconds", sp2.median},
      {"incremental_save_seconds", si.median},
      {"bytes_written", bytes_written},
      {"changed_bytes", changed_bytes},
      {"durable_write_gbps", limit->median},
      {"full_save_gbps", state_bytes / sf.median / 1e9},
      {"incremental_vs_full", si.median / sf.median},
      {"full_vs_plain", sf.median / sp.median},
      {"incremental_vs_plain", si.median / sp2.median},
      {"written_vs_changed", changed_bytes ? bytes_written / double(changed_bytes) : 0.0},
      {"written_vs_state", bytes_written / double(state_bytes)}};
  PutCeiling(&j, "durable_write_gbps", *ceiling);
  j["ceiling_parallelism"] = parallelism;
  PutRatio(&j, "full_save_vs_durable_write", state_bytes / sf.median / 1e9 / limit->median);
  if (o.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "bench incremental: %.2f GB state (%d F32 tensors), %d rank(s), %d of them changed (%.0f%%), "
      "durable saves, median of %d\n",
      state_bytes / 1e9, kTensors, world, nchanged, o.changed * 100, o.reps);
  std::printf(
      "  durable write ceiling (best of 1/2/%d)   %7.3f GB/s  -> %.3f s for the state (%d thr)\n",
      parallelism, limit->median, state_bytes / limit->median / 1e9, ceiling->best_parallelism);
  std::printf("  plain full save (no hashing)             %7.3f s\n", sp.median);
  std::printf(
      "  full save, hashes recorded               %7.3f s  (%.2fx plain; %.2fx the ceiling's "
      "speed%s)\n",
      sf.median, sf.median / sp.median, state_bytes / sf.median / 1e9 / limit->median,
      state_bytes / sf.median / 1e9 / limit->median > kCeilingSlack ? kCeilingTooLow : "");
  std::printf("  plain save of step 2 (step 1 on disk)    %7.3f s\n", sp2.median);
  std::printf(
      "  incremental save                         %7.3f s  (%.2fx full; %.2fx the plain step 2)\n",
      si.median, si.median / sf.median, si.median / sp2.median);
  std::printf("  bytes written %.3f GB for %.3f GB changed (%.2fx), %.2f%% of the state\n",
              bytes_written / 1e9, changed_bytes / 1e9,
              changed_bytes ? bytes_written / double(changed_bytes) : 0.0,
              100.0 * bytes_written / state_bytes);
  return 0;
}

}  // namespace megackpt::bench
