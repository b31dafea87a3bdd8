// A thin RAII layer over SQLite3 for the hub's metadata: connections with WAL,
// a busy timeout and foreign keys; prepared statements with typed binds; and
// transactions (BEGIN IMMEDIATE for writers, so concurrent writers from several
// processes queue on the database lock instead of failing at COMMIT).
#ifndef MEGACKPT_HUB_SQLITE_H_
#define MEGACKPT_HUB_SQLITE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace megackpt::hub {

class SqliteDb;

// A prepared statement. Bind parameters are 1-based. Not thread-safe.
class SqliteStmt {
 public:
  SqliteStmt(SqliteStmt&&) noexcept;
  SqliteStmt& operator=(SqliteStmt&&) noexcept;
  ~SqliteStmt();

  SqliteStmt& Bind(int i, int64_t v);
  SqliteStmt& Bind(int i, std::string_view v);
  SqliteStmt& Bind(int i, const char* v) { return Bind(i, std::string_view(v)); }
  SqliteStmt& Bind(int i, const std::string& v) { return Bind(i, std::string_view(v)); }
  SqliteStmt& BindNull(int i);
  SqliteStmt& Bind(int i, const std::optional<std::string>& v) {
    return v ? Bind(i, *v) : BindNull(i);
  }

  // Advances: true when a row is available, false when done.
  Result<bool> Step();
  // Steps until done (for statements without rows).
  Status Run();

  int64_t Int(int col) const;
  std::string Text(int col) const;
  bool IsNull(int col) const;
  std::optional<std::string> OptText(int col) const {
    return IsNull(col) ? std::nullopt : std::optional<std::string>(Text(col));
  }

  // Number of rows changed by the last Run of this connection.
  int64_t Changes() const;

 private:
  friend class SqliteDb;
  SqliteStmt(sqlite3* db, sqlite3_stmt* stmt, std::string sql);
  Status Error(int rc) const;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
  std::string sql_;
  Status bind_error_;
};

// One connection. Not thread-safe: use one per thread (see SqlitePool).
class SqliteDb {
 public:
  // Opens (creating) the database file with WAL, synchronous=FULL, foreign
  // keys and a busy timeout.
  static Result<std::unique_ptr<SqliteDb>> Open(const std::string& path,
                                                int busy_timeout_ms = 30000);
  ~SqliteDb();

  // Runs SQL text (may hold several statements, no parameters).
  Status Exec(std::string_view sql);
  // Prepares one statement (finalized when the SqliteStmt is destroyed).
  Result<SqliteStmt> Prepare(std::string_view sql);

  const std::string& path() const { return path_; }
  // Rowid of the last INSERT on this connection.
  int64_t LastInsertRowId() const;

 private:
  SqliteDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
};

// A transaction: BEGIN IMMEDIATE (write) or BEGIN DEFERRED (read) at
// construction via Begin(); rolled back on destruction unless Commit()ed.
class SqliteTxn {
 public:
  static Result<SqliteTxn> Begin(SqliteDb* db, bool write);
  SqliteTxn(SqliteTxn&&) noexcept;
  SqliteTxn& operator=(SqliteTxn&&) = delete;
  ~SqliteTxn();
  Status Commit();

 private:
  explicit SqliteTxn(SqliteDb* db) : db_(db) {}
  SqliteDb* db_;
  bool done_ = false;
};

// A pool of connections to one database file, each lent to one thread at a
// time. Lease::db() is valid until the lease is destroyed.
class SqlitePool {
 public:
  static Result<std::unique_ptr<SqlitePool>> Open(const std::string& path, int size = 8);

  class Lease {
   public:
    Lease(SqlitePool* pool, std::unique_ptr<SqliteDb> db) : pool_(pool), db_(std::move(db)) {}
    Lease(Lease&&) = default;
    ~Lease();
    SqliteDb* db() const { return db_.get(); }
    SqliteDb* operator->() const { return db_.get(); }

   private:
    SqlitePool* pool_;
    std::unique_ptr<SqliteDb> db_;
  };

  // Borrows a connection (opens a new one when all are lent out).
  Result<Lease> Acquire();

 private:
  std::string path_;
  size_t max_idle_ = 8;
  std::mutex mu_;
  std::vector<std::unique_ptr<SqliteDb>> idle_;
};

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_SQLITE_H_
