// megackpt.CheckpointManager over dcp::CheckpointManager (megackpt/_manager.py
// wraps it with the pickling of objects and the docstrings).
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "megackpt/dcp/checkpoint_manager.h"
#include "planners.h"

namespace megackpt::python {
namespace {

nb::list SkippedToPython(const std::vector<dcp::SkippedStep>& skipped) {
  nb::list out;
  for (const dcp::SkippedStep& s : skipped) out.append(nb::make_tuple(s.step, s.reason.ToString()));
  return out;
}

// The handle of a step's async save; keeps its planner alive.
class PyStepSave {
 public:
  PyStepSave(std::unique_ptr<PySavePlanner> planner) : planner_(std::move(planner)) {}
  ~PyStepSave() {
    nb::gil_scoped_release release;
    if (handle_.done.valid()) handle_.done.wait();
  }
  PySavePlanner* planner() { return planner_.get(); }
  void set_handle(dcp::StepSaveHandle h) { handle_ = std::move(h); }
  int64_t step() const { return handle_.step; }
  bool staged() const { return IsReady(handle_.staged); }
  bool done() const { return IsReady(handle_.done); }
  bool Wait(bool for_done, double timeout) {
    return WaitAndRaise(for_done ? handle_.done : handle_.staged, timeout);
  }

 private:
  std::unique_ptr<PySavePlanner> planner_;
  dcp::StepSaveHandle handle_;
};

class PyManager {
 public:
  PyManager(const std::string& root, const std::string& storage, nb::handle group, int keep_last,
            int64_t keep_every, int keep_best, bool best_is_max, int thread_count, bool sync,
            bool direct_io, bool fail_if_in_flight, bool remove_incomplete,
            uint64_t staging_bytes) {
    group_ = GroupFromPython(group);
    dcp::CheckpointManagerOptions o;
    o.storage = storage;
    o.group = group_.get();
    o.retention.keep_last = keep_last;
    o.retention.keep_every = keep_every;
    o.retention.keep_best = keep_best;
    o.retention.best_is_max = best_is_max;
    o.storage_options.thread_count = thread_count;
    o.storage_options.sync = sync;
    o.storage_options.direct_io = direct_io;
    o.in_flight = fail_if_in_flight ? dcp::InFlightPolicy::kFail : dcp::InFlightPolicy::kWait;
    o.remove_incomplete = remove_incomplete;
    if (staging_bytes > 0) o.pool = dcp::StagingPool::Create(staging_bytes);
    manager_ = WithoutGil([&] { return dcp::CheckpointManager::Open(root, std::move(o)); });
  }
  ~PyManager() {
    nb::gil_scoped_release release;
    manager_.reset();  // waits for a save in flight
  }

  std::string root() const { return manager_->root(); }
  std::string storage() const { return manager_->storage(); }
  std::string step_path(int64_t step) const { return manager_->StepPath(step); }

  void Save(int64_t step, nb::handle tree, const std::string& extra, std::optional<double> metric,
            bool overwrite) {
    dcp::StateDict state = Unwrap(StateDictFromPython(tree, /*writable=*/false));
    PySavePlanner planner(extra);
    dcp::StepSaveOptions so;
    so.metric = metric;
    so.overwrite = overwrite;
    so.planner = &planner;
    WithoutGil([&] { return manager_->Save(step, state, so); });
  }

  PyStepSave* AsyncSave(int64_t step, nb::handle tree, const std::string& extra,
                        std::optional<double> metric, bool overwrite) {
    dcp::StateDict state = Unwrap(StateDictFromPython(tree, /*writable=*/false));
    auto handle = std::make_unique<PyStepSave>(std::make_unique<PySavePlanner>(extra));
    dcp::StepSaveOptions so;
    so.metric = metric;
    so.overwrite = overwrite;
    so.planner = handle->planner();
    handle->set_handle(WithoutGil([&] { return manager_->AsyncSave(step, std::move(state), so); }));
    return handle.release();
  }

  // Returns (tree or {fqn: bytes}, planner extra, {fqn: raw dtype}, step, skipped).
  nb::tuple Load(nb::handle tree, std::optional<int64_t> step, bool allow_partial) {
    const bool build = tree.is_none();
    dcp::StateDict state;
    if (!build) state = Unwrap(StateDictFromPython(tree, /*writable=*/true));
    PyLoadPlanner planner(build, allow_partial);
    dcp::StepLoadOptions lo;
    lo.planner = &planner;
    dcp::ValidStep loaded = WithoutGil([&] { return manager_->Load(state, step, lo); });
    nb::dict raw;
    nb::object out = build ? PythonFromStateDict(state, raw) : nb::object(BytesLeaves(state));
    return nb::make_tuple(out, nb::str(planner.extra().c_str()), raw, loaded.step,
                          SkippedToPython(loaded.skipped));
  }

