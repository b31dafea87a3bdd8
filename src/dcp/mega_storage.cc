// MegaStorageWriter / MegaStorageReader (docs/mega-storage.md).
//
// Save: the coordinator assigns every item of every rank a shard file in
// PrepareGlobalPlan and ships the whole per-rank file layout (names, item
// order, dtypes, shapes) in SavePlan::storage_data. WriteData plans a
// format::MegaEncoder per file on first use, writes items in parallel straight
// from the planner's tensors (CRC and block CRCs computed per 1 MiB piece while
// hot), and finishes a file (block table, header, fsync) as soon as all of its
// items are in. Every file is written inside this rank's fs::Transaction on the
// checkpoint folder (the coordinator begins it in PrepareGlobalPlan and ships
// its token in the layout; the other ranks join with it and export what they
// staged with their write results); Finish commits the coordinator's
// transaction (mega_storage_commit.h): one path for local folders (in place,
// .metadata rename) and mega:// (one hub commit).
//
// Load: Metadata comes from .metadata or is rebuilt from the shard headers;
// ReadData reads each item's box with MegaReader::ReadTensor (whole pieces,
// checksum verified) or ReadSlice (only the needed runs, widened to the
// shard's checksum blocks and verified), in parallel; a large whole piece with
// block CRCs is read as byte-range parts of ~32 MiB (each verified against its
// blocks) so that every thread works on it, and committed when its last part
// is in.
#include "megackpt/dcp/mega_storage.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "dcp/mega_storage_commit.h"
#include "dcp/mega_storage_files.h"
#include "dcp/mega_storage_shard.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"  // kWritebackUnit
#include "megackpt/core/text.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/format/index_file.h"

namespace megackpt::dcp {

using json = nlohmann::json;

namespace {

constexpr std::string_view kLayoutFormat = "megackpt-mega-layout-v1";

std::string MetadataNameFor(const StorageSetUp& setup) {
  if (!setup.use_collectives && setup.world_size > 1 && setup.rank > 0) {
    return std::string(kMetadataFileName) + ".rank" + std::to_string(setup.rank);
  }
  return std::string(kMetadataFileName);
}

std::string IndexNameFor(const StorageSetUp& setup) {
  if (!setup.use_collectives && setup.world_size > 1 && setup.rank > 0) {
    return "model-rank" + std::to_string(setup.rank) + ".mega.index.json";
  }
  return std::string(kMegaStorageIndexName);
}

int RankTagFor(const StorageSetUp& setup) {
  return !setup.use_collectives && setup.world_size > 1 ? setup.rank : -1;
}

// One planned item of a shard file.
struct LayoutItem {
  MetadataIndex key;  // fqn + chunk offsets (none for bytes)
  bool is_bytes = false;
  DType dtype = DType::kU8;
  Shape sizes;         // chunk sizes (bytes: {nbytes})
  Shape global_shape;  // tensors
};

struct LayoutFile {
  std::string name;
  std::vector<LayoutItem> items;
};

// What PrepareGlobalPlan tells one rank.
struct RankLayout {
  std::string save_id;
  std::vector<LayoutFile> files;
  // Every rank writes into its own transaction on the checkpoint folder, joined
  // to the coordinator's with this token (fs::Transaction::token()).
  std::string txn_token;
};

std::string EncodeLayout(const RankLayout& l) {
  json j;
  j["format"] = kLayoutFormat;
  j["save_id"] = l.save_id;
  j["txn_token"] = l.txn_token;
  json files = json::array();
  for (const LayoutFile& f : l.files) {
    json items = json::array();
    for (const LayoutItem& it : f.items) {
      json v;
      v["fqn"] = it.key.fqn;
      v["offsets"] = it.key.offset ? json(*it.key.offset) : json(nullptr);
      v["bytes"] = it.is_bytes;
      v["dtype"] = std::string(DTypeName(it.dtype));
      v["sizes"] = it.sizes;
      v["global"] = it.global_shape;
      items.push_back(std::move(v));
    }
    files.push_back({{"name", f.name}, {"items", std::move(items)}});
  }
  j["files"] = std::move(files);
  return j.dump();
}

Result<RankLayout> DecodeLayout(std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kLayoutFormat) {
    return FailedPreconditionError(
        "save plan carries no MEGA file layout (PrepareGlobalPlan of MegaStorageWriter did not run "
        "on the coordinator)");
  }
  try {
    RankLayout l;
    l.save_id = j.at("save_id").get<std::string>();
    l.txn_token = j.at("txn_token").get<std::string>();
    for (const json& f : j.at("files")) {
      LayoutFile lf;
      lf.name = f.at("name").get<std::string>();
      for (const json& v : f.at("items")) {
        LayoutItem it;
        it.key.fqn = v.at("fqn").get<std::string>();
        if (!v.at("offsets").is_null()) it.key.offset = v.at("offsets").get<Shape>();
        it.is_bytes = v.at("bytes").get<bool>();
        MEGA_ASSIGN_OR_RETURN(it.dtype, DTypeFromName(v.at("dtype").get<std::string>()));
        it.sizes = v.at("sizes").get<Shape>();
        it.global_shape = v.at("global").get<Shape>();
        lf.items.push_back(std::move(it));
      }
      l.files.push_back(std::move(lf));
    }
    return l;
  } catch (const std::exception& e) {
    return InternalError(std::string("malformed MEGA file layout in the save plan: ") + e.what());
  }
}

LayoutItem ItemFor(const WriteItem& w) {
  LayoutItem it;
  it.key = MetadataIndex(w.index.fqn, w.index.offset);
  if (w.type == WriteItemType::kByteIO) {
    it.is_bytes = true;
    it.key.offset.reset();
    it.dtype = DType::kU8;
    it.sizes = {static_cast<int64_t>(w.bytes_size)};
  } else if (w.tensor_data) {
    it.dtype = w.tensor_data->properties.dtype;
    it.sizes = w.tensor_data->chunk.sizes;
    it.global_shape = w.tensor_data->size;
    if (!it.key.offset) it.key.offset = w.tensor_data->chunk.offsets;
  }
  return it;
}

// The files of one rank's items in the default bucket: `want` files balanced
// by bytes, largest item first onto the lightest file that does not hold its
// fqn yet (a file names each tensor by its fqn); a further file when every file
// holds it (several chunks of one fqn). Returns each item's file number k.
std::vector<int> SplitOverFiles(const std::vector<WriteItem>& items, size_t want) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<uint64_t> nbytes(items.size());
  for (size_t i = 0; i < items.size(); ++i) nbytes[i] = WriteItemNbytes(items[i]);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return nbytes[a] > nbytes[b]; });
  struct Bin {
    uint64_t bytes = 0;
    std::set<std::string> fqns;
  };
  std::vector<Bin> bins(std::max<size_t>(want, 1));
  std::vector<int> file_of(items.size(), 0);
  for (size_t i : order) {
    const std::string& fqn = items[i].index.fqn;
    size_t best = bins.size();
    for (size_t b = 0; b < bins.size(); ++b) {
      if (bins[b].fqns.count(fqn)) continue;
      if (best == bins.size() || bins[b].bytes < bins[best].bytes) best = b;
    }
    if (best == bins.size()) bins.emplace_back();
    bins[best].bytes += nbytes[i];
    bins[best].fqns.insert(fqn);
    file_of[i] = static_cast<int>(best);
  }
  return file_of;
}

}  // namespace

