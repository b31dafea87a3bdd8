// The mega:// filesystem (contract in include/megackpt/hub/mega_fs.h) and the
// "mega" scheme's registration.
#include "megackpt/hub/mega_fs.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "hub/util.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {
namespace {

bool SameTarget(const MegaUri& a, const MegaUri& b) {
  return a.is_bucket == b.is_bucket && a.ns == b.ns && a.name == b.name &&
         (a.is_bucket || a.revision == b.revision);
}

bool UnderRoot(const MegaUri& root, const MegaUri& u) {
  if (!SameTarget(root, u)) return false;
  if (root.path.empty()) return true;
  return u.path == root.path || u.path.starts_with(root.path + "/");
}

std::string Relative(const MegaUri& root, const std::string& path) {
  if (root.path.empty()) return path;
  return path.size() > root.path.size() ? path.substr(root.path.size() + 1) : std::string();
}

// A single-file write outside a transaction: the file is staged in a private
// transaction that commits when the file closes.
class CommitOnCloseWriter final : public WritableFile {
 public:
  CommitOnCloseWriter(std::unique_ptr<HubTransaction> txn, std::unique_ptr<WritableFile> inner)
      : txn_(std::move(txn)), inner_(std::move(inner)) {}
  ~CommitOnCloseWriter() override {
    if (txn_ && txn_->is_open()) txn_->Abort();
  }
  const std::string& name() const override { return inner_->name(); }
  Status Append(std::span<const std::byte> data) override { return inner_->Append(data); }
  uint64_t size() const override { return inner_->size(); }
  Status Sync() override { return Status::OK(); }
  Status Close() override {
    MEGA_RETURN_IF_ERROR(inner_->Close());
    return txn_->Commit().status();
  }

 private:
  std::unique_ptr<HubTransaction> txn_;
  std::unique_ptr<WritableFile> inner_;
};

std::string StripTrailingSlashes(std::string_view s) {
  std::string out(s);
  while (!out.empty() && out.back() == '/' && !out.ends_with("://")) out.pop_back();
  return out;
}

// fs::Transaction over one HubTransaction (the contract is in mega_fs.h and
// fs/filesystem.h). Relative paths are relative to the root folder; exports
// carry full repo paths (SerializeStaged).
class MegaTransaction final : public fs::Transaction {
 public:
  MegaTransaction(std::shared_ptr<HubTransaction> txn, std::string root)
      : txn_(std::move(txn)), root_(std::move(root)) {
    MegaUri base = txn_->root();
    if (!base.is_bucket) {
      base.revision = txn_->base_commit();
      base.has_revision = true;
    }
    base_root_ = base.ToString();
  }

  const std::string& root() const override { return root_; }
  const std::string& base_root() const override { return base_root_; }
  std::string token() const override { return txn_->base_commit(); }

  Result<std::unique_ptr<WritableFile>> OpenForWrite(std::string_view relative_path) override {
    return txn_->OpenForWrite(relative_path);
  }
  Status Put(std::string_view relative_path, std::string_view data) override {
    return txn_->Put(relative_path, data);
  }
  Status Remove(std::string_view relative_path) override { return txn_->Delete(relative_path); }

  Result<std::string> Export() override { return SerializeStaged(txn_->staged()); }

  Status Import(std::string_view token) override {
    MEGA_ASSIGN_OR_RETURN(std::vector<StagedEntry> entries, ParseStaged(token));
    const std::string& folder = txn_->root().path;
    for (const StagedEntry& e : entries) {
      if (!folder.empty() && !e.entry.path.starts_with(folder + "/")) {
        return InvalidArgumentError("transaction export stages " + e.entry.path + ", outside " +
                                    root_);
      }
    }
    return txn_->Stage(entries);
  }

  std::vector<std::string> staged_files() const override {
    const std::string& folder = txn_->root().path;
    std::vector<std::string> out;
    for (const StagedEntry& e : txn_->staged()) {
      if (e.deleted) continue;
      out.push_back(folder.empty() ? e.entry.path : e.entry.path.substr(folder.size() + 1));
    }
    return out;
  }

  fs::TransactionStats stats() const override { return txn_->stats(); }

