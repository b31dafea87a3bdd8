// The engine side of megackpt.torch / megackpt.tensorplay: a StorageWriter or
// StorageReader driven step by step from a Python DCP framework's own
// StorageWriter/StorageReader methods (megackpt/_dcp_adapter.py).
//
// Plans cross the boundary as tuples (the adapter converts the framework's
// dataclasses):
//   write item  (fqn, offset | None, type 0 TENSOR | 1 SHARD | 2 BYTE_IO, dtype name | None,
//                global size | None, chunk offsets | None, chunk sizes | None, bytes_size)
//   read item   (type 0 TENSOR | 1 BYTE_IO, dest fqn, dest offset | None, dest_offsets,
//                storage fqn, storage offset | None, storage_offsets, lengths)
// Storage-specific plan data stays the C++ backend's text (SavePlan::storage_data),
// and each WriteResult travels as its encoding (dcp codec), so what the framework
// gathers and pickles is plain strings. Tensor bytes never pass through Python:
// WriteData reads the framework's tensors in place, ReadData writes into the
// planner's destination views in place.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common.h"
#include "dcp/codec.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/planner.h"
#include "megackpt/dcp/storage.h"

namespace megackpt::python {
namespace {

using Dims = std::vector<int64_t>;
using WriteItemTuple =
    std::tuple<std::string, std::optional<Dims>, int, std::optional<std::string>,
               std::optional<Dims>, std::optional<Dims>, std::optional<Dims>, uint64_t>;
using ResultTuple = std::tuple<std::string, std::optional<Dims>, uint64_t, std::string>;
using ReadItemTuple = std::tuple<int, std::string, std::optional<Dims>, Dims, std::string,
                                 std::optional<Dims>, Dims, Dims>;

Result<dcp::WriteItem> WriteItemFromTuple(const WriteItemTuple& t) {
  dcp::WriteItem w;
  const auto& [fqn, offset, type, dtype, size, chunk_offsets, chunk_sizes, bytes_size] = t;
  w.index = dcp::MetadataIndex(fqn, offset);
  if (type < 0 || type > 2) return InvalidArgumentError(fqn + ": bad write item type");
  w.type = static_cast<dcp::WriteItemType>(type);
  if (w.type == dcp::WriteItemType::kByteIO) {
    w.bytes_size = bytes_size;
    return w;
  }
  if (!dtype || !size || !chunk_offsets || !chunk_sizes) {
    return InvalidArgumentError(fqn + ": tensor write item without tensor data");
  }
  dcp::TensorWriteData td;
  MEGA_ASSIGN_OR_RETURN(td.properties.dtype, DTypeFromName(*dtype));
  td.size = *size;
  td.chunk.offsets = *chunk_offsets;
  td.chunk.sizes = *chunk_sizes;
  w.tensor_data = std::move(td);
  return w;
}

Result<dcp::SavePlan> SavePlanFromPython(const std::vector<WriteItemTuple>& items,
                                         std::string storage_data) {
  dcp::SavePlan plan;
  plan.items.reserve(items.size());
  for (const auto& t : items) {
    MEGA_ASSIGN_OR_RETURN(dcp::WriteItem w, WriteItemFromTuple(t));
    plan.items.push_back(std::move(w));
  }
  plan.storage_data = std::move(storage_data);
  return plan;
}

// What the resolved planners answer to planning calls: the framework's planner
// planned already (its plans arrive as tuples).
Status PlanningUnsupported() { return InternalError("planning is the framework's job"); }

// Resolves each item of one WriteData call to the data the framework's planner
// resolved it to (tensors wrapped in place; bytes copied once, they are small).
class ResolvedSavePlanner final : public dcp::SavePlanner {
 public:
  void Add(const dcp::MetadataIndex& index, dcp::ResolvedData data) {
    dcp::MetadataIndex key = index;
    key.index.reset();
    data_.emplace(std::move(key), std::move(data));
  }
  std::vector<std::string>& bytes_storage() { return bytes_; }

  Status SetUp(const dcp::StateDict&, const std::optional<dcp::StorageMeta>&, bool) override {
    return Status::OK();
  }
  Result<dcp::SavePlan> CreateLocalPlan() override { return PlanningUnsupported(); }
  Result<dcp::GlobalSavePlan> CreateGlobalPlan(std::vector<dcp::SavePlan>) override {
    return PlanningUnsupported();
  }
  Result<dcp::SavePlan> FinishPlan(dcp::SavePlan plan) override { return plan; }
  Result<dcp::ResolvedData> ResolveData(const dcp::WriteItem& item) override {
    dcp::MetadataIndex key = item.index;
    key.index.reset();
    auto it = data_.find(key);
    if (it == data_.end()) {
      return InternalError("write item " + dcp::ToString(item.index) + " was not resolved");
    }
    return it->second;
  }