// ============================== writer =======================================

struct MegaStorageWriter::Impl {
  std::string path;
  std::optional<FqnToIndexMapping> mapping;
  MegaStorageWriterOptions options;
  std::shared_ptr<fs::FileSystem> fs;
  StorageSetUp setup;
  std::string save_id = mega_storage::NewSaveId();
  bool committed = false;

  // Per save: the decoded layout and the shard writers opened so far.
  std::string layout_text;
  RankLayout layout;
  std::map<MetadataIndex, std::pair<size_t, size_t>> where;  // key -> (file, position)
  struct Slot {
    std::unique_ptr<WritableFile> file;
    std::unique_ptr<format::MegaEncoder> writer;
    bool done = false;
    void Abandon() {
      if (file && !done) file->Close().IgnoreError();
      done = true;
    }
  };
  std::vector<Slot> slots;
  std::vector<std::string> created;  // names of the files this rank created
  std::unique_ptr<ThreadPool> pool;
  std::map<std::string, ObjectPath> object_paths;  // from this rank's local plan
  fs::FileSystemCapabilities caps;                 // of `fs`
  // This rank's transaction of the current save (see the top of this file).
  std::unique_ptr<fs::Transaction> txn;
  std::string last_commit;  // id of the last commit this writer made ("" = none / no history)
  fs::TransactionStats txn_stats;  // this rank's writes in its last save

  void ForgetSave() {
    // Dropped, not aborted: like a crash, nothing becomes committed (files
    // written in place are a later commit's leftovers to clean up).
    txn.reset();
    for (Slot& s : slots) s.Abandon();
    slots.clear();
    created.clear();
    layout_text.clear();
    layout = RankLayout();
    where.clear();
    committed = false;
  }

  Status EnsureLayout(const std::string& text) {
    if (!layout_text.empty() && text == layout_text) return Status::OK();
    if (!layout_text.empty()) {
      return FailedPreconditionError(path +
                                     ": WriteData got a different file layout within one save");
    }
    MEGA_ASSIGN_OR_RETURN(layout, DecodeLayout(text));
    layout_text = text;
    slots.clear();
    slots.resize(layout.files.size());
    for (size_t f = 0; f < layout.files.size(); ++f) {
      for (size_t k = 0; k < layout.files[f].items.size(); ++k) {
        where[layout.files[f].items[k].key] = {f, k};
      }
    }
    return Status::OK();
  }

  format::MegaMetadata ShardMetadata(const LayoutFile& f, const PlannerData& planner_data) const {
    std::map<std::string, mega_storage::ShardEntry> entries;
    std::map<std::string, ObjectPath> paths;
    for (const LayoutItem& it : f.items) {
      mega_storage::ShardEntry e;
      e.is_bytes = it.is_bytes;
      e.dtype = it.dtype;
      if (!it.is_bytes) {
        e.global_shape = it.global_shape;
        e.offsets = it.key.offset.value_or(Shape(it.sizes.size(), 0));
      }
      entries[it.key.fqn] = e;
      auto p = planner_data.object_paths.find(it.key.fqn);
      if (p != planner_data.object_paths.end()) {
        paths[it.key.fqn] = p->second;
      } else if (auto q = object_paths.find(it.key.fqn); q != object_paths.end()) {
        paths[it.key.fqn] = q->second;
      }
    }
    format::MegaMetadata md;
    md.Add(std::string(kDcpVersionKey), format::MetaValue::U32(kDcpShardVersion)).IgnoreError();
    md.Add(std::string(kDcpSaveIdKey), format::MetaValue::String(layout.save_id)).IgnoreError();
    md.Add(std::string(kDcpEntriesKey),
           format::MetaValue::String(mega_storage::EncodeShardEntries(entries)))
        .IgnoreError();
    if (!paths.empty()) {
      md.Add(std::string(kDcpObjectPathsKey),
             format::MetaValue::String(mega_storage::EncodeObjectPaths(paths)))
          .IgnoreError();
    }
    return md;
  }

  ConsolidateOptions ConsolidateOpts() const {
    ConsolidateOptions co;
    co.format = options.consolidate_format;
    co.max_shard_size = options.consolidate_max_shard_size;
    co.fqn_to_index_mapping = mapping;
    co.thread_count = options.thread_count;
    co.sync = options.sync;
    co.checksum = options.checksum == format::MegaChecksumType::kNone
                      ? format::MegaChecksumType::kCrc32
                      : options.checksum;
    co.fs = fs;
    return co;
  }

