// HubStore: buckets (mutable path -> entry maps, no history).
#include "megackpt/hub/store.h"

#include <algorithm>

#include "hub/util.h"
#include "megackpt/hub/mega_uri.h"

#include "hub/store_internal.h"

namespace megackpt::hub {

using namespace store_internal;

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

Status HubStore::BucketBatch(std::string_view bucket, const std::vector<BucketOperation>& ops,
                             const ContentAccess& access) {
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
        // Xet's batch format carries no size: take it from the content
        // (content the caller may not read is "not uploaded" too).
        const Status not_uploaded = FailedPreconditionError(
            "bucket path " + Quote(op.entry.path) + ": content " + fe.xet_hash + " was not uploaded");
        MEGA_ASSIGN_OR_RETURN(bool readable, ContentReadable(d, fe.xet_hash, access));
        if (!readable) return not_uploaded;
        MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(fe.xet_hash));
        auto recon = cas_->GetReconstruction(hash);
        if (!recon.ok()) {
          if (recon.status().code() == StatusCode::kNotFound) return not_uploaded;
          return recon.status();
        }
        fe.size = recon->size;
      }
      MEGA_RETURN_IF_ERROR(CheckContent(d, *cas_, fe, op.entry.path, access));
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

}  // namespace megackpt::hub