 private:
  std::unordered_map<dcp::MetadataIndex, dcp::ResolvedData> data_;
  std::vector<std::string> bytes_;
};

class DcpWriter {
 public:
  DcpWriter(const std::string& kind, const std::string& path, nb::dict options)
      : writer_(Unwrap(MakeWriter(kind, path, options))) {}

  // Reset, Validate and SetUp may touch the filesystem (SetUp creates the folder
  // and checks for a committed checkpoint; on mega:// each is a hub request), so
  // they run without the GIL: torch's async_save runs them on its background
  // thread while the training loop goes on.
  void Reset(const std::string& checkpoint_id) {
    WithoutGil([&] { return writer_->Reset(checkpoint_id); });
  }
  bool Validate(const std::string& checkpoint_id) {
    nb::gil_scoped_release release;
    return writer_->ValidateCheckpointId(checkpoint_id);
  }
  void SetUp(bool is_coordinator, int rank, int world_size, bool use_collectives) {
    WithoutGil([&] {
      return writer_->SetUpStorageWriter({.is_coordinator = is_coordinator,
                                          .rank = rank,
                                          .world_size = world_size,
                                          .use_collectives = use_collectives});
    });
  }
  std::string PrepareLocalPlan(const std::vector<WriteItemTuple>& items) {
    dcp::SavePlan plan = Unwrap(SavePlanFromPython(items, ""));
    return Unwrap(writer_->PrepareLocalPlan(std::move(plan))).storage_data;
  }
  std::vector<std::string> PrepareGlobalPlan(
      const std::vector<std::pair<std::vector<WriteItemTuple>, std::string>>& plans) {
    std::vector<dcp::SavePlan> in;
    for (const auto& [items, storage_data] : plans) {
      in.push_back(Unwrap(SavePlanFromPython(items, storage_data)));
    }
    std::vector<dcp::SavePlan> out =
        WithoutGil([&] { return writer_->PrepareGlobalPlan(std::move(in)); });
    std::vector<std::string> storage;
    for (auto& p : out) storage.push_back(std::move(p.storage_data));
    return storage;
  }

  // `data[i]` is what the framework's planner resolved items[i] to: a CPU tensor
  // (any strides) or bytes. Returns (fqn, offset, size_in_bytes, encoded
  // WriteResult) per item written.
  std::vector<ResultTuple> WriteData(const std::vector<WriteItemTuple>& items,
                                     const std::string& storage_data, nb::list data) {
    if (nb::len(data) != items.size()) {
      ThrowIfError(InvalidArgumentError("write_data: one resolved value per item expected"));
    }
    dcp::SavePlan plan = Unwrap(SavePlanFromPython(items, storage_data));
    ResolvedSavePlanner planner;
    std::vector<std::string>& bytes = planner.bytes_storage();
    bytes.reserve(items.size());
    for (size_t i = 0; i < plan.items.size(); ++i) {
      const dcp::WriteItem& w = plan.items[i];
      nb::handle value = data[i];
      dcp::ResolvedData r;
      if (w.type == dcp::WriteItemType::kByteIO) {
        if (!nb::isinstance<nb::bytes>(value)) {
          ThrowIfError(InvalidArgumentError("write item '" + w.index.fqn + "': expected bytes"));
        }
        nb::bytes b = nb::borrow<nb::bytes>(value);
        bytes.emplace_back(b.c_str(), b.size());
        r.bytes = bytes.back();
      } else {
        r.tensor = Unwrap(
            TensorFromArray(value, /*writable=*/false, "tensor '" + dcp::ToString(w.index) + "'"));
        if (r.tensor.dtype() != w.tensor_data->properties.dtype ||
            r.tensor.shape() != w.tensor_data->chunk.sizes) {
          ThrowIfError(InvalidArgumentError(
              "tensor '" + dcp::ToString(w.index) + "': resolved to " +
              std::string(DTypeName(r.tensor.dtype())) + ShapeToString(r.tensor.shape()) +
              ", planned " + std::string(DTypeName(w.tensor_data->properties.dtype)) +
              ShapeToString(w.tensor_data->chunk.sizes)));
        }
      }
      planner.Add(w.index, std::move(r));
    }
    const std::vector<dcp::WriteResult> results =
        WithoutGil([&] { return writer_->WriteData(plan, planner); });
    std::vector<ResultTuple> out;
    for (const dcp::WriteResult& wr : results) {
      out.emplace_back(wr.index.fqn, wr.index.offset, wr.size_in_bytes,
                       dcp::internal::EncodeWriteResults({wr}));
    }
    return out;
  }

