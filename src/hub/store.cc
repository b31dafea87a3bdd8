// HubStore: SQLite metadata + CAS content. Schema and rules: docs/hub.md.
#include "megackpt/hub/store.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_set>

#include "hub/sqlite.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/hub/mega_uri.h"

namespace megackpt::hub {
namespace {

constexpr int kSchemaVersion = 1;

// The whole schema. Every statement is idempotent so opening an existing root
// is the same code path as creating one.
constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS repos(
  id INTEGER PRIMARY KEY,
  ns TEXT NOT NULL,
  name TEXT NOT NULL,
  type TEXT NOT NULL,
  private INTEGER NOT NULL DEFAULT 0,
  description TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL,
  UNIQUE(ns, name));
CREATE TABLE IF NOT EXISTS commits(
  repo_id INTEGER NOT NULL REFERENCES repos(id) ON DELETE CASCADE,
  id TEXT NOT NULL,
  parent TEXT,
  message TEXT NOT NULL,
  description TEXT NOT NULL,
  author TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  PRIMARY KEY(repo_id, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tree_entries(
  repo_id INTEGER NOT NULL,
  commit_id TEXT NOT NULL,
  path TEXT NOT NULL,
  size INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  xet_hash TEXT NOT NULL,
  PRIMARY KEY(repo_id, commit_id, path),
  FOREIGN KEY(repo_id, commit_id) REFERENCES commits(repo_id, id) ON DELETE CASCADE) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tree_entries_xet ON tree_entries(xet_hash);
CREATE TABLE IF NOT EXISTS commit_changes(
  repo_id INTEGER NOT NULL,
  commit_id TEXT NOT NULL,
  path TEXT NOT NULL,
  change TEXT NOT NULL,
  size INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  previous_sha256 TEXT NOT NULL,
  PRIMARY KEY(repo_id, commit_id, path),
  FOREIGN KEY(repo_id, commit_id) REFERENCES commits(repo_id, id) ON DELETE CASCADE) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS refs(
  repo_id INTEGER NOT NULL REFERENCES repos(id) ON DELETE CASCADE,
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  target TEXT NOT NULL,
  message TEXT,
  updated_ms INTEGER NOT NULL,
  PRIMARY KEY(repo_id, kind, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS content(
  xet_hash TEXT PRIMARY KEY,
  size INTEGER NOT NULL,
  sha256 TEXT NOT NULL DEFAULT '',
  sha256_verified INTEGER NOT NULL DEFAULT 0,
  recorded_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS content_sha256 ON content(sha256) WHERE sha256_verified = 1;
CREATE TABLE IF NOT EXISTS buckets(
  id INTEGER PRIMARY KEY,
  ns TEXT NOT NULL,
  name TEXT NOT NULL,
  private INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  UNIQUE(ns, name));
CREATE TABLE IF NOT EXISTS bucket_entries(
  bucket_id INTEGER NOT NULL REFERENCES buckets(id) ON DELETE CASCADE,
  path TEXT NOT NULL,
  size INTEGER NOT NULL,
  xet_hash TEXT NOT NULL,
  sha256 TEXT NOT NULL DEFAULT '',
  content_type TEXT NOT NULL DEFAULT '',
  mtime_ms INTEGER NOT NULL,
  uploaded_ms INTEGER NOT NULL,
  PRIMARY KEY(bucket_id, path)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS bucket_entries_xet ON bucket_entries(xet_hash);
CREATE TABLE IF NOT EXISTS tokens(
  hash TEXT PRIMARY KEY,
  scope TEXT NOT NULL,
  namespace TEXT,
  description TEXT NOT NULL DEFAULT '',
  created_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS uploads(
  id TEXT PRIMARY KEY,
  repo TEXT NOT NULL,
  path TEXT NOT NULL,
  revision TEXT NOT NULL,
  size INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  part_size INTEGER NOT NULL,
  stage_only INTEGER NOT NULL,
  created_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS upload_parts(
  upload_id TEXT NOT NULL REFERENCES uploads(id) ON DELETE CASCADE,
  part_number INTEGER NOT NULL,
  etag TEXT NOT NULL,
  size INTEGER NOT NULL,
  PRIMARY KEY(upload_id, part_number)) WITHOUT ROWID;
)sql";

std::string Quote(std::string_view s) { return "'" + std::string(s) + "'"; }

// Runs `fn` in a write transaction, retrying a few times when SQLite reports
// the database busy beyond its busy timeout (a long GC, heavy contention).
template <typename Fn>
auto WithWriteTxn(SqliteDb* db, Fn&& fn) -> decltype(fn()) {
  for (int attempt = 0;; ++attempt) {
    auto txn = SqliteTxn::Begin(db, /*write=*/true);
    if (!txn.ok()) {
      if (txn.status().code() == StatusCode::kUnavailable && attempt < 3) continue;
      return txn.status();
    }
    auto result = fn();
    if (!internal::AsStatus(result).ok()) return result;  // txn rolls back
    Status s = txn->Commit();
    if (!s.ok()) {
      if (s.code() == StatusCode::kUnavailable && attempt < 3) continue;
      return s;
    }
    return result;
  }
}

// A RandomAccessFile with no bytes (empty files have no CAS object).
class EmptyFile final : public RandomAccessFile {
 public:
  explicit EmptyFile(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return 0; }
  Result<size_t> ReadAt(uint64_t, std::span<std::byte>) const override { return size_t{0}; }

 private:
  std::string name_;
};

// Gives a CAS file the caller's name and checks its size.
class NamedFile final : public RandomAccessFile {
 public:
  NamedFile(std::unique_ptr<RandomAccessFile> base, std::string name)
      : base_(std::move(base)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return base_->size(); }
  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    auto r = base_->ReadAt(offset, dst);
    if (!r.ok()) return r.status().WithContext(name_);
    return r;
  }

 private:
  std::unique_ptr<RandomAccessFile> base_;
  std::string name_;
};

TokenScope ScopeFromText(std::string_view s) {
  return s == "write" ? TokenScope::kWrite : TokenScope::kRead;
}

}  // namespace

// ---------------------------------------------------------------------------
// ContentUpload
// ---------------------------------------------------------------------------

struct ContentUpload::ShaState {
  Sha256 sha;
};

ContentUpload::ContentUpload(std::string name, std::unique_ptr<cas::UploadStream> stream)
    : name_(std::move(name)), stream_(std::move(stream)), sha_(std::make_unique<ShaState>()) {}

ContentUpload::~ContentUpload() = default;

Status ContentUpload::Append(std::span<const std::byte> data) {
  if (closed_) return FailedPreconditionError(name_ + ": append after close");
  sha_->sha.Update(data);
  MEGA_RETURN_IF_ERROR(stream_->Append(data));
  size_ += data.size();
  return Status::OK();
}

Status ContentUpload::Close() {
  if (closed_) return FailedPreconditionError(name_ + ": closed twice");
  closed_ = true;
  MEGA_ASSIGN_OR_RETURN(result_, stream_->Finish());
  entry_.size = size_;
  entry_.sha256 = ToHex(sha_->sha.Finish());
  entry_.xet_hash = size_ == 0 ? std::string(kEmptyXetHash) : result_.file_hash.ToHex();
  if (result_.size != size_) {
    return InternalError(name_ + ": CAS upload reports " + std::to_string(result_.size) +
                         " bytes, " + std::to_string(size_) + " were written");
  }
  if (on_close_) MEGA_RETURN_IF_ERROR(on_close_(entry_, result_));
  return Status::OK();
}

Result<std::unique_ptr<RandomAccessFile>> OpenCasContent(cas::CasStore& cas, const FileEntry& entry,
                                                         std::string name) {
  if (entry.size == 0) return std::unique_ptr<RandomAccessFile>(new EmptyFile(std::move(name)));
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(entry.xet_hash));
  auto file = cas.OpenFile(hash);
  if (!file.ok()) return file.status().WithContext(name);
  if ((*file)->size() != entry.size) {
    return DataLossError(name + ": content " + entry.xet_hash + " has " +
                         std::to_string((*file)->size()) + " bytes, the entry says " +
                         std::to_string(entry.size));
  }
  return std::unique_ptr<RandomAccessFile>(new NamedFile(*std::move(file), std::move(name)));
}

// ---------------------------------------------------------------------------
// HubStore
// ---------------------------------------------------------------------------

struct HubStore::Impl {
  std::unique_ptr<SqlitePool> pool;
  std::string secret;
};

HubStore::~HubStore() = default;

Result<std::unique_ptr<HubStore>> HubStore::Open(const std::string& root,
                                                 const HubStoreOptions& options) {
  MEGA_RETURN_IF_ERROR(CreateDirectories(root));
  MEGA_RETURN_IF_ERROR(CreateDirectories(root + "/uploads"));
  std::unique_ptr<HubStore> store(new HubStore());
  store->root_ = root;
  store->impl_ = std::make_unique<Impl>();
  cas::LocalBackendOptions local;
  local.sync = options.sync;
  auto cas = cas::CasStore::OpenLocal(root + "/cas", options.cas, local);
  if (!cas.ok()) return cas.status().WithContext("hub root " + root);
  store->cas_ = *std::move(cas);
  auto pool = SqlitePool::Open(root + "/hub.db", options.db_connections);
  if (!pool.ok()) return pool.status().WithContext("hub root " + root);
  store->impl_->pool = *std::move(pool);

  MEGA_ASSIGN_OR_RETURN(auto db, store->impl_->pool->Acquire());
  Status s = WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_RETURN_IF_ERROR(db->Exec(kSchema));
    MEGA_ASSIGN_OR_RETURN(auto get, db->Prepare("SELECT value FROM meta WHERE key='schema_version'"));
    MEGA_ASSIGN_OR_RETURN(bool has, get.Step());
    if (has) {
      std::string v = get.Text(0);
      if (v != std::to_string(kSchemaVersion)) {
        return FailedPreconditionError("hub root " + root + ": schema version " + v +
                                       " is not supported (expected " +
                                       std::to_string(kSchemaVersion) + ")");
      }
    } else {
      MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare("INSERT INTO meta(key, value) VALUES(?, ?)"));
      MEGA_RETURN_IF_ERROR(ins.Bind(1, "schema_version").Bind(2, std::to_string(kSchemaVersion)).Run());
      MEGA_ASSIGN_OR_RETURN(auto ins2, db->Prepare("INSERT INTO meta(key, value) VALUES(?, ?)"));
      MEGA_RETURN_IF_ERROR(ins2.Bind(1, "secret").Bind(2, RandomHex(32)).Run());
    }
    return Status::OK();
  });
  if (!s.ok()) return s.WithContext("hub root " + root);
  return store;
}

namespace {

struct RepoRow {
  int64_t id = 0;
  RepoInfo info;
};

constexpr const char* kRepoColumns =
    "id, ns, name, type, private, description, created_ms, updated_ms";

RepoRow ReadRepoRow(const SqliteStmt& st) {
  RepoRow r;
  r.id = st.Int(0);
  r.info.ns = st.Text(1);
  r.info.name = st.Text(2);
  auto type = RepoTypeFromName(st.Text(3));
  r.info.type = type.ok() ? *type : RepoType::kModel;
  r.info.is_private = st.Int(4) != 0;
  r.info.description = st.Text(5);
  r.info.created_ms = st.Int(6);
  r.info.updated_ms = st.Int(7);
  return r;
}

Result<RepoRow> FindRepo(SqliteDb* db, std::string_view repo) {
  MEGA_ASSIGN_OR_RETURN(auto parts, SplitRepoId(repo));
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(std::string("SELECT ") + kRepoColumns +
                                             " FROM repos WHERE ns = ? AND name = ?"));
  st.Bind(1, parts.first).Bind(2, parts.second);
  MEGA_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return NotFoundError("repo " + Quote(repo) + " not found");
  return ReadRepoRow(st);
}

Result<std::optional<std::string>> FindRef(SqliteDb* db, int64_t repo_id, std::string_view kind,
                                           std::string_view name) {
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT target FROM refs WHERE repo_id = ? AND kind = ? AND name = ?"));
  st.Bind(1, repo_id).Bind(2, kind).Bind(3, name);
  MEGA_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(st.Text(0));
}

Result<bool> CommitExists(SqliteDb* db, int64_t repo_id, std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT 1 FROM commits WHERE repo_id = ? AND id = ?"));
  st.Bind(1, repo_id).Bind(2, id);
  return st.Step();
}

Result<std::string> Resolve(SqliteDb* db, const RepoRow& repo, std::string_view revision) {
  if (revision.empty()) return InvalidArgumentError("empty revision for " + repo.info.id());
  MEGA_ASSIGN_OR_RETURN(auto branch, FindRef(db, repo.id, "branch", revision));
  if (branch) return *branch;
  MEGA_ASSIGN_OR_RETURN(auto tag, FindRef(db, repo.id, "tag", revision));
  if (tag) return *tag;
  if (IsXetHashText(revision) || revision.size() == 40) {
    std::string lower = ToLower(revision);
    if (IsCommitId(lower)) {
      MEGA_ASSIGN_OR_RETURN(bool exists, CommitExists(db, repo.id, lower));
      if (exists) return lower;
    }
  }
  return NotFoundError("revision " + Quote(revision) + " not found in " + repo.info.id());
}

CommitInfo ReadCommitRow(const SqliteStmt& st, int first_col) {
  CommitInfo c;
  c.id = st.Text(first_col);
  c.parent = st.OptText(first_col + 1);
  c.message = st.Text(first_col + 2);
  c.description = st.Text(first_col + 3);
  c.author = st.Text(first_col + 4);
  c.created_ms = st.Int(first_col + 5);
  return c;
}

Result<std::optional<FileEntry>> FindTreeEntry(SqliteDb* db, int64_t repo_id,
                                               std::string_view commit, std::string_view path) {
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT size, sha256, xet_hash FROM tree_entries WHERE repo_id = ? AND commit_id = ? AND path = ?"));
  st.Bind(1, repo_id).Bind(2, commit).Bind(3, path);
  MEGA_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<FileEntry>();
  FileEntry e;
  e.path = std::string(path);
  e.size = static_cast<uint64_t>(st.Int(0));
  e.sha256 = st.Text(1);
  e.xet_hash = st.Text(2);
  return std::optional<FileEntry>(std::move(e));
}

// The smallest string greater than every string starting with `prefix`
// (prefix ends in '/', so bumping it to '0' bounds the range).
std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

std::string NewCommitId(std::string_view repo, std::string_view base, std::string_view message) {
  std::string seed = std::string(repo) + '\n' + std::string(base) + '\n' + std::string(message) +
                     '\n' + std::to_string(NowMs()) + '\n' + RandomHex(16);
  return Sha256Hex(seed).substr(0, 40);
}

}  // namespace

Result<RepoInfo> HubStore::CreateRepo(const RepoSpec& spec, bool exist_ok) {
  MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(spec.ns, "namespace"));
  MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(spec.name, "name"));
  std::string id = spec.ns + "/" + spec.name;
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Result<RepoInfo> {
    auto existing = FindRepo(db.db(), id);
    if (existing.ok()) {
      if (exist_ok) return existing->info;
      return AlreadyExistsError("repo " + Quote(id) + " already exists");
    }
    if (existing.status().code() != StatusCode::kNotFound) return existing.status();
    int64_t now = NowMs();
    MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare(
        "INSERT INTO repos(ns, name, type, private, description, created_ms, updated_ms) "
        "VALUES(?, ?, ?, ?, ?, ?, ?)"));
    ins.Bind(1, spec.ns).Bind(2, spec.name).Bind(3, RepoTypeName(spec.type))
        .Bind(4, int64_t{spec.is_private}).Bind(5, spec.description).Bind(6, now).Bind(7, now);
    MEGA_RETURN_IF_ERROR(ins.Run());
    int64_t repo_id = db->LastInsertRowId();
    std::string commit = NewCommitId(id, "", "initial commit");
    MEGA_ASSIGN_OR_RETURN(auto c, db->Prepare(
        "INSERT INTO commits(repo_id, id, parent, message, description, author, created_ms) "
        "VALUES(?, ?, NULL, 'initial commit', '', 'megahub', ?)"));
    MEGA_RETURN_IF_ERROR(c.Bind(1, repo_id).Bind(2, commit).Bind(3, now).Run());
    MEGA_ASSIGN_OR_RETURN(auto r, db->Prepare(
        "INSERT INTO refs(repo_id, kind, name, target, message, updated_ms) "
        "VALUES(?, 'branch', 'main', ?, NULL, ?)"));
    MEGA_RETURN_IF_ERROR(r.Bind(1, repo_id).Bind(2, commit).Bind(3, now).Run());
    RepoInfo info;
    info.type = spec.type;
    info.ns = spec.ns;
    info.name = spec.name;
    info.is_private = spec.is_private;
    info.description = spec.description;
    info.created_ms = info.updated_ms = now;
    return info;
  });
}

