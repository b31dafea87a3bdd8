// Internals shared by the hub store's files (store_*.cc), one file per
// concern: store.cc (open, content streams), store_repos.cc (repositories,
// refs, commit and tree reads), store_commit.cc (the commit transaction),
// store_content.cc (content records, access to content by hash),
// store_buckets.cc, store_uploads.cc (multipart uploads), store_tokens.cc,
// store_gc.cc. The schema is in store_schema.h.
#ifndef MEGACKPT_SRC_HUB_STORE_INTERNAL_H_
#define MEGACKPT_SRC_HUB_STORE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "hub/sqlite.h"
#include "megackpt/core/text.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

struct HubStore::Impl {
  std::unique_ptr<SqlitePool> pool;
  std::string secret;
};

namespace store_internal {

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

// ---- rows named "ns/name" (repos, buckets) ----
// A `find(db, id)` returns the row {int64_t id; Info info;} named `id`, or
// NotFound.
template <typename Row>
using FindNamedFn = Result<Row> (*)(SqliteDb* db, std::string_view id);

// The info of the row `find` returns for `id`.
template <typename Row>
Result<decltype(Row::info)> GetNamed(SqlitePool& pool, FindNamedFn<Row> find, std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, pool.Acquire());
  MEGA_ASSIGN_OR_RETURN(auto row, find(db.db(), id));
  return row.info;
}

// Deletes the row `find` returns for `id` from `table` (what refers to it
// goes by ON DELETE CASCADE).
template <typename Row>
Status DeleteNamed(SqlitePool& pool, FindNamedFn<Row> find, std::string_view table,
                   std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, pool.Acquire());
  return WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto row, find(db.db(), id));
    MEGA_ASSIGN_OR_RETURN(auto del,
                          db->Prepare("DELETE FROM " + std::string(table) + " WHERE id = ?"));
    return del.Bind(1, row.id).Run();
  });
}

// Creates the `what` ("repo", "bucket") named ns/name: validates both parts,
// then in one write transaction returns the existing row's info when
// `exist_ok` (AlreadyExists when not), or else what `insert(db, id)` returns.
template <typename Row, typename Insert>
Result<decltype(Row::info)> CreateNamed(SqlitePool& pool, FindNamedFn<Row> find,
                                        std::string_view what, std::string_view ns,
                                        std::string_view name, bool exist_ok, Insert&& insert) {
  MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(ns, "namespace"));
  MEGA_RETURN_IF_ERROR(ValidateRepoNamePart(name, "name"));
  const std::string id = std::string(ns) + "/" + std::string(name);
  MEGA_ASSIGN_OR_RETURN(auto db, pool.Acquire());
  return WithWriteTxn(db.db(), [&]() -> Result<decltype(Row::info)> {
    auto existing = find(db.db(), id);
    if (existing.ok()) {
      if (exist_ok) return existing->info;
      return AlreadyExistsError(std::string(what) + " " + Quote(id) + " already exists");
    }
    if (existing.status().code() != StatusCode::kNotFound) return existing.status();
    return insert(db.db(), id);
  });
}

inline TokenScope ScopeFromText(std::string_view s) {
  return s == "write" ? TokenScope::kWrite : TokenScope::kRead;
}

// ---- repository rows (store_repos.cc) ----
struct RepoRow {
  int64_t id = 0;
  RepoInfo info;
};
extern const char* const kRepoColumns;
RepoRow ReadRepoRow(const SqliteStmt& st);
Result<RepoRow> FindRepo(SqliteDb* db, std::string_view repo);
Result<std::optional<std::string>> FindRef(SqliteDb* db, int64_t repo_id, std::string_view kind,
                                           std::string_view name);
Result<bool> CommitExists(SqliteDb* db, int64_t repo_id, std::string_view id);
Result<std::string> Resolve(SqliteDb* db, const RepoRow& repo, std::string_view revision);
CommitInfo ReadCommitRow(const SqliteStmt& st, int first_col);
Result<std::optional<FileEntry>> FindTreeEntry(SqliteDb* db, int64_t repo_id,
                                               std::string_view commit, std::string_view path);
// Prepares one page of a path-keyed table in path order: `select_where`
// ("SELECT ... FROM t WHERE k1 = ? AND ... ", its `keys` parameters left for
// the caller to bind) narrowed to paths >= `prefix` that start with it, after
// `after`, at most `limit` rows. The range bound lets SQLite scan the
// primary key.
Result<SqliteStmt> PreparePathPage(SqliteDb* db, std::string select_where, int keys,
                                   std::string_view prefix, std::string_view after, size_t limit);
// The smallest string greater than every string starting with `prefix`
// (prefix ends in '/', so bumping it to '0' bounds the range).
std::string PrefixEnd(std::string prefix);
std::string NewCommitId(std::string_view repo, std::string_view base, std::string_view message);

// ---- content (store_content.cc) ----
// Whether `access` may name the content `xet_hash` (lowercase).
Result<bool> ContentReadable(SqliteDb* db, std::string_view xet_hash, const ContentAccess& access);
// Checks that `entry` names stored content of the right size that `access`
// may read (unreadable content fails exactly like unknown content), recording
// it in the content table when only the CAS knew it. Messages name `path`.
Status CheckContent(SqliteDb* db, cas::CasStore& cas, const FileEntry& entry, std::string_view path,
                    const ContentAccess& access);

}  // namespace store_internal
}  // namespace megackpt::hub

#endif  // MEGACKPT_SRC_HUB_STORE_INTERNAL_H_