  Result<std::string> Commit() override {
    auto c = txn_->Commit();
    if (c.ok()) return c->id;
    const MegaUri& r = txn_->root();
    if (c.status().code() == StatusCode::kAborted && !r.is_bucket) {
      return AbortedError("conflict: branch '" + r.revision + "' of " + r.repo_id() +
                          " moved since this transaction began at " + txn_->base_commit() +
                          " (a concurrent commit); nothing under " + root_ +
                          " changed: " + std::string(c.status().message()));
    }
    return c.status();
  }
  void Abort() override { txn_->Abort(); }
  bool is_open() const override { return txn_->is_open(); }

 private:
  std::shared_ptr<HubTransaction> txn_;
  std::string root_, base_root_;
};

class MegaFs final : public MegaFileSystem {
 public:
  explicit MegaFs(std::shared_ptr<HubConnection> hub) : MegaFileSystem(std::move(hub)) {}

  std::string_view scheme() const override { return "mega"; }

  fs::FileSystemCapabilities capabilities() const override {
    fs::FileSystemCapabilities c;
    c.positioned_writes = false;     // uploads stream
    c.isolated_transactions = true;  // one commit
    c.atomic_rename = true;          // one commit / one batch
    return c;
  }

  Result<std::string> PinPath(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(path));
    if (u.is_bucket || IsCommitId(u.revision)) return path;
    auto commit = hub_->ResolveRevision(u.repo_id(), u.revision);
    if (!commit.ok()) return commit.status().WithContext(path);
    u.revision = *commit;
    u.has_revision = true;
    std::string pinned = u.ToString();
    if (path.size() > 1 && path.back() == '/' && !pinned.ends_with("/")) pinned += "/";
    return pinned;
  }