  nb::list Steps() const {
    nb::list out;
    for (const dcp::StepInfo& s : WithoutGil([&] { return manager_->Steps(); })) {
      nb::dict d;
      d["step"] = s.step;
      d["folder"] = s.folder;
      d["path"] = s.path;
      d["complete"] = s.complete;
      d["problem"] = s.problem;
      d["storage"] = s.storage;
      d["metric"] = s.metric ? nb::object(nb::float_(*s.metric)) : nb::none();
      d["saved_unix_seconds"] = s.saved_unix_seconds;
      d["entries"] = s.tensors;
      d["stored_bytes"] = s.stored_bytes;
      out.append(d);
    }
    return out;
  }

  std::optional<int64_t> Latest() const {
    return WithoutGil([&] { return manager_->Latest(); });
  }

  nb::tuple LatestValid(bool full) const {
    dcp::ValidStep v = WithoutGil([&] {
      return manager_->LatestValid(full ? dcp::VerifyLevel::kFull : dcp::VerifyLevel::kStructure);
    });
    return nb::make_tuple(v.step, SkippedToPython(v.skipped));
  }

  void VerifyStep(int64_t step, bool full) const {
    WithoutGil([&] {
      return manager_->VerifyStep(step,
                                  full ? dcp::VerifyLevel::kFull : dcp::VerifyLevel::kStructure);
    });
  }

  std::vector<int64_t> GarbageCollect(std::optional<int> keep_last,
                                      std::optional<int64_t> keep_every,
                                      std::optional<int> keep_best,
                                      std::optional<bool> best_is_max) {
    std::optional<dcp::RetentionPolicy> policy;
    if (keep_last || keep_every || keep_best || best_is_max) {
      policy.emplace();
      policy->keep_last = keep_last.value_or(0);
      policy->keep_every = keep_every.value_or(0);
      policy->keep_best = keep_best.value_or(0);
      policy->best_is_max = best_is_max.value_or(false);
    }
    return WithoutGil([&] { return manager_->GarbageCollect(policy); });
  }

  void RemoveStep(int64_t step) {
    WithoutGil([&] { return manager_->RemoveStep(step); });
  }

  void Wait() {
    WithoutGil([&] { return manager_->WaitForPendingSave(); });
  }

  bool save_in_flight() const { return manager_->save_in_flight(); }

 private:
  std::shared_ptr<dist::ProcessGroup> group_;  // outlives manager_ (declared first)
  std::unique_ptr<dcp::CheckpointManager> manager_;
};

}  // namespace

void RegisterManager(nb::module_& m) {
  nb::class_<PyStepSave>(m, "_StepSave")
      .def_prop_ro("step", &PyStepSave::step)
      .def("staged", &PyStepSave::staged)
      .def("done", &PyStepSave::done)
      .def("wait", &PyStepSave::Wait, nb::arg("for_done"), nb::arg("timeout"));
  nb::class_<PyManager>(m, "_CheckpointManager")
      .def(nb::init<const std::string&, const std::string&, nb::handle, int, int64_t, int, bool,
                    int, bool, bool, bool, bool, uint64_t>(),
           nb::arg("root"), nb::arg("storage"), nb::arg("group").none(), nb::arg("keep_last"),
           nb::arg("keep_every"), nb::arg("keep_best"), nb::arg("best_is_max"),
           nb::arg("thread_count"), nb::arg("sync"), nb::arg("direct_io"),
           nb::arg("fail_if_in_flight"), nb::arg("remove_incomplete"), nb::arg("staging_bytes"))
      .def_prop_ro("root", &PyManager::root)
      .def_prop_ro("storage", &PyManager::storage)
      .def("step_path", &PyManager::step_path)
      .def("save", &PyManager::Save, nb::arg("step"), nb::arg("tree"), nb::arg("extra"),
           nb::arg("metric").none(), nb::arg("overwrite"))
      .def("async_save", &PyManager::AsyncSave, nb::arg("step"), nb::arg("tree"), nb::arg("extra"),
           nb::arg("metric").none(), nb::arg("overwrite"), nb::rv_policy::take_ownership)
      .def("load", &PyManager::Load, nb::arg("tree").none(), nb::arg("step").none(),
           nb::arg("allow_partial"))
      .def("steps", &PyManager::Steps)
      .def("latest", &PyManager::Latest)
      .def("latest_valid", &PyManager::LatestValid, nb::arg("full"))
      .def("verify_step", &PyManager::VerifyStep, nb::arg("step"), nb::arg("full"))
      .def("gc", &PyManager::GarbageCollect, nb::arg("keep_last").none(),
           nb::arg("keep_every").none(), nb::arg("keep_best").none(), nb::arg("best_is_max").none())
      .def("remove_step", &PyManager::RemoveStep, nb::arg("step"))
      .def("wait", &PyManager::Wait)
      .def("save_in_flight", &PyManager::save_in_flight);
}

}  // namespace megackpt::python