  // This rank's transaction of a save; `base` = the coordinator's token ("" on
  // the coordinator).
  Status BeginSave(const std::string& base) {
    fs::TransactionOptions o;
    o.message = "megackpt: save checkpoint " + path;
    o.description = "save id " + save_id;
    o.base = base;
    // Saves without collectives: every rank commits alone to disjoint
    // (rank-tagged) names, so a concurrent commit of another rank is no conflict.
    o.rebase = RankTagFor(setup) >= 0;
    o.sync = options.sync;
    auto t = fs->BeginTransaction(path, o);
    if (!t.ok()) return t.status().WithContext("beginning the save to " + path);
    txn = std::move(*t);
    txn_stats = fs::TransactionStats();
    return Status::OK();
  }

  // Consolidation in place after the save's commit (`commit_id`), inside a
  // transaction that captures consolidation's writes through `fs`: on mega:// a
  // second commit on top of the save's; local folders need no capture
  // (consolidation's own commit protocol keeps them safe).
  Status ConsolidateInPlace(const std::string& commit_id) {
    fs::TransactionOptions o;
    o.message = "megackpt: consolidate checkpoint " + path;
    o.base = commit_id;
    o.sync = options.sync;
    o.capture_filesystem_writes = true;
    auto ctxn = fs->BeginTransaction(path, o);
    if (!ctxn.ok()) {
      return ctxn.status().WithContext(path +
                                       ": saved (sharded) and committed, but consolidation failed");
    }
    auto r = Consolidate(path, path, ConsolidateOpts());
    if (!r.ok()) {
      (*ctxn)->Abort();
      return r.status().WithContext(path +
                                    ": saved (sharded) and committed, but consolidation failed");
    }
    auto c = (*ctxn)->Commit();
    if (!c.ok()) {
      return c.status().WithContext(path +
                                    ": saved (sharded) and committed, but the consolidation "
                                    "commit failed");
    }
    if (!c->empty()) last_commit = *c;
    return Status::OK();
  }

  Status OpenSlot(size_t f, const PlannerData& planner_data) {
    if (slots[f].writer) return Status::OK();
    const LayoutFile& lf = layout.files[f];
    const std::string full = fs::JoinPath(path, lf.name);
    created.push_back(lf.name);
    MEGA_ASSIGN_OR_RETURN(auto file, txn->OpenForWrite(lf.name));
    if (!file->supports_write_at()) {
      return InternalError(full +
                           ": the filesystem promises positioned writes, but this file has none");
    }
    if (options.sync && options.direct_io) file->UseDirectIo();  // a hint; refused is fine
    MEGA_ASSIGN_OR_RETURN(slots[f].writer, PlanShard(full, lf, planner_data));
    slots[f].file = std::move(file);
    return Status::OK();
  }

  // The encoder of one shard: its layout from the plan (names, dtypes, shapes).
  Result<std::unique_ptr<format::MegaEncoder>> PlanShard(const std::string& full,
                                                         const LayoutFile& lf,
                                                         const PlannerData& planner_data) const {
    std::vector<format::MegaEncoderTensor> specs;
    for (const LayoutItem& it : lf.items)
      specs.push_back({it.key.fqn, it.dtype, it.sizes, options.checksum});
    format::MegaEncoderOptions eo =
        mega_storage::ShardEncoderOptions(options.tensor_alignment, options.checksum);
    // Durable saves: start writeback every core kWritebackUnit, as the fs writer does.
    if (options.sync) eo.writeback_bytes = kWritebackUnit;
    return format::MegaEncoder::Plan(full, std::move(specs), ShardMetadata(lf, planner_data), eo);
  }

  // What this rank staged so far travels to the coordinator's Finish.
  Result<std::vector<WriteResult>> ExportStaged(std::vector<WriteResult> results) {
    if (!results.empty()) {
      MEGA_ASSIGN_OR_RETURN(results.front().commit_token, txn->Export());
    }
    txn_stats = txn->stats();
    return results;
  }

  // Sinks without positioned writes (e.g. an upload stream): the whole file must
  // be in this call; the encoder computes checksums in a first pass, then streams.
  Status WriteSequentialFile(size_t f, const SavePlan& plan, const std::vector<size_t>& items,
                             SavePlanner& planner, std::vector<WriteResult>* results) {
    const LayoutFile& lf = layout.files[f];
    const std::string full = fs::JoinPath(path, lf.name);
    if (items.size() != lf.items.size()) {
      return UnimplementedError(full +
                                ": this filesystem cannot write a shard in several waves "
                                "(no positioned writes); give async_save a staging pool "
                                "larger than one rank's state");
    }
    created.push_back(lf.name);
    // E.g. streams into the hub's CAS, staged in this rank's transaction on Close.
    MEGA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, txn->OpenForWrite(lf.name));
    MEGA_ASSIGN_OR_RETURN(auto writer, PlanShard(full, lf, plan.planner_data));
    std::vector<ResolvedData> held(lf.items.size());
    for (size_t i : items) {
      const WriteItem& w = plan.items[i];
      const size_t pos = where.at(ItemFor(w).key).second;
      MEGA_ASSIGN_OR_RETURN(held[pos], planner.ResolveData(w));
    }
    std::vector<Tensor> tensors(lf.items.size());
    for (size_t pos = 0; pos < lf.items.size(); ++pos) {
      const LayoutItem& it = lf.items[pos];
      tensors[pos] = held[pos].tensor;
      if (it.is_bytes) {
        MEGA_ASSIGN_OR_RETURN(
            tensors[pos],
            Tensor::FromBlob(const_cast<char*>(held[pos].bytes.data()), DType::kU8, it.sizes));
      }
    }
    MEGA_RETURN_IF_ERROR(writer->WriteSequential(*file, tensors));
    const format::MegaWriteResult wr = writer->result();
    if (options.sync) MEGA_RETURN_IF_ERROR(file->Sync());
    MEGA_RETURN_IF_ERROR(file->Close());
    for (size_t i : items) {
      const WriteItem& w = plan.items[i];
      const size_t pos = where.at(ItemFor(w).key).second;
      const format::MegaTensorInfo& t = wr.tensors[pos];
      WriteResult& r = (*results)[i];
      r.index = w.index;
      r.size_in_bytes = t.logical_nbytes;
      r.storage_data.relative_path = lf.name;
      r.storage_data.offset = t.file_offset;
      r.storage_data.length = t.logical_nbytes;
      r.storage_data.checksum = mega_storage::MegaChecksumString(t);
    }
    slots[f].done = true;
    return Status::OK();
  }
};