  Result<std::unique_ptr<fs::Transaction>> BeginTransaction(
      const std::string& root, const fs::TransactionOptions& options) override {
    const std::string clean = StripTrailingSlashes(root);
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(clean));
    if (u.path.empty()) {
      return InvalidArgumentError(root +
                                  ": a transaction needs a folder inside the repository or bucket "
                                  "(e.g. " +
                                  clean + "/ckpt/step-100)");
    }
    TransactionOptions o;
    o.message = options.message;
    o.description = options.description;
    o.rebase = options.rebase;
    o.create = true;
    std::shared_ptr<HubTransaction> txn;
    if (options.capture_filesystem_writes) {
      MEGA_ASSIGN_OR_RETURN(txn, BeginHubTransaction(clean, std::move(o), options.base));
    } else {
      // Not registered for routing: thread ranks of one process sharing this
      // FileSystem each stage into their own transaction.
      MEGA_ASSIGN_OR_RETURN(auto t, HubTransaction::Begin(hub_, u, std::move(o), options.base));
      txn = std::move(t);
    }
    return std::unique_ptr<fs::Transaction>(new MegaTransaction(std::move(txn), clean));
  }

  Result<std::shared_ptr<HubTransaction>> BeginHubTransaction(std::string_view root_uri,
                                                              TransactionOptions options,
                                                              std::string base_commit) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri root, ParseMegaUri(root_uri));
    MEGA_ASSIGN_OR_RETURN(
        auto txn, HubTransaction::Begin(hub_, root, std::move(options), std::move(base_commit)));
    std::shared_ptr<HubTransaction> shared(std::move(txn));
    std::lock_guard<std::mutex> lock(mu_);
    Prune();
    for (const auto& w : txns_) {
      auto t = w.lock();
      if (t && (UnderRoot(t->root(), root) || UnderRoot(root, t->root()))) {
        return FailedPreconditionError("a transaction on " + t->root().ToString() +
                                       " is already open and overlaps " + root.ToString());
      }
    }
    txns_.push_back(shared);
    return shared;
  }

  Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(path));
    if (u.path.empty()) return InvalidArgumentError(path + ": is a repository root, not a file");
    if (auto txn = TxnFor(u)) {
      if (auto staged = txn->FindStaged(u.path)) {
        if (staged->deleted) return NotFoundError(path + ": deleted in the open transaction");
        return hub_->OpenContent(staged->entry, path);
      }
    }
    if (u.is_bucket) {
      auto e = hub_->GetBucketEntry(u.repo_id(), u.path);
      if (!e.ok()) return e.status().WithContext(path);
      FileEntry fe;
      fe.path = e->path;
      fe.size = e->size;
      fe.sha256 = e->sha256;
      fe.xet_hash = e->xet_hash;
      return hub_->OpenFile(u, fe);
    }
    auto commit = hub_->ResolveRevision(u.repo_id(), u.revision);
    if (!commit.ok()) return commit.status().WithContext(path);
    auto e = hub_->GetFile(u.repo_id(), *commit, u.path);
    if (!e.ok()) return e.status().WithContext(path);
    MegaUri pinned = u;
    pinned.revision = *commit;
    pinned.has_revision = true;
    return hub_->OpenFile(pinned, *e);
  }

  Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(path));
    if (u.path.empty()) return InvalidArgumentError(path + ": is a repository root, not a file");
    if (auto txn = TxnFor(u)) return txn->OpenForWrite(Relative(txn->root(), u.path));
    TransactionOptions opts;
    opts.message = "megackpt: write " + u.path;
    opts.rebase = true;  // a lone file write lands on whatever the head is
    MEGA_ASSIGN_OR_RETURN(auto txn, HubTransaction::Begin(hub_, u.Root(), opts));
    MEGA_ASSIGN_OR_RETURN(auto inner, txn->OpenForWrite(u.path));
    return std::unique_ptr<WritableFile>(new CommitOnCloseWriter(std::move(txn), std::move(inner)));
  }

  Status WriteAtomically(const std::string& path, std::string_view data, bool) override {
    MEGA_ASSIGN_OR_RETURN(auto f, OpenForWrite(path));
    MEGA_RETURN_IF_ERROR(f->Append(AsBytes(data)));
    return f->Close();
  }

  Result<bool> Exists(const std::string& path) override {
    auto st = Stat(path);
    if (st.ok()) return true;
    if (st.status().code() == StatusCode::kNotFound) return false;
    return st.status();
  }

  Result<fs::FileInfo> Stat(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(path));
    auto txn = TxnFor(u);
    if (txn && !u.path.empty()) {
      if (auto staged = txn->FindStaged(u.path)) {
        if (staged->deleted) return NotFoundError(path + ": deleted in the open transaction");
        return fs::FileInfo{path, staged->entry.size, false};
      }
    }
    if (u.path.empty()) {
      Status s =
          u.is_bucket ? hub_->GetBucket(u.repo_id()).status() : hub_->GetRepo(u.repo_id()).status();
      if (!s.ok()) return s.WithContext(path);
      return fs::FileInfo{path, 0, true};
    }
    if (u.is_bucket) {
      auto e = hub_->GetBucketEntry(u.repo_id(), u.path);
      if (e.ok()) return fs::FileInfo{path, e->size, false};
      if (e.status().code() != StatusCode::kNotFound) return e.status();
    } else {
      auto commit = hub_->ResolveRevision(u.repo_id(), u.revision);
      if (!commit.ok()) return commit.status().WithContext(path);
      auto e = hub_->GetFile(u.repo_id(), *commit, u.path);
      if (e.ok()) return fs::FileInfo{path, e->size, false};
      if (e.status().code() != StatusCode::kNotFound) return e.status();
    }
    MEGA_ASSIGN_OR_RETURN(auto children, Children(u, txn.get()));
    if (!children.empty()) return fs::FileInfo{path, 0, true};
    return NotFoundError(path + ": no such file or folder");
  }

  Result<std::vector<fs::FileInfo>> List(const std::string& dir) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(dir));
    MEGA_ASSIGN_OR_RETURN(auto children, Children(u, TxnFor(u).get()));
    if (children.empty()) {
      if (!u.path.empty()) return NotFoundError(dir + ": no such folder");
      Status s =
          u.is_bucket ? hub_->GetBucket(u.repo_id()).status() : hub_->GetRepo(u.repo_id()).status();
      if (!s.ok()) return s.WithContext(dir);
    }
    std::vector<fs::FileInfo> out;
    for (auto& [name, info] : children) {
      MEGA_ASSIGN_OR_RETURN(MegaUri child, u.WithPath(u.path.empty() ? name : u.path + "/" + name));
      info.path = child.ToString();
      out.push_back(std::move(info));
    }
    std::sort(out.begin(), out.end(),
              [](const fs::FileInfo& a, const fs::FileInfo& b) { return a.path < b.path; });
    return out;
  }

  Status Remove(const std::string& path) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri u, ParseMegaUri(path));
    if (u.path.empty()) return InvalidArgumentError(path + ": cannot remove a repository root");
    if (auto txn = TxnFor(u)) {
      MEGA_ASSIGN_OR_RETURN(fs::FileInfo info, Stat(path));
      if (info.is_directory) return InvalidArgumentError(path + ": is a folder");
      return txn->Delete(Relative(txn->root(), u.path));
    }
    if (u.is_bucket) {
      MEGA_RETURN_IF_ERROR(hub_->GetBucketEntry(u.repo_id(), u.path).status().WithContext(path));
      BucketOperation op;
      op.kind = BucketOperation::Kind::kDelete;
      op.entry.path = u.path;
      return hub_->BucketBatch(u.repo_id(), {op});
    }
    CommitRequest req;
    req.repo = u.repo_id();
    req.branch = u.revision;
    req.message = "megackpt: remove " + u.path;
    CommitOperation op;
    op.kind = CommitOperation::Kind::kDelete;
    op.path = u.path;
    req.ops.push_back(op);
    auto c = hub_->Commit(req);
    if (!c.ok()) return c.status().WithContext(path);
    return Status::OK();
  }

  Status CreateDirectories(const std::string& dir) override {
    return ParseMegaUri(dir).status();  // folders are implied by file paths
  }

  Status Rename(const std::string& from, const std::string& to) override {
    MEGA_ASSIGN_OR_RETURN(MegaUri a, ParseMegaUri(from));
    MEGA_ASSIGN_OR_RETURN(MegaUri b, ParseMegaUri(to));
    if (!SameTarget(a, b) || a.path.empty() || b.path.empty()) {
      return UnimplementedError("rename " + from + " -> " + to +
                                ": only files within one repo branch or bucket can be renamed");
    }
    auto txn = TxnFor(a);
    if (txn && UnderRoot(txn->root(), b)) {
      std::optional<StagedEntry> src = txn->FindStaged(a.path);
      if (src && src->deleted) return NotFoundError(from + ": deleted in the open transaction");
      FileEntry entry;
      if (src) {
        entry = src->entry;
      } else {
        MEGA_ASSIGN_OR_RETURN(entry, CommittedEntry(a));
      }
      StagedEntry moved;
      moved.entry = entry;
      moved.entry.path = b.path;
      MEGA_RETURN_IF_ERROR(txn->Stage(std::span<const StagedEntry>(&moved, 1)));
      return txn->Delete(Relative(txn->root(), a.path));
    }
    if (a.is_bucket) {
      auto e = hub_->GetBucketEntry(a.repo_id(), a.path);
      if (!e.ok()) return e.status().WithContext(from);
      BucketOperation add;
      add.entry = *e;
      add.entry.path = b.path;
      BucketOperation del;
      del.kind = BucketOperation::Kind::kDelete;
      del.entry.path = a.path;
      return hub_->BucketBatch(a.repo_id(), {add, del});
    }
    CommitRequest req;
    req.repo = a.repo_id();
    req.branch = a.revision;
    req.message = "megackpt: rename " + a.path + " -> " + b.path;
    CommitOperation del_to;
    del_to.kind = CommitOperation::Kind::kDelete;
    del_to.path = b.path;
    CommitOperation copy;
    copy.kind = CommitOperation::Kind::kCopy;
    copy.path = b.path;
    copy.source_path = a.path;
    CommitOperation del;
    del.kind = CommitOperation::Kind::kDelete;
    del.path = a.path;
    req.ops = {del_to, copy, del};
    req.ignore_missing_deletes = true;  // `to` may not exist yet
    auto c = hub_->Commit(req);
    if (!c.ok()) return c.status().WithContext("rename " + from + " -> " + to);
    return Status::OK();
  }

  Status SyncDirectory(const std::string& dir) override { return ParseMegaUri(dir).status(); }

 private:
  Result<FileEntry> CommittedEntry(const MegaUri& u) {
    if (u.is_bucket) {
      MEGA_ASSIGN_OR_RETURN(auto e, hub_->GetBucketEntry(u.repo_id(), u.path));
      FileEntry fe;
      fe.path = e.path;
      fe.size = e.size;
      fe.sha256 = e.sha256;
      fe.xet_hash = e.xet_hash;
      return fe;
    }
    MEGA_ASSIGN_OR_RETURN(std::string commit, hub_->ResolveRevision(u.repo_id(), u.revision));
    return hub_->GetFile(u.repo_id(), commit, u.path);
  }

  // Direct children of folder u.path: name -> info (files and folders),
  // merging the staged changes of an open transaction.
  Result<std::map<std::string, fs::FileInfo>> Children(const MegaUri& u, HubTransaction* txn) {
    std::string prefix = u.path.empty() ? "" : u.path + "/";
    std::map<std::string, uint64_t> files;  // full path -> size
    if (u.is_bucket) {
      auto list = hub_->ListBucket(u.repo_id(), prefix);
      if (!list.ok()) {
        if (list.status().code() != StatusCode::kNotFound || !txn) return list.status();
      } else {
        for (const auto& e : *list) files[e.path] = e.size;
      }
    } else {
      auto commit = hub_->ResolveRevision(u.repo_id(), u.revision);
      if (!commit.ok()) return commit.status();
      MEGA_ASSIGN_OR_RETURN(auto list, hub_->ListFiles(u.repo_id(), *commit, prefix));
      for (const auto& e : list) files[e.path] = e.size;
    }
    if (txn) {
      for (const auto& s : txn->staged()) {
        if (!s.entry.path.starts_with(prefix)) continue;
        if (s.deleted) {
          files.erase(s.entry.path);
        } else {
          files[s.entry.path] = s.entry.size;
        }
      }
    }
    std::map<std::string, fs::FileInfo> out;
    for (const auto& [path, size] : files) {
      std::string rest = path.substr(prefix.size());
      size_t slash = rest.find('/');
      if (slash == std::string::npos) {
        out[rest] = fs::FileInfo{"", size, false};
      } else {
        out.emplace(rest.substr(0, slash), fs::FileInfo{"", 0, true});
      }
    }
    return out;
  }

  void Prune() {
    txns_.erase(std::remove_if(txns_.begin(), txns_.end(),
                               [](const std::weak_ptr<HubTransaction>& w) {
                                 auto t = w.lock();
                                 return !t || !t->is_open();
                               }),
                txns_.end());
  }

  std::shared_ptr<HubTransaction> TxnFor(const MegaUri& u) {
    std::lock_guard<std::mutex> lock(mu_);
    Prune();
    for (const auto& w : txns_) {
      auto t = w.lock();
      if (t && UnderRoot(t->root(), u)) return t;
    }
    return nullptr;
  }

  std::mutex mu_;
  std::vector<std::weak_ptr<HubTransaction>> txns_;
};

}  // namespace

