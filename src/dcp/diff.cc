#include "megackpt/dcp/diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "dcp/entry_io.h"

namespace megackpt::dcp {
namespace {

// Logical bytes of an entry: the whole tensor, or the stored bytes value.
uint64_t EntryBytes(const Metadata& md, const std::string& fqn, const StorageMetadata& m) {
  if (const auto* t = std::get_if<TensorStorageMetadata>(&m)) {
    auto n = LogicalNbytes(t->properties.dtype, t->size);
    return n.ok() ? *n : 0;
  }
  auto it = md.storage_data.find(MetadataIndex(fqn));
  return it == md.storage_data.end() ? 0 : it->second.length;
}

// Compares two whole tensors of one dtype and shape (contiguous).
void CompareTensors(const Tensor& a, const Tensor& b, EntryDiff* d) {
  const auto* pa = static_cast<const uint8_t*>(a.data());
  const auto* pb = static_cast<const uint8_t*>(b.data());
  const uint64_t n = a.nbytes();
  if (std::memcmp(pa, pb, n) == 0) return;
  const DType dt = a.dtype();
  const int bits = DTypeBits(dt);
  if (bits < 8) {  // F4 and friends: nibbles
    for (uint64_t i = 0; i < n; ++i) {
      uint8_t x = pa[i] ^ pb[i];
      d->changed_elements += ((x & 0x0F) != 0) + ((x & 0xF0) != 0);
      d->changed_bytes += x != 0;
    }
    return;
  }
  const uint64_t es = static_cast<uint64_t>(bits / 8);
  const bool is_float = IsFloatDType(dt);
  double max_diff = 0;
  for (uint64_t off = 0; off < n; off += es) {
    if (std::memcmp(pa + off, pb + off, es) == 0) continue;
    ++d->changed_elements;
    if (!is_float) continue;
    const double x = FloatElementAt(dt, pa + off), y = FloatElementAt(dt, pb + off);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      ++d->non_finite_changes;
      if (std::isnan(x) != std::isnan(y)) max_diff = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (!std::isnan(max_diff)) max_diff = std::max(max_diff, std::fabs(x - y));
  }
  d->changed_bytes = d->changed_elements * es;
  if (is_float) d->max_abs_diff = max_diff;
}

}  // namespace

Result<CheckpointDiff> DiffCheckpoints(const std::string& a, const std::string& b) {
  MEGA_ASSIGN_OR_RETURN(Metadata ma, ReadCheckpointMetadata(a));
  MEGA_ASSIGN_OR_RETURN(Metadata mb, ReadCheckpointMetadata(b));
  const std::string ka = StorageKindOf(ma), kb = StorageKindOf(mb);
  CheckpointDiff out;
  for (const auto& [fqn, m] : ma.state_dict_metadata) {
    out.bytes_a += EntryBytes(ma, fqn, m);
    if (!mb.state_dict_metadata.count(fqn)) out.removed.push_back(fqn);
  }
  for (const auto& [fqn, m] : mb.state_dict_metadata) {
    out.bytes_b += EntryBytes(mb, fqn, m);
    if (!ma.state_dict_metadata.count(fqn)) {
      out.added.push_back(fqn);
      out.changed_bytes += EntryBytes(mb, fqn, m);
    }
  }
  for (const auto& [fqn, m1] : ma.state_dict_metadata) {
    auto it = mb.state_dict_metadata.find(fqn);
    if (it == mb.state_dict_metadata.end()) continue;
    const StorageMetadata& m2 = it->second;
    EntryDiff d;
    d.fqn = fqn;
    const auto* t1 = std::get_if<TensorStorageMetadata>(&m1);
    const auto* t2 = std::get_if<TensorStorageMetadata>(&m2);
    d.nbytes_a = EntryBytes(ma, fqn, m1);
    d.nbytes_b = EntryBytes(mb, fqn, m2);
    if (t1) {
      d.dtype_a = t1->properties.dtype;
      d.shape_a = t1->size;
    }
    if (t2) {
      d.dtype_b = t2->properties.dtype;
      d.shape_b = t2->size;
    }
    if ((t1 == nullptr) != (t2 == nullptr)) {
      d.what = "kind";
    } else if (t1 && t1->properties.dtype != t2->properties.dtype) {
      d.what = "dtype";
    } else if (t1 && t1->size != t2->size) {
      d.what = "shape";
    }
    MEGA_ASSIGN_OR_RETURN(StateValue va, LoadEntryWhole(ka, a, ma, fqn));
    MEGA_ASSIGN_OR_RETURN(StateValue vb, LoadEntryWhole(kb, b, mb, fqn));
    d.is_bytes = !t1 && !t2;
    if (!d.what.empty()) {
      d.changed_bytes = std::max(d.nbytes_a, d.nbytes_b);
    } else if (d.is_bytes) {
      const std::string& x = va.bytes();
      const std::string& y = vb.bytes();
      const size_t common = std::min(x.size(), y.size());
      for (size_t i = 0; i < common; ++i) d.changed_elements += x[i] != y[i];
      d.changed_elements += std::max(x.size(), y.size()) - common;
      d.changed_bytes = d.changed_elements;
      if (d.changed_elements) d.what = "values";
    } else {
      CompareTensors(va.tensor(), vb.tensor(), &d);
      if (d.changed_elements) d.what = "values";
    }
    if (d.what.empty()) {
      ++out.unchanged;
      continue;
    }
    out.changed_bytes += d.changed_bytes;
    out.changed.push_back(std::move(d));
  }
  return out;
}

}  // namespace megackpt::dcp