  // entries: fqn -> ("tensor", dtype, size, [(offsets, sizes), ...]) | ("bytes",);
  // object_paths: fqn -> [str | int, ...]; results[rank] = encoded WriteResults.
  void Finish(nb::dict entries, nb::dict object_paths, std::optional<std::string> checkpoint_id,
              std::optional<std::string> save_id, const std::string& version,
              const std::vector<std::vector<std::string>>& results) {
    dcp::Metadata md;
    for (auto [k, v] : entries) {
      std::string fqn = nb::cast<std::string>(k);
      std::string kind = nb::cast<std::string>(v[0]);
      if (kind == "bytes") {
        md.state_dict_metadata[fqn] = dcp::BytesStorageMetadata{};
        continue;
      }
      dcp::TensorStorageMetadata t;
      t.properties.dtype = Unwrap(DTypeFromName(nb::cast<std::string>(v[1])));
      t.size = nb::cast<Dims>(v[2]);
      for (nb::handle c : v[3]) {
        t.chunks.push_back({nb::cast<Dims>(c[0]), nb::cast<Dims>(c[1])});
      }
      md.state_dict_metadata[fqn] = std::move(t);
    }
    for (auto [k, v] : object_paths) {
      dcp::ObjectPath path;
      for (nb::handle key : v) {
        if (nb::isinstance<nb::int_>(key)) {
          path.push_back({nb::cast<int64_t>(key)});
        } else {
          path.push_back({nb::cast<std::string>(nb::str(key))});
        }
      }
      md.planner_data.object_paths[nb::cast<std::string>(k)] = std::move(path);
    }
    if (checkpoint_id || save_id) {
      md.storage_meta = dcp::StorageMeta{.checkpoint_id = checkpoint_id.value_or(""),
                                         .save_id = save_id.value_or("")};
    }
    md.version = version;
    std::vector<std::vector<dcp::WriteResult>> all(results.size());
    for (size_t r = 0; r < results.size(); ++r) {
      for (const std::string& enc : results[r]) {
        for (dcp::WriteResult& wr : Unwrap(dcp::internal::DecodeWriteResults(enc))) {
          dcp::MetadataIndex key = wr.index;
          key.index.reset();
          md.storage_data[key] = wr.storage_data;
          all[r].push_back(std::move(wr));
        }
      }
    }
    ThrowIfError(dcp::ValidateMetadata(md));
    WithoutGil([&] { return writer_->Finish(md, all); });
  }

  void Abort() {
    nb::gil_scoped_release release;
    writer_->Abort();
  }

  std::optional<std::pair<std::string, std::string>> StorageMeta() {
    auto m = writer_->GetStorageMeta();
    if (!m) return std::nullopt;
    return std::make_pair(m->checkpoint_id, m->save_id);
  }

 private:
  std::unique_ptr<dcp::StorageWriter> writer_;
};

std::string ReadItemKey(const dcp::ReadItem& r) {
  std::string k = dcp::ToString(r.dest_index) + "|" + ShapeToString(r.dest_offsets) + "|" +
                  dcp::ToString(r.storage_index) + "|" + ShapeToString(r.storage_offsets);
  return k;
}

// Hands the reader the destination views the framework's planner resolved;
// bytes values are collected for the framework's load_bytes.
class ResolvedLoadPlanner final : public dcp::LoadPlanner {
 public:
  ResolvedLoadPlanner(std::map<std::string, size_t> slots, std::vector<Tensor> dests)
      : slots_(std::move(slots)), dests_(std::move(dests)), bytes_(dests_.size()) {}
  std::vector<std::optional<std::string>>& bytes() { return bytes_; }