Result<RepoInfo> HubStore::GetRepo(std::string_view repo) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  return row.info;
}

Status HubStore::DeleteRepo(std::string_view repo) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
    MEGA_ASSIGN_OR_RETURN(auto del, db->Prepare("DELETE FROM repos WHERE id = ?"));
    return del.Bind(1, row.id).Run();
  });
}

Result<std::vector<RepoInfo>> HubStore::ListRepos(std::string_view owner, std::string_view after,
                                                  size_t limit) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      std::string("SELECT ") + kRepoColumns +
      " FROM repos WHERE (? = '' OR ns = ?) AND (ns || '/' || name) > ? "
      "ORDER BY ns || '/' || name LIMIT ?"));
  st.Bind(1, owner).Bind(2, owner).Bind(3, after).Bind(4, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
  std::vector<RepoInfo> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(ReadRepoRow(st).info);
  }
  return out;
}

Result<std::string> HubStore::ResolveRevision(std::string_view repo, std::string_view revision) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  return Resolve(db.db(), row, revision);
}

Result<std::vector<RefInfo>> HubStore::ListRefs(std::string_view repo) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT kind, name, target, message, updated_ms FROM refs WHERE repo_id = ? "
      "ORDER BY kind, name"));
  st.Bind(1, row.id);
  std::vector<RefInfo> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) break;
    RefInfo r;
    r.is_tag = st.Text(0) == "tag";
    r.name = st.Text(1);
    r.target = st.Text(2);
    r.message = st.OptText(3);
    r.updated_ms = st.Int(4);
    out.push_back(std::move(r));
  }
  return out;
}

