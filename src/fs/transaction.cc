// The in-place transaction (FileSystem::BeginTransaction's default): the local
// commit protocol expressed over a FileSystem's own primitives, so it serves
// LocalFileSystem and any wrapper that forwards them (fault injection, counting).
//
// Why in place: a local save must not copy its large files at commit time, so
// they are written under their final names (the caller picks names the
// committed state does not reference) and only the small Puts carry the commit:
// at Commit the folder is fsynced (the files' directory entries are durable
// before anything refers to them), then each Put is written atomically in order,
// the last one being the commit point, then the staged removals run. A crash
// before the last Put's rename leaves the previous state; after it, the new one.
#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "megackpt/core/path_components.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::fs {
namespace {

constexpr std::string_view kExportFormat = "megackpt-inplace-transaction-v1";

Status ValidateRelativePath(std::string_view p) {
  if (p.empty()) return InvalidArgumentError("transaction path is empty");
  if (p.front() == '/')
    return InvalidArgumentError(std::string(p) + ": transaction paths are relative to the root");
  if (p.find('\n') != std::string_view::npos || p.find('\0') != std::string_view::npos) {
    return InvalidArgumentError("transaction path holds a newline or NUL");
  }
  for (std::string_view part : PathComponents(p)) {
    if (part.empty() || part == "..") {
      return InvalidArgumentError(std::string(p) +
                                  ": empty or '..' component in a transaction path");
    }
  }
  return Status::OK();
}

class InPlaceTransaction final : public Transaction {
 public:
  InPlaceTransaction(FileSystem& fs, std::string root, TransactionOptions options)
      : fs_(fs), root_(std::move(root)), options_(std::move(options)) {}

  const std::string& root() const override { return root_; }
  const std::string& base_root() const override { return root_; }
  std::string token() const override { return ""; }

