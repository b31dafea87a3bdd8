// Status -> Python exception: the only place the extension maps error codes.
// The classes live in megackpt/errors.py (megackpt.Error and one subclass per
// code); _BY_CODE maps StatusCodeName() to the class.
#include <string>

#include "common.h"

namespace megackpt::python {

void RegisterErrors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const std::string name(StatusCodeName(e.status.code()));
      nb::object cls;
      try {
        nb::dict by_code = nb::module_::import_("megackpt.errors").attr("_BY_CODE");
        nb::str key(name.c_str());
        cls = by_code.contains(key) ? nb::object(by_code[key]) : by_code["Unknown"];
      } catch (const nb::python_error&) {
        PyErr_SetString(PyExc_RuntimeError, (name + ": " + e.status.message()).c_str());
        return;
      }
      PyErr_SetString(cls.ptr(), e.status.message().c_str());
    }
  });
  // For tests of the mapping itself: raises the exception of `code` (a StatusCode
  // name) with `message`.
  m.def("_raise_status", [](const std::string& code, const std::string& message) {
    for (int c = 1; c <= static_cast<int>(StatusCode::kIOError); ++c) {
      if (StatusCodeName(static_cast<StatusCode>(c)) == code) {
        ThrowIfError(Status(static_cast<StatusCode>(c), message));
      }
    }
    ThrowIfError(InvalidArgumentError("unknown status code '" + code + "'"));
  });
}

}  // namespace megackpt::python
