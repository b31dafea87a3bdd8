// save / load / async_save over Python trees (megackpt/_api.py wraps these with
// the pickling of objects and the docstrings).
//
// Python-side information that the C++ planners do not know (which bytes entries
// are pickled objects) travels as a JSON text in Metadata::planner_data.extra:
// each rank's save planner puts its own in the local plan, and the coordinator
// stores the union ({"megackpt.python": 1, "objects": [fqn, ...]}).
#include "megackpt/dcp/checkpoint.h"

#include <chrono>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common.h"
#include "megackpt/dcp/planner.h"
#include "planners.h"

namespace megackpt::python {
namespace {

// The Python handle of an async save. Keeps the planner, writer and group the
// background save uses; destroying it waits for the save (without the GIL).
class PyAsyncSave {
 public:
  PyAsyncSave(std::unique_ptr<PySavePlanner> planner, std::shared_ptr<dcp::StorageWriter> writer,
              std::shared_ptr<dist::ProcessGroup> group)
      : planner_(std::move(planner)), writer_(std::move(writer)), group_(std::move(group)) {}
  ~PyAsyncSave() {
    nb::gil_scoped_release release;
    if (handle_.done.valid()) handle_.done.wait();
    handle_ = {};
  }

  dcp::SavePlanner* planner() { return planner_.get(); }
  const std::shared_ptr<dcp::StorageWriter>& writer() { return writer_; }
  dist::ProcessGroup* group() { return group_.get(); }
  void set_handle(dcp::AsyncSaveHandle h) { handle_ = std::move(h); }

  bool staged() const { return IsReady(handle_.staged); }
  bool done() const { return IsReady(handle_.done); }
  // Raises the save's error, if any, once `which` is ready; False on timeout.
  bool Wait(bool for_done, double timeout) {
    return WaitAndRaise(for_done ? handle_.done : handle_.staged, timeout);
  }

 private:
  std::unique_ptr<PySavePlanner> planner_;
  std::shared_ptr<dcp::StorageWriter> writer_;
  std::shared_ptr<dist::ProcessGroup> group_;
  dcp::AsyncSaveHandle handle_;
};

void Save(nb::handle tree, const std::string& path, const std::string& storage, nb::handle group,
          const std::string& extra, bool use_collectives, nb::dict options) {
  dcp::StateDict state = Unwrap(StateDictFromPython(tree, /*writable=*/false));
  auto writer = Unwrap(MakeWriter(storage, path, options));
  auto pg = GroupFromPython(group);
  PySavePlanner planner(extra);
  dcp::SaveOptions so;
  so.planner = &planner;
  so.use_collectives = use_collectives;
  WithoutGil([&] { return dcp::Save(state, *writer, pg.get(), so); });
}

// Returns (tree or {fqn: bytes}, planner extra, {fqn: raw dtype name}).
nb::tuple Load(const std::string& path, nb::handle tree, const std::string& storage,
               nb::handle group, bool allow_partial, bool use_collectives, nb::dict options) {
  const bool build = tree.is_none();
  dcp::StateDict state;
  if (!build) state = Unwrap(StateDictFromPython(tree, /*writable=*/true));
  auto reader = Unwrap(MakeReader(storage, path, options));
  auto pg = GroupFromPython(group);
  PyLoadPlanner planner(build, allow_partial);
  dcp::LoadOptions lo;
  lo.planner = &planner;
  lo.use_collectives = use_collectives;
  WithoutGil([&] { return dcp::Load(state, *reader, pg.get(), lo); });
  nb::dict raw;
  nb::object out = build ? PythonFromStateDict(state, raw) : nb::object(BytesLeaves(state));
  return nb::make_tuple(out, nb::str(planner.extra().c_str()), raw);
}

PyAsyncSave* AsyncSave(nb::handle tree, const std::string& path, const std::string& storage,
                       nb::handle group, const std::string& extra, bool use_collectives,
                       uint64_t staging_bytes, nb::dict options) {
  dcp::StateDict state = Unwrap(StateDictFromPython(tree, /*writable=*/false));
  std::shared_ptr<dcp::StorageWriter> writer = Unwrap(MakeWriter(storage, path, options));
  auto handle = std::make_unique<PyAsyncSave>(std::make_unique<PySavePlanner>(extra), writer,
                                              GroupFromPython(group));
  dcp::AsyncSaveOptions ao;
  ao.save.planner = handle->planner();
  ao.save.use_collectives = use_collectives;
  if (staging_bytes > 0) ao.default_pool_capacity_bytes = staging_bytes;
  {
    nb::gil_scoped_release release;
    handle->set_handle(dcp::AsyncSave(std::move(state), handle->writer(), handle->group(), ao));
  }
  return handle.release();
}

}  // namespace

void RegisterCheckpoint(nb::module_& m) {
  m.def("_save", &Save, nb::arg("tree"), nb::arg("path"), nb::arg("storage"),
        nb::arg("group").none(), nb::arg("extra"), nb::arg("use_collectives"), nb::arg("options"));
  m.def("_load", &Load, nb::arg("path"), nb::arg("tree").none(), nb::arg("storage"),
        nb::arg("group").none(), nb::arg("allow_partial"), nb::arg("use_collectives"),
        nb::arg("options"));
  m.def("_async_save", &AsyncSave, nb::arg("tree"), nb::arg("path"), nb::arg("storage"),
        nb::arg("group").none(), nb::arg("extra"), nb::arg("use_collectives"),
        nb::arg("staging_bytes"), nb::arg("options"), nb::rv_policy::take_ownership);
  nb::class_<PyAsyncSave>(m, "_AsyncSave")
      .def("staged", &PyAsyncSave::staged)
      .def("done", &PyAsyncSave::done)
      .def("wait", &PyAsyncSave::Wait, nb::arg("for_done"), nb::arg("timeout"));
}

}  // namespace megackpt::python