Result<RefInfo> HubStore::CreateRef(std::string_view repo, std::string_view name,
                                    std::string_view revision, bool is_tag, bool exist_ok,
                                    std::optional<std::string> message) {
  MEGA_RETURN_IF_ERROR(ValidateRevision(name).WithContext(is_tag ? "tag name" : "branch name"));
  if (IsCommitId(name)) {
    return InvalidArgumentError(std::string(is_tag ? "tag" : "branch") + " name " + Quote(name) +
                                " looks like a commit id");
  }
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Result<RefInfo> {
    MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
    const char* kind = is_tag ? "tag" : "branch";
    MEGA_ASSIGN_OR_RETURN(auto existing, FindRef(db.db(), row.id, kind, name));
    if (existing) {
      if (!exist_ok) {
        return AlreadyExistsError(std::string(kind) + " " + Quote(name) + " already exists in " +
                                  std::string(repo));
      }
      RefInfo r;
      r.name = std::string(name);
      r.is_tag = is_tag;
      r.target = *existing;
      return r;
    }
    MEGA_ASSIGN_OR_RETURN(std::string target, Resolve(db.db(), row, revision));
    int64_t now = NowMs();
    MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare(
        "INSERT INTO refs(repo_id, kind, name, target, message, updated_ms) VALUES(?, ?, ?, ?, ?, ?)"));
    MEGA_RETURN_IF_ERROR(
        ins.Bind(1, row.id).Bind(2, kind).Bind(3, name).Bind(4, target).Bind(5, message).Bind(6, now).Run());
    RefInfo r;
    r.name = std::string(name);
    r.is_tag = is_tag;
    r.target = target;
    r.message = message;
    r.updated_ms = now;
    return r;
  });
}

Status HubStore::DeleteRef(std::string_view repo, std::string_view name, bool is_tag) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
    MEGA_ASSIGN_OR_RETURN(auto del, db->Prepare(
        "DELETE FROM refs WHERE repo_id = ? AND kind = ? AND name = ?"));
    MEGA_RETURN_IF_ERROR(del.Bind(1, row.id).Bind(2, is_tag ? "tag" : "branch").Bind(3, name).Run());
    if (del.Changes() == 0) {
      return NotFoundError(std::string(is_tag ? "tag " : "branch ") + Quote(name) +
                           " not found in " + std::string(repo));
    }
    return Status::OK();
  });
}

Result<CommitInfo> HubStore::GetCommit(std::string_view repo, std::string_view revision,
                                       bool with_changes) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto txn, SqliteTxn::Begin(db.db(), /*write=*/false));
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  MEGA_ASSIGN_OR_RETURN(std::string id, Resolve(db.db(), row, revision));
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT id, parent, message, description, author, created_ms FROM commits "
      "WHERE repo_id = ? AND id = ?"));
  st.Bind(1, row.id).Bind(2, id);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return NotFoundError("commit " + id + " not found in " + std::string(repo));
  CommitInfo c = ReadCommitRow(st, 0);
  if (with_changes) {
    MEGA_ASSIGN_OR_RETURN(auto ch, db->Prepare(
        "SELECT path, change, size, sha256, previous_sha256 FROM commit_changes "
        "WHERE repo_id = ? AND commit_id = ? ORDER BY path"));
    ch.Bind(1, row.id).Bind(2, id);
    while (true) {
      MEGA_ASSIGN_OR_RETURN(bool more, ch.Step());
      if (!more) break;
      FileChange f;
      f.path = ch.Text(0);
      f.change = ch.Text(1);
      f.size = static_cast<uint64_t>(ch.Int(2));
      f.sha256 = ch.Text(3);
      f.previous_sha256 = ch.Text(4);
      c.changes.push_back(std::move(f));
    }
  }
  return c;
}

Result<std::vector<CommitInfo>> HubStore::ListCommits(std::string_view repo,
                                                      std::string_view revision, size_t offset,
                                                      size_t limit) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto txn, SqliteTxn::Begin(db.db(), /*write=*/false));
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  MEGA_ASSIGN_OR_RETURN(std::string id, Resolve(db.db(), row, revision));
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "WITH RECURSIVE chain(id, depth) AS ("
      "  SELECT ?2, 0"
      "  UNION ALL SELECT c.parent, chain.depth + 1 FROM commits c JOIN chain ON c.id = chain.id"
      "  WHERE c.repo_id = ?1 AND c.parent IS NOT NULL) "
      "SELECT c.id, c.parent, c.message, c.description, c.author, c.created_ms "
      "FROM chain JOIN commits c ON c.id = chain.id AND c.repo_id = ?1 "
      "ORDER BY chain.depth LIMIT ?3 OFFSET ?4"));
  st.Bind(1, row.id).Bind(2, id)
      .Bind(3, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)))
      .Bind(4, static_cast<int64_t>(std::min<size_t>(offset, INT64_MAX)));
  std::vector<CommitInfo> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) break;
    out.push_back(ReadCommitRow(st, 0));
  }
  return out;
}

