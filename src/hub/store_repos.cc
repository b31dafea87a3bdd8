// HubStore: repositories, refs, and reads of commits and trees.
#include <algorithm>

#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

namespace store_internal {

const char* const kRepoColumns = "id, ns, name, type, private, description, created_ms, updated_ms";

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
  MEGA_ASSIGN_OR_RETURN(
      auto st, db->Prepare("SELECT target FROM refs WHERE repo_id = ? AND kind = ? AND name = ?"));
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
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT size, sha256, xet_hash FROM tree_entries "
                                             "WHERE repo_id = ? AND commit_id = ? AND path = ?"));
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

Result<SqliteStmt> PreparePathPage(SqliteDb* db, std::string select_where, int keys,
                                   std::string_view prefix, std::string_view after, size_t limit) {
  std::string sql = std::move(select_where) + "AND path >= ? AND path > ? ";
  if (!prefix.empty()) sql += "AND substr(path, 1, ?) = ? ";
  sql += "ORDER BY path LIMIT ?";
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare(sql));
  int i = keys + 1;
  st.Bind(i, prefix).Bind(i + 1, after);
  i += 2;
  if (!prefix.empty()) {
    st.Bind(i, static_cast<int64_t>(prefix.size())).Bind(i + 1, prefix);
    i += 2;
  }
  st.Bind(i, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
  return st;
}

std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

std::string NewCommitId(std::string_view repo, std::string_view base, std::string_view message) {
  std::string seed = std::string(repo) + '\n' + std::string(base) + '\n' + std::string(message) +
                     '\n' + std::to_string(NowMs()) + '\n' + RandomHex(16);
  return Sha256Hex(seed).substr(0, 40);
}

}  // namespace store_internal

namespace {

// One revision read consistently: a borrowed connection in a read
// transaction, the repo, and the commit `revision` resolved to. Members are
// destroyed in reverse order, so the transaction ends before the lease.
struct RevisionRead {
  SqlitePool::Lease db;
  SqliteTxn txn;
  RepoRow repo;
  std::string commit;
};

Result<RevisionRead> BeginRevisionRead(SqlitePool& pool, std::string_view repo,
                                       std::string_view revision) {
  MEGA_ASSIGN_OR_RETURN(auto db, pool.Acquire());
  MEGA_ASSIGN_OR_RETURN(auto txn, SqliteTxn::Begin(db.db(), /*write=*/false));
  MEGA_ASSIGN_OR_RETURN(auto row, FindRepo(db.db(), repo));
  MEGA_ASSIGN_OR_RETURN(std::string commit, Resolve(db.db(), row, revision));
  return RevisionRead{std::move(db), std::move(txn), std::move(row), std::move(commit)};
}

}  // namespace

