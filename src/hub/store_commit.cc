// HubStore::Commit: one SQLite write transaction per commit (rules: docs/hub.md §2).
#include <map>
#include <set>

#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

namespace {

// Rejects a file whose path is a folder of another file or vice versa.
Status CheckNoFileFolderClash(SqliteDb* db, int64_t repo_id, std::string_view commit,
                              std::string_view path) {
  std::string under = std::string(path) + "/";
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT path FROM tree_entries WHERE repo_id = ? AND "
                                             "commit_id = ? AND path >= ? AND path < ? LIMIT 1"));
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
    if (op.kind == CommitOperation::Kind::kCopy)
      MEGA_RETURN_IF_ERROR(ValidateRepoPath(op.source_path));
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
      MEGA_ASSIGN_OR_RETURN(auto diff,
                            d->Prepare("SELECT path FROM (SELECT path, xet_hash, sha256 FROM "
                                       "tree_entries WHERE repo_id = ?1 AND commit_id = ?2 "
                                       "  EXCEPT SELECT path, xet_hash, sha256 FROM tree_entries "
                                       "WHERE repo_id = ?1 AND commit_id = ?3) "
                                       "UNION SELECT path FROM (SELECT path, xet_hash, sha256 FROM "
                                       "tree_entries WHERE repo_id = ?1 AND commit_id = ?3 "
                                       "  EXCEPT SELECT path, xet_hash, sha256 FROM tree_entries "
                                       "WHERE repo_id = ?1 AND commit_id = ?2)"));
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
    MEGA_ASSIGN_OR_RETURN(
        auto ins,
        d->Prepare(
            "INSERT INTO commits(repo_id, id, parent, message, description, author, created_ms) "
            "VALUES(?, ?, ?, ?, ?, ?, ?)"));
    MEGA_RETURN_IF_ERROR(ins.Bind(1, repo.id)
                             .Bind(2, id)
                             .Bind(3, base)
                             .Bind(4, req.message)
                             .Bind(5, req.description)
                             .Bind(6, req.author)
                             .Bind(7, now)
                             .Run());
    if (base) {
      MEGA_ASSIGN_OR_RETURN(
          auto copy,
          d->Prepare("INSERT INTO tree_entries(repo_id, commit_id, path, size, sha256, xet_hash) "
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
      c.previous_sha256 =
          it != changes.end() ? it->second.previous_sha256 : (before ? before->sha256 : "");
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
    auto put = [&](const std::string& path, FileEntry entry,
                   const ContentAccess& access) -> Status {
      MEGA_RETURN_IF_ERROR(CheckContent(d, *cas_, entry, path, access));
      entry.xet_hash = ToLower(entry.xet_hash);
      MEGA_RETURN_IF_ERROR(CheckNoFileFolderClash(d, repo.id, id, path));
      MEGA_ASSIGN_OR_RETURN(auto before, FindTreeEntry(d, repo.id, id, path));
      MEGA_ASSIGN_OR_RETURN(auto up, d->Prepare("INSERT OR REPLACE INTO tree_entries(repo_id, "
                                                "commit_id, path, size, sha256, xet_hash) "
                                                "VALUES(?, ?, ?, ?, ?, ?)"));
      MEGA_RETURN_IF_ERROR(up.Bind(1, repo.id)
                               .Bind(2, id)
                               .Bind(3, path)
                               .Bind(4, static_cast<int64_t>(entry.size))
                               .Bind(5, entry.sha256)
                               .Bind(6, entry.xet_hash)
                               .Run());
      note(path, "put", &entry, before);
      return Status::OK();
    };
    auto remove = [&](const std::string& path) -> Result<bool> {
      MEGA_ASSIGN_OR_RETURN(auto before, FindTreeEntry(d, repo.id, id, path));
      if (!before) return false;
      MEGA_ASSIGN_OR_RETURN(
          auto del,
          d->Prepare("DELETE FROM tree_entries WHERE repo_id = ? AND commit_id = ? AND path = ?"));
      MEGA_RETURN_IF_ERROR(del.Bind(1, repo.id).Bind(2, id).Bind(3, path).Run());
      note(path, "delete", nullptr, before);
      return true;
    };

    for (const auto& op : req.ops) {
      switch (op.kind) {
        case CommitOperation::Kind::kAdd: {
          MEGA_RETURN_IF_ERROR(put(op.path, op.entry, req.access));
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
          MEGA_ASSIGN_OR_RETURN(auto list,
                                d->Prepare("SELECT path FROM tree_entries WHERE repo_id = ? AND "
                                           "commit_id = ? AND path >= ? AND path < ?"));
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
          MEGA_ASSIGN_OR_RETURN(auto src,
                                FindTreeEntry(d, src_repo.id, src_commit, op.source_path));
          if (!src) {
            return NotFoundError("copy source " + Quote(op.source_path) + " not found in " +
                                 src_repo.info.id() + " at " + src_commit);
          }
          // The caller checked that it may read the source.
          MEGA_RETURN_IF_ERROR(put(op.path, *src, ContentAccess{}));
          break;
        }
      }
    }

    // Nothing to change on an existing branch: no commit (the rows written
    // for the new commit are removed; the ref does not move).
    if (head) {
      bool changed = false;
      for (const auto& [path, c] : changes) {
        MEGA_ASSIGN_OR_RETURN(auto was, FindTreeEntry(d, repo.id, *head, path));
        MEGA_ASSIGN_OR_RETURN(auto now_entry, FindTreeEntry(d, repo.id, id, path));
        if (was != now_entry) {
          changed = true;
          break;
        }
      }
      if (!changed) {
        MEGA_ASSIGN_OR_RETURN(
            auto drop_tree,
            d->Prepare("DELETE FROM tree_entries WHERE repo_id = ? AND commit_id = ?"));
        MEGA_RETURN_IF_ERROR(drop_tree.Bind(1, repo.id).Bind(2, id).Run());
        MEGA_ASSIGN_OR_RETURN(auto drop,
                              d->Prepare("DELETE FROM commits WHERE repo_id = ? AND id = ?"));
        MEGA_RETURN_IF_ERROR(drop.Bind(1, repo.id).Bind(2, id).Run());
        MEGA_ASSIGN_OR_RETURN(
            auto cur,
            d->Prepare("SELECT id, parent, message, description, author, created_ms FROM commits "
                       "WHERE repo_id = ? AND id = ?"));
        cur.Bind(1, repo.id).Bind(2, *head);
        MEGA_ASSIGN_OR_RETURN(bool has, cur.Step());
        if (!has) return InternalError("head commit " + *head + " of " + req.repo + " is missing");
        CommitInfo unchanged = ReadCommitRow(cur, 0);
        unchanged.no_change = true;
        return unchanged;
      }
    }

    for (const auto& [path, c] : changes) {
      MEGA_ASSIGN_OR_RETURN(auto r, d->Prepare("INSERT INTO commit_changes(repo_id, commit_id, "
                                               "path, change, size, sha256, previous_sha256) "
                                               "VALUES(?, ?, ?, ?, ?, ?, ?)"));
      MEGA_RETURN_IF_ERROR(r.Bind(1, repo.id)
                               .Bind(2, id)
                               .Bind(3, path)
                               .Bind(4, c.change)
                               .Bind(5, static_cast<int64_t>(c.size))
                               .Bind(6, c.sha256)
                               .Bind(7, c.previous_sha256)
                               .Run());
    }

    if (head) {
      MEGA_ASSIGN_OR_RETURN(
          auto up,
          d->Prepare(
              "UPDATE refs SET target = ?, updated_ms = ? WHERE repo_id = ? AND kind = 'branch' "
              "AND name = ? AND target = ?"));
      MEGA_RETURN_IF_ERROR(
          up.Bind(1, id).Bind(2, now).Bind(3, repo.id).Bind(4, req.branch).Bind(5, *head).Run());
      if (up.Changes() != 1) {
        return AbortedError("conflict: branch '" + req.branch + "' of " + req.repo +
                            " moved during the commit");
      }
    } else {
      MEGA_ASSIGN_OR_RETURN(
          auto insref,
          d->Prepare("INSERT INTO refs(repo_id, kind, name, target, message, updated_ms) "
                     "VALUES(?, 'branch', ?, ?, NULL, ?)"));
      MEGA_RETURN_IF_ERROR(
          insref.Bind(1, repo.id).Bind(2, req.branch).Bind(3, id).Bind(4, now).Run());
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

}  // namespace megackpt::hub