Result<std::vector<FileEntry>> HubStore::ListFiles(std::string_view repo,
                                                   std::string_view commit_id,
                                                   std::string_view prefix, std::string_view after,
                                                   size_t limit) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  MEGA_ASSIGN_OR_RETURN(bool exists, CommitExists(db.db(), row.id, commit_id));
  if (!exists) {
    return NotFoundError("commit " + Quote(commit_id) + " not found in " + std::string(repo));
  }
  // Range scan on the primary key: path >= prefix and path < prefix-end.
  std::string sql =
      "SELECT path, size, sha256, xet_hash FROM tree_entries WHERE repo_id = ? AND commit_id = ? "
      "AND path >= ? AND path > ? ";
  if (!prefix.empty()) sql += "AND substr(path, 1, ?) = ? ";
  sql += "ORDER BY path LIMIT ?";
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(sql));
  st.Bind(1, row.id).Bind(2, commit_id).Bind(3, prefix).Bind(4, after);
  int i = 5;
  if (!prefix.empty()) {
    st.Bind(5, static_cast<int64_t>(prefix.size())).Bind(6, prefix);
    i = 7;
  }
  st.Bind(i, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
  std::vector<FileEntry> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) break;
    FileEntry e;
    e.path = st.Text(0);
    e.size = static_cast<uint64_t>(st.Int(1));
    e.sha256 = st.Text(2);
    e.xet_hash = st.Text(3);
    out.push_back(std::move(e));
  }
  return out;
}

Result<FileEntry> HubStore::GetFile(std::string_view repo, std::string_view commit_id,
                                    std::string_view path) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  MEGA_ASSIGN_OR_RETURN(auto e, FindTreeEntry(db.db(), row.id, commit_id, path));
  if (!e) {
    return NotFoundError("entry " + Quote(path) + " not found in " + std::string(repo) + " at " +
                         std::string(commit_id));
  }
  return *e;
}

namespace {

// Checks that `entry` names stored content of the right size, recording it in
// the content table when only the CAS knew it.
Status CheckContent(SqliteDb* db, cas::CasStore& cas, const FileEntry& entry,
                    std::string_view path) {
  if (!IsXetHashText(entry.xet_hash)) {
    return InvalidArgumentError("path " + Quote(path) + ": bad xet hash " + Quote(entry.xet_hash));
  }
  if (!entry.sha256.empty() && !IsSha256Hex(entry.sha256)) {
    return InvalidArgumentError("path " + Quote(path) + ": bad sha256 " + Quote(entry.sha256));
  }
  if (entry.xet_hash == kEmptyXetHash) {
    if (entry.size != 0) {
      return InvalidArgumentError("path " + Quote(path) + ": empty-file hash with size " +
                                  std::to_string(entry.size));
    }
    return Status::OK();
  }
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT size FROM content WHERE xet_hash = ?"));
  st.Bind(1, ToLower(entry.xet_hash));
  MEGA_ASSIGN_OR_RETURN(bool known, st.Step());
  uint64_t size = 0;
  if (known) {
    size = static_cast<uint64_t>(st.Int(0));
  } else {
    MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(entry.xet_hash));
    auto recon = cas.GetReconstruction(hash);
    if (!recon.ok()) {
      if (recon.status().code() == StatusCode::kNotFound) {
        return FailedPreconditionError("path " + Quote(path) + ": content " + entry.xet_hash +
                                       " was not uploaded");
      }
      return recon.status();
    }
    size = recon->size;
    MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare(
        "INSERT OR IGNORE INTO content(xet_hash, size, sha256, sha256_verified, recorded_ms) "
        "VALUES(?, ?, ?, 0, ?)"));
    MEGA_RETURN_IF_ERROR(ins.Bind(1, ToLower(entry.xet_hash)).Bind(2, static_cast<int64_t>(size))
                             .Bind(3, entry.sha256).Bind(4, NowMs()).Run());
  }
  if (size != entry.size) {
    return InvalidArgumentError("path " + Quote(path) + ": size " + std::to_string(entry.size) +
                                " does not match the uploaded content " + entry.xet_hash + " (" +
                                std::to_string(size) + " bytes)");
  }
  return Status::OK();
}

// Rejects a file whose path is a folder of another file or vice versa.
Status CheckNoFileFolderClash(SqliteDb* db, int64_t repo_id, std::string_view commit,
                              std::string_view path) {
  std::string under = std::string(path) + "/";
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT path FROM tree_entries WHERE repo_id = ? AND commit_id = ? AND path >= ? AND path < ? LIMIT 1"));
  st.Bind(1, repo_id).Bind(2, commit).Bind(3, under).Bind(4, PrefixEnd(under));
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (has) {
    return InvalidArgumentError("path " + Quote(path) + " is a folder (it holds " +
                                Quote(st.Text(0)) + ")");
  }
  for (size_t slash = path.find('/'); slash != std::string_view::npos;
       slash = path.find('/', slash + 1)) {
    std::string_view parent = path.substr(0, slash);
    MEGA_ASSIGN_OR_RETURN(auto e, FindTreeEntry(db, repo_id, commit, parent));
    if (e) {
      return InvalidArgumentError("path " + Quote(path) + ": " + Quote(parent) + " is a file");
    }
  }
  return Status::OK();
}

}  // namespace