MegaStorageWriter::MegaStorageWriter(std::string path, std::optional<FqnToIndexMapping> mapping,
                                     MegaStorageWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->mapping = std::move(mapping);
  impl_->options = std::move(options);
  if (impl_->options.thread_count < 1) impl_->options.thread_count = 1;
}

MegaStorageWriter::~MegaStorageWriter() {
  if (impl_) impl_->ForgetSave();
}

Status MegaStorageWriter::Reset(std::string_view checkpoint_id) {
  impl_->ForgetSave();
  if (!checkpoint_id.empty()) impl_->path = std::string(checkpoint_id);
  impl_->save_id = mega_storage::NewSaveId();
  return Status::OK();
}

bool MegaStorageWriter::ValidateCheckpointId(std::string_view checkpoint_id) const {
  return !checkpoint_id.empty() && fs::FileSystemForPath(checkpoint_id).ok();
}

std::string MegaStorageWriter::last_hub_commit() const { return impl_->last_commit; }
uint64_t MegaStorageWriter::hub_bytes_written() const { return impl_->txn_stats.bytes_written; }
uint64_t MegaStorageWriter::hub_new_bytes() const { return impl_->txn_stats.new_bytes; }

std::optional<StorageMeta> MegaStorageWriter::GetStorageMeta() const {
  StorageMeta m;
  m.checkpoint_id = impl_->path;
  m.save_id = impl_->save_id;
  return m;
}

Status MegaStorageWriter::SetUpStorageWriter(const StorageSetUp& setup) {
  Impl& s = *impl_;
  s.setup = setup;
  if (s.options.fs) {
    s.fs = s.options.fs;
  } else {
    MEGA_ASSIGN_OR_RETURN(s.fs, fs::FileSystemForPath(s.path));
  }
  s.caps = s.fs->capabilities();
  if (!s.caps.positioned_writes && s.options.consolidate &&
      s.options.consolidate_format == ConsolidateFormat::kMega) {
    return UnimplementedError(s.path +
                              ": consolidating into .mega files needs positioned writes, "
                              "which this filesystem's files do not have (mega:// uploads "
                              "stream); consolidate to safetensors, or consolidate a local "
                              "copy and push it");
  }
  if (setup.is_coordinator) {
    MEGA_RETURN_IF_ERROR(s.fs->CreateDirectories(s.path));
    if (!s.options.overwrite) {
      const std::string md = MetadataNameFor(setup);
      MEGA_ASSIGN_OR_RETURN(bool exists, s.fs->Exists(fs::JoinPath(s.path, md)));
      if (exists) {
        return AlreadyExistsError("a checkpoint already exists at " + s.path + " (" + md +
                                  " present); set overwrite to replace it");
      }
    }
  }
  return Status::OK();
}

Result<SavePlan> MegaStorageWriter::PrepareLocalPlan(SavePlan plan) {
  // The nesting of this rank's fqns goes into its shard headers (so Metadata
  // rebuilt from headers alone restores it); the finished plans may not carry it.
  impl_->object_paths = plan.planner_data.object_paths;
  return plan;
}

Result<std::vector<SavePlan>> MegaStorageWriter::PrepareGlobalPlan(std::vector<SavePlan> plans) {
  Impl& s = *impl_;
  if (!s.fs) return FailedPreconditionError(s.path + ": SetUpStorageWriter was not called");
  const int rank_tag = RankTagFor(s.setup);
  // Group items by (bucket, rank, k): k separates several chunks of one fqn that
  // one rank holds in one bucket, so every tensor in a file is named by its fqn.
  // Without a mapping (one bucket), k is the file of the rank's split over
  // options.files_per_rank files (1: the (bucket, rank, k) rule alone).
  using GroupKey = std::tuple<int, int, int>;
  std::map<GroupKey, std::vector<std::pair<size_t, size_t>>> groups;  // -> (plan, item)
  const size_t files_per_rank = s.options.files_per_rank > 0
                                    ? static_cast<size_t>(s.options.files_per_rank)
                                    : static_cast<size_t>(s.options.thread_count);
  for (size_t r = 0; r < plans.size(); ++r) {
    const int rank = s.setup.use_collectives ? static_cast<int>(r) : s.setup.rank;
    if (!s.mapping && files_per_rank > 1) {
      const std::vector<int> file_of =
          SplitOverFiles(plans[r].items, std::min(files_per_rank, plans[r].items.size()));
      for (size_t i = 0; i < plans[r].items.size(); ++i)
        groups[{1, rank, file_of[i]}].push_back({r, i});
      continue;
    }
    std::map<std::pair<int, std::string>, int> seen;
    for (size_t i = 0; i < plans[r].items.size(); ++i) {
      const WriteItem& w = plans[r].items[i];
      int bucket = 1;
      if (s.mapping) {
        auto it = s.mapping->find(w.index.fqn);
        if (it != s.mapping->end()) bucket = it->second;
      }
      if (bucket < 1) {
        return InvalidArgumentError("fqn_to_index_mapping maps " + w.index.fqn + " to " +
                                    std::to_string(bucket) + "; buckets start at 1");
      }
      int k = seen[{bucket, w.index.fqn}]++;
      groups[{bucket, rank, k}].push_back({r, i});
    }
  }
  const size_t count = groups.size();
  std::vector<std::string> plain;
  for (size_t n = 1; n <= count; ++n)
    plain.push_back(mega_storage::ShardFileName(".mega", n, count, "", -1));
  // The coordinator's transaction; its token goes to every rank.
  s.txn.reset();
  MEGA_RETURN_IF_ERROR(s.BeginSave(""));
  std::string id_in_name;
  if (rank_tag >= 0) {
    id_in_name = s.save_id;
  } else if (!s.caps.isolated_transactions) {
    // Files land in place under their final names: plain names unless one is
    // taken (by the committed checkpoint or leftovers), so a file the current
    // .metadata may reference is never overwritten. (Isolated transactions
    // replace the folder in one commit: plain names, overwritten.)
    MEGA_ASSIGN_OR_RETURN(bool taken, mega_storage::AnyExists(*s.fs, s.path, plain));
    if (taken) id_in_name = s.save_id;
  }
  std::vector<RankLayout> layouts(plans.size());
  for (auto& l : layouts) {
    l.save_id = s.save_id;
    l.txn_token = s.txn->token();
  }
  size_t n = 0;
  for (const auto& [key, members] : groups) {
    ++n;
    const std::string name = mega_storage::ShardFileName(".mega", n, count, id_in_name, rank_tag);
    // All members of a group belong to one plan (one rank).
    const size_t r = members.front().first;
    LayoutFile lf;
    lf.name = name;
    for (const auto& [pr, i] : members) lf.items.push_back(ItemFor(plans[pr].items[i]));
    layouts[r].files.push_back(std::move(lf));
  }
  for (size_t r = 0; r < plans.size(); ++r) plans[r].storage_data = EncodeLayout(layouts[r]);
  return plans;
}

