// HubStore: buckets (mutable path -> entry maps, no history).
#include <algorithm>

#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

namespace {

struct BucketRow {
  int64_t id = 0;
  BucketInfo info;
};

Result<BucketRow> FindBucket(SqliteDb* db, std::string_view bucket) {
  MEGA_ASSIGN_OR_RETURN(auto parts, SplitRepoId(bucket));
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare(
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
  auto insert = [&](SqliteDb* db, const std::string&) -> Result<BucketInfo> {
    int64_t now = NowMs();
    MEGA_ASSIGN_OR_RETURN(
        auto ins,
        db->Prepare("INSERT INTO buckets(ns, name, private, created_ms) VALUES(?, ?, ?, ?)"));
    MEGA_RETURN_IF_ERROR(
        ins.Bind(1, ns).Bind(2, name).Bind(3, int64_t{is_private}).Bind(4, now).Run());
    BucketInfo info;
    info.ns = std::string(ns);
    info.name = std::string(name);
    info.is_private = is_private;
    info.created_ms = now;
    return info;
  };
  return CreateNamed(*impl_->pool, FindBucket, "bucket", ns, name, exist_ok, insert);
}

Result<BucketInfo> HubStore::GetBucket(std::string_view bucket) {
  return GetNamed(*impl_->pool, FindBucket, bucket);
}

Status HubStore::DeleteBucket(std::string_view bucket) {
  return DeleteNamed(*impl_->pool, FindBucket, "buckets", bucket);
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
        MEGA_ASSIGN_OR_RETURN(
            auto del, d->Prepare("DELETE FROM bucket_entries WHERE bucket_id = ? AND path = ?"));
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
        const Status not_uploaded =
            FailedPreconditionError("bucket path " + Quote(op.entry.path) + ": content " +
                                    fe.xet_hash + " was not uploaded");
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
      MEGA_ASSIGN_OR_RETURN(
          auto up,
          d->Prepare(
              "INSERT OR REPLACE INTO bucket_entries(bucket_id, path, size, xet_hash, sha256, "
              "content_type, mtime_ms, uploaded_ms) VALUES(?, ?, ?, ?, ?, ?, ?, ?)"));
      MEGA_RETURN_IF_ERROR(up.Bind(1, row.id)
                               .Bind(2, op.entry.path)
                               .Bind(3, static_cast<int64_t>(fe.size))
                               .Bind(4, ToLower(fe.xet_hash))
                               .Bind(5, fe.sha256)
                               .Bind(6, op.entry.content_type)
                               .Bind(7, op.entry.mtime_ms ? op.entry.mtime_ms : now)
                               .Bind(8, now)
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
  MEGA_ASSIGN_OR_RETURN(auto st,
                        PreparePathPage(db.db(),
                                        "SELECT path, size, xet_hash, sha256, content_type, "
                                        "mtime_ms, uploaded_ms FROM bucket_entries "
                                        "WHERE bucket_id = ? ",
                                        1, prefix, after, limit));
  st.Bind(1, row.id);
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
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT path, size, xet_hash, sha256, content_type, "
                                             "mtime_ms, uploaded_ms FROM bucket_entries "
                                             "WHERE bucket_id = ? AND path = ?"));
  st.Bind(1, row.id).Bind(2, path);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) {
    return NotFoundError("entry " + Quote(path) + " not found in bucket " + std::string(bucket));
  }
  return ReadBucketEntry(st);
}

}  // namespace megackpt::hub
