// Distributed-checkpoint commands: `megackpt demo` and `megackpt bench dcp`.
//
// The demo saves a deterministic synthetic model state (whole, sharded,
// replicated and bytes entries under nested names) from N ranks and loads it
// back at world size M with another sharding, comparing every byte with what the
// seed says it must be. Ranks are threads of this process (--backend threads) or
// the processes of `mpirun -np N megackpt demo --backend mpi ...`.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dcp/synthetic.h"
#include "dcp_bench.h"
#include "megackpt/commands.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dcp/storage_factory.h"
#include "megackpt/dist/process_group.h"
#include "reshard_bench.h"

namespace megackpt::cli {
namespace {

using namespace ::megackpt::dcp;  // NOLINT: this file is the dcp command group

std::string Mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  return buf;
}

struct DemoOptions {
  std::string out;
  std::string storage = "fs";
  int world_size = 2;
  bool world_size_given = false;
  std::string backend = "threads";
  uint64_t seed = 1;
  uint64_t size = 256ull << 20;
  int load_world_size = 0;  // 0: pick a different one
  std::string mode = "both";
  int threads = 2;
  bool consolidate = false;  // --storage mega: consolidate after saving
  bool direct_io = false;    // data files around the page cache (StorageFactoryOptions)
  int mapping = 0;           // --storage mega: spread fqns over N index buckets
};

// What one rank measured in one phase.
struct RankTiming {
  double seconds = 0;
  SaveStats save;
  LoadStats load;
  double verify_seconds = 0;
  uint64_t bytes = 0;  // bytes this rank held
};

// Runs fn on every rank of a `world`-rank job: threads of this process, or
// (mpi) this process being one rank of an existing MPI group. Returns per-rank
// statuses and timings gathered on every rank.
using RankFn = std::function<Status(dist::ProcessGroup&, RankTiming*)>;

Result<std::vector<RankTiming>> RunRanks(const std::string& backend, dist::ProcessGroup* mpi,
                                         int world, const RankFn& fn) {
  std::vector<RankTiming> timings(world);
  if (backend == "threads") {
    dist::ProcessGroupOptions po;
    auto results = dist::RunThreadRanks(
        world, [&](dist::ProcessGroup& g) { return fn(g, &timings[g.rank()]); }, po);
    for (const Status& s : results) MEGA_RETURN_IF_ERROR(s);
    return timings;
  }
  RankTiming mine;
  Status s = fn(*mpi, &mine);
  // Every rank reaches here (the flows agree on their outcome); share timings.
  char buf[256];
  std::snprintf(buf, sizeof buf, "%.9f %.9f %.9f %.9f %.9f %llu", mine.seconds,
                mine.save.write_seconds, mine.save.commit_seconds, mine.load.read_seconds,
                mine.verify_seconds, static_cast<unsigned long long>(mine.bytes));
  Status agreed = mpi->AllReduceStatus(s);
  MEGA_RETURN_IF_ERROR(agreed);
  MEGA_ASSIGN_OR_RETURN(auto all, mpi->AllGather(buf));
  for (int r = 0; r < world && r < static_cast<int>(all.size()); ++r) {
    unsigned long long b = 0;
    std::sscanf(all[r].c_str(), "%lf %lf %lf %lf %lf %llu", &timings[r].seconds,
                &timings[r].save.write_seconds, &timings[r].save.commit_seconds,
                &timings[r].load.read_seconds, &timings[r].verify_seconds, &b);
    timings[r].bytes = b;
  }
  return timings;
}

double MaxOf(const std::vector<RankTiming>& t, double RankTiming::*field) {
  double m = 0;
  for (const auto& x : t) m = std::max(m, x.*field);
  return m;
}

// The bytes the ranks held together (replicas counted on every rank holding them).
uint64_t BytesHeld(const std::vector<RankTiming>& t) {
  uint64_t held = 0;
  for (const auto& x : t) held += x.bytes;
  return held;
}

// One timed phase of a rank: every rank starts `phase` together (a barrier),
// t->seconds is how long it took on this rank.
Status TimePhase(dist::ProcessGroup& g, RankTiming* t, const std::function<Status()>& phase) {
  MEGA_RETURN_IF_ERROR(g.Barrier());
  const double t0 = NowSeconds();
  MEGA_RETURN_IF_ERROR(phase());
  t->seconds = NowSeconds() - t0;
  return Status::OK();
}

int RunDemo(const DemoOptions& o) {
  std::unique_ptr<dist::ProcessGroup> mpi;
  int world = o.world_size;
  bool printer = true;
  if (o.backend == "mpi") {
    dist::ProcessGroupOptions po;
    auto g = dist::NewMpiProcessGroup(po);
    if (!g.ok()) {
      return ReportError(
          "demo --backend mpi",
          Status(g.status().code(),
                 g.status().message() +
                     " (start it with mpirun -np N megackpt demo --backend mpi ...)"));
    }
    mpi = std::move(*g);
    if (o.world_size_given && o.world_size != mpi->world_size()) {
      if (mpi->rank() == 0) {
        return ReportUsage("demo", "--world-size " + std::to_string(o.world_size) +
                                       " but mpirun started " + std::to_string(mpi->world_size()) +
                                       " ranks");
      }
      return kExitUsage;
    }
    world = mpi->world_size();
    printer = mpi->rank() == 0;
  }
  int load_world = o.load_world_size;
  if (load_world <= 0) {
    load_world = o.backend == "mpi" ? world : (world < 4 ? world + 1 : world - 1);
  }
  if (o.backend == "mpi" && load_world != world) {
    if (!printer) return kExitUsage;
    return ReportUsage("demo", "with --backend mpi the load runs on the " + std::to_string(world) +
                                   " MPI ranks; --load-world-size must be " +
                                   std::to_string(world) + " (the sharding still changes)");
  }
  const synthetic::Spec spec = synthetic::MakeSpec(o.seed, o.size);
  size_t ntensors = 0, nbytes_entries = 0;
  for (const auto& e : spec.entries) (e.is_bytes ? nbytes_entries : ntensors)++;
  // A different layout for every tensor when loading.
  const int load_variant = 1;
  // --json: one object at the end instead of the text lines.
  const bool text = printer && !JsonOutput();
  nlohmann::ordered_json result = {{"out", o.out},
                                   {"storage", o.storage},
                                   {"backend", o.backend},
                                   {"seed", o.seed},
                                   {"bytes", spec.total_bytes},
                                   {"tensors", ntensors},
                                   {"bytes_values", nbytes_entries},
                                   {"direct_io", o.direct_io}};
  if (text) {
    std::printf(
        "megackpt demo: seed %llu, %s of state (%zu tensors, %zu bytes values, nested names)\n",
        static_cast<unsigned long long>(o.seed), Mb(spec.total_bytes).c_str(), ntensors,
        nbytes_entries);
    std::printf("  storage %s at %s, backend %s\n", o.storage.c_str(), o.out.c_str(),
                o.backend.c_str());
  }
  StorageFactoryOptions so;
  so.thread_count = o.threads;
  so.direct_io = o.direct_io;

  if (o.mode == "save" || o.mode == "both") {
    auto timings =
        RunRanks(o.backend, mpi.get(), world, [&](dist::ProcessGroup& g, RankTiming* t) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd,
                                synthetic::BuildRankState(spec, world, g.rank(), 0, true));
          t->bytes = synthetic::RankStateBytes(sd);
          MEGA_ASSIGN_OR_RETURN(auto writer, MakeStorageWriter(o.storage, o.out, so));
          if (o.storage == "mega" && (o.consolidate || o.mapping > 0)) {
            // MegaStorageWriter options the factory does not carry (mega_storage.h).
            std::optional<FqnToIndexMapping> mapping;
            if (o.mapping > 0) {
              mapping.emplace();
              int i = 0;
              for (const auto& e : spec.entries) (*mapping)[e.fqn] = 1 + (i++ % o.mapping);
            }
            MegaStorageWriterOptions mo;
            mo.thread_count = o.threads;
            mo.consolidate = o.consolidate;
            mo.direct_io = o.direct_io;
            writer = std::make_unique<MegaStorageWriter>(o.out, std::move(mapping), mo);
          }
          SaveOptions opts;
          opts.stats = &t->save;
          return TimePhase(g, t, [&] { return Save(sd, *writer, &g, opts); });
        });
    if (!timings.ok()) {
      return printer ? ReportError("demo: save", timings.status()) : kExitFailure;
    }
    if (printer) {
      double secs = MaxOf(*timings, &RankTiming::seconds);
      const uint64_t held = BytesHeld(*timings);
      double write = 0, commit = 0;
      for (const auto& t : *timings) {
        write = std::max(write, t.save.write_seconds);
        commit = std::max(commit, t.save.commit_seconds);
      }
      result["save"] = {
          {"ranks", world},     {"seconds", secs},        {"gbps", spec.total_bytes / secs / 1e9},
          {"bytes_held", held}, {"write_seconds", write}, {"commit_seconds", commit}};
      if (text) {
        std::printf(
            "  save   %d ranks: %8.3f s  %7.3f GB/s  (ranks hold %s incl. replicas, each "
            "replica written once; slowest write %.3f s, commit %.3f s)\n",
            world, secs, spec.total_bytes / secs / 1e9, Mb(held).c_str(), write, commit);
      }
    }
  }
  if (o.mode == "load" || o.mode == "both") {
    auto timings = RunRanks(
        o.backend, mpi.get(), load_world, [&](dist::ProcessGroup& g, RankTiming* t) -> Status {
          MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, load_world, g.rank(),
                                                                        load_variant, false));
          t->bytes = synthetic::RankStateBytes(sd);
          MEGA_ASSIGN_OR_RETURN(auto reader, MakeStorageReader(o.storage, o.out, so));
          LoadOptions opts;
          opts.stats = &t->load;
          MEGA_RETURN_IF_ERROR(TimePhase(g, t, [&] { return Load(sd, *reader, &g, opts); }));
          const double v0 = NowSeconds();
          Status v = synthetic::VerifyRankState(spec, sd);
          t->verify_seconds = NowSeconds() - v0;
          if (!v.ok())
            return Status(v.code(), "loaded state differs from the seed's: " + v.message());
          return Status::OK();
        });
    if (!timings.ok()) {
      return printer ? ReportError("demo: load", timings.status()) : kExitFailure;
    }
    if (printer) {
      double secs = MaxOf(*timings, &RankTiming::seconds);
      const uint64_t held = BytesHeld(*timings);
      const double verify = MaxOf(*timings, &RankTiming::verify_seconds);
      result["load"] = {{"ranks", load_world},
                        {"seconds", secs},
                        {"gbps", spec.total_bytes / secs / 1e9},
                        {"bytes_read", held},
                        {"verify_seconds", verify},
                        {"identical", true}};
      if (text) {
        std::printf(
            "  load   %d ranks: %8.3f s  %7.3f GB/s  (resharded: every tensor in another layout; "
            "ranks read %s incl. replicas, %.3f GB/s)\n",
            load_world, secs, spec.total_bytes / secs / 1e9, Mb(held).c_str(), held / secs / 1e9);
        std::printf("  verify %d ranks: %8.3f s  every byte identical to the seed's state\n",
                    load_world, verify);
      }
    }
  }
  if (text) std::printf("OK\n");
  if (printer && JsonOutput()) PrintJson(result);
  return kExitOk;
}

}  // namespace

void RegisterDcpCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  {
    auto o = std::make_shared<DemoOptions>();
    auto size = std::make_shared<std::string>("256MiB");
    auto* cmd = app.add_subcommand(
        "demo",
        "Save a deterministic synthetic model state from N ranks and load it back resharded.\n"
        "The state (derived from --seed) mixes whole tensors replicated on every rank,\n"
        "tensors sharded by rows, columns, uneven rows and 2-D blocks, rows replicated on\n"
        "pairs of ranks, bytes values, and nested names (model.layers.0.attn.weight ...).\n"
        "The load uses --load-world-size ranks and a different sharding of every tensor, then\n"
        "compares every byte with the seed's state. Prints the time and GB/s of each phase.\n"
        "Exit 0 only when the loaded state is identical.\n\n"
        "Examples:\n"
        "  megackpt demo --out /tmp/ckpt --world-size 2\n"
        "  megackpt demo --out /tmp/ckpt --world-size 4 --load-world-size 3 --size 64MB\n"
        "  mpirun -np 4 megackpt demo --backend mpi --out /tmp/ckpt\n"
        "  megackpt demo --out /tmp/ckpt --mode load --load-world-size 1   (an existing save)\n"
        "  MEGA_ENDPOINT=http://127.0.0.1:8080 MEGA_TOKEN=... megackpt demo --out "
        "mega://org/model/ckpt");
    cmd->add_option("--out", o->out,
                    "Checkpoint folder, or a mega:// folder (mega://NS/REPO[@BRANCH]/PATH or\n"
                    "mega://buckets/NS/NAME/PATH; MEGA_ENDPOINT / MEGA_TOKEN pick the hub)")
        ->required();
    auto* storage =
        cmd->add_option("--storage", o->storage,
                        "Storage backend: fs (default for local folders) or mega (always\n"
                        "used for mega://: each save is one hub commit)")
            ->check(CLI::IsMember({"fs", "mega"}));
    auto* ws =
        cmd->add_option("--world-size", o->world_size,
                        "Ranks that save (threads; with mpi: must equal mpirun's -np). Default 2")
            ->check(CLI::Range(1, 1024));
    cmd->add_option("--backend", o->backend,
                    "threads (default: ranks are threads) or mpi (under mpirun)")
        ->check(CLI::IsMember({"threads", "mpi"}));
    cmd->add_option("--seed", o->seed, "Seed of the synthetic state (default 1)");
    cmd->add_option("--size", *size,
                    "Approximate state size, e.g. 256MiB (default), 64MB, 1000000");
    cmd->add_option("--load-world-size", o->load_world_size,
                    "Ranks that load (default: world size + 1, or - 1 at 4 and above)")
        ->check(CLI::Range(1, 1024));
    cmd->add_option("--mode", o->mode, "save, load or both (default)")
        ->check(CLI::IsMember({"save", "load", "both"}));
    cmd->add_option("--threads", o->threads, "I/O threads per rank (default 2)")
        ->check(CLI::Range(1, 64));
    cmd->add_flag("--consolidate", o->consolidate,
                  "With --storage mega: consolidate into whole tensors after saving (in place)");
    cmd->add_flag("--direct-io", o->direct_io,
                  "Saves write their data files around the page cache (O_DIRECT where the file\n"
                  "system takes it): faster durable saves where new pages are slow to come by (a\n"
                  "save loop on a VM); a load right after reads the device");
    auto steps = std::make_shared<StepsDemoOptions>();
    cmd->add_option(
           "--steps", steps->steps,
           "Run a simulated training loop of N steps through the checkpoint manager: --out\n"
           "is the run's root, each step saves step-<N> (docs/checkpoint-manager.md)")
        ->check(CLI::Range(1, 1000000));
    cmd->add_option("--change-fraction", steps->change_fraction,
                    "With --steps: fraction of the entries each step changes (default 0.1)")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--keep-last", steps->keep_last, "With --steps: steps to keep (default 3)")
        ->check(CLI::Range(1, 1000000));
    auto full_saves = std::make_shared<bool>(false);
    cmd->add_flag(
        "--full-saves", *full_saves,
        "With --steps: rewrite every entry at every step (default: incremental saves that\n"
        "reference the entries a step did not change)");
    AddJsonFlag(
        cmd,
        "Print one JSON object: {\"out\", \"storage\", \"backend\", \"seed\", \"bytes\", "
        "\"tensors\", \"bytes_values\", \"save\": {\"ranks\", \"seconds\", \"gbps\", ...}, "
        "\"load\": {..., \"identical\"}}; with --steps {\"out\", \"steps\", \"kept_steps\", ...}");
    cmd->add_option(
           "--mapping", o->mapping,
           "With --storage mega: spread the fqns over N index buckets (fqn_to_index_mapping)")
        ->check(CLI::Range(1, 100000));
    cmd->callback([o, size, ws, storage, steps, full_saves, exit_code] {
      if (steps->steps > 0) {  // the training loop (cmd_ckpt.cc)
        if (!ParseSizeFlag("demo", "--size", *size, &steps->size, exit_code)) return;
        steps->out = o->out;
        steps->storage = storage->count() > 0 ? o->storage : "";
        steps->backend = o->backend;
        steps->world_size = o->world_size;
        steps->load_world_size = o->load_world_size;
        steps->threads = o->threads;
        steps->direct_io = o->direct_io;
        steps->seed = o->seed;
        steps->incremental = !*full_saves;
        *exit_code = RunStepsDemo(*steps);
        return;
      }
      if (o->out.rfind("mega://", 0) == 0 && o->storage != "mega") {
        // The FileSystemWriter commits file by file; on a hub that would be
        // many commits. MegaStorageWriter makes each save one commit.
        ReportWarning("demo", o->out +
                                  " is a hub path; using --storage mega (one commit per save)" +
                                  (storage->count() > 0 ? " instead of the requested fs" : ""));
        o->storage = "mega";
      }
      if ((o->consolidate || o->mapping > 0) && o->storage != "mega") {
        *exit_code = ReportUsage("demo", "--consolidate and --mapping need --storage mega");
        return;
      }
      if (!ParseSizeFlag("demo", "--size", *size, &o->size, exit_code)) return;
      o->world_size_given = ws->count() > 0;
      *exit_code = RunDemo(*o);
    });
  }
  {
    auto o = std::make_shared<bench::DcpBenchOptions>();
    auto* cmd = AddStateBench(
        bench, "dcp",
        "Save and load a state of --size bytes (16 row-sharded F32 tensors) from --world-size\n"
        "ranks with the FileSystemWriter/Reader, next to the machine's limits measured the\n"
        "same way in the same run: durable save (fsync before the commit) vs plain write +\n"
        "fsync of the same bytes; --no-sync save vs page-cache write (and, as a reference,\n"
        "vs plain writers computing the same block CRCs before each pwrite); load into\n"
        "caller-allocated, pre-faulted, reused tensors vs a warm page-cache read into a reused\n"
        "buffer. Each limit is the best of 1, 2 and world-size x threads plain threads (a ratio\n"
        "above 1.05 is flagged 'ceiling too low'). Also the peak extra memory (RSS) during a\n"
        "synchronous save. Medians of --reps runs after a dropped warm-up; decimal GB/s.\n"
        "JSON keys: save_gbps, save_nosync_gbps, load_gbps, durable_write_gbps,\n"
        "pagecache_write_gbps, pagecache_read_gbps, checksummed_write_gbps (each + _min/_max),\n"
        "peak_extra_rss_bytes, ...\n"
        "With --backend mpi run it as: mpirun -np N megackpt bench dcp --backend mpi ...",
        o, &bench::RunDcpBench, exit_code);
    cmd->add_option("--backend", o->backend, "threads (default) or mpi")
        ->check(CLI::IsMember({"threads", "mpi"}));
    cmd->add_flag("--direct-io", o->direct_io,
                  "Durable saves write their data files with direct I/O "
                  "(FileSystemWriterOptions::direct_io)");
    AddStatePagesFlag(cmd, &o->pages);
    AddOverPreviousFlag(cmd, &o->over_previous);
  }
  {
    auto o = std::make_shared<bench::ReshardBenchOptions>();
    auto size = std::make_shared<std::string>("2GiB");
    auto* cmd = bench.add_subcommand(
        "reshard",
        "What verification costs on loads: a state of --size bytes (16 row-sharded F32\n"
        "tensors) saved once from --save-world ranks with fs and MEGA storage, loaded at\n"
        "--save-world ranks and resharded at --load-world ranks, each with verification on\n"
        "(the default) and off, into pre-faulted reused destinations from a warm page cache.\n"
        "Also the bytes each load read (rchar of /proc/self/io) over the state's bytes.\n"
        "Medians of --reps runs after a dropped warm-up; decimal GB/s. Every loaded byte is\n"
        "checked against the state.\n"
        "JSON keys: <fs|mega>_load_gbps, <fs|mega>_load_unverified_gbps,\n"
        "<fs|mega>_reshard_load_gbps, ..._verified_vs_unverified, ..._bytes_read_ratio (each\n"
        "GB/s key + _min/_max).");
    cmd->add_option("--size", *size, "State bytes, e.g. 2GiB (default), 256MB");
    cmd->add_option("--save-world", o->save_world, "Ranks that save (threads; default 2)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--load-world", o->load_world, "Ranks of the resharded load (default 3)")
        ->check(CLI::Range(1, 64));
    cmd->add_option("--storage", o->storage, "fs, mega or both (default)")
        ->check(CLI::IsMember({"fs", "mega", "both"}));
    AddStateBenchRunFlags(cmd, o.get());
    cmd->callback([o, size, exit_code] {
      if (!ParseSizeFlag("bench reshard", "--size", *size, &o->size, exit_code)) return;
      *exit_code = bench::RunReshardBench(*o);
    });
  }
}

}  // namespace megackpt::cli