Result<std::vector<WriteResult>> MegaStorageWriter::WriteData(const SavePlan& plan,
                                                              SavePlanner& planner) {
  Impl& s = *impl_;
  if (!s.fs) return FailedPreconditionError(s.path + ": SetUpStorageWriter was not called");
  MEGA_RETURN_IF_ERROR(s.EnsureLayout(plan.storage_data));
  if (!s.txn) MEGA_RETURN_IF_ERROR(s.BeginSave(s.layout.txn_token));  // joins the coordinator's
  // Which file and position each item goes to.
  std::vector<std::pair<size_t, size_t>> target(plan.items.size());
  std::map<size_t, std::vector<size_t>> by_file;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    const WriteItem& w = plan.items[i];
    const LayoutItem want = ItemFor(w);
    auto it = s.where.find(want.key);
    if (it == s.where.end()) {
      return FailedPreconditionError(s.path + ": item " + ToString(w.index) +
                                     " is not in the file layout of the global plan");
    }
    LayoutItem& have = s.layout.files[it->second.first].items[it->second.second];
    // A bytes value planned with size 0 had no known size when planned (torch's
    // DCP serialises objects only in write_data): its file takes the size the
    // WriteData plan gives, if the file has not been opened yet.
    if (have.is_bytes && want.is_bytes && have.sizes == Shape{0} && want.sizes != have.sizes &&
        !s.slots[it->second.first].writer && !s.slots[it->second.first].done) {
      have.sizes = want.sizes;
    }
    if (have.dtype != want.dtype || have.sizes != want.sizes || have.is_bytes != want.is_bytes) {
      return FailedPreconditionError(s.path + ": item " + ToString(w.index) +
                                     " differs from the global plan");
    }
    target[i] = it->second;
    by_file[it->second.first].push_back(i);
  }
  std::vector<WriteResult> results(plan.items.size());
  std::vector<size_t> files;  // files written with positioned writes
  bool created_now = false;   // one of them is opened by this call
  for (auto& [f, items] : by_file) {
    if (s.slots[f].done) {
      return FailedPreconditionError(s.path + ": " + s.layout.files[f].name +
                                     " was already finished");
    }
    if (!s.caps.positioned_writes) {
      // Sequential sinks (e.g. hub uploads): the whole file in this call.
      MEGA_RETURN_IF_ERROR(s.WriteSequentialFile(f, plan, items, planner, &results));
      continue;
    }
    created_now |= !s.slots[f].writer;
    MEGA_RETURN_IF_ERROR(s.OpenSlot(f, plan.planner_data));
    files.push_back(f);
  }
  // New shards exist (in place, under the transaction's root): their entries
  // go out before their data.
  if (created_now) {
    WriteOutNewEntries(*s.fs, s.txn->root(), {MetadataNameFor(s.setup), IndexNameFor(s.setup)});
  }
  const auto write_item = [&](size_t i) -> Status {
    const WriteItem& w = plan.items[i];
    auto [f, pos] = target[i];
    format::MegaEncoder& fw = *s.slots[f].writer;
    WritableFile& file = *s.slots[f].file;
    {
      // Released before the next item is resolved (bounded staging pools).
      MEGA_ASSIGN_OR_RETURN(ResolvedData data, planner.ResolveData(w));
      MEGA_RETURN_IF_ERROR(CheckResolvedData(w, data));
      if (w.type == WriteItemType::kByteIO) {
        MEGA_RETURN_IF_ERROR(fw.WriteTensorBytes(file, pos, AsBytes(data.bytes)));
      } else {
        MEGA_RETURN_IF_ERROR(
            fw.WriteTensor(file, pos, data.tensor).WithContext("writing " + ToString(w.index)));
      }
    }
    WriteResult& r = results[i];
    r.index = w.index;
    r.size_in_bytes = fw.tensor_nbytes(pos);
    r.storage_data.relative_path = s.layout.files[f].name;
    r.storage_data.offset = fw.tensor_file_offset(pos);
    r.storage_data.length = fw.tensor_nbytes(pos);
    r.storage_data.checksum = mega_storage::MegaChecksumString(fw.tensor_info(pos));
    return Status::OK();
  };
  // A file whose items are all in: header (+ fsync), closed.
  const auto finish_if_complete = [&](size_t f) -> Status {
    Impl::Slot& slot = s.slots[f];
    if (!slot.writer || slot.done || !slot.writer->all_written()) return Status::OK();
    MEGA_RETURN_IF_ERROR(slot.writer->FinishPositioned(*slot.file));
    if (s.options.sync) MEGA_RETURN_IF_ERROR(slot.file->Sync());
    slot.done = true;
    return slot.file->Close();
  };
  const int par = s.options.thread_count;
  if (!s.pool && par > 1) s.pool = std::make_unique<ThreadPool>(par - 1);
  const auto call_bytes = [&](size_t f) {
    uint64_t n = 0;
    for (size_t i : by_file.at(f)) n += WriteItemNbytes(plan.items[i]);
    return n;
  };
  if (files.size() >= static_cast<size_t>(par)) {
    // One task per file (largest first): its items in file order, then its
    // header, so no two threads write one file (ext4 serialises writes to one
    // inode) and one file's fsync overlaps the others' writes.
    std::vector<uint64_t> bytes_of(s.slots.size(), 0);
    for (size_t f : files) bytes_of[f] = call_bytes(f);
    std::stable_sort(files.begin(), files.end(),
                     [&](size_t a, size_t b) { return bytes_of[a] > bytes_of[b]; });
    MEGA_RETURN_IF_ERROR(ParallelFor(
        s.pool.get(), files.size(),
        [&](size_t k) -> Status {
          const size_t f = files[k];
          std::vector<size_t> items = by_file.at(f);
          std::sort(items.begin(), items.end(),
                    [&](size_t a, size_t b) { return target[a].second < target[b].second; });
          for (size_t i : items) MEGA_RETURN_IF_ERROR(write_item(i));
          return finish_if_complete(f);
        },
        par));
    return s.ExportStaged(std::move(results));
  }
  // Fewer files than threads: items in parallel, largest first so the threads
  // finish together; then the complete files' headers, in parallel.
  std::vector<size_t> positioned;
  for (size_t f : files)
    positioned.insert(positioned.end(), by_file.at(f).begin(), by_file.at(f).end());
  std::stable_sort(positioned.begin(), positioned.end(), [&](size_t a, size_t b) {
    return WriteItemNbytes(plan.items[a]) > WriteItemNbytes(plan.items[b]);
  });
  MEGA_RETURN_IF_ERROR(ParallelFor(
      s.pool.get(), positioned.size(), [&](size_t k) { return write_item(positioned[k]); }, par));
  MEGA_RETURN_IF_ERROR(ParallelFor(
      s.pool.get(), files.size(), [&](size_t k) { return finish_if_complete(files[k]); }, par));
  return s.ExportStaged(std::move(results));
}

