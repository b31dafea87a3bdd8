// HubStore: content records, and which content a caller may name by hash.
#include <unordered_set>

#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

namespace store_internal {

Result<bool> ContentReadable(SqliteDb* db, std::string_view xet_hash, const ContentAccess& access) {
  if (!access.ns || xet_hash == kEmptyXetHash) return true;
  // Uploaded under a grant to the namespace, or referenced by any commit of
  // a repo (or a bucket) that the namespace may read.
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare("SELECT EXISTS(SELECT 1 FROM content_grants WHERE xet_hash = ?1 AND ns = ?2) "
                  "OR EXISTS(SELECT 1 FROM tree_entries t JOIN repos r ON r.id = t.repo_id "
                  "          WHERE t.xet_hash = ?1 AND (r.private = 0 OR r.ns = ?2)) "
                  "OR EXISTS(SELECT 1 FROM bucket_entries e JOIN buckets b ON b.id = e.bucket_id "
                  "          WHERE e.xet_hash = ?1 AND (b.private = 0 OR b.ns = ?2))"));
  st.Bind(1, ToLower(xet_hash)).Bind(2, *access.ns);
  MEGA_ASSIGN_OR_RETURN(bool row, st.Step());
  return row && st.Int(0) != 0;
}

Status CheckContent(SqliteDb* db, cas::CasStore& cas, const FileEntry& entry, std::string_view path,
                    const ContentAccess& access) {
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
  const Status not_uploaded = FailedPreconditionError("path " + Quote(path) + ": content " +
                                                      entry.xet_hash + " was not uploaded");
  // Before anything else (the size check would tell a size): content the
  // caller may not read is "not uploaded", like unknown content.
  MEGA_ASSIGN_OR_RETURN(bool readable, ContentReadable(db, entry.xet_hash, access));
  if (!readable) return not_uploaded;
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
      if (recon.status().code() == StatusCode::kNotFound) return not_uploaded;
      return recon.status();
    }
    size = recon->size;
    MEGA_ASSIGN_OR_RETURN(
        auto ins,
        db->Prepare(
            "INSERT OR IGNORE INTO content(xet_hash, size, sha256, sha256_verified, recorded_ms) "
            "VALUES(?, ?, ?, 0, ?)"));
    MEGA_RETURN_IF_ERROR(ins.Bind(1, ToLower(entry.xet_hash))
                             .Bind(2, static_cast<int64_t>(size))
                             .Bind(3, entry.sha256)
                             .Bind(4, NowMs())
                             .Run());
  }
  if (size != entry.size) {
    return InvalidArgumentError("path " + Quote(path) + ": size " + std::to_string(entry.size) +
                                " does not match the uploaded content " + entry.xet_hash + " (" +
                                std::to_string(size) + " bytes)");
  }
  return Status::OK();
}

}  // namespace store_internal

Result<std::unique_ptr<ContentUpload>> HubStore::BeginUpload(std::string name,
                                                             std::optional<std::string> grant_ns) {
  cas::UploadOptions opts;
  opts.name = name;
  MEGA_ASSIGN_OR_RETURN(auto stream, cas_->BeginUpload(opts));
  auto upload = std::make_unique<ContentUpload>(std::move(name), std::move(stream));
  upload->set_on_close([this, grant_ns](const FileEntry& entry, const cas::FileUploadResult&) {
    return RecordContent(entry, /*sha256_verified=*/true, grant_ns);
  });
  return upload;
}

