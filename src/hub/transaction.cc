#include "megackpt/hub/transaction.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "hub/util.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {
namespace {

using json = nlohmann::json;

// Streams into a ContentUpload and hands the finished entry to `done`.
class StagingWriter final : public WritableFile {
 public:
  StagingWriter(std::unique_ptr<ContentUpload> upload, std::string name, std::string full_path,
                std::function<Status(StagedEntry, const cas::FileUploadResult*)> done)
      : upload_(std::move(upload)),
        name_(std::move(name)),
        full_path_(std::move(full_path)),
        done_(std::move(done)) {}

  const std::string& name() const override { return name_; }
  Status Append(std::span<const std::byte> data) override {
    if (closed_) return FailedPreconditionError(name_ + ": append after close");
    return upload_->Append(data).WithContext(name_);
  }
  uint64_t size() const override { return upload_->size(); }
  Status Sync() override { return Status::OK(); }
  Status Close() override {
    if (closed_) return FailedPreconditionError(name_ + ": closed twice");
    closed_ = true;
    MEGA_RETURN_IF_ERROR(upload_->Close().WithContext(name_));
    StagedEntry e;
    e.entry = upload_->entry();
    e.entry.path = full_path_;
    return done_(std::move(e), &upload_->result());
  }

 private:
  std::unique_ptr<ContentUpload> upload_;
  std::string name_, full_path_;
  std::function<Status(StagedEntry, const cas::FileUploadResult*)> done_;
  bool closed_ = false;
};

std::string Author() {
  const char* user = std::getenv("USER");
  return user && *user ? user : "megackpt";
}

}  // namespace

std::string SerializeStaged(std::span<const StagedEntry> entries) {
  json arr = json::array();
  for (const auto& e : entries) {
    if (e.deleted) {
      arr.push_back({{"path", e.entry.path}, {"deleted", true}});
    } else {
      arr.push_back({{"path", e.entry.path},
                     {"size", e.entry.size},
                     {"sha256", e.entry.sha256},
                     {"xet_hash", e.entry.xet_hash}});
    }
  }
  return arr.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<std::vector<StagedEntry>> ParseStaged(std::string_view text) {
  json arr = json::parse(text, nullptr, false);
  if (arr.is_discarded() || !arr.is_array()) {
    return InvalidArgumentError("staged entries: not a JSON array");
  }
  std::vector<StagedEntry> out;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& j = arr[i];
    std::string where = "staged entries[" + std::to_string(i) + "]";
    if (!j.is_object() || !j.contains("path") || !j["path"].is_string()) {
      return InvalidArgumentError(where + ": missing path");
    }
    StagedEntry e;
    e.entry.path = j["path"].get<std::string>();
    MEGA_RETURN_IF_ERROR(ValidateRepoPath(e.entry.path).WithContext(where));
    e.deleted = j.value("deleted", false);
    if (!e.deleted) {
      if (!j.contains("size") || !j["size"].is_number_unsigned()) {
        return InvalidArgumentError(where + ": missing size");
      }
      e.entry.size = j["size"].get<uint64_t>();
      e.entry.sha256 = j.value("sha256", "");
      e.entry.xet_hash = j.value("xet_hash", "");
      if (!IsSha256Hex(e.entry.sha256)) return InvalidArgumentError(where + ": bad sha256");
      if (!IsXetHashText(e.entry.xet_hash)) return InvalidArgumentError(where + ": bad xet_hash");
    }
    out.push_back(std::move(e));
  }
  return out;
}

HubTransaction::~HubTransaction() = default;

Result<std::unique_ptr<HubTransaction>> HubTransaction::Begin(std::shared_ptr<HubConnection> hub,
                                                              const MegaUri& root,
                                                              TransactionOptions options,
                                                              std::string base_commit) {
  std::unique_ptr<HubTransaction> txn(new HubTransaction());
  txn->hub_ = std::move(hub);
  txn->root_ = root;
  txn->options_ = std::move(options);
  if (txn->options_.message.empty()) {
    txn->options_.message =
        "megackpt: update " + (root.path.empty() ? std::string("/") : root.path);
  }
  HubConnection& h = *txn->hub_;
  std::string id = root.repo_id();
  if (root.is_bucket) {
    auto b = h.GetBucket(id);
    if (!b.ok()) {
      if (b.status().code() != StatusCode::kNotFound || !txn->options_.create) return b.status();
      MEGA_RETURN_IF_ERROR(
          h.CreateBucket(root.ns, root.name, txn->options_.create_private, true).status());
    }
    return txn;
  }
  if (root.revision.empty()) return InvalidArgumentError(root.ToString() + ": no revision");
  auto repo = h.GetRepo(id);
  if (!repo.ok()) {
    if (repo.status().code() != StatusCode::kNotFound || !txn->options_.create)
      return repo.status();
    RepoSpec spec;
    spec.type = root.type;
    spec.ns = root.ns;
    spec.name = root.name;
    spec.is_private = txn->options_.create_private;
    MEGA_RETURN_IF_ERROR(h.CreateRepo(spec, /*exist_ok=*/true).status());
  }
  MEGA_ASSIGN_OR_RETURN(auto refs, h.ListRefs(id));
  const RefInfo* branch = nullptr;
  bool is_tag = false;
  for (const auto& r : refs) {
    if (r.name != root.revision) continue;
    if (r.is_tag) {
      is_tag = true;
    } else {
      branch = &r;
    }
  }
  if (!branch) {
    if (is_tag || IsCommitId(root.revision)) {
      return FailedPreconditionError(root.ToString() + ": revision '" + root.revision +
                                     "' is not a branch (tags and commits are read-only)");
    }
    if (!txn->options_.create) {
      return NotFoundError("branch not found: " + root.revision + " (repo " + id + ")");
    }
    MEGA_ASSIGN_OR_RETURN(auto created, h.CreateBranch(id, root.revision, "main"));
    txn->base_ = created.target;
  } else {
    txn->base_ = branch->target;
  }
  if (!base_commit.empty()) {
    if (!IsCommitId(base_commit)) {
      return InvalidArgumentError("base commit '" + base_commit + "' is not a 40-hex commit id");
    }
    txn->base_ = base_commit;
  }
  return txn;
}

