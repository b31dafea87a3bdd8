// State dicts: what a training job saves and loads.
//
// A StateDict is an insertion-ordered map name -> StateValue. A value is
//  - a whole tensor held by this rank (a megackpt::Tensor; every rank that holds
//    the same name holds a replica and the save keeps one copy),
//  - a sharded tensor: this rank's chunks of a larger global tensor (the C++
//    equivalent of DTensor / ShardedTensor): global shape, dtype, and a list of
//    {offsets, local tensor},
//  - bytes: an opaque byte string (a serialized object),
//  - a nested dict or list of values. Nesting is flattened to dotted names
//    ("optim.state.0.exp_avg") for storage; the path is kept in the checkpoint so
//    loading can rebuild it (BuildStateDictFromMetadata).
// Copying a StateValue copies tensor *views*, never tensor bytes.
#ifndef MEGACKPT_DCP_STATE_DICT_H_
#define MEGACKPT_DCP_STATE_DICT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/metadata.h"

namespace megackpt::dcp {

// One chunk of a sharded tensor held by this rank: `tensor` holds the elements
// [offsets[d], offsets[d] + tensor.shape()[d]) of the global tensor.
struct Shard {
  Shape offsets;
  Tensor tensor;
};

struct ShardedTensor {
  DType dtype = DType::kF32;
  Shape global_shape;
  std::vector<Shard> shards;  // may be empty (this rank holds nothing)
};

class StateValue;

// Insertion-ordered map from key to value. Look-ups are linear; a state dict is
// walked, rarely searched.
class StateDict {
 public:
  using Entry = std::pair<std::string, StateValue>;

  StateDict();
  StateDict(const StateDict&);
  StateDict(StateDict&&) noexcept;
  StateDict& operator=(const StateDict&);
  StateDict& operator=(StateDict&&) noexcept;
  ~StateDict();

  // Inserts or replaces `key`; returns the stored value. Replacing keeps the
  // key's original position.
  StateValue& Set(std::string key, StateValue value);
  // nullptr when absent.
  StateValue* Find(std::string_view key);
  const StateValue* Find(std::string_view key) const;
  bool Contains(std::string_view key) const { return Find(key) != nullptr; }
  bool Erase(std::string_view key);

  // Defined below, once StateValue is complete (std::vector of an incomplete
  // pair type may not be instantiated here; clang rejects it).
  size_t size() const;
  bool empty() const;
  std::vector<Entry>::iterator begin();
  std::vector<Entry>::iterator end();
  std::vector<Entry>::const_iterator begin() const;
  std::vector<Entry>::const_iterator end() const;

 private:
  std::vector<Entry> entries_;
};

class StateValue {
 public:
  enum class Kind { kNone, kTensor, kSharded, kBytes, kDict, kList };

  StateValue();                       // kNone
  StateValue(Tensor tensor);          // NOLINT: implicit by design
  StateValue(ShardedTensor sharded);  // NOLINT
  static StateValue Bytes(std::string bytes);
  StateValue(StateDict dict);  // NOLINT
  static StateValue List(std::vector<StateValue> items);

  StateValue(const StateValue&);
  StateValue(StateValue&&) noexcept;
  StateValue& operator=(const StateValue&);
  StateValue& operator=(StateValue&&) noexcept;
  ~StateValue();

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_tensor() const { return kind_ == Kind::kTensor; }
  bool is_sharded() const { return kind_ == Kind::kSharded; }
  bool is_bytes() const { return kind_ == Kind::kBytes; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_list() const { return kind_ == Kind::kList; }

  // REQUIRES: the matching kind.
  Tensor& tensor() { return tensor_; }
  const Tensor& tensor() const { return tensor_; }
  ShardedTensor& sharded() { return sharded_; }
  const ShardedTensor& sharded() const { return sharded_; }
  std::string& bytes() { return bytes_; }
  const std::string& bytes() const { return bytes_; }
  StateDict& dict() { return dict_; }
  const StateDict& dict() const { return dict_; }
  std::vector<StateValue>& list() { return list_; }
  const std::vector<StateValue>& list() const { return list_; }

 private:
  Kind kind_ = Kind::kNone;
  Tensor tensor_;
  ShardedTensor sharded_;
  std::string bytes_;
  StateDict dict_;
  std::vector<StateValue> list_;
};

inline size_t StateDict::size() const { return entries_.size(); }
inline bool StateDict::empty() const { return entries_.empty(); }
inline std::vector<StateDict::Entry>::iterator StateDict::begin() { return entries_.begin(); }
inline std::vector<StateDict::Entry>::iterator StateDict::end() { return entries_.end(); }
inline std::vector<StateDict::Entry>::const_iterator StateDict::begin() const {
  return entries_.begin();
}
inline std::vector<StateDict::Entry>::const_iterator StateDict::end() const {
  return entries_.end();
}

// "none", "tensor", "sharded", "bytes", "dict", "list".
std::string_view KindName(StateValue::Kind kind);

// One leaf of a flattened state dict. Pointers point into the dict given to
// FlattenStateDict and stay valid while it is not modified structurally.
struct FlatEntry {
  std::string fqn;
  StateValue* value = nullptr;  // kTensor, kSharded or kBytes
};

// Flattens nested dicts/lists into dotted fqns in depth-first insertion order;
// `object_paths` receives fqn -> path for every leaf that was nested (top-level
// leaves are not recorded). InvalidArgument when two leaves flatten to the same
// fqn, or a dict entry is kNone (kNone list elements are holes and are skipped).
Result<std::vector<FlatEntry>> FlattenStateDict(StateDict& state_dict,
                                                std::map<std::string, ObjectPath>* object_paths);

// Builds a state dict with the checkpoint's structure: nesting rebuilt from
// metadata.planner_data.object_paths, every tensor entry a freshly allocated whole
// tensor of its global shape and dtype (contents unspecified unless `zero`),
// every bytes entry an empty string. Loading into the result restores the saved
// state exactly. List slots with no saved value are kNone.
// DataLoss when object paths contradict each other.
Result<StateDict> BuildStateDictFromMetadata(const Metadata& metadata, bool zero = false);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_STATE_DICT_H_
