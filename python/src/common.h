// Shared pieces of the megackpt._core extension: Status -> exception, arrays <->
// Tensors, Python trees <-> StateDicts, process groups. Each concern lives in its
// own .cc file; module.cc registers them all.
//
// GIL rules of the extension: Python objects are touched only with the GIL held;
// every save, load, read, write, verification and wait runs with the GIL released.
// Tensors made from Python arrays keep their array alive through an nb::ndarray
// owner, which may be dropped on any thread (nanobind takes the GIL for it).
#ifndef MEGACKPT_PYTHON_COMMON_H_
#define MEGACKPT_PYTHON_COMMON_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/state_dict.h"
#include "megackpt/dcp/storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/mega.h"

namespace megackpt::python {

namespace nb = nanobind;

// ---- errors.cc: the one place where a Status becomes a Python exception -----

// Thrown by ThrowIfError; translated into megackpt.errors.<Code>Error.
struct StatusError {
  Status status;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T Unwrap(Result<T> result) {
  if (!result.ok()) throw StatusError{result.status()};
  return std::move(result).value();
}

void RegisterErrors(nb::module_& m);

// Runs fn() without the GIL (blocking library work that touches no Python
// object), then raises its error when fn returns a Status, or returns the
// value of the Result<T> it returns (raising its error).
template <typename F>
auto WithoutGil(F&& fn) {
  using R = std::invoke_result_t<F&>;
  std::optional<R> r;
  {
    nb::gil_scoped_release release;
    r.emplace(fn());
  }
  if constexpr (std::is_same_v<R, Status>) {
    ThrowIfError(*r);
  } else {
    return Unwrap(std::move(*r));
  }
}

// ---- the futures of async saves (AsyncSaveHandle, StepSaveHandle) ----------

// True when `f` is ready now.
inline bool IsReady(const std::shared_future<Status>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// Waits for `f` up to `timeout` seconds (< 0: forever) without the GIL. False
// on timeout; raises the save's error when it failed; true when it succeeded.
inline bool WaitAndRaise(const std::shared_future<Status>& f, double timeout) {
  {
    nb::gil_scoped_release release;
    if (timeout < 0) {
      f.wait();
    } else if (f.wait_for(std::chrono::duration<double>(timeout)) != std::future_status::ready) {
      return false;
    }
  }
  ThrowIfError(f.get());
  return true;
}

// ---- arrays.cc: Python arrays <-> Tensors -----------------------------------

// Wraps a CPU array (numpy array, torch/TensorPlay tensor: anything with the
// buffer protocol or __dlpack__) as a Tensor without copying; the Tensor keeps
// the array alive. `writable`: the array must accept writes (loads).
// InvalidArgument naming `what` for anything else (wrong device, read-only when
// writable, unsupported dtype). REQUIRES: the GIL.
Result<Tensor> TensorFromArray(nb::handle array, bool writable, std::string_view what);

// A numpy array viewing `tensor` (which it keeps alive). Dtypes numpy lacks come
// back as raw unsigned integers of the same width (BF16 -> uint16, F8_* -> uint8,
// F4 -> 1-d uint8 of the packed bytes). REQUIRES: the GIL.
nb::object NumpyFromTensor(const Tensor& tensor);

// True when NumpyFromTensor returns `dtype` as raw integers.
bool NumpyLacksDType(DType dtype);

void RegisterArrays(nb::module_& m);

// ---- state.cc: Python trees <-> StateDicts ---------------------------------

// Converts a tree prepared by megackpt/_state.py: dict (str keys) / list nodes;
// leaves are bytes, ShardedTensor-like objects (attributes global_shape, dtype,
// shards = [(offsets, array), ...]) and arrays. InvalidArgument naming the fqn
// for anything else. REQUIRES: the GIL.
Result<dcp::StateDict> StateDictFromPython(nb::handle tree, bool writable);

// The Python tree of `state` (dicts, lists, numpy arrays, bytes); `raw_dtypes`
// receives fqn -> dtype name of every tensor NumpyFromTensor returned raw.
nb::object PythonFromStateDict(const dcp::StateDict& state, nb::dict raw_dtypes);

// fqn -> bytes of every bytes leaf of `state` (after an in-place load).
nb::dict BytesLeaves(dcp::StateDict& state);

// ---- groups.cc: process groups -------------------------------------------

// The ProcessGroup behind a Python `megackpt.ProcessGroup` (or None: null, a
// single process). REQUIRES: the GIL.
std::shared_ptr<dist::ProcessGroup> GroupFromPython(nb::handle group);

void RegisterGroups(nb::module_& m);

// ---- storage.cc: writers and readers from Python options -------------------

// `kind` "mega" | "fs"; `options` a dict of the keyword arguments documented on
// megackpt.save (thread_count, sync, overwrite, fqn_to_index_mapping, checksum,
// consolidate). InvalidArgument for an unknown kind or option value.
// REQUIRES: the GIL.
Result<std::unique_ptr<dcp::StorageWriter>> MakeWriter(const std::string& kind,
                                                       const std::string& path, nb::dict options);
// `kind` "mega" | "fs" | "auto" (mega when the path holds a MEGA or safetensors
// index or is a model file, else fs); options: thread_count, verify.
Result<std::unique_ptr<dcp::StorageReader>> MakeReader(const std::string& kind,
                                                       const std::string& path, nb::dict options);

// "none" | "crc32" | "sha256" (InvalidArgument otherwise).
Result<format::MegaChecksumType> ChecksumFromName(const std::string& name);

// ---- the API surfaces -------------------------------------------------------
void RegisterCheckpoint(nb::module_& m);  // checkpoint.cc: save, load, async_save
void RegisterTools(nb::module_& m);       // tools.cc: inspect, verify, convert, consolidate
void RegisterDcpStorage(nb::module_& m);  // dcp_storage.cc: writers/readers for torch/TensorPlay
void RegisterManager(nb::module_& m);     // manager.cc: CheckpointManager

}  // namespace megackpt::python

#endif  // MEGACKPT_PYTHON_COMMON_H_
