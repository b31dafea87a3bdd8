// Process groups for Python: single process, and MPI under mpirun (the C++ MPI
// backend; no mpi4py). The MPI group is created once per process (MPI can be
// initialised only once) and lives until exit.
#include <mutex>
#include <string>

#include "common.h"

namespace megackpt::python {
namespace {

struct PyProcessGroup {
  std::shared_ptr<dist::ProcessGroup> group;
};

std::shared_ptr<dist::ProcessGroup> MpiGroup(double timeout_seconds) {
  static std::mutex mu;
  static auto* group = new std::shared_ptr<dist::ProcessGroup>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  if (!*group) {
    dist::ProcessGroupOptions options;
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
    auto made = dist::NewMpiProcessGroup(options);
    if (!made.ok()) throw StatusError{made.status()};
    *group = std::shared_ptr<dist::ProcessGroup>(std::move(*made));
  }
  return *group;
}

}  // namespace

std::shared_ptr<dist::ProcessGroup> GroupFromPython(nb::handle group) {
  if (group.is_none()) return nullptr;
  if (!nb::isinstance<PyProcessGroup>(group)) {
    ThrowIfError(InvalidArgumentError("group must be a megackpt.ProcessGroup or None"));
  }
  return nb::cast<PyProcessGroup&>(group).group;
}

void RegisterGroups(nb::module_& m) {
  nb::class_<PyProcessGroup>(m, "ProcessGroup",
                             "The ranks a save or load runs on (megackpt.process_group()).")
      .def_prop_ro("rank", [](const PyProcessGroup& g) { return g.group->rank(); })
      .def_prop_ro("world_size", [](const PyProcessGroup& g) { return g.group->world_size(); })
      .def_prop_ro("backend",
                   [](const PyProcessGroup& g) { return std::string(g.group->backend()); })
      .def(
          "barrier",
          [](PyProcessGroup& g) {
            Status s;
            {
              nb::gil_scoped_release release;
              s = g.group->Barrier();
            }
            ThrowIfError(s);
          },
          "Waits until every rank has called barrier().")
      .def("__repr__", [](const PyProcessGroup& g) {
        return "<megackpt.ProcessGroup " + std::string(g.group->backend()) + " rank " +
               std::to_string(g.group->rank()) + " of " + std::to_string(g.group->world_size()) +
               ">";
      });
  m.def("_single_group", [] { return PyProcessGroup{dist::NewSingleProcessGroup()}; });
  m.def(
      "_mpi_group",
      [](double timeout_seconds) { return PyProcessGroup{MpiGroup(timeout_seconds)}; },
      nb::arg("timeout_seconds") = 300.0);
  m.def("_launched_by_mpi", [] { return dist::LaunchedByMpi(); });
}

}  // namespace megackpt::python