Result<std::string> HubTransaction::FullPath(std::string_view relative_path) const {
  while (!relative_path.empty() && relative_path.front() == '/') relative_path.remove_prefix(1);
  std::string full = root_.path.empty() ? std::string(relative_path)
                                        : root_.path + "/" + std::string(relative_path);
  MEGA_RETURN_IF_ERROR(ValidateRepoPath(full).WithContext(root_.ToString()));
  return full;
}

Status HubTransaction::Record(StagedEntry entry, const cas::FileUploadResult* upload) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return FailedPreconditionError(root_.ToString() + ": transaction is closed");
  if (upload) {
    ++stats_.files_written;
    stats_.bytes_written += upload->size;
    stats_.new_bytes += upload->stored_bytes;
  }
  std::string path = entry.entry.path;
  staged_[path] = std::move(entry);
  return Status::OK();
}

Result<std::unique_ptr<WritableFile>> HubTransaction::OpenForWrite(std::string_view relative_path) {
  MEGA_ASSIGN_OR_RETURN(std::string full, FullPath(relative_path));
  if (!is_open()) return FailedPreconditionError(root_.ToString() + ": transaction is closed");
  MEGA_ASSIGN_OR_RETURN(MegaUri uri, root_.WithPath(full));
  MEGA_ASSIGN_OR_RETURN(auto upload, hub_->BeginUpload(uri.ToString()));
  return std::unique_ptr<WritableFile>(new StagingWriter(
      std::move(upload), uri.ToString(), full,
      [this](StagedEntry e, const cas::FileUploadResult* r) { return Record(std::move(e), r); }));
}

Status HubTransaction::Put(std::string_view relative_path, std::string_view data) {
  MEGA_ASSIGN_OR_RETURN(auto f, OpenForWrite(relative_path));
  MEGA_RETURN_IF_ERROR(f->Append(AsBytes(data)));
  return f->Close();
}

Status HubTransaction::Delete(std::string_view relative_path) {
  MEGA_ASSIGN_OR_RETURN(std::string full, FullPath(relative_path));
  StagedEntry e;
  e.entry.path = full;
  e.deleted = true;
  return Record(std::move(e));
}

Status HubTransaction::Stage(std::span<const StagedEntry> entries) {
  for (const auto& e : entries) {
    MEGA_RETURN_IF_ERROR(ValidateRepoPath(e.entry.path));
    if (!e.deleted && !IsXetHashText(e.entry.xet_hash)) {
      return InvalidArgumentError("staged entry '" + e.entry.path + "' has no xet hash");
    }
    MEGA_RETURN_IF_ERROR(Record(e));
  }
  return Status::OK();
}

std::vector<StagedEntry> HubTransaction::staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StagedEntry> out;
  out.reserve(staged_.size());
  for (const auto& [path, e] : staged_) out.push_back(e);
  return out;
}

std::optional<StagedEntry> HubTransaction::FindStaged(std::string_view full_path) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = staged_.find(std::string(full_path));
  if (it == staged_.end()) return std::nullopt;
  return it->second;
}

TransactionStats HubTransaction::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool HubTransaction::is_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

void HubTransaction::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = false;
  staged_.clear();
}

Result<CommitInfo> HubTransaction::Commit() {
  std::vector<StagedEntry> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return FailedPreconditionError(root_.ToString() + ": transaction is closed");
    open_ = false;
    for (auto& [path, e] : staged_) entries.push_back(std::move(e));
    staged_.clear();
  }
  if (root_.is_bucket) {
    std::vector<BucketOperation> ops;
    for (const auto& e : entries) {
      BucketOperation op;
      op.kind = e.deleted ? BucketOperation::Kind::kDelete : BucketOperation::Kind::kAdd;
      op.entry.path = e.entry.path;
      op.entry.size = e.entry.size;
      op.entry.sha256 = e.entry.sha256;
      op.entry.xet_hash = e.entry.xet_hash;
      op.entry.mtime_ms = NowMs();
      ops.push_back(std::move(op));
    }
    MEGA_RETURN_IF_ERROR(hub_->BucketBatch(root_.repo_id(), ops).WithContext(root_.ToString()));
    CommitInfo info;
    info.message = options_.message;
    info.created_ms = NowMs();
    return info;
  }
  CommitRequest req;
  req.repo = root_.repo_id();
  req.branch = root_.revision;
  req.message = options_.message;
  req.description = options_.description;
  req.author = Author();
  req.parent = base_;
  req.rebase = options_.rebase;
  req.ignore_missing_deletes = true;
  // Deletions first, so a path deleted and re-added in the same save works.
  for (const auto& e : entries) {
    if (!e.deleted) continue;
    CommitOperation op;
    op.kind = CommitOperation::Kind::kDelete;
    op.path = e.entry.path;
    req.ops.push_back(std::move(op));
  }
  for (const auto& e : entries) {
    if (e.deleted) continue;
    CommitOperation op;
    op.kind = CommitOperation::Kind::kAdd;
    op.path = e.entry.path;
    op.entry = e.entry;
    req.ops.push_back(std::move(op));
  }
  auto c = hub_->Commit(req);
  if (!c.ok()) return c.status().WithContext(root_.ToString());
  return c;
}

}  // namespace megackpt::hub