  Result<std::unique_ptr<WritableFile>> OpenForWrite(std::string_view relative_path) override {
    MEGA_RETURN_IF_ERROR(ValidateRelativePath(relative_path).WithContext(root_));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!open_) return FailedPreconditionError(root_ + ": transaction is closed");
      // Recorded before the file exists, so Abort also removes a partial one.
      created_.insert(std::string(relative_path));
    }
    return fs_.OpenForWrite(JoinPath(root_, relative_path));
  }

  Status Put(std::string_view relative_path, std::string_view data) override {
    MEGA_RETURN_IF_ERROR(ValidateRelativePath(relative_path).WithContext(root_));
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return FailedPreconditionError(root_ + ": transaction is closed");
    auto same = [&](const auto& p) { return p.first == relative_path; };
    puts_.erase(std::remove_if(puts_.begin(), puts_.end(), same), puts_.end());
    puts_.emplace_back(std::string(relative_path), std::string(data));
    return Status::OK();
  }

  Status Remove(std::string_view relative_path) override {
    MEGA_RETURN_IF_ERROR(ValidateRelativePath(relative_path).WithContext(root_));
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return FailedPreconditionError(root_ + ": transaction is closed");
    if (std::find(removes_.begin(), removes_.end(), relative_path) == removes_.end()) {
      removes_.emplace_back(relative_path);
    }
    return Status::OK();
  }

  Result<std::string> Export() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out(kExportFormat);
    out += '\n';
    for (const std::string& f : created_) {
      out += f;
      out += '\n';
    }
    return out;
  }

  Status Import(std::string_view token) override {
    const std::string header = std::string(kExportFormat) + "\n";
    if (!std::string_view(token).starts_with(header)) {
      return InvalidArgumentError(root_ + ": not an export of a local transaction");
    }
    token.remove_prefix(header.size());
    std::vector<std::string> files;
    while (!token.empty()) {
      size_t nl = token.find('\n');
      if (nl == std::string_view::npos) {
        return InvalidArgumentError(root_ + ": truncated transaction export");
      }
      std::string_view f = token.substr(0, nl);
      MEGA_RETURN_IF_ERROR(ValidateRelativePath(f).WithContext(root_ + ": transaction export"));
      files.emplace_back(f);
      token.remove_prefix(nl + 1);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!open_) return FailedPreconditionError(root_ + ": transaction is closed");
    imported_.insert(files.begin(), files.end());
    return Status::OK();
  }

  std::vector<std::string> staged_files() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::set<std::string> all(created_.begin(), created_.end());
    all.insert(imported_.begin(), imported_.end());
    for (const auto& [path, data] : puts_) all.insert(path);
    return std::vector<std::string>(all.begin(), all.end());
  }

  TransactionStats stats() const override { return {}; }

  Result<std::string> Commit() override {
    std::vector<std::pair<std::string, std::string>> puts;
    std::vector<std::string> removes;
    std::set<std::string> created;
    bool wrote = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!open_) return FailedPreconditionError(root_ + ": transaction is closed");
      open_ = false;
      puts.swap(puts_);
      removes.swap(removes_);
      created.swap(created_);
      wrote = !created.empty() || !imported_.empty() || !puts.empty();
    }
    // Every failure below happens before the commit point: the transaction is
    // discarded as by Abort.
    auto discard = [&] {
      for (const std::string& f : created) fs_.Remove(JoinPath(root_, f)).IgnoreError();
    };
    // 1. The in-place files' directory entries are durable before anything
    //    refers to them.
    if (options_.sync && wrote) {
      Status synced = fs_.SyncDirectory(root_);
      if (!synced.ok()) {
        discard();
        return synced.WithContext("commit");
      }
    }
    // 2. The Puts, in order; the last one is the commit point. A failure puts
    //    the earlier ones back, so readers of any of them keep a consistent view
    //    of the previous state.
    std::vector<std::pair<std::string, std::optional<std::string>>> replaced;
    for (size_t i = 0; i < puts.size(); ++i) {
      const std::string path = JoinPath(root_, puts[i].first);
      std::optional<std::string> previous;
      if (i + 1 < puts.size()) {
        auto old = fs_.ReadWhole(path);
        if (old.ok()) previous = std::move(*old);
      }
      Status st = fs_.WriteAtomically(path, puts[i].second, options_.sync);
      if (!st.ok()) {
        for (auto it = replaced.rbegin(); it != replaced.rend(); ++it) {
          if (it->second) {
            fs_.WriteAtomically(it->first, *it->second, options_.sync).IgnoreError();
          } else {
            fs_.Remove(it->first).IgnoreError();
          }
        }
        discard();
        return st.WithContext(root_ + ": commit of " + puts[i].first);
      }
      replaced.emplace_back(path, std::move(previous));
    }
    // 3. Removals after the commit point; failures are left for a later commit.
    std::vector<std::string> garbage;
    for (const std::string& r : removes) garbage.push_back(JoinPath(root_, r));
    fs_.RemoveGarbage(garbage);
    return std::string();
  }

  void Abort() override {
    std::set<std::string> created;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!open_) return;
      open_ = false;
      created.swap(created_);
      puts_.clear();
      removes_.clear();
    }
    for (const std::string& f : created) fs_.Remove(JoinPath(root_, f)).IgnoreError();
  }

  bool is_open() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return open_;
  }

 private:
  FileSystem& fs_;
  const std::string root_;
  const TransactionOptions options_;
  mutable std::mutex mu_;
  bool open_ = true;
  std::set<std::string> created_;                          // written here (removed by Abort)
  std::set<std::string> imported_;                         // written by other participants
  std::vector<std::pair<std::string, std::string>> puts_;  // in commit order
  std::vector<std::string> removes_;
};

}  // namespace

Result<std::unique_ptr<Transaction>> FileSystem::BeginTransaction(
    const std::string& root, const TransactionOptions& options) {
  std::string clean = root;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  if (clean.empty()) return InvalidArgumentError("transaction root is empty");
  return std::unique_ptr<Transaction>(new InPlaceTransaction(*this, std::move(clean), options));
}

}  // namespace megackpt::fs