  Status SetUp(dcp::StateDict*, const dcp::Metadata&, bool) override { return Status::OK(); }
  Result<dcp::LoadPlan> CreateLocalPlan() override { return PlanningUnsupported(); }
  Result<std::vector<dcp::LoadPlan>> CreateGlobalPlan(std::vector<dcp::LoadPlan>) override {
    return PlanningUnsupported();
  }
  Result<dcp::LoadPlan> FinishPlan(dcp::LoadPlan plan) override { return plan; }
  Status LoadBytes(const dcp::ReadItem& item, std::string value) override {
    MEGA_ASSIGN_OR_RETURN(size_t i, Slot(item));
    bytes_[i] = std::move(value);
    return Status::OK();
  }
  Result<Tensor> ResolveTensor(const dcp::ReadItem& item) override {
    MEGA_ASSIGN_OR_RETURN(size_t i, Slot(item));
    return dests_[i];
  }
  Status CommitTensor(const dcp::ReadItem&, const Tensor&) override { return Status::OK(); }

 private:
  Result<size_t> Slot(const dcp::ReadItem& item) const {
    auto it = slots_.find(ReadItemKey(item));
    if (it == slots_.end()) return InternalError("read item " + ReadItemKey(item) + " unknown");
    return it->second;
  }
  std::map<std::string, size_t> slots_;
  std::vector<Tensor> dests_;
  std::vector<std::optional<std::string>> bytes_;
};

nb::list DimsList(const Dims& d) {
  nb::list l;
  for (int64_t v : d) l.append(v);
  return l;
}

class DcpReader {
 public:
  DcpReader(const std::string& kind, const std::string& path, nb::dict options)
      : reader_(Unwrap(MakeReader(kind, path, options))) {}

  // As on DcpWriter: what may touch the filesystem runs without the GIL.
  void Reset(const std::string& checkpoint_id) {
    metadata_.reset();
    WithoutGil([&] { return reader_->Reset(checkpoint_id); });
  }
  bool Validate(const std::string& checkpoint_id) {
    nb::gil_scoped_release release;
    return reader_->ValidateCheckpointId(checkpoint_id);
  }

  // (entries, object_paths, storage_meta (checkpoint_id, save_id) | None,
  //  version, {(fqn, offset | None): relative path})
  nb::tuple ReadMetadata() {
    metadata_ = WithoutGil([&] { return reader_->ReadMetadata(); });
    const dcp::Metadata& md = *metadata_;
    nb::dict entries;
    for (const auto& [fqn, value] : md.state_dict_metadata) {
      if (const auto* t = std::get_if<dcp::TensorStorageMetadata>(&value)) {
        nb::list chunks;
        for (const auto& c : t->chunks)
          chunks.append(nb::make_tuple(DimsList(c.offsets), DimsList(c.sizes)));
        entries[nb::str(fqn.c_str())] = nb::make_tuple(
            "tensor", std::string(DTypeName(t->properties.dtype)), DimsList(t->size), chunks);
      } else {
        entries[nb::str(fqn.c_str())] = nb::make_tuple("bytes");
      }
    }
    nb::dict paths;
    for (const auto& [fqn, path] : md.planner_data.object_paths) {
      nb::list p;
      for (const dcp::PathKey& k : path) {
        if (const auto* s = std::get_if<std::string>(&k.key)) {
          p.append(nb::str(s->c_str()));
        } else {
          p.append(std::get<int64_t>(k.key));
        }
      }
      paths[nb::str(fqn.c_str())] = p;
    }
    nb::object meta = nb::none();
    if (md.storage_meta)
      meta = nb::make_tuple(md.storage_meta->checkpoint_id, md.storage_meta->save_id);
    nb::dict storage;
    for (const auto& [index, info] : md.storage_data) {
      nb::object off = index.offset ? nb::object(nb::tuple(DimsList(*index.offset))) : nb::none();
      storage[nb::make_tuple(index.fqn, off)] = info.relative_path;
    }
    return nb::make_tuple(entries, paths, meta, md.version, storage);
  }

  void SetUp(bool is_coordinator, int rank, int world_size, bool use_collectives) {
    if (!metadata_) ThrowIfError(FailedPreconditionError("read_metadata was not called"));
    WithoutGil([&] {
      return reader_->SetUpStorageReader(*metadata_, {.is_coordinator = is_coordinator,
                                                      .rank = rank,
                                                      .world_size = world_size,
                                                      .use_collectives = use_collectives});
    });
  }