Result<CommitInfo> HubStore::Commit(const CommitRequest& req) {
  if (req.parent && !IsCommitId(*req.parent)) {
    return InvalidArgumentError("parent revision " + Quote(*req.parent) +
                                " is not a 40-hex commit id");
  }
  MEGA_RETURN_IF_ERROR(ValidateRevision(req.branch).WithContext("branch"));
  for (const auto& op : req.ops) {
    MEGA_RETURN_IF_ERROR(ValidateRepoPath(op.path));
    if (op.kind == CommitOperation::Kind::kCopy) MEGA_RETURN_IF_ERROR(ValidateRepoPath(op.source_path));
  }
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  SqliteDb* d = db.db();
  return WithWriteTxn(d, [&]() -> Result<CommitInfo> {
    MEGA_ASSIGN_OR_RETURN(auto repo, FindRepo(d, req.repo));
    MEGA_ASSIGN_OR_RETURN(auto head, FindRef(d, repo.id, "branch", req.branch));
    if (!head && !req.create_branch) {
      return NotFoundError("branch not found: " + req.branch + " (repo " + req.repo + ")");
    }
    if (req.parent) {
      MEGA_ASSIGN_OR_RETURN(bool known, CommitExists(d, repo.id, *req.parent));
      if (!known) {
        return NotFoundError("parent revision " + *req.parent + " not found in " + req.repo);
      }
    }
    std::optional<std::string> base = head ? head : req.parent;
    if (head && req.parent && *head != *req.parent) {
      std::string conflict = "conflict: branch '" + req.branch + "' of " + req.repo + " is at " +
                             *head + ", not at the expected parent " + *req.parent;
      if (!req.rebase) return AbortedError(conflict);
      // Rebase: the paths this commit touches must be unchanged between the
      // expected parent and the head.
      MEGA_ASSIGN_OR_RETURN(auto diff, d->Prepare(
          "SELECT path FROM (SELECT path, xet_hash, sha256 FROM tree_entries WHERE repo_id = ?1 AND commit_id = ?2 "
          "  EXCEPT SELECT path, xet_hash, sha256 FROM tree_entries WHERE repo_id = ?1 AND commit_id = ?3) "
          "UNION SELECT path FROM (SELECT path, xet_hash, sha256 FROM tree_entries WHERE repo_id = ?1 AND commit_id = ?3 "
          "  EXCEPT SELECT path, xet_hash, sha256 FROM tree_entries WHERE repo_id = ?1 AND commit_id = ?2)"));
      diff.Bind(1, repo.id).Bind(2, *req.parent).Bind(3, *head);
      std::set<std::string> changed;
      while (true) {
        MEGA_ASSIGN_OR_RETURN(bool has, diff.Step());
        if (!has) break;
        changed.insert(diff.Text(0));
      }
      for (const auto& op : req.ops) {
        bool clash = changed.count(op.path) > 0;
        if (!clash && op.kind == CommitOperation::Kind::kDeleteFolder) {
          auto it = changed.lower_bound(op.path + "/");
          clash = it != changed.end() && it->starts_with(op.path + "/");
        }
        if (clash) {
          return AbortedError(conflict + "; cannot rebase: path '" + op.path +
                              "' changed on the branch since");
        }
      }
    }

    int64_t now = NowMs();
    std::string id = NewCommitId(req.repo, base.value_or(""), req.message);
    MEGA_ASSIGN_OR_RETURN(auto ins, d->Prepare(
        "INSERT INTO commits(repo_id, id, parent, message, description, author, created_ms) "
        "VALUES(?, ?, ?, ?, ?, ?, ?)"));
    MEGA_RETURN_IF_ERROR(ins.Bind(1, repo.id).Bind(2, id).Bind(3, base).Bind(4, req.message)
                             .Bind(5, req.description).Bind(6, req.author).Bind(7, now).Run());
    if (base) {
      MEGA_ASSIGN_OR_RETURN(auto copy, d->Prepare(
          "INSERT INTO tree_entries(repo_id, commit_id, path, size, sha256, xet_hash) "
          "SELECT repo_id, ?2, path, size, sha256, xet_hash FROM tree_entries "
          "WHERE repo_id = ?1 AND commit_id = ?3"));
      MEGA_RETURN_IF_ERROR(copy.Bind(1, repo.id).Bind(2, id).Bind(3, *base).Run());
    }

    // path -> change, merged when one commit touches a path twice.
    std::map<std::string, FileChange> changes;
    auto note = [&](const std::string& path, std::string_view kind, const FileEntry* now_entry,
                    const std::optional<FileEntry>& before) {
      auto it = changes.find(path);
      FileChange c;
      c.path = path;
      c.previous_sha256 = it != changes.end() ? it->second.previous_sha256
                                              : (before ? before->sha256 : "");
      bool existed_before = it != changes.end() ? it->second.change != "add" : before.has_value();
      if (now_entry) {
        c.change = existed_before ? "modify" : "add";
        c.size = now_entry->size;
        c.sha256 = now_entry->sha256;
      } else {
        if (!existed_before) {
          if (it != changes.end()) changes.erase(it);
          return;
        }
        c.change = "delete";
      }
      (void)kind;
      changes[path] = std::move(c);
    };
    auto put = [&](const std::string& path, FileEntry entry) -> Status {
      MEGA_RETURN_IF_ERROR(CheckContent(d, *cas_, entry, path));
      entry.xet_hash = ToLower(entry.xet_hash);
      MEGA_RETURN_IF_ERROR(CheckNoFileFolderClash(d, repo.id, id, path));
      MEGA_ASSIGN_OR_RETURN(auto before, FindTreeEntry(d, repo.id, id, path));
      MEGA_ASSIGN_OR_RETURN(auto up, d->Prepare(
          "INSERT OR REPLACE INTO tree_entries(repo_id, commit_id, path, size, sha256, xet_hash) "
          "VALUES(?, ?, ?, ?, ?, ?)"));
      MEGA_RETURN_IF_ERROR(up.Bind(1, repo.id).Bind(2, id).Bind(3, path)
                               .Bind(4, static_cast<int64_t>(entry.size)).Bind(5, entry.sha256)
                               .Bind(6, entry.xet_hash).Run());
      note(path, "put", &entry, before);
      return Status::OK();
    };
    auto remove = [&](const std::string& path) -> Result<bool> {
      MEGA_ASSIGN_OR_RETURN(auto before, FindTreeEntry(d, repo.id, id, path));
      if (!before) return false;
      MEGA_ASSIGN_OR_RETURN(auto del, d->Prepare(
          "DELETE FROM tree_entries WHERE repo_id = ? AND commit_id = ? AND path = ?"));
      MEGA_RETURN_IF_ERROR(del.Bind(1, repo.id).Bind(2, id).Bind(3, path).Run());
      note(path, "delete", nullptr, before);
      return true;
    };

    for (const auto& op : req.ops) {
      switch (op.kind) {
        case CommitOperation::Kind::kAdd: {
          MEGA_RETURN_IF_ERROR(put(op.path, op.entry));
          break;
        }
        case CommitOperation::Kind::kDelete: {
          MEGA_ASSIGN_OR_RETURN(bool removed, remove(op.path));
          if (!removed && !req.ignore_missing_deletes) {
            return NotFoundError("cannot delete " + Quote(op.path) + ": not in " + req.repo +
                                 " at " + base.value_or("(empty)"));
          }
          break;
        }
        case CommitOperation::Kind::kDeleteFolder: {
          std::string under = op.path + "/";
          MEGA_ASSIGN_OR_RETURN(auto list, d->Prepare(
              "SELECT path FROM tree_entries WHERE repo_id = ? AND commit_id = ? AND path >= ? AND path < ?"));
          list.Bind(1, repo.id).Bind(2, id).Bind(3, under).Bind(4, PrefixEnd(under));
          std::vector<std::string> paths;
          while (true) {
            MEGA_ASSIGN_OR_RETURN(bool has, list.Step());
            if (!has) break;
            paths.push_back(list.Text(0));
          }
          if (paths.empty() && !req.ignore_missing_deletes) {
            return NotFoundError("cannot delete folder " + Quote(op.path) + ": not in " + req.repo);
          }
          for (const auto& p : paths) MEGA_RETURN_IF_ERROR(remove(p).status());
          break;
        }
        case CommitOperation::Kind::kCopy: {
          RepoRow src_repo = repo;
          if (!op.source_repo.empty() && op.source_repo != req.repo) {
            MEGA_ASSIGN_OR_RETURN(src_repo, FindRepo(d, op.source_repo));
          }
          std::string src_commit;
          if (op.source_revision.empty()) {
            if (src_repo.id != repo.id) {
              MEGA_ASSIGN_OR_RETURN(src_commit, Resolve(d, src_repo, "main"));
            } else {
              src_commit = id;  // the tree as built so far
            }
          } else {
            MEGA_ASSIGN_OR_RETURN(src_commit, Resolve(d, src_repo, op.source_revision));
          }
          MEGA_ASSIGN_OR_RETURN(auto src, FindTreeEntry(d, src_repo.id, src_commit, op.source_path));
          if (!src) {
            return NotFoundError("copy source " + Quote(op.source_path) + " not found in " +
                                 src_repo.info.id() + " at " + src_commit);
          }
          MEGA_RETURN_IF_ERROR(put(op.path, *src));
          break;
        }
      }
    }

    for (const auto& [path, c] : changes) {
      MEGA_ASSIGN_OR_RETURN(auto r, d->Prepare(
          "INSERT INTO commit_changes(repo_id, commit_id, path, change, size, sha256, previous_sha256) "
          "VALUES(?, ?, ?, ?, ?, ?, ?)"));
      MEGA_RETURN_IF_ERROR(r.Bind(1, repo.id).Bind(2, id).Bind(3, path).Bind(4, c.change)
                               .Bind(5, static_cast<int64_t>(c.size)).Bind(6, c.sha256)
                               .Bind(7, c.previous_sha256).Run());
    }

    if (head) {
      MEGA_ASSIGN_OR_RETURN(auto up, d->Prepare(
          "UPDATE refs SET target = ?, updated_ms = ? WHERE repo_id = ? AND kind = 'branch' "
          "AND name = ? AND target = ?"));
      MEGA_RETURN_IF_ERROR(up.Bind(1, id).Bind(2, now).Bind(3, repo.id).Bind(4, req.branch)
                               .Bind(5, *head).Run());
      if (up.Changes() != 1) {
        return AbortedError("conflict: branch '" + req.branch + "' of " + req.repo +
                            " moved during the commit");
      }
    } else {
      MEGA_ASSIGN_OR_RETURN(auto insref, d->Prepare(
          "INSERT INTO refs(repo_id, kind, name, target, message, updated_ms) "
          "VALUES(?, 'branch', ?, ?, NULL, ?)"));
      MEGA_RETURN_IF_ERROR(insref.Bind(1, repo.id).Bind(2, req.branch).Bind(3, id).Bind(4, now).Run());
    }
    MEGA_ASSIGN_OR_RETURN(auto touch, d->Prepare("UPDATE repos SET updated_ms = ? WHERE id = ?"));
    MEGA_RETURN_IF_ERROR(touch.Bind(1, now).Bind(2, repo.id).Run());

    CommitInfo out;
    out.id = id;
    out.parent = base;
    out.message = req.message;
    out.description = req.description;
    out.author = req.author;
    out.created_ms = now;
    for (auto& [path, c] : changes) out.changes.push_back(c);
    return out;
  });
}

