// HubStore::CollectGarbage: the live set from commits, buckets and recent uploads.
#include <filesystem>
#include <unordered_set>

#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

Result<GcReport> HubStore::CollectGarbage(double grace_seconds) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  SqliteDb* d = db.db();
  GcReport report;
  // Holding the write lock for the whole collection means no commit can start
  // referencing content while the live set is computed and applied.
  MEGA_RETURN_IF_ERROR(WithWriteTxn(d, [&]() -> Status {
    int64_t cutoff = NowMs() - static_cast<int64_t>(grace_seconds * 1000);
    MEGA_ASSIGN_OR_RETURN(
        auto st,
        d->Prepare("SELECT xet_hash FROM tree_entries UNION SELECT xet_hash FROM bucket_entries "
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
        MEGA_ASSIGN_OR_RETURN(auto adopt, d->Prepare("INSERT OR IGNORE INTO content(xet_hash, "
                                                     "size, sha256, sha256_verified, recorded_ms) "
                                                     "VALUES(?, ?, '', 0, ?)"));
        MEGA_RETURN_IF_ERROR(adopt.Bind(1, h.ToHex())
                                 .Bind(2, static_cast<int64_t>(recon.size))
                                 .Bind(3, NowMs())
                                 .Run());
        live.push_back(h);
      }
    }
    report.live_files = live.size();
    cas::GcOptions opts;
    opts.live_files = std::move(live);
    opts.min_xorb_age_seconds = grace_seconds;
    MEGA_ASSIGN_OR_RETURN(report.cas, cas_->GarbageCollect(opts));
    MEGA_ASSIGN_OR_RETURN(
        auto drop,
        d->Prepare(
            "DELETE FROM content WHERE recorded_ms <= ?1 AND xet_hash NOT IN "
            "(SELECT xet_hash FROM tree_entries UNION SELECT xet_hash FROM bucket_entries)"));
    MEGA_RETURN_IF_ERROR(drop.Bind(1, cutoff).Run());
    report.expired_uploads = static_cast<uint64_t>(drop.Changes());
    // The dedup index follows the files that still exist.
    MEGA_RETURN_IF_ERROR(
        d->Exec("DELETE FROM content_xorbs WHERE xet_hash NOT IN (SELECT xet_hash FROM content) "
                "AND xet_hash NOT IN "
                "(SELECT xet_hash FROM tree_entries UNION SELECT xet_hash FROM bucket_entries)"));
    // Grants only bridge an upload and its commit (then the commit's repo
    // makes the content readable): they expire with the grace period.
    MEGA_ASSIGN_OR_RETURN(auto grants,
                          d->Prepare("DELETE FROM content_grants WHERE recorded_ms <= ?"));
    MEGA_RETURN_IF_ERROR(grants.Bind(1, cutoff).Run());
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
