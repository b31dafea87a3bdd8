// megackpt._core: the C++ engine for the megackpt Python package. The public,
// documented API is the Python package (megackpt/__init__.py); this module is its
// implementation detail.
#include "common.h"
#include "megackpt/config.h"  // MEGACKPT_VERSION

NB_MODULE(_core, m) {
  namespace py = megackpt::python;
  m.attr("__version__") = MEGACKPT_VERSION;
  py::RegisterErrors(m);
  py::RegisterArrays(m);
  py::RegisterGroups(m);
  py::RegisterCheckpoint(m);
  py::RegisterTools(m);
  py::RegisterDcpStorage(m);
  py::RegisterManager(m);
}
