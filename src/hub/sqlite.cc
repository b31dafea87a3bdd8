#include "hub/sqlite.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace megackpt::hub {
namespace {

Status SqliteError(sqlite3* db, int rc, std::string_view context) {
  std::string msg = std::string(context) + ": " + (db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  int primary = rc & 0xff;
  if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED) {
    return UnavailableError("database busy: " + msg);
  }
  if (primary == SQLITE_CONSTRAINT) return AlreadyExistsError("constraint violated: " + msg);
  if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB) return DataLossError(msg);
  if (primary == SQLITE_FULL) return ResourceExhaustedError(msg);
  if (primary == SQLITE_CANTOPEN || primary == SQLITE_IOERR) return IOError(msg);
  return InternalError(msg);
}

}  // namespace

SqliteStmt::SqliteStmt(sqlite3* db, sqlite3_stmt* stmt, std::string sql)
    : db_(db), stmt_(stmt), sql_(std::move(sql)) {}

SqliteStmt::SqliteStmt(SqliteStmt&& o) noexcept
    : db_(o.db_), stmt_(o.stmt_), sql_(std::move(o.sql_)), bind_error_(std::move(o.bind_error_)) {
  o.stmt_ = nullptr;
}

SqliteStmt& SqliteStmt::operator=(SqliteStmt&& o) noexcept {
  if (this != &o) {
    if (stmt_) sqlite3_finalize(stmt_);
    db_ = o.db_;
    stmt_ = o.stmt_;
    sql_ = std::move(o.sql_);
    bind_error_ = std::move(o.bind_error_);
    o.stmt_ = nullptr;
  }
  return *this;
}

SqliteStmt::~SqliteStmt() {
  if (stmt_) sqlite3_finalize(stmt_);
}

Status SqliteStmt::Error(int rc) const {
  return SqliteError(db_, rc, "sql '" + sql_.substr(0, 80) + "'");
}

SqliteStmt& SqliteStmt::Bind(int i, int64_t v) {
  int rc = sqlite3_bind_int64(stmt_, i, v);
  if (rc != SQLITE_OK && bind_error_.ok()) bind_error_ = Error(rc);
  return *this;
}

SqliteStmt& SqliteStmt::Bind(int i, std::string_view v) {
  int rc = sqlite3_bind_text64(stmt_, i, v.data(), v.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (rc != SQLITE_OK && bind_error_.ok()) bind_error_ = Error(rc);
  return *this;
}

SqliteStmt& SqliteStmt::BindNull(int i) {
  int rc = sqlite3_bind_null(stmt_, i);
  if (rc != SQLITE_OK && bind_error_.ok()) bind_error_ = Error(rc);
  return *this;
}

Result<bool> SqliteStmt::Step() {
  if (!bind_error_.ok()) return bind_error_;
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return Error(rc);
}

Status SqliteStmt::Run() {
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return Status::OK();
  }
}

int64_t SqliteStmt::Int(int col) const { return sqlite3_column_int64(stmt_, col); }

std::string SqliteStmt::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  int n = sqlite3_column_bytes(stmt_, col);
  return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
}

bool SqliteStmt::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }

int64_t SqliteStmt::Changes() const { return sqlite3_changes64(db_); }

Result<std::unique_ptr<SqliteDb>> SqliteDb::Open(const std::string& path, int busy_timeout_ms) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    Status s = SqliteError(db, rc, "open " + path);
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SqliteDb> out(new SqliteDb(db, path));
  sqlite3_busy_timeout(db, busy_timeout_ms);
  sqlite3_extended_result_codes(db, 1);
  // WAL lets readers proceed while one writer commits; synchronous=FULL makes
  // every committed transaction durable (a hub must never lose a commit).
  // Connections that switch a new file to WAL at once race for its exclusive
  // lock, and SQLite fails the loser with SQLITE_BUSY at once, without the
  // busy handler (waiting could deadlock). So a busy switch is retried here,
  // for as long as the busy timeout.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    Status s =
        out->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;");
    if (s.ok()) break;
    if (s.code() != StatusCode::kUnavailable || std::chrono::steady_clock::now() >= deadline)
      return s;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return out;
}

SqliteDb::~SqliteDb() { sqlite3_close_v2(db_); }

int64_t SqliteDb::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }

Status SqliteDb::Exec(std::string_view sql) {
  std::string text(sql);
  char* err = nullptr;
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    Status s = SqliteError(nullptr, rc, path_ + ": '" + text.substr(0, 80) + "'");
    return Status(s.code(), path_ + ": '" + text.substr(0, 80) + "': " + msg);
  }
  return Status::OK();
}

Result<SqliteStmt> SqliteDb::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr);
  if (rc != SQLITE_OK)
    return SqliteError(db_, rc, "prepare '" + std::string(sql.substr(0, 80)) + "'");
  return SqliteStmt(db_, stmt, std::string(sql));
}

Result<SqliteTxn> SqliteTxn::Begin(SqliteDb* db, bool write) {
  MEGA_RETURN_IF_ERROR(db->Exec(write ? "BEGIN IMMEDIATE" : "BEGIN"));
  return SqliteTxn(db);
}

SqliteTxn::SqliteTxn(SqliteTxn&& o) noexcept : db_(o.db_), done_(o.done_) { o.done_ = true; }

SqliteTxn::~SqliteTxn() {
  if (!done_) db_->Exec("ROLLBACK").IgnoreError();
}

Status SqliteTxn::Commit() {
  done_ = true;
  Status s = db_->Exec("COMMIT");
  if (!s.ok()) db_->Exec("ROLLBACK").IgnoreError();
  return s;
}

SqlitePool::Lease::~Lease() {
  if (!db_ || !pool_) return;
  std::lock_guard<std::mutex> lock(pool_->mu_);
  if (pool_->idle_.size() < pool_->max_idle_) pool_->idle_.push_back(std::move(db_));
}

Result<std::unique_ptr<SqlitePool>> SqlitePool::Open(const std::string& path, int size) {
  auto pool = std::make_unique<SqlitePool>();
  pool->path_ = path;
  pool->max_idle_ = size > 0 ? size : 1;
  MEGA_ASSIGN_OR_RETURN(auto first, SqliteDb::Open(path));
  pool->idle_.push_back(std::move(first));
  return pool;
}

Result<SqlitePool::Lease> SqlitePool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto db = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(db));
    }
  }
  MEGA_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(path_));
  return Lease(this, std::move(db));
}

}  // namespace megackpt::hub
