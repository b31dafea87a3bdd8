// The hub store's SQLite schema (docs/hub.md §2). Every statement is
// idempotent, so opening an existing root is the same code path as creating
// one. Tables added later are created by the same statements on open (no
// version bump when old code may ignore them: content_grants, content_xorbs).
#ifndef MEGACKPT_SRC_HUB_STORE_SCHEMA_H_
#define MEGACKPT_SRC_HUB_STORE_SCHEMA_H_

namespace megackpt::hub::store_internal {

inline constexpr int kSchemaVersion = 1;

inline constexpr const char* kSchema = R"sql(
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
CREATE TABLE IF NOT EXISTS content_grants(
  xet_hash TEXT NOT NULL,
  ns TEXT NOT NULL,
  recorded_ms INTEGER NOT NULL,
  PRIMARY KEY(xet_hash, ns)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS content_sha256_any ON content(sha256);
CREATE TABLE IF NOT EXISTS content_xorbs(
  xorb_hash TEXT NOT NULL,
  xet_hash TEXT NOT NULL,
  PRIMARY KEY(xorb_hash, xet_hash)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS content_xorbs_file ON content_xorbs(xet_hash);
)sql";

}  // namespace megackpt::hub::store_internal

#endif  // MEGACKPT_SRC_HUB_STORE_SCHEMA_H_