Status MegaStorageWriter::Finish(const Metadata& metadata,
                                 const std::vector<std::vector<WriteResult>>& results) {
  Impl& s = *impl_;
  if (!s.fs) return FailedPreconditionError(s.path + ": SetUpStorageWriter was not called");
  if (!s.txn || !s.txn->is_open()) {
    return FailedPreconditionError(s.path +
                                   ": no save in progress to commit (aborted, or "
                                   "PrepareGlobalPlan did not run on this writer)");
  }
  for (size_t f = 0; f < s.slots.size(); ++f) {
    if (!s.slots[f].done) {
      return InternalError(s.path + ": shard " + s.layout.files[f].name +
                           " did not receive all of its items");
    }
  }
  Metadata md = metadata;
  if (!md.storage_meta) md.storage_meta = StorageMeta();
  if (md.storage_meta->checkpoint_id.empty()) md.storage_meta->checkpoint_id = s.path;
  if (md.storage_meta->save_id.empty()) md.storage_meta->save_id = s.save_id;
  mega_storage::CommitRequest req;
  req.dir = s.path;
  req.metadata_name = MetadataNameFor(s.setup);
  req.index_name = IndexNameFor(s.setup);
  req.other_index_name = RankTagFor(s.setup) >= 0 ? "" : std::string(kSafetensorsStorageIndexName);
  req.sync = s.options.sync;
  req.rank_tag = RankTagFor(s.setup);
  MEGA_ASSIGN_OR_RETURN(req.index, mega_storage::BuildIndex(md, /*mega_fields=*/true));
  req.metadata = std::move(md);
  // Every rank's shards + removals + index + .metadata: one commit.
  auto commit = mega_storage::CommitSave(*s.txn, *s.fs, req, results);
  s.txn.reset();
  if (!commit.ok())
    return commit.status().WithContext("the checkpoint at " + s.path + " was not saved");
  s.committed = true;
  s.last_commit = *commit;
  if (s.options.consolidate) return s.ConsolidateInPlace(*commit);
  return Status::OK();
}

void MegaStorageWriter::Abort() {
  Impl& s = *impl_;
  if (!s.fs) return;
  for (auto& slot : s.slots) slot.Abandon();
  if (s.txn && s.txn->is_open()) {
    // Only the coordinator knows whether the commit happened (e.g. the save was
    // committed and a later step such as consolidation failed): when the
    // committed .metadata references a file of ours, the save is committed and
    // our transaction is dropped, not aborted (an in-place Abort would remove
    // the files).
    bool committed = false;
    auto text = s.fs->ReadWhole(fs::JoinPath(s.path, MetadataNameFor(s.setup)), kMaxMetadataBytes);
    if (text.ok()) {
      auto md = DecodeMetadata(*text);
      if (md.ok()) {
        const std::set<std::string> referenced = mega_storage::ReferencedFiles(*md);
        for (const std::string& f : s.created) committed = committed || referenced.count(f) > 0;
      }
    }
    if (!committed) s.txn->Abort();
  }
  s.txn.reset();
  s.created.clear();
}

// ============================== reader =======================================

struct MegaStorageReader::Impl {
  std::string path;
  MegaStorageReaderOptions options;
  mega_storage::CheckpointPaths paths;
  std::shared_ptr<Metadata> metadata;
  std::unique_ptr<mega_storage::ShardFiles> files;
  CheckpointSource source = CheckpointSource::kMetadataFile;
  std::unique_ptr<ThreadPool> pool;
};