std::shared_ptr<MegaFileSystem> NewMegaFileSystem(std::shared_ptr<HubConnection> hub) {
  return std::make_shared<MegaFs>(std::move(hub));
}

Result<std::shared_ptr<MegaFileSystem>> MegaFileSystemFor(std::string_view endpoint,
                                                          std::optional<std::string> token) {
  MEGA_ASSIGN_OR_RETURN(auto hub, ConnectHub(endpoint, token));
  static std::mutex mu;
  static std::map<HubConnection*, std::weak_ptr<MegaFileSystem>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[hub.get()];
  if (auto fs = slot.lock()) return fs;
  auto fs = NewMegaFileSystem(hub);
  slot = fs;
  return fs;
}

void RegisterMegaScheme() {
  static std::once_flag once;
  std::call_once(once, [] {
    fs::RegisterFileSystemScheme(
        "mega", [](std::string_view path) -> Result<std::shared_ptr<fs::FileSystem>> {
          MEGA_RETURN_IF_ERROR(ParseMegaUri(path).status());
          MEGA_ASSIGN_OR_RETURN(auto fs, MegaFileSystemFor());
          return std::shared_ptr<fs::FileSystem>(std::move(fs));
        });
  });
}

}  // namespace megackpt::hub

// Registers the scheme before main(). A static archive member is linked only
// when something references it, so megackpt::hub's link flags (CMake
// INTERFACE_LINK_OPTIONS, megackpt.pc) name this symbol as undefined
// (-Wl,--undefined=...), which keeps this object, and so its initializer, in
// every program that links the hub.
extern "C" {
extern const int megackpt_hub_mega_scheme_registered;
const int megackpt_hub_mega_scheme_registered = (megackpt::hub::RegisterMegaScheme(), 1);
}