Result<RepoInfo> HubStore::CreateRepo(const RepoSpec& spec, bool exist_ok) {
  auto insert = [&](SqliteDb* db, const std::string& id) -> Result<RepoInfo> {
    int64_t now = NowMs();
    MEGA_ASSIGN_OR_RETURN(
        auto ins,
        db->Prepare(
            "INSERT INTO repos(ns, name, type, private, description, created_ms, updated_ms) "
            "VALUES(?, ?, ?, ?, ?, ?, ?)"));
    ins.Bind(1, spec.ns)
        .Bind(2, spec.name)
        .Bind(3, RepoTypeName(spec.type))
        .Bind(4, int64_t{spec.is_private})
        .Bind(5, spec.description)
        .Bind(6, now)
        .Bind(7, now);
    MEGA_RETURN_IF_ERROR(ins.Run());
    int64_t repo_id = db->LastInsertRowId();
    std::string commit = NewCommitId(id, "", "initial commit");
    MEGA_ASSIGN_OR_RETURN(
        auto c,
        db->Prepare(
            "INSERT INTO commits(repo_id, id, parent, message, description, author, created_ms) "
            "VALUES(?, ?, NULL, 'initial commit', '', 'megahub', ?)"));
    MEGA_RETURN_IF_ERROR(c.Bind(1, repo_id).Bind(2, commit).Bind(3, now).Run());
    MEGA_ASSIGN_OR_RETURN(
        auto r, db->Prepare("INSERT INTO refs(repo_id, kind, name, target, message, updated_ms) "
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
  };
  return CreateNamed(*impl_->pool, FindRepo, "repo", spec.ns, spec.name, exist_ok, insert);
}

Result<RepoInfo> HubStore::GetRepo(std::string_view repo) {
  return GetNamed(*impl_->pool, FindRepo, repo);
}

Status HubStore::DeleteRepo(std::string_view repo) {
  return DeleteNamed(*impl_->pool, FindRepo, "repos", repo);
}

Result<std::vector<RepoInfo>> HubStore::ListRepos(std::string_view owner, std::string_view after,
                                                  size_t limit) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(
      auto st, db->Prepare(std::string("SELECT ") + kRepoColumns +
                           " FROM repos WHERE (? = '' OR ns = ?) AND (ns || '/' || name) > ? "
                           "ORDER BY ns || '/' || name LIMIT ?"));
  st.Bind(1, owner).Bind(2, owner).Bind(3, after).Bind(
      4, static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
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
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare("SELECT kind, name, target, message, updated_ms FROM refs WHERE repo_id = ? "
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
    MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare("INSERT INTO refs(repo_id, kind, name, target, "
                                                "message, updated_ms) VALUES(?, ?, ?, ?, ?, ?)"));
    MEGA_RETURN_IF_ERROR(ins.Bind(1, row.id)
                             .Bind(2, kind)
                             .Bind(3, name)
                             .Bind(4, target)
                             .Bind(5, message)
                             .Bind(6, now)
                             .Run());
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
    MEGA_ASSIGN_OR_RETURN(
        auto del, db->Prepare("DELETE FROM refs WHERE repo_id = ? AND kind = ? AND name = ?"));
    MEGA_RETURN_IF_ERROR(
        del.Bind(1, row.id).Bind(2, is_tag ? "tag" : "branch").Bind(3, name).Run());
    if (del.Changes() == 0) {
      return NotFoundError(std::string(is_tag ? "tag " : "branch ") + Quote(name) +
                           " not found in " + std::string(repo));
    }
    return Status::OK();
  });
}

Result<CommitInfo> HubStore::GetCommit(std::string_view repo, std::string_view revision,
                                       bool with_changes) {
  MEGA_ASSIGN_OR_RETURN(auto read, BeginRevisionRead(*impl_->pool, repo, revision));
  SqliteDb* db = read.db.db();
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare("SELECT id, parent, message, description, author, created_ms FROM commits "
                  "WHERE repo_id = ? AND id = ?"));
  st.Bind(1, read.repo.id).Bind(2, read.commit);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return NotFoundError("commit " + read.commit + " not found in " + std::string(repo));
  CommitInfo c = ReadCommitRow(st, 0);
  if (with_changes) {
    MEGA_ASSIGN_OR_RETURN(
        auto ch,
        db->Prepare("SELECT path, change, size, sha256, previous_sha256 FROM commit_changes "
                    "WHERE repo_id = ? AND commit_id = ? ORDER BY path"));
    ch.Bind(1, read.repo.id).Bind(2, read.commit);
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
  MEGA_ASSIGN_OR_RETURN(auto read, BeginRevisionRead(*impl_->pool, repo, revision));
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      read.db->Prepare("WITH RECURSIVE chain(id, depth) AS ("
                       "  SELECT ?2, 0"
                       "  UNION ALL SELECT c.parent, chain.depth + 1 FROM commits c JOIN chain ON "
                       "c.id = chain.id"
                       "  WHERE c.repo_id = ?1 AND c.parent IS NOT NULL) "
                       "SELECT c.id, c.parent, c.message, c.description, c.author, c.created_ms "
                       "FROM chain JOIN commits c ON c.id = chain.id AND c.repo_id = ?1 "
                       "ORDER BY chain.depth LIMIT ?3 OFFSET ?4"));
  st.Bind(1, read.repo.id)
      .Bind(2, read.commit)
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
  MEGA_ASSIGN_OR_RETURN(auto st,
                        PreparePathPage(db.db(),
                                        "SELECT path, size, sha256, xet_hash FROM tree_entries "
                                        "WHERE repo_id = ? AND commit_id = ? ",
                                        2, prefix, after, limit));
  st.Bind(1, row.id).Bind(2, commit_id);
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

}  // namespace megackpt::hub