// ---- content ----

Result<std::unique_ptr<ContentUpload>> HubStore::BeginUpload(std::string name) {
  cas::UploadOptions opts;
  opts.name = name;
  MEGA_ASSIGN_OR_RETURN(auto stream, cas_->BeginUpload(opts));
  auto upload = std::make_unique<ContentUpload>(std::move(name), std::move(stream));
  upload->set_on_close([this](const FileEntry& entry, const cas::FileUploadResult&) {
    return RecordContent(entry, /*sha256_verified=*/true);
  });
  return upload;
}

Status HubStore::RecordContent(const FileEntry& entry, bool sha256_verified) {
  if (entry.xet_hash == kEmptyXetHash || entry.size == 0) return Status::OK();
  if (!IsXetHashText(entry.xet_hash)) {
    return InvalidArgumentError("bad xet hash " + Quote(entry.xet_hash));
  }
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(entry.xet_hash));
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  // A content row is a hint (GC grace for uploads not committed yet, sha256
  // lookups), not a commit: its transaction skips the WAL fsync
  // (synchronous=NORMAL: a crash may drop the row but never corrupts the
  // database), and the next synchronous=FULL commit persists it with the WAL.
  // Saves one device flush per uploaded file.
  MEGA_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=NORMAL"));
  struct RestoreFull {
    SqliteDb* db;
    ~RestoreFull() { (void)db->Exec("PRAGMA synchronous=FULL"); }
  } restore{db.db()};
  return WithWriteTxn(db.db(), [&]() -> Status {
    // Checked under the write lock: a GC (which holds it throughout) cannot
    // delete the content between this check and the insert.
    MEGA_ASSIGN_OR_RETURN(bool has, cas_->HasFile(hash));
    if (!has) {
      return FailedPreconditionError("content " + entry.xet_hash + " is not in the CAS store");
    }
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
        "INSERT INTO content(xet_hash, size, sha256, sha256_verified, recorded_ms) VALUES(?, ?, ?, ?, ?) "
        "ON CONFLICT(xet_hash) DO UPDATE SET recorded_ms = excluded.recorded_ms, "
        "sha256 = CASE WHEN excluded.sha256_verified = 1 OR content.sha256 = '' THEN excluded.sha256 "
        "              ELSE content.sha256 END, "
        "sha256_verified = max(content.sha256_verified, excluded.sha256_verified)"));
    return st.Bind(1, ToLower(entry.xet_hash)).Bind(2, static_cast<int64_t>(entry.size))
        .Bind(3, entry.sha256).Bind(4, int64_t{sha256_verified}).Bind(5, NowMs()).Run();
  });
}

Result<std::optional<FileEntry>> HubStore::FindBySha256(std::string_view sha256) {
  std::string lower = ToLower(sha256);
  if (lower == Sha256Hex("")) {
    FileEntry e;
    e.sha256 = lower;
    e.xet_hash = kEmptyXetHash;
    return std::optional<FileEntry>(e);
  }
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT xet_hash, size FROM content WHERE sha256 = ? AND sha256_verified = 1 LIMIT 1"));
  st.Bind(1, lower);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return std::optional<FileEntry>();
  FileEntry e;
  e.xet_hash = st.Text(0);
  e.size = static_cast<uint64_t>(st.Int(1));
  e.sha256 = lower;
  return std::optional<FileEntry>(e);
}

Result<bool> HubStore::HasContent(std::string_view xet_hash) {
  if (xet_hash == kEmptyXetHash) return true;
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(xet_hash));
  return cas_->HasFile(hash);
}

Result<std::unique_ptr<RandomAccessFile>> HubStore::OpenContent(const FileEntry& entry,
                                                                std::string name) {
  return OpenCasContent(*cas_, entry, std::move(name));
}

// ---- buckets ----

namespace {

struct BucketRow {
  int64_t id = 0;
  BucketInfo info;
};

Result<BucketRow> FindBucket(SqliteDb* db, std::string_view bucket) {
  MEGA_ASSIGN_OR_RETURN(auto parts, SplitRepoId(bucket));
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT b.id, b.private, b.created_ms, "
      "  (SELECT coalesce(sum(size), 0) FROM bucket_entries e WHERE e.bucket_id = b.id), "
      "  (SELECT count(*) FROM bucket_entries e WHERE e.bucket_id = b.id) "
      "FROM buckets b WHERE ns = ? AND name = ?"));
  st.Bind(1, parts.first).Bind(2, parts.second);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return NotFoundError("bucket " + Quote(bucket) + " not found");
  BucketRow r;
  r.id = st.Int(0);
  r.info.ns = parts.first;
  r.info.name = parts.second;
  r.info.is_private = st.Int(1) != 0;
  r.info.created_ms = st.Int(2);
  r.info.size = static_cast<uint64_t>(st.Int(3));
  r.info.total_files = static_cast<uint64_t>(st.Int(4));
  return r;
}

BucketEntry ReadBucketEntry(const SqliteStmt& st) {
  BucketEntry e;
  e.path = st.Text(0);
  e.size = static_cast<uint64_t>(st.Int(1));
  e.xet_hash = st.Text(2);
  e.sha256 = st.Text(3);
  e.content_type = st.Text(4);
  e.mtime_ms = st.Int(5);
  e.uploaded_ms = st.Int(6);
  return e;
}

}  // namespace

Result<BucketInfo> HubStore::CreateBucket(std::string_view ns, std::string_view name,
                                          bool is_private, bool exist_ok) {
  MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(ns, "namespace"));
  MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(name, "name"));
  std::string id = std::string(ns) + "/" + std::string(name);
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Result<BucketInfo> {
    auto existing = FindBucket(db.db(), id);
    if (existing.ok()) {
      if (exist_ok) return existing->info;
      return AlreadyExistsError("bucket " + Quote(id) + " already exists");
    }
    if (existing.status().code() != StatusCode::kNotFound) return existing.status();
    int64_t now = NowMs();
    MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare(
        "INSERT INTO buckets(ns, name, private, created_ms) VALUES(?, ?, ?, ?)"));
    MEGA_RETURN_IF_ERROR(ins.Bind(1, ns).Bind(2, name).Bind(3, int64_t{is_private}).Bind(4, now).Run());
    BucketInfo info;
    info.ns = std::string(ns);
    info.name = std::string(name);
    info.is_private = is_private;
    info.created_ms = now;
    return info;
  });
}

Result<BucketInfo> HubStore::GetBucket(std::string_view bucket) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindBucket(db.db(), bucket));
  return row.info;
}

Status HubStore::DeleteBucket(std::string_view bucket) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto row, FindBucket(db.db(), bucket));
    MEGA_ASSIGN_OR_RETURN(auto del, db->Prepare("DELETE FROM buckets WHERE id = ?"));
    return del.Bind(1, row.id).Run();
  });
}

