#include "megackpt/dcp/state_dict.h"

#include <algorithm>
#include <set>

namespace megackpt::dcp {

// ---- StateDict ---------------------------------------------------------------

StateDict::StateDict() = default;
StateDict::StateDict(const StateDict&) = default;
StateDict::StateDict(StateDict&&) noexcept = default;
StateDict& StateDict::operator=(const StateDict&) = default;
StateDict& StateDict::operator=(StateDict&&) noexcept = default;
StateDict::~StateDict() = default;

StateValue& StateDict::Set(std::string key, StateValue value) {
  for (auto& e : entries_) {
    if (e.first == key) {
      e.second = std::move(value);
      return e.second;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
  return entries_.back().second;
}

StateValue* StateDict::Find(std::string_view key) {
  for (auto& e : entries_) {
    if (e.first == key) return &e.second;
  }
  return nullptr;
}

const StateValue* StateDict::Find(std::string_view key) const {
  for (const auto& e : entries_) {
    if (e.first == key) return &e.second;
  }
  return nullptr;
}

bool StateDict::Erase(std::string_view key) {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.first == key; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

// ---- StateValue --------------------------------------------------------------

StateValue::StateValue() = default;
StateValue::StateValue(Tensor tensor) : kind_(Kind::kTensor), tensor_(std::move(tensor)) {}
StateValue::StateValue(ShardedTensor sharded)
    : kind_(Kind::kSharded), sharded_(std::move(sharded)) {}
StateValue::StateValue(StateDict dict) : kind_(Kind::kDict), dict_(std::move(dict)) {}
StateValue StateValue::Bytes(std::string bytes) {
  StateValue v;
  v.kind_ = Kind::kBytes;
  v.bytes_ = std::move(bytes);
  return v;
}
StateValue StateValue::List(std::vector<StateValue> items) {
  StateValue v;
  v.kind_ = Kind::kList;
  v.list_ = std::move(items);
  return v;
}
StateValue::StateValue(const StateValue&) = default;
StateValue::StateValue(StateValue&&) noexcept = default;
StateValue& StateValue::operator=(const StateValue&) = default;
StateValue& StateValue::operator=(StateValue&&) noexcept = default;
StateValue::~StateValue() = default;

std::string_view KindName(StateValue::Kind kind) {
  switch (kind) {
    case StateValue::Kind::kNone:
      return "none";
    case StateValue::Kind::kTensor:
      return "tensor";
    case StateValue::Kind::kSharded:
      return "sharded";
    case StateValue::Kind::kBytes:
      return "bytes";
    case StateValue::Kind::kDict:
      return "dict";
    case StateValue::Kind::kList:
      return "list";
  }
  return "?";
}

// ---- flattening --------------------------------------------------------------

namespace {

struct Flattener {
  std::vector<FlatEntry>* out;
  std::map<std::string, ObjectPath>* paths;
  std::set<std::string> seen;

  Status Visit(StateValue& v, const std::string& fqn, ObjectPath& path) {
    switch (v.kind()) {
      case StateValue::Kind::kNone:
        return InvalidArgumentError("state dict entry '" + fqn + "' has no value (kind none)");
      case StateValue::Kind::kTensor:
      case StateValue::Kind::kSharded:
      case StateValue::Kind::kBytes: {
        if (!seen.insert(fqn).second) {
          return InvalidArgumentError("state dict: two entries flatten to the same name '" + fqn +
                                      "'");
        }
        out->push_back(FlatEntry{fqn, &v});
        if (path.size() > 1 && paths) (*paths)[fqn] = path;
        return Status::OK();
      }
      case StateValue::Kind::kDict:
        for (auto& [key, child] : v.dict()) {
          path.emplace_back().key.emplace<std::string>(key);
          Status s = Visit(child, fqn + "." + key, path);
          path.pop_back();
          MEGA_RETURN_IF_ERROR(s);
        }
        return Status::OK();
      case StateValue::Kind::kList:
        for (size_t i = 0; i < v.list().size(); ++i) {
          if (v.list()[i].is_none()) continue;  // holes (e.g. rebuilt lists) carry nothing
          path.emplace_back().key.emplace<int64_t>(static_cast<int64_t>(i));
          Status s = Visit(v.list()[i], fqn + "." + std::to_string(i), path);
          path.pop_back();
          MEGA_RETURN_IF_ERROR(s);
        }
        return Status::OK();
    }
    return InternalError("unknown state value kind");
  }
};

}  // namespace

Result<std::vector<FlatEntry>> FlattenStateDict(StateDict& state_dict,
                                                std::map<std::string, ObjectPath>* object_paths) {
  std::vector<FlatEntry> out;
  Flattener f{&out, object_paths, {}};
  for (auto& [key, value] : state_dict) {
    ObjectPath path{PathKey{key}};
    MEGA_RETURN_IF_ERROR(f.Visit(value, key, path));
  }
  return out;
}

namespace {

std::string PathToString(const ObjectPath& path) {
  std::string s;
  for (const auto& k : path) {
    if (!s.empty()) s += '.';
    if (const auto* str = std::get_if<std::string>(&k.key)) {
      s += *str;
    } else {
      s += '[';
      s += std::to_string(std::get<int64_t>(k.key));
      s += ']';
    }
  }
  return s;
}

// Places `leaf` at `path` below `container` (a kDict or kList value), creating
// intermediate containers as the next path step's type asks.
Status Place(StateValue& container, const ObjectPath& path, size_t i, StateValue leaf,
             const std::string& fqn) {
  const PathKey& step = path[i];
  const bool last = i + 1 == path.size();
  StateValue* slot = nullptr;
  if (const auto* key = std::get_if<std::string>(&step.key)) {
    if (!container.is_dict()) {
      return DataLossError("metadata planner_data: path of '" + fqn + "' (" + PathToString(path) +
                           ") uses a key where another path has a list");
    }
    slot = container.dict().Find(*key);
    if (!slot) slot = &container.dict().Set(*key, StateValue());
  } else {
    int64_t idx = std::get<int64_t>(step.key);
    if (!container.is_list()) {
      return DataLossError("metadata planner_data: path of '" + fqn + "' (" + PathToString(path) +
                           ") uses a list index where another path has a dict");
    }
    if (idx < 0 || idx > (1 << 24)) {
      return DataLossError("metadata planner_data: path of '" + fqn + "' has list index " +
                           std::to_string(idx));
    }
    auto& list = container.list();
    if (static_cast<size_t>(idx) >= list.size()) list.resize(static_cast<size_t>(idx) + 1);
    slot = &list[static_cast<size_t>(idx)];
  }
  if (last) {
    if (!slot->is_none()) {
      return DataLossError("metadata planner_data: two entries map to path " + PathToString(path) +
                           " (one is '" + fqn + "')");
    }
    *slot = std::move(leaf);
    return Status::OK();
  }
  if (slot->is_none()) {
    const bool next_is_key = std::holds_alternative<std::string>(path[i + 1].key);
    *slot = next_is_key ? StateValue(StateDict()) : StateValue::List({});
  }
  if (!slot->is_dict() && !slot->is_list()) {
    return DataLossError("metadata planner_data: path of '" + fqn + "' (" + PathToString(path) +
                         ") passes through a leaf value");
  }
  return Place(*slot, path, i + 1, std::move(leaf), fqn);
}

}  // namespace

Result<StateDict> BuildStateDictFromMetadata(const Metadata& metadata, bool zero) {
  StateValue root{StateDict()};
  for (const auto& [fqn, md] : metadata.state_dict_metadata) {
    StateValue leaf;
    if (const auto* t = std::get_if<TensorStorageMetadata>(&md)) {
      MEGA_ASSIGN_OR_RETURN(Tensor tensor, Tensor::Empty(t->properties.dtype, t->size, zero));
      leaf = StateValue(std::move(tensor));
    } else {
      leaf = StateValue::Bytes("");
    }
    ObjectPath path;
    auto it = metadata.planner_data.object_paths.find(fqn);
    if (it != metadata.planner_data.object_paths.end()) {
      path = it->second;
      if (path.empty() || !std::holds_alternative<std::string>(path[0].key)) {
        return DataLossError("metadata planner_data: path of '" + fqn + "' must start with a key");
      }
    } else {
      path = {PathKey{fqn}};
    }
    MEGA_RETURN_IF_ERROR(Place(root, path, 0, std::move(leaf), fqn));
  }
  return std::move(root.dict());
}

}  // namespace megackpt::dcp