  // dests[i]: the planner's destination view of tensor item i (None for bytes).
  // Returns {i: bytes} for the bytes items.
  nb::dict ReadData(const std::vector<ReadItemTuple>& items, nb::list dests) {
    if (!metadata_) ThrowIfError(FailedPreconditionError("read_metadata was not called"));
    if (nb::len(dests) != items.size()) {
      ThrowIfError(InvalidArgumentError("read_data: one destination per item expected"));
    }
    dcp::LoadPlan plan;
    std::map<std::string, size_t> slots;
    std::vector<Tensor> tensors(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const auto& [type, dfqn, doff, dest_offsets, sfqn, soff, storage_offsets, lengths] = items[i];
      dcp::ReadItem r;
      r.type = type == 1 ? dcp::LoadItemType::kByteIO : dcp::LoadItemType::kTensor;
      r.dest_index = dcp::MetadataIndex(dfqn, doff);
      r.dest_offsets = dest_offsets;
      r.storage_index = dcp::MetadataIndex(sfqn, soff);
      r.storage_offsets = storage_offsets;
      r.lengths = lengths;
      if (r.type == dcp::LoadItemType::kTensor) {
        const std::string what = "tensor '" + dcp::ToString(r.dest_index) + "'";
        tensors[i] = Unwrap(TensorFromArray(dests[i], /*writable=*/true, what));
        auto md = metadata_->state_dict_metadata.find(sfqn);
        const auto* stored = md == metadata_->state_dict_metadata.end()
                                 ? nullptr
                                 : std::get_if<dcp::TensorStorageMetadata>(&md->second);
        if (stored == nullptr) {
          ThrowIfError(
              InvalidArgumentError(what + ": the checkpoint holds no tensor '" + sfqn + "'"));
        }
        if (stored->properties.dtype != tensors[i].dtype()) {
          ThrowIfError(InvalidArgumentError(what + ": dtype mismatch: the checkpoint has " +
                                            std::string(DTypeName(stored->properties.dtype)) +
                                            ", the destination is " +
                                            std::string(DTypeName(tensors[i].dtype()))));
        }
        if (tensors[i].shape() != r.lengths) {
          ThrowIfError(InvalidArgumentError(what + ": destination view has shape " +
                                            ShapeToString(tensors[i].shape()) +
                                            ", the read needs " + ShapeToString(r.lengths)));
        }
      }
      if (!slots.emplace(ReadItemKey(r), i).second) {
        ThrowIfError(InvalidArgumentError("read_data: duplicate read item " + ReadItemKey(r)));
      }
      plan.items.push_back(std::move(r));
    }
    ResolvedLoadPlanner planner(std::move(slots), std::move(tensors));
    WithoutGil([&] { return reader_->ReadData(plan, planner); });
    nb::dict out;
    for (size_t i = 0; i < planner.bytes().size(); ++i) {
      if (planner.bytes()[i]) {
        out[nb::int_(i)] = nb::bytes(planner.bytes()[i]->data(), planner.bytes()[i]->size());
      }
    }
    return out;
  }

 private:
  std::unique_ptr<dcp::StorageReader> reader_;
  std::optional<dcp::Metadata> metadata_;
};

}  // namespace

namespace {

// The methods DcpWriter and DcpReader share: made from (kind, path, options)
// (MakeWriter / MakeReader), then reset, validate and set_up.
template <typename Storage>
nb::class_<Storage> BindDcpStorage(nb::module_& m, const char* name) {
  return nb::class_<Storage>(m, name)
      .def(nb::init<const std::string&, const std::string&, nb::dict>(), nb::arg("kind"),
           nb::arg("path"), nb::arg("options"))
      .def("reset", &Storage::Reset)
      .def("validate", &Storage::Validate)
      .def("set_up", &Storage::SetUp);
}

}  // namespace

void RegisterDcpStorage(nb::module_& m) {
  BindDcpStorage<DcpWriter>(m, "_DcpWriter")
      .def("prepare_local_plan", &DcpWriter::PrepareLocalPlan)
      .def("prepare_global_plan", &DcpWriter::PrepareGlobalPlan)
      .def("write_data", &DcpWriter::WriteData)
      .def("finish", &DcpWriter::Finish)
      .def("abort", &DcpWriter::Abort)
      .def("storage_meta", &DcpWriter::StorageMeta);
  BindDcpStorage<DcpReader>(m, "_DcpReader")
      .def("read_metadata", &DcpReader::ReadMetadata)
      .def("read_data", &DcpReader::ReadData);
}

}  // namespace megackpt::python