Status HubStore::BucketBatch(std::string_view bucket, const std::vector<BucketOperation>& ops) {
  for (const auto& op : ops) MEGA_RETURN_IF_ERROR(ValidateRepoPath(op.entry.path));
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  SqliteDb* d = db.db();
  return WithWriteTxn(d, [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto row, FindBucket(d, bucket));
    int64_t now = NowMs();
    for (const auto& op : ops) {
      if (op.kind == BucketOperation::Kind::kDelete) {
        MEGA_ASSIGN_OR_RETURN(auto del, d->Prepare(
            "DELETE FROM bucket_entries WHERE bucket_id = ? AND path = ?"));
        MEGA_RETURN_IF_ERROR(del.Bind(1, row.id).Bind(2, op.entry.path).Run());
        continue;
      }
      FileEntry fe;
      fe.size = op.entry.size;
      fe.sha256 = op.entry.sha256;
      fe.xet_hash = op.entry.xet_hash;
      if (fe.size == 0 && fe.xet_hash != kEmptyXetHash && IsXetHashText(fe.xet_hash)) {
        // Xet's batch format carries no size: take it from the content.
        MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(fe.xet_hash));
        auto recon = cas_->GetReconstruction(hash);
        if (!recon.ok()) {
          if (recon.status().code() == StatusCode::kNotFound) {
            return FailedPreconditionError("bucket path " + Quote(op.entry.path) + ": content " +
                                           fe.xet_hash + " was not uploaded");
          }
          return recon.status();
        }
        fe.size = recon->size;
      }
      MEGA_RETURN_IF_ERROR(CheckContent(d, *cas_, fe, op.entry.path));
      MEGA_ASSIGN_OR_RETURN(auto up, d->Prepare(
          "INSERT OR REPLACE INTO bucket_entries(bucket_id, path, size, xet_hash, sha256, "
          "content_type, mtime_ms, uploaded_ms) VALUES(?, ?, ?, ?, ?, ?, ?, ?)"));
      MEGA_RETURN_IF_ERROR(up.Bind(1, row.id).Bind(2, op.entry.path)
                               .Bind(3, static_cast<int64_t>(fe.size)).Bind(4, ToLower(fe.xet_hash))
                               .Bind(5, fe.sha256).Bind(6, op.entry.content_type)
                               .Bind(7, op.entry.mtime_ms ? op.entry.mtime_ms : now).Bind(8, now)
                               .Run());
    }
    return Status::OK();
  });
}

Result<std::vector<BucketEntry>> HubStore::ListBucket(std::string_view bucket,
                                                      std::string_view prefix,
                                                      std::string_view after, size_t limit) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindBucket(db.db(), bucket));
  std::string sql =
      "SELECT path, size, xet_hash, sha256, content_type, mtime_ms, uploaded_ms FROM bucket_entries "
      "WHERE bucket_id = ? AND path >= ? AND path > ? ";
  if (!prefix.empty()) sql += "AND substr(path, 1, ?) = ? ";
  sql += "ORDER BY path LIMIT ?";
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(sql));
  st.Bind(1, row.id).Bind(2, prefix).Bind(3, after);
  int i = 4;
  if (!prefix.empty()) {
    st.Bind(4, static_cast<int64_t>(prefix.size())).Bind(5, prefix);
    i = 6;
  }
  st.Bind(i, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
  std::vector<BucketEntry> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) break;
    out.push_back(ReadBucketEntry(st));
  }
  return out;
}

Result<BucketEntry> HubStore::GetBucketEntry(std::string_view bucket, std::string_view path) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, FindBucket(db.db(), bucket));
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT path, size, xet_hash, sha256, content_type, mtime_ms, uploaded_ms FROM bucket_entries "
      "WHERE bucket_id = ? AND path = ?"));
  st.Bind(1, row.id).Bind(2, path);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) {
    return NotFoundError("entry " + Quote(path) + " not found in bucket " + std::string(bucket));
  }
  return ReadBucketEntry(st);
}

// ---- multipart uploads ----

Result<HubStore::MultipartUpload> HubStore::CreateMultipartUpload(MultipartUpload spec) {
  if (spec.part_size == 0) return InvalidArgumentError("multipart upload: part size 0");
  if (!IsSha256Hex(ToLower(spec.sha256))) {
    return InvalidArgumentError("multipart upload: bad sha256 " + Quote(spec.sha256));
  }
  spec.sha256 = ToLower(spec.sha256);
  spec.id = RandomHex(16);
  MEGA_RETURN_IF_ERROR(CreateDirectories(root_ + "/uploads/" + spec.id));
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_RETURN_IF_ERROR(WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
        "INSERT INTO uploads(id, repo, path, revision, size, sha256, part_size, stage_only, created_ms) "
        "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    return st.Bind(1, spec.id).Bind(2, spec.repo).Bind(3, spec.path).Bind(4, spec.revision)
        .Bind(5, static_cast<int64_t>(spec.size)).Bind(6, spec.sha256)
        .Bind(7, static_cast<int64_t>(spec.part_size)).Bind(8, int64_t{spec.stage_only})
        .Bind(9, NowMs()).Run();
  }));
  return spec;
}

Result<HubStore::MultipartUpload> HubStore::GetMultipartUpload(std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT repo, path, revision, size, sha256, part_size, stage_only FROM uploads WHERE id = ?"));
  st.Bind(1, id);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return NotFoundError("upload " + Quote(id) + " not found");
  MultipartUpload u;
  u.id = std::string(id);
  u.repo = st.Text(0);
  u.path = st.Text(1);
  u.revision = st.Text(2);
  u.size = static_cast<uint64_t>(st.Int(3));
  u.sha256 = st.Text(4);
  u.part_size = static_cast<uint64_t>(st.Int(5));
  u.stage_only = st.Int(6) != 0;
  return u;
}

Result<std::vector<std::pair<int, std::string>>> HubStore::ListUploadParts(std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT part_number, etag FROM upload_parts WHERE upload_id = ? ORDER BY part_number"));
  st.Bind(1, id);
  std::vector<std::pair<int, std::string>> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) break;
    out.emplace_back(static_cast<int>(st.Int(0)), st.Text(1));
  }
  return out;
}

std::string HubStore::UploadPartPath(std::string_view id, int part_number) const {
  return root_ + "/uploads/" + std::string(id) + "/" + std::to_string(part_number);
}

Status HubStore::RecordUploadPart(std::string_view id, int part_number, std::string_view etag,
                                  uint64_t size) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  return WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
        "INSERT OR REPLACE INTO upload_parts(upload_id, part_number, etag, size) VALUES(?, ?, ?, ?)"));
    return st.Bind(1, id).Bind(2, int64_t{part_number}).Bind(3, etag)
        .Bind(4, static_cast<int64_t>(size)).Run();
  });
}

