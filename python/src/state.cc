// Python trees <-> dcp::StateDict. The Python side (megackpt/_state.py) has
// already pickled every object that is not an array, bytes or ShardedTensor, so
// this file only maps containers and leaves. Dotted fqns follow
// FlattenStateDict's rule ("a.b.0"), so messages name what the checkpoint calls
// the entry.
#include <string>
#include <vector>

#include "common.h"
#include "megackpt/core/dtype.h"

namespace megackpt::python {
namespace {

std::string Child(const std::string& fqn, const std::string& key) {
  return fqn.empty() ? key : fqn + "." + key;
}

Result<Shape> ShapeFromPython(nb::handle seq, const std::string& what) {
  Shape out;
  try {
    for (nb::handle v : seq) out.push_back(nb::cast<int64_t>(v));
  } catch (const std::exception&) {
    return InvalidArgumentError(what + ": expected a sequence of integers");
  }
  return out;
}

Result<dcp::StateValue> ShardedFromPython(nb::handle obj, const std::string& fqn, bool writable) {
  dcp::ShardedTensor st;
  std::string dtype_name = nb::cast<std::string>(nb::str(obj.attr("dtype")));
  auto dtype = DTypeFromName(dtype_name);
  if (!dtype.ok()) return dtype.status().WithContext("tensor '" + fqn + "'");
  st.dtype = *dtype;
  MEGA_ASSIGN_OR_RETURN(st.global_shape, ShapeFromPython(obj.attr("global_shape"),
                                                         "tensor '" + fqn + "': global_shape"));
  size_t i = 0;
  for (nb::handle shard : obj.attr("shards")) {
    const std::string what = "tensor '" + fqn + "' shard " + std::to_string(i++);
    if (nb::len(shard) != 2) return InvalidArgumentError(what + ": expected (offsets, array)");
    dcp::Shard s;
    MEGA_ASSIGN_OR_RETURN(s.offsets, ShapeFromPython(shard[0], what + ": offsets"));
    MEGA_ASSIGN_OR_RETURN(s.tensor, TensorFromArray(shard[1], writable, what));
    if (s.tensor.dtype() != st.dtype) {
      return InvalidArgumentError(
          what + ": array dtype " + std::string(DTypeName(s.tensor.dtype())) +
          " differs from the ShardedTensor's " + std::string(DTypeName(st.dtype)));
    }
    st.shards.push_back(std::move(s));
  }
  return dcp::StateValue(std::move(st));
}

Result<dcp::StateValue> ValueFromPython(nb::handle obj, const std::string& fqn, bool writable) {
  if (nb::isinstance<nb::dict>(obj)) {
    dcp::StateDict d;
    for (auto [k, v] : nb::borrow<nb::dict>(obj)) {
      if (!nb::isinstance<nb::str>(k)) {
        return InvalidArgumentError("state dict '" + fqn + "': keys must be str");
      }
      std::string key = nb::cast<std::string>(k);
      MEGA_ASSIGN_OR_RETURN(dcp::StateValue value, ValueFromPython(v, Child(fqn, key), writable));
      d.Set(std::move(key), std::move(value));
    }
    return dcp::StateValue(std::move(d));
  }
  if (nb::isinstance<nb::list>(obj)) {
    std::vector<dcp::StateValue> items;
    size_t i = 0;
    for (nb::handle v : obj) {
      if (v.is_none()) {
        items.emplace_back();
      } else {
        MEGA_ASSIGN_OR_RETURN(dcp::StateValue value,
                              ValueFromPython(v, Child(fqn, std::to_string(i)), writable));
        items.push_back(std::move(value));
      }
      ++i;
    }
    return dcp::StateValue::List(std::move(items));
  }
  if (nb::isinstance<nb::bytes>(obj)) {
    nb::bytes b = nb::borrow<nb::bytes>(obj);
    return dcp::StateValue::Bytes(std::string(b.c_str(), b.size()));
  }
  if (nb::hasattr(obj, "shards") && nb::hasattr(obj, "global_shape")) {
    return ShardedFromPython(obj, fqn, writable);
  }
  MEGA_ASSIGN_OR_RETURN(Tensor t, TensorFromArray(obj, writable, "tensor '" + fqn + "'"));
  return dcp::StateValue(std::move(t));
}

nb::object PythonFromValue(const dcp::StateValue& v, const std::string& fqn, nb::dict raw) {
  switch (v.kind()) {
    case dcp::StateValue::Kind::kTensor:
      if (NumpyLacksDType(v.tensor().dtype())) {
        raw[nb::str(fqn.c_str())] = nb::str(std::string(DTypeName(v.tensor().dtype())).c_str());
      }
      return NumpyFromTensor(v.tensor());
    case dcp::StateValue::Kind::kBytes:
      return nb::bytes(v.bytes().data(), v.bytes().size());
    case dcp::StateValue::Kind::kDict: {
      nb::dict d;
      for (const auto& [key, child] : v.dict()) {
        d[nb::str(key.c_str())] = PythonFromValue(child, Child(fqn, key), raw);
      }
      return d;
    }
    case dcp::StateValue::Kind::kList: {
      nb::list l;
      for (size_t i = 0; i < v.list().size(); ++i) {
        l.append(PythonFromValue(v.list()[i], Child(fqn, std::to_string(i)), raw));
      }
      return l;
    }
    case dcp::StateValue::Kind::kSharded:  // never built by BuildStateDictFromMetadata
    case dcp::StateValue::Kind::kNone:
      break;
  }
  return nb::none();
}

}  // namespace

Result<dcp::StateDict> StateDictFromPython(nb::handle tree, bool writable) {
  if (!nb::isinstance<nb::dict>(tree)) {
    return InvalidArgumentError("a state dict must be a dict");
  }
  MEGA_ASSIGN_OR_RETURN(dcp::StateValue root, ValueFromPython(tree, "", writable));
  return std::move(root.dict());
}

nb::object PythonFromStateDict(const dcp::StateDict& state, nb::dict raw_dtypes) {
  nb::dict out;
  for (const auto& [key, value] : state) {
    out[nb::str(key.c_str())] = PythonFromValue(value, key, raw_dtypes);
  }
  return out;
}

nb::dict BytesLeaves(dcp::StateDict& state) {
  nb::dict out;
  auto flat = dcp::FlattenStateDict(state, nullptr);
  if (!flat.ok()) return out;
  for (const dcp::FlatEntry& e : *flat) {
    if (e.value->is_bytes()) {
      out[nb::str(e.fqn.c_str())] = nb::bytes(e.value->bytes().data(), e.value->bytes().size());
    }
  }
  return out;
}

}  // namespace megackpt::python