MegaStorageReader::MegaStorageReader(std::string path, MegaStorageReaderOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->options = std::move(options);
  if (impl_->options.thread_count < 1) impl_->options.thread_count = 1;
}

MegaStorageReader::~MegaStorageReader() = default;

Status MegaStorageReader::Reset(std::string_view checkpoint_id) {
  if (!checkpoint_id.empty()) impl_->path = std::string(checkpoint_id);
  impl_->metadata.reset();
  impl_->files.reset();
  return Status::OK();
}

bool MegaStorageReader::ValidateCheckpointId(std::string_view checkpoint_id) const {
  return !checkpoint_id.empty() && fs::FileSystemForPath(checkpoint_id).ok();
}

CheckpointSource MegaStorageReader::source() const { return impl_->source; }

std::string_view MegaStorageReader::verification() const {
  return impl_->options.verify_checksums ? "verified" : "off";
}

Result<Metadata> MegaStorageReader::ReadMetadata() {
  Impl& s = *impl_;
  std::shared_ptr<fs::FileSystem> fs = s.options.fs;
  if (!fs) {
    MEGA_ASSIGN_OR_RETURN(fs, fs::FileSystemForPath(s.path));
  }
  // Resolve the revision once (mega://); every file of this load comes from
  // that commit even if the branch moves meanwhile.
  MEGA_ASSIGN_OR_RETURN(std::string pinned, fs->PinPath(s.path));
  MEGA_ASSIGN_OR_RETURN(s.paths, mega_storage::ResolveCheckpointPath(pinned, fs));
  std::optional<Metadata> md;
  Status metadata_error;
  if (s.paths.index_file.empty() && s.paths.single_file.empty()) {
    const std::string name =
        s.options.metadata_rank >= 1
            ? std::string(kMetadataFileName) + ".rank" + std::to_string(s.options.metadata_rank)
            : std::string(kMetadataFileName);
    const std::string full = fs::JoinPath(s.paths.dir, name);
    auto text = s.paths.fs->ReadWhole(full, kMaxMetadataBytes);
    if (text.ok()) {
      auto decoded = DecodeMetadata(*text);
      if (decoded.ok()) {
        for (const std::string& f : mega_storage::ReferencedFiles(*decoded)) {
          if (!f.ends_with(".mega") && !f.ends_with(".safetensors")) {
            return FailedPreconditionError(
                full + " references " + f +
                ", which is not a .mega or .safetensors shard (a FileSystemWriter checkpoint? "
                "load it with the fs reader)");
          }
        }
        md = std::move(*decoded);
        s.source = CheckpointSource::kMetadataFile;
      } else {
        // E.g. TensorPlay's pickle: fall back to the shard headers.
        metadata_error = Status(decoded.status().code(), full + ": " + decoded.status().message());
      }
    } else if (text.status().code() != StatusCode::kNotFound) {
      metadata_error = text.status();
    }
  }
  if (!md) {
    auto rebuilt = mega_storage::RebuildMetadata(s.paths, &s.source);
    if (!rebuilt.ok()) {
      if (!metadata_error.ok() && rebuilt.status().code() == StatusCode::kNotFound) {
        return metadata_error;
      }
      return rebuilt.status();
    }
    md = std::move(*rebuilt);
  }
  if (!md->storage_meta) md->storage_meta = StorageMeta();
  md->storage_meta->load_id = mega_storage::NewSaveId();
  s.metadata = std::make_shared<Metadata>(*md);
  s.files = std::make_unique<mega_storage::ShardFiles>(s.paths.fs, s.paths.dir,
                                                       s.options.verify_checksums);
  if (!s.options.verify_checksums) {
    std::fprintf(
        stderr,
        "megackpt: warning: loading %s with checksum verification off "
        "(MegaStorageReaderOptions::verify_checksums = false): loaded bytes are not verified\n",
        EscapeBytes(s.path).c_str());
  }
  return std::move(*md);
}

Status MegaStorageReader::SetUpStorageReader(const Metadata& metadata, const StorageSetUp& setup) {
  (void)setup;
  if (!impl_->metadata) impl_->metadata = std::make_shared<Metadata>(metadata);
  return Status::OK();
}

Result<LoadPlan> MegaStorageReader::PrepareLocalPlan(LoadPlan plan) { return plan; }

Result<std::vector<LoadPlan>> MegaStorageReader::PrepareGlobalPlan(std::vector<LoadPlan> plans) {
  return plans;
}

namespace {

// A whole piece of at least this size may be read by every thread at once
// (ShardFiles::ReadWhole); smaller ones are one task each.
constexpr uint64_t kWideRead = 64ull << 20;

// One read item, resolved before the reads start.
struct PlannedRead {
  const StorageInfo* info = nullptr;
  const TensorStorageMetadata* tensor = nullptr;  // nullptr: a bytes entry
  const ChunkStorageMetadata* chunk = nullptr;
  Tensor dst;
  uint64_t nbytes = 0;
  bool wide = false;  // read before the others by every thread (ReadWhole)
};

}  // namespace

