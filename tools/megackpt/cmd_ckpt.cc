// Checkpoint-manager commands: `megackpt ckpt ls|latest|gc ROOT`, `megackpt diff
// A B`, and the simulated training loop of `megackpt demo --steps N` (hooked
// into the demo command of cmd_dcp.cc). docs/checkpoint-manager.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcp/synthetic.h"
#include "incremental_bench.h"
#include "megackpt/commands.h"
#include "megackpt/dcp/checkpoint_manager.h"
#include "megackpt/dcp/diff.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::cli {
namespace {

using namespace ::megackpt::dcp;  // NOLINT: this file is the checkpoint-manager command group
using nlohmann::json;

// The manager for a root as a tool sees it: nothing removed on open (ls and
// latest only look; gc removes explicitly).
Result<std::unique_ptr<CheckpointManager>> OpenForTool(const std::string& root) {
  CheckpointManagerOptions o;
  o.remove_incomplete = false;
  return CheckpointManager::Open(root, o);
}

std::string TimeString(double unix_seconds) {
  if (unix_seconds <= 0) return "-";
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

// ---- ckpt ls / latest / gc --------------------------------------------------------

int RunLs(const std::string& root, bool as_json, bool verify) {
  auto m = OpenForTool(root);
  if (!m.ok()) {
    return ReportError("ckpt ls", m.status());
  }
  auto steps = (*m)->Steps();
  if (!steps.ok()) {
    return ReportError("ckpt ls", steps.status());
  }
  auto latest = (*m)->Latest();
  json out = {{"root", root}, {"steps", json::array()}};
  out["latest"] = latest.ok() && latest->has_value() ? json(**latest) : json(nullptr);
  if (!as_json) {
    std::printf(
        "%s: %zu step folder(s)%s\n", root.c_str(), steps->size(),
        latest.ok() && latest->has_value() ? (", latest " + std::to_string(**latest)).c_str() : "");
    std::printf("  %-12s %-10s %-7s %8s %12s %12s %12s %12s  %-19s\n", "step", "state", "storage",
                "entries", "stored", "written", "referenced", "metric", "saved");
  }
  for (const StepInfo& s : *steps) {
    Status check;
    if (verify && s.complete) check = (*m)->VerifyStep(s.step, VerifyLevel::kFull);
    const std::string state =
        !s.complete ? "incomplete" : (verify && !check.ok() ? "damaged" : "complete");
    json j = {{"step", s.step},
              {"folder", s.folder},
              {"complete", s.complete},
              {"storage", s.storage},
              {"entries", s.tensors},
              {"stored_bytes", s.stored_bytes},
              {"bytes_written", s.bytes_written},
              {"bytes_referenced", s.bytes_referenced},
              {"base_step", s.base_step ? json(*s.base_step) : json(nullptr)},
              {"metric", s.metric ? json(*s.metric) : json(nullptr)},
              {"saved_unix_seconds", s.saved_unix_seconds}};
    if (!s.complete) j["problem"] = s.problem;
    if (verify) {
      j["valid"] = s.complete && check.ok();
      if (!check.ok()) j["problem"] = check.ToString();
    }
    out["steps"].push_back(j);
    if (!as_json) {
      char metric[32] = "-";
      if (s.metric) std::snprintf(metric, sizeof metric, "%.6g", *s.metric);
      std::printf("  %-12lld %-10s %-7s %8llu %12s %12s %12s %12s  %-19s\n",
                  static_cast<long long>(s.step), state.c_str(),
                  s.storage.empty() ? "-" : s.storage.c_str(),
                  static_cast<unsigned long long>(s.tensors), HumanBytes(s.stored_bytes).c_str(),
                  HumanBytes(s.bytes_written).c_str(), HumanBytes(s.bytes_referenced).c_str(),
                  metric, TimeString(s.saved_unix_seconds).c_str());
      if (!s.complete) std::printf("      %s\n", s.problem.c_str());
      if (verify && s.complete && !check.ok()) std::printf("      %s\n", check.ToString().c_str());
    }
  }
  if (as_json) std::printf("%s\n", out.dump(2).c_str());
  return kExitOk;
}

int RunLatest(const std::string& root, bool valid, bool as_json) {
  auto m = OpenForTool(root);
  if (!m.ok()) {
    return ReportError("ckpt latest", m.status());
  }
  if (!valid) {
    auto latest = (*m)->Latest();
    if (!latest.ok()) {
      return ReportError("ckpt latest", latest.status());
    }
    if (!latest->has_value()) {
      return ReportError("ckpt latest", NotFoundError("no complete step in " + root));
    }
    if (as_json) {
      PrintJson({{"root", root}, {"step", **latest}});
    } else {
      std::printf("%lld\n", static_cast<long long>(**latest));
    }
    return kExitOk;
  }
  auto v = (*m)->LatestValid(VerifyLevel::kFull);
  if (!v.ok()) {
    return ReportError("ckpt latest", v.status());
  }
  for (const SkippedStep& s : v->skipped) {
    std::fprintf(stderr, "skipped step %lld: %s\n", static_cast<long long>(s.step),
                 s.reason.ToString().c_str());
  }
  if (as_json) {
    nlohmann::ordered_json j = {
        {"root", root}, {"step", v->step}, {"skipped", nlohmann::ordered_json::array()}};
    for (const SkippedStep& s : v->skipped) {
      j["skipped"].push_back({{"step", s.step}, {"reason", s.reason.ToString()}});
    }
    PrintJson(j);
  } else {
    std::printf("%lld\n", static_cast<long long>(v->step));
  }
  return kExitOk;
}

int RunGc(const std::string& root, const RetentionPolicy& policy, bool as_json) {
  auto m = OpenForTool(root);
  if (!m.ok()) {
    return ReportError("ckpt gc", m.status());
  }
  auto removed = (*m)->GarbageCollect(policy);
  if (!removed.ok()) {
    return ReportError("ckpt gc", removed.status());
  }
  if (as_json) {
    std::printf("%s\n", json({{"root", root}, {"removed", *removed}}).dump().c_str());
  } else {
    std::printf("%s: removed %zu step folder(s)", root.c_str(), removed->size());
    for (int64_t s : *removed) std::printf(" %lld", static_cast<long long>(s));
    std::printf("\n");
  }
  return kExitOk;
}

// ---- diff -----------------------------------------------------------------------

int RunDiff(const std::string& a, const std::string& b, bool as_json) {
  auto d = DiffCheckpoints(a, b);
  if (!d.ok()) {
    return ReportError("diff", d.status());
  }
  json changed = json::array();
  for (const EntryDiff& e : d->changed) {
    json j = {{"name", e.fqn},
              {"what", e.what},
              {"kind", e.is_bytes ? "bytes" : "tensor"},
              {"changed_elements", e.changed_elements},
              {"changed_bytes", e.changed_bytes},
              {"nbytes_a", e.nbytes_a},
              {"nbytes_b", e.nbytes_b}};
    if (!e.is_bytes) {
      j["dtype_a"] = std::string(DTypeName(e.dtype_a));
      j["dtype_b"] = std::string(DTypeName(e.dtype_b));
      j["shape_a"] = e.shape_a;
      j["shape_b"] = e.shape_b;
    }
    if (e.max_abs_diff) {
      j["max_abs_diff"] = std::isnan(*e.max_abs_diff) ? json(nullptr) : json(*e.max_abs_diff);
      j["non_finite_changes"] = e.non_finite_changes;
    }
    changed.push_back(j);
  }
  if (as_json) {
    json out = {{"a", a},
                {"b", b},
                {"added", d->added},
                {"removed", d->removed},
                {"changed", changed},
                {"unchanged", d->unchanged},
                {"bytes_a", d->bytes_a},
                {"bytes_b", d->bytes_b},
                {"changed_bytes", d->changed_bytes}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "%s -> %s: %zu added, %zu removed, %zu changed, %llu unchanged; changed bytes %s of %s\n",
        a.c_str(), b.c_str(), d->added.size(), d->removed.size(), d->changed.size(),
        static_cast<unsigned long long>(d->unchanged), HumanBytes(d->changed_bytes).c_str(),
        HumanBytes(d->bytes_b).c_str());
    for (const std::string& f : d->added) std::printf("  + %s\n", f.c_str());
    for (const std::string& f : d->removed) std::printf("  - %s\n", f.c_str());
    for (const EntryDiff& e : d->changed) {
      std::printf("  ~ %s: %s", e.fqn.c_str(), e.what.c_str());
      if (e.what == "dtype") {
        std::printf(" %s -> %s", std::string(DTypeName(e.dtype_a)).c_str(),
                    std::string(DTypeName(e.dtype_b)).c_str());
      } else if (e.what == "shape") {
        std::printf(" %s -> %s", ShapeToString(e.shape_a).c_str(),
                    ShapeToString(e.shape_b).c_str());
      } else if (e.what == "values") {
        std::printf(", %llu element(s), %s", static_cast<unsigned long long>(e.changed_elements),
                    HumanBytes(e.changed_bytes).c_str());
        if (e.max_abs_diff) std::printf(", max abs diff %.6g", *e.max_abs_diff);
        if (e.non_finite_changes) {
          std::printf(", %llu involve NaN/Inf",
                      static_cast<unsigned long long>(e.non_finite_changes));
        }
      }
      std::printf("\n");
    }
  }
  return kExitOk;
}

}  // namespace

// ---- demo --steps ----------------------------------------------------------------

namespace {

// Which tensors step `step` changes: the round(F * n) tensors with the
// smallest hash of (seed, step, fqn). Step 1 writes everything anyway.
std::vector<size_t> ChangedAt(const synthetic::Spec& spec, int64_t step, double fraction) {
  std::vector<std::pair<uint64_t, size_t>> order;
  for (size_t i = 0; i < spec.entries.size(); ++i) {
    uint64_t h = 1469598103934665603ull ^ (spec.seed * 0x9E3779B97F4A7C15ull) ^
                 (static_cast<uint64_t>(step) * 0xBF58476D1CE4E5B9ull);
    for (unsigned char c : spec.entries[i].fqn) h = (h ^ c) * 1099511628211ull;
    order.emplace_back(h, i);
  }
  std::sort(order.begin(), order.end());
  const size_t n = static_cast<size_t>(std::llround(fraction * static_cast<double>(order.size())));
  std::vector<size_t> out;
  for (size_t k = 0; k < n && k < order.size(); ++k) out.push_back(order[k].second);
  return out;
}

using RankFn = std::function<Status(dist::ProcessGroup&)>;

Status RunOnRanks(const std::string& backend, dist::ProcessGroup* mpi, int world,
                  const RankFn& fn) {
  if (backend == "mpi") return mpi->AllReduceStatus(fn(*mpi));
  for (const Status& s : dist::RunThreadRanks(world, fn)) MEGA_RETURN_IF_ERROR(s);
  return Status::OK();
}

}  // namespace

int RunStepsDemo(const StepsDemoOptions& o) {
  std::unique_ptr<dist::ProcessGroup> mpi;
  int world = o.world_size;
  bool printer = true;
  if (o.backend == "mpi") {
    auto g = dist::NewMpiProcessGroup();
    if (!g.ok()) {
      return ReportError("demo --backend mpi", g.status());
    }
    mpi = std::move(*g);
    world = mpi->world_size();
    printer = mpi->rank() == 0;
  }
  int load_world = o.load_world_size > 0
                       ? o.load_world_size
                       : (o.backend == "mpi" ? world : (world < 4 ? world + 1 : world - 1));
  if (o.backend == "mpi") load_world = world;
  synthetic::Spec spec = synthetic::MakeSpec(o.seed, o.size);
  // --json: one object at the end instead of the text lines.
  const bool text = printer && !JsonOutput();
  nlohmann::ordered_json result = {{"out", o.out},
                                   {"steps", o.steps},
                                   {"bytes", spec.total_bytes},
                                   {"entries", spec.entries.size()},
                                   {"ranks", world},
                                   {"incremental", o.incremental},
                                   {"direct_io", o.direct_io},
                                   {"saves", nlohmann::ordered_json::array()}};
  if (text) {
    std::printf(
        "megackpt demo: %d training steps, %.0f%% of the %zu entries change per step, %s of state, "
        "%d rank(s), checkpoints in %s (keep last %d, %s saves)\n",
        o.steps, o.change_fraction * 100, spec.entries.size(), HumanBytes(spec.total_bytes).c_str(),
        world, o.out.c_str(), o.keep_last, o.incremental ? "incremental" : "full");
  }
  CheckpointManagerOptions mo;
  mo.storage = o.storage;
  mo.storage_options.thread_count = o.threads;
  mo.storage_options.direct_io = o.direct_io;
  mo.retention.keep_last = o.keep_last;
  mo.incremental.enabled = o.incremental;
  // One manager per rank for the whole run, as in a training job; every rank
  // derives the same changes from the seed.
  const synthetic::Spec initial = spec;
  Status run = RunOnRanks(o.backend, mpi.get(), world, [&](dist::ProcessGroup& g) -> Status {
    synthetic::Spec mine = initial;
    CheckpointManagerOptions rank_options = mo;
    rank_options.group = &g;
    MEGA_ASSIGN_OR_RETURN(auto m, CheckpointManager::Open(o.out, rank_options));
    for (int64_t step = 1; step <= o.steps; ++step) {
      size_t changed = 0;
      uint64_t changed_bytes = 0;
      for (size_t i : ChangedAt(mine, step, o.change_fraction)) {
        auto& e = mine.entries[i];
        e.generation = static_cast<uint64_t>(step);
        ++changed;
        changed_bytes += e.is_bytes ? e.bytes_len : LogicalNbytes(e.dtype, e.shape).value();
      }
      MEGA_ASSIGN_OR_RETURN(StateDict sd,
                            synthetic::BuildRankState(mine, world, g.rank(), 0, true));
      MEGA_RETURN_IF_ERROR(g.Barrier());
      const double t0 = NowSeconds();
      StepSaveOptions so;
      so.overwrite = true;                          // re-running the demo over the same root
      so.metric = 1.0 / static_cast<double>(step);  // a "loss" that improves
      MEGA_RETURN_IF_ERROR(m->Save(step, sd, so).WithContext("step " + std::to_string(step)));
      if (g.rank() == 0 && printer) {
        const double secs = NowSeconds() - t0;
        uint64_t written = 0, referenced = 0;
        auto steps = m->Steps();
        if (steps.ok()) {
          for (const StepInfo& i : *steps) {
            if (i.step == step) written = i.bytes_written, referenced = i.bytes_referenced;
          }
        }
        result["saves"].push_back({{"step", step},
                                   {"entries_changed", step == 1 ? mine.entries.size() : changed},
                                   {"seconds", secs},
                                   {"bytes_written", written},
                                   {"bytes_referenced", referenced}});
        if (text) {
          std::printf(
              "  step %3lld: %3zu entries changed (%s), saved in %.3f s: %s written, %s "
              "referenced\n",
              static_cast<long long>(step), step == 1 ? mine.entries.size() : changed,
              HumanBytes(step == 1 ? mine.total_bytes : changed_bytes).c_str(), secs,
              HumanBytes(written).c_str(), HumanBytes(referenced).c_str());
        }
        std::fflush(stdout);
      }
    }
    if (o.backend == "mpi" || g.rank() == 0) spec = mine;  // the last step's content, for the check
    return Status::OK();
  });
  if (!run.ok()) {
    if (printer) ReportError("demo", run);
    return kExitFailure;
  }
  // The last step, reloaded at another world size with every tensor in
  // another layout, must be the state of that step byte for byte.
  Status s = RunOnRanks(o.backend, mpi.get(), load_world, [&](dist::ProcessGroup& g) -> Status {
    MEGA_ASSIGN_OR_RETURN(StateDict sd,
                          synthetic::BuildRankState(spec, load_world, g.rank(), 1, false));
    CheckpointManagerOptions rank_options = mo;
    rank_options.group = &g;
    MEGA_ASSIGN_OR_RETURN(auto m, CheckpointManager::Open(o.out, rank_options));
    MEGA_ASSIGN_OR_RETURN(ValidStep v, m->Load(sd));
    if (v.step != o.steps) {
      return DataLossError("loaded step " + std::to_string(v.step) + ", expected " +
                           std::to_string(o.steps));
    }
    Status same = synthetic::VerifyRankState(spec, sd);
    if (!same.ok())
      return Status(same.code(), "loaded state differs from step " + std::to_string(o.steps) +
                                     ": " + same.message());
    return Status::OK();
  });
  if (!s.ok()) {
    if (printer) ReportError("demo: reload", s);
    return kExitFailure;
  }
  if (printer) {
    auto m = OpenForTool(o.out);
    std::vector<int64_t> kept;
    if (m.ok()) {
      auto steps = (*m)->Steps();
      if (steps.ok()) {
        for (const StepInfo& i : *steps) {
          if (i.complete) kept.push_back(i.step);
        }
      }
    }
    if (JsonOutput()) {
      result["load"] = {{"step", o.steps}, {"ranks", load_world}, {"identical", true}};
      result["kept_steps"] = kept;
      PrintJson(result);
    } else {
      std::printf(
          "  reload of step %d at %d rank(s), every tensor resharded: identical\n  kept steps:",
          o.steps, load_world);
      for (int64_t k : kept) std::printf(" %lld", static_cast<long long>(k));
      std::printf("\nOK\n");
    }
  }
  return kExitOk;
}

namespace {

// The ROOT argument every `ckpt` subcommand takes.
std::shared_ptr<std::string> AddRootArg(CLI::App* cmd) {
  return AddRequiredArg(cmd, "ROOT", "Root folder (local or mega://)");
}

}  // namespace

void RegisterCkptCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  {
    auto o = std::make_shared<bench::IncrementalBenchOptions>();
    auto* cmd = AddStateBench(
        bench, "incremental",
        "Incremental checkpoint saves through the CheckpointManager, durable: a plain full save,\n"
        "the full first save of an incremental run (hashes recorded) and the next step after\n"
        "--changed of the 64 tensors got new content, next to the write + fdatasync limit of the\n"
        "same bytes measured in the same run. Medians of --reps after a dropped warm-up.\n"
        "JSON keys: full_save_seconds, incremental_save_seconds, bytes_written, changed_bytes,\n"
        "durable_write_gbps, plain_full_save_seconds, incremental_vs_full, full_vs_plain,\n"
        "written_vs_changed, written_vs_state, ...",
        o, &bench::RunIncrementalBench, exit_code);
    cmd->add_option("--changed", o->changed, "Fraction of the tensors changed (default 0.1)")
        ->check(CLI::Range(0.0, 1.0));
  }
  CLI::App* ckpt = app.add_subcommand(
      "ckpt",
      "Checkpoints of a training run managed by the CheckpointManager: ROOT holds one\n"
      "step-<N> folder per saved step and a `latest` record (docs/checkpoint-manager.md).");
  ckpt->require_subcommand(1);
  {
    auto* cmd = ckpt->add_subcommand(
        "ls",
        "List the step folders of ROOT: step, complete or not (and why), storage, entries, stored\n"
        "bytes, metric, save time. --verify reads and checks every stored byte of every step.\n"
        "JSON: {\"root\", \"latest\", \"steps\": [{\"step\", \"folder\", \"complete\", "
        "\"storage\",\n"
        "\"entries\", \"stored_bytes\", \"metric\", \"saved_unix_seconds\", \"problem\"?, "
        "\"valid\"?}]}");
    auto root = AddRootArg(cmd);
    auto as_json = AddSharedFlag(cmd, "--json", "Print one JSON object");
    auto verify = AddSharedFlag(cmd, "--verify", "Check every stored byte of every complete step");
    cmd->callback([=] { *exit_code = RunLs(*root, *as_json, *verify); });
  }
  {
    auto* cmd = ckpt->add_subcommand(
        "latest",
        "Print the newest complete step of ROOT (exit 1 when there is none). --valid: the newest\n"
        "step whose every byte checks out; the steps skipped on the way are named on stderr with\n"
        "the reason.");
    auto root = AddRootArg(cmd);
    auto valid = AddSharedFlag(cmd, "--valid", "Verify, and fall back past damaged steps");
    auto as_json = AddSharedFlag(
        cmd, "--json",
        "Print {\"root\", \"step\"} (with --valid also \"skipped\": [{\"step\", \"reason\"}])");
    cmd->callback([=] { *exit_code = RunLatest(*root, *valid, *as_json); });
  }
  {
    auto policy = std::make_shared<RetentionPolicy>();
    auto* cmd = ckpt->add_subcommand(
        "gc",
        "Remove step folders left incomplete by a crash, and the complete steps that the given\n"
        "retention rules do not keep (a step is kept when any rule keeps it; the newest complete\n"
        "step always). Without rules only incomplete folders are removed.");
    auto root = AddRootArg(cmd);
    cmd->add_option("--keep-last", policy->keep_last, "Keep the newest K complete steps")
        ->check(CLI::Range(0, 1 << 30));
    cmd->add_option("--keep-every", policy->keep_every, "Keep steps that are multiples of M")
        ->check(CLI::Range(int64_t{0}, INT64_MAX));
    cmd->add_option("--keep-best", policy->keep_best, "Keep the N steps with the best metric")
        ->check(CLI::Range(0, 1 << 30));
    cmd->add_flag("--best-max", policy->best_is_max, "A higher metric is better (default: lower)");
    auto as_json = AddSharedFlag(cmd, "--json", "Print {\"root\", \"removed\": [steps]}");
    cmd->callback([=] {
      if (policy->keeps_everything()) {
        // Only incomplete folders: keep every complete step.
        RetentionPolicy none;
        *exit_code = RunGc(*root, none, *as_json);
      } else {
        *exit_code = RunGc(*root, *policy, *as_json);
      }
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "diff",
        "Compare two checkpoint folders (e.g. two steps of a run): entries added, removed and\n"
        "changed (values, dtype, shape, kind), the bytes that differ, and for float dtypes the\n"
        "max absolute difference. Every byte is read through the storage's reader (verified).\n"
        "JSON: {\"added\", \"removed\", \"changed\": [{\"name\", \"what\", \"changed_elements\",\n"
        "\"changed_bytes\", \"max_abs_diff\"?, ...}], \"unchanged\", \"changed_bytes\", ...}");
    auto a = AddRequiredArg(cmd, "A", "First checkpoint folder");
    auto b = AddRequiredArg(cmd, "B", "Second checkpoint folder");
    auto as_json = AddSharedFlag(cmd, "--json", "Print one JSON object");
    cmd->callback([=] { *exit_code = RunDiff(*a, *b, *as_json); });
  }
}

}  // namespace megackpt::cli