Result<FileEntry> HubStore::CompleteMultipartUpload(
    std::string_view id, const std::vector<std::pair<int, std::string>>& parts) {
  MEGA_ASSIGN_OR_RETURN(auto upload, GetMultipartUpload(id));
  MEGA_ASSIGN_OR_RETURN(auto stored, ListUploadParts(id));
  uint64_t expected_parts = (upload.size + upload.part_size - 1) / upload.part_size;
  if (parts.size() != expected_parts) {
    return InvalidArgumentError("upload " + std::string(id) + ": " + std::to_string(parts.size()) +
                                " parts listed, " + std::to_string(expected_parts) + " expected");
  }
  std::map<int, std::string> have(stored.begin(), stored.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].first != static_cast<int>(i + 1)) {
      return InvalidArgumentError("upload " + std::string(id) + ": part list out of order at " +
                                  std::to_string(i));
    }
    auto it = have.find(parts[i].first);
    if (it == have.end()) {
      return FailedPreconditionError("upload " + std::string(id) + ": part " +
                                     std::to_string(parts[i].first) + " was not uploaded");
    }
    if (it->second != parts[i].second) {
      return InvalidArgumentError("upload " + std::string(id) + ": part " +
                                  std::to_string(parts[i].first) + " etag mismatch");
    }
  }
  MEGA_ASSIGN_OR_RETURN(auto sink, BeginUpload(upload.path));
  std::string buf(std::min<uint64_t>(upload.part_size, 8u << 20), '\0');
  for (const auto& [n, etag] : parts) {
    MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(UploadPartPath(id, n)));
    for (uint64_t off = 0; off < file->size();) {
      size_t len = static_cast<size_t>(std::min<uint64_t>(buf.size(), file->size() - off));
      auto dst = std::as_writable_bytes(std::span<char>(buf.data(), len));
      MEGA_RETURN_IF_ERROR(file->ReadExactlyAt(off, dst));
      MEGA_RETURN_IF_ERROR(sink->Append(dst));
      off += len;
    }
  }
  if (sink->size() != upload.size) {
    return DataLossError("upload " + std::string(id) + ": received " + std::to_string(sink->size()) +
                         " bytes, declared " + std::to_string(upload.size));
  }
  // Close() records the content as verified; check the hash first so a bad
  // upload is not registered under a sha256 it does not have.
  sink->set_on_close(nullptr);
  MEGA_RETURN_IF_ERROR(sink->Close());
  FileEntry entry = sink->entry();
  if (entry.sha256 != upload.sha256) {
    return DataLossError("upload " + std::string(id) + ": content sha256 " + entry.sha256 +
                         " does not match the declared " + upload.sha256);
  }
  MEGA_RETURN_IF_ERROR(RecordContent(entry, /*sha256_verified=*/true));
  MEGA_RETURN_IF_ERROR(DeleteMultipartUpload(id));
  entry.path = upload.path;
  return entry;
}

Status HubStore::DeleteMultipartUpload(std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_RETURN_IF_ERROR(WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("DELETE FROM uploads WHERE id = ?"));
    return st.Bind(1, id).Run();
  }));
  std::error_code ec;
  std::filesystem::remove_all(root_ + "/uploads/" + std::string(id), ec);
  return Status::OK();
}

// ---- tokens ----

Result<std::string> HubStore::CreateToken(TokenScope scope, std::optional<std::string> ns,
                                          std::string description) {
  if (ns) MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(*ns, "namespace"));
  std::string token = "mega_" + RandomHex(20);
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_RETURN_IF_ERROR(WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
        "INSERT INTO tokens(hash, scope, namespace, description, created_ms) VALUES(?, ?, ?, ?, ?)"));
    return st.Bind(1, Sha256Hex(token)).Bind(2, scope == TokenScope::kWrite ? "write" : "read")
        .Bind(3, ns).Bind(4, description).Bind(5, NowMs()).Run();
  }));
  return token;
}

Result<TokenInfo> HubStore::Authenticate(std::string_view token) {
  if (token.empty()) return UnauthenticatedError("no token");
  std::string hash = Sha256Hex(token);
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(
      "SELECT scope, namespace, description, created_ms FROM tokens WHERE hash = ?"));
  st.Bind(1, hash);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return UnauthenticatedError("invalid token");
  TokenInfo info;
  info.id = hash.substr(0, 8);
  info.scope = ScopeFromText(st.Text(0));
  info.ns = st.OptText(1);
  info.description = st.Text(2);
  info.created_ms = st.Int(3);
  return info;
}

Result<std::string> HubStore::ServerSecret() {
  if (!impl_->secret.empty()) return impl_->secret;
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT value FROM meta WHERE key = 'secret'"));
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return InternalError("hub root " + root_ + ": no server secret in meta");
  impl_->secret = st.Text(0);
  return impl_->secret;
}

// ---- maintenance ----

Result<GcReport> HubStore::CollectGarbage(double grace_seconds) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  SqliteDb* d = db.db();
  GcReport report;
  // Holding the write lock for the whole collection means no commit can start
  // referencing content while the live set is computed and applied.
  MEGA_RETURN_IF_ERROR(WithWriteTxn(d, [&]() -> Status {
    int64_t cutoff = NowMs() - static_cast<int64_t>(grace_seconds * 1000);
    MEGA_ASSIGN_OR_RETURN(auto st, d->Prepare(
        "SELECT xet_hash FROM tree_entries UNION SELECT xet_hash FROM bucket_entries "
        "UNION SELECT xet_hash FROM content WHERE recorded_ms > ?"));
    st.Bind(1, cutoff);
    std::vector<cas::MerkleHash> live;
    while (true) {
      MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
      if (!has) break;
      std::string text = st.Text(0);
      if (text == kEmptyXetHash) continue;
      auto hash = cas::MerkleHash::FromHex(text);
      if (!hash.ok()) continue;
      MEGA_ASSIGN_OR_RETURN(bool stored, cas_->HasFile(*hash));
      if (stored) live.push_back(*hash);
    }
    // Content the CAS holds but the hub has no record of at all is an upload
    // in flight (stored, not yet recorded: ContentUpload::Close before
    // RecordContent, a shard import before its record). Adopt it with a fresh
    // record so it gets a whole grace period; a true orphan goes next time.
    {
      std::unordered_set<cas::MerkleHash> known(live.begin(), live.end());
      MEGA_ASSIGN_OR_RETURN(auto rec, d->Prepare("SELECT xet_hash FROM content"));
      while (true) {
        MEGA_ASSIGN_OR_RETURN(bool has, rec.Step());
        if (!has) break;
        auto hash = cas::MerkleHash::FromHex(rec.Text(0));
        if (hash.ok()) known.insert(*hash);
      }
      MEGA_ASSIGN_OR_RETURN(auto stored, cas_->backend().ListFiles());
      for (const cas::MerkleHash& h : stored) {
        if (known.count(h)) continue;
        MEGA_ASSIGN_OR_RETURN(auto recon, cas_->backend().GetFile(h));
        MEGA_ASSIGN_OR_RETURN(auto adopt, d->Prepare(
            "INSERT OR IGNORE INTO content(xet_hash, size, sha256, sha256_verified, recorded_ms) "
            "VALUES(?, ?, '', 0, ?)"));
        MEGA_RETURN_IF_ERROR(adopt.Bind(1, h.ToHex()).Bind(2, static_cast<int64_t>(recon.size))
                                 .Bind(3, NowMs()).Run());
        live.push_back(h);
      }
    }
    report.live_files = live.size();
    cas::GcOptions opts;
    opts.live_files = std::move(live);
    opts.min_xorb_age_seconds = grace_seconds;
    MEGA_ASSIGN_OR_RETURN(report.cas, cas_->GarbageCollect(opts));
    MEGA_ASSIGN_OR_RETURN(auto drop, d->Prepare(
        "DELETE FROM content WHERE recorded_ms <= ?1 AND xet_hash NOT IN "
        "(SELECT xet_hash FROM tree_entries UNION SELECT xet_hash FROM bucket_entries)"));
    MEGA_RETURN_IF_ERROR(drop.Bind(1, cutoff).Run());
    report.expired_uploads = static_cast<uint64_t>(drop.Changes());
    MEGA_ASSIGN_OR_RETURN(auto old, d->Prepare("SELECT id FROM uploads WHERE created_ms <= ?"));
    old.Bind(1, cutoff);
    std::vector<std::string> ids;
    while (true) {
      MEGA_ASSIGN_OR_RETURN(bool has, old.Step());
      if (!has) break;
      ids.push_back(old.Text(0));
    }
    for (const auto& id : ids) {
      MEGA_ASSIGN_OR_RETURN(auto del, d->Prepare("DELETE FROM uploads WHERE id = ?"));
      MEGA_RETURN_IF_ERROR(del.Bind(1, id).Run());
      std::error_code ec;
      std::filesystem::remove_all(root_ + "/uploads/" + id, ec);
      ++report.expired_uploads;
    }
    return Status::OK();
  }));
  return report;
}

}  // namespace megackpt::hub