Status MegaStorageReader::ReadData(const LoadPlan& plan, LoadPlanner& planner) {
  Impl& s = *impl_;
  if (!s.metadata || !s.files) MEGA_RETURN_IF_ERROR(ReadMetadata().status());
  const Metadata& md = *s.metadata;
  const size_t n = plan.items.size();
  std::vector<PlannedRead> reads(n);
  for (size_t i = 0; i < n; ++i) {
    const ReadItem& item = plan.items[i];
    PlannedRead& r = reads[i];
    MetadataIndex key(item.storage_index.fqn, item.storage_index.offset);
    auto info = md.storage_data.find(key);
    if (info == md.storage_data.end()) {
      return NotFoundError(s.path + ": checkpoint has no stored piece " + ToString(key));
    }
    r.info = &info->second;
    auto entry = md.state_dict_metadata.find(key.fqn);
    if (entry == md.state_dict_metadata.end()) {
      return NotFoundError(s.path + ": checkpoint has no entry " + key.fqn);
    }
    if (item.type == LoadItemType::kByteIO) {
      if (!std::holds_alternative<BytesStorageMetadata>(entry->second)) {
        return InvalidArgumentError(s.path + ": " + key.fqn + " is a tensor, not bytes");
      }
      r.nbytes = r.info->length;
      continue;
    }
    const auto* t = std::get_if<TensorStorageMetadata>(&entry->second);
    if (!t) return InvalidArgumentError(s.path + ": " + key.fqn + " is bytes, not a tensor");
    r.tensor = t;
    if (item.storage_index.index && *item.storage_index.index >= 0 &&
        static_cast<size_t>(*item.storage_index.index) < t->chunks.size() &&
        t->chunks[*item.storage_index.index].offsets == key.offset) {
      r.chunk = &t->chunks[*item.storage_index.index];
    } else {
      for (const auto& c : t->chunks) {
        if (key.offset && c.offsets == *key.offset) r.chunk = &c;
      }
    }
    if (!r.chunk) return NotFoundError(s.path + ": checkpoint has no chunk " + ToString(key));
    MEGA_ASSIGN_OR_RETURN(r.dst, planner.ResolveTensor(item));
    if (r.dst.dtype() != t->properties.dtype || r.dst.shape() != item.lengths) {
      return InvalidArgumentError(
          s.path + ": destination of " + ToString(key) + " is " +
          std::string(DTypeName(r.dst.dtype())) + ShapeToString(r.dst.shape()) + ", the read is " +
          std::string(DTypeName(t->properties.dtype)) + ShapeToString(item.lengths));
    }
    r.nbytes = r.dst.nbytes();
  }
  // Phase 1, only when the threads cannot share the items out whole: the whole
  // pieces larger than half a thread's share of the bytes, each read by every
  // thread (the format readers split it; a MEGA piece's CRC is still checked
  // as a whole, from combined partials).
  const int par = s.options.thread_count;
  if (!s.pool && par > 1) s.pool = std::make_unique<ThreadPool>(par - 1);
  uint64_t total = 0;
  for (const PlannedRead& r : reads) total += r.nbytes;
  std::vector<mega_storage::ShardFiles::WholeRead> wide;
  for (size_t i = 0; i < n && par > 1; ++i) {
    PlannedRead& r = reads[i];
    const ReadItem& item = plan.items[i];
    if (!r.tensor || r.nbytes < kWideRead || r.nbytes * 2 * par <= total) continue;
    bool whole = item.lengths == r.chunk->sizes && r.dst.is_contiguous();
    for (int64_t o : item.storage_offsets) whole = whole && o == 0;
    if (!whole) continue;
    r.wide = true;
    wide.push_back({r.info, &item.storage_index.fqn, r.tensor->properties.dtype, &r.chunk->sizes,
                    &r.chunk->offsets, &r.tensor->size, r.dst});
  }
  if (!wide.empty()) MEGA_RETURN_IF_ERROR(s.files->ReadWhole(wide, s.pool.get()));
  // Phase 2: every other item on one thread each, largest first (the pieces of
  // phase 1 only commit).
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return reads[a].nbytes > reads[b].nbytes; });
  return ParallelFor(
      s.pool.get(), n,
      [&](size_t k) -> Status {
        const size_t i = order[k];
        const ReadItem& item = plan.items[i];
        const PlannedRead& r = reads[i];
        const std::string& fqn = item.storage_index.fqn;
        if (!r.tensor) {
          MEGA_ASSIGN_OR_RETURN(std::string value, s.files->ReadBytes(*r.info, fqn));
          return planner.LoadBytes(item, std::move(value));
        }
        if (!r.wide) {
          const TensorStorageMetadata& t = *r.tensor;
          MEGA_RETURN_IF_ERROR(s.files->ReadBox(*r.info, fqn, t.properties.dtype, r.chunk->sizes,
                                                r.chunk->offsets, t.size, item.storage_offsets,
                                                r.dst, s.options.verify_partial_reads));
        }
        return planner.CommitTensor(item, r.dst);
      },
      par);
}

// ============================== free functions ================================

Result<Metadata> RebuildMetadataFromShards(const std::string& path,
                                           std::shared_ptr<fs::FileSystem> fs) {
  MEGA_ASSIGN_OR_RETURN(auto paths, mega_storage::ResolveCheckpointPath(path, std::move(fs)));
  CheckpointSource source;
  return mega_storage::RebuildMetadata(paths, &source);
}

Status VerifyMegaCheckpoint(const std::string& path, int thread_count,
                            std::shared_ptr<fs::FileSystem> fs) {
  MegaStorageReaderOptions o;
  if (!fs) {
    MEGA_ASSIGN_OR_RETURN(fs, fs::FileSystemForPath(path));
  }
  o.fs = std::move(fs);
  // mega://: metadata and shards from one commit.
  MEGA_ASSIGN_OR_RETURN(std::string pinned, o.fs->PinPath(path));
  MegaStorageReader reader(pinned, o);
  MEGA_ASSIGN_OR_RETURN(Metadata md, reader.ReadMetadata());
  MEGA_ASSIGN_OR_RETURN(auto paths, mega_storage::ResolveCheckpointPath(pinned, o.fs));
  mega_storage::ShardFiles files(paths.fs, paths.dir, true);
  std::vector<std::pair<const MetadataIndex*, const StorageInfo*>> pieces;
  for (const auto& [key, info] : md.storage_data) pieces.push_back({&key, &info});
  std::unique_ptr<ThreadPool> pool;
  if (thread_count > 1) pool = std::make_unique<ThreadPool>(thread_count - 1);
  return ParallelFor(
      pool.get(), pieces.size(),
      [&](size_t i) { return files.Verify(*pieces[i].second, pieces[i].first->fqn); },
      std::max(thread_count, 1));
}

}  // namespace megackpt::dcp