Status HubStore::RecordContent(const FileEntry& entry, bool sha256_verified,
                               std::optional<std::string> grant_ns) {
  if (entry.xet_hash == kEmptyXetHash || entry.size == 0) return Status::OK();
  if (!IsXetHashText(entry.xet_hash)) {
    return InvalidArgumentError("bad xet hash " + Quote(entry.xet_hash));
  }
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(entry.xet_hash));
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  // A content row is a hint (GC grace for uploads not committed yet, sha256
  // lookups, access grants), not a commit: its transaction skips the WAL
  // fsync (synchronous=NORMAL: a crash may drop the row but never corrupts the
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
    int64_t now = NowMs();
    MEGA_ASSIGN_OR_RETURN(
        auto st,
        db->Prepare("INSERT INTO content(xet_hash, size, sha256, sha256_verified, recorded_ms) "
                    "VALUES(?, ?, ?, ?, ?) "
                    "ON CONFLICT(xet_hash) DO UPDATE SET recorded_ms = excluded.recorded_ms, "
                    "sha256 = CASE WHEN excluded.sha256_verified = 1 OR content.sha256 = '' THEN "
                    "excluded.sha256 "
                    "              ELSE content.sha256 END, "
                    "sha256_verified = max(content.sha256_verified, excluded.sha256_verified)"));
    MEGA_RETURN_IF_ERROR(st.Bind(1, ToLower(entry.xet_hash))
                             .Bind(2, static_cast<int64_t>(entry.size))
                             .Bind(3, entry.sha256)
                             .Bind(4, int64_t{sha256_verified})
                             .Bind(5, now)
                             .Run());
    // Which xorbs the file uses (global dedup answers name a file's other
    // xorbs next to the one holding the queried chunk).
    MEGA_ASSIGN_OR_RETURN(auto recon, cas_->GetReconstruction(hash));
    std::unordered_set<cas::MerkleHash> xorbs;
    for (const auto& t : recon.terms) xorbs.insert(t.xorb_hash);
    for (const auto& x : xorbs) {
      MEGA_ASSIGN_OR_RETURN(
          auto xs,
          db->Prepare("INSERT OR IGNORE INTO content_xorbs(xorb_hash, xet_hash) VALUES(?, ?)"));
      MEGA_RETURN_IF_ERROR(xs.Bind(1, x.ToHex()).Bind(2, ToLower(entry.xet_hash)).Run());
    }
    if (grant_ns) {
      MEGA_ASSIGN_OR_RETURN(
          auto g,
          db->Prepare(
              "INSERT INTO content_grants(xet_hash, ns, recorded_ms) VALUES(?, ?, ?) "
              "ON CONFLICT(xet_hash, ns) DO UPDATE SET recorded_ms = excluded.recorded_ms"));
      MEGA_RETURN_IF_ERROR(
          g.Bind(1, ToLower(entry.xet_hash)).Bind(2, *grant_ns).Bind(3, now).Run());
    }
    return Status::OK();
  });
}

Result<std::optional<FileEntry>> HubStore::FindBySha256(std::string_view sha256,
                                                        const ContentAccess& access,
                                                        std::optional<std::string> claimed_in_ns) {
  std::string lower = ToLower(sha256);
  if (lower == Sha256Hex("")) {
    FileEntry e;
    e.sha256 = lower;
    e.xet_hash = kEmptyXetHash;
    return std::optional<FileEntry>(e);
  }
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  // Verified rows first; then (with claimed_in_ns) rows whose uploader holds
  // a grant to that namespace, newest first.
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare(
          "SELECT c.xet_hash, c.size FROM content c WHERE c.sha256 = ?1 AND (c.sha256_verified = 1 "
          "  OR (?2 IS NOT NULL AND EXISTS(SELECT 1 FROM content_grants g "
          "                                WHERE g.xet_hash = c.xet_hash AND g.ns = ?2))) "
          "ORDER BY c.sha256_verified DESC, c.recorded_ms DESC"));
  st.Bind(1, lower);
  st.Bind(2, claimed_in_ns);
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) return std::optional<FileEntry>();
    FileEntry e;
    e.xet_hash = st.Text(0);
    e.size = static_cast<uint64_t>(st.Int(1));
    e.sha256 = lower;
    MEGA_ASSIGN_OR_RETURN(bool readable, ContentReadable(db.db(), e.xet_hash, access));
    if (readable) return std::optional<FileEntry>(e);
  }
}

Result<std::vector<cas::MerkleHash>> HubStore::DedupCompanionXorbs(const cas::MerkleHash& xorb,
                                                                   const ContentAccess& access,
                                                                   size_t max_xorbs) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  // The newest files using the xorb (a few: a popular xorb is in many).
  MEGA_ASSIGN_OR_RETURN(
      auto files,
      db->Prepare(
          "SELECT x.xet_hash FROM content_xorbs x LEFT JOIN content c ON c.xet_hash = x.xet_hash "
          "WHERE x.xorb_hash = ? ORDER BY c.recorded_ms DESC LIMIT 16"));
  files.Bind(1, xorb.ToHex());
  std::vector<std::string> readable;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, files.Step());
    if (!has) break;
    std::string file = files.Text(0);
    MEGA_ASSIGN_OR_RETURN(bool ok, ContentReadable(db.db(), file, access));
    if (ok) readable.push_back(std::move(file));
  }
  std::vector<cas::MerkleHash> out;
  std::unordered_set<cas::MerkleHash> seen{xorb};
  for (const auto& file : readable) {
    MEGA_ASSIGN_OR_RETURN(auto st,
                          db->Prepare("SELECT xorb_hash FROM content_xorbs WHERE xet_hash = ?"));
    st.Bind(1, file);
    while (out.size() < max_xorbs) {
      MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
      if (!has) break;
      auto h = cas::MerkleHash::FromHex(st.Text(0));
      if (h.ok() && seen.insert(*h).second) out.push_back(*h);
    }
  }
  return out;
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

}  // namespace megackpt::hub
