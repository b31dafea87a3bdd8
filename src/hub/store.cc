// HubStore: opening a root, and content streams in and out of the CAS.
#include "megackpt/hub/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "hub/store_internal.h"
#include "hub/store_schema.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"

namespace megackpt::hub {

using namespace store_internal;

namespace {

// A RandomAccessFile with no bytes (empty files have no CAS object).
class EmptyFile final : public RandomAccessFile {
 public:
  explicit EmptyFile(std::string name) : name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return 0; }
  Result<size_t> ReadAt(uint64_t, std::span<std::byte>) const override { return size_t{0}; }

 private:
  std::string name_;
};

// Gives a CAS file the caller's name and checks its size.
class NamedFile final : public RandomAccessFile {
 public:
  NamedFile(std::unique_ptr<RandomAccessFile> base, std::string name)
      : base_(std::move(base)), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return base_->size(); }
  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    auto r = base_->ReadAt(offset, dst);
    if (!r.ok()) return r.status().WithContext(name_);
    return r;
  }

 private:
  std::unique_ptr<RandomAccessFile> base_;
  std::string name_;
};

}  // namespace

// ---------------------------------------------------------------------------
// ContentUpload
// ---------------------------------------------------------------------------

struct ContentUpload::ShaState {
  Sha256 sha;
};

ContentUpload::ContentUpload(std::string name, std::unique_ptr<cas::UploadStream> stream)
    : name_(std::move(name)), stream_(std::move(stream)), sha_(std::make_unique<ShaState>()) {}

ContentUpload::~ContentUpload() = default;

Status ContentUpload::Append(std::span<const std::byte> data) {
  if (closed_) return FailedPreconditionError(name_ + ": append after close");
  sha_->sha.Update(data);
  MEGA_RETURN_IF_ERROR(stream_->Append(data));
  size_ += data.size();
  return Status::OK();
}

Status ContentUpload::Close() {
  if (closed_) return FailedPreconditionError(name_ + ": closed twice");
  closed_ = true;
  MEGA_ASSIGN_OR_RETURN(result_, stream_->Finish());
  entry_.size = size_;
  entry_.sha256 = ToHex(sha_->sha.Finish());
  entry_.xet_hash = size_ == 0 ? std::string(kEmptyXetHash) : result_.file_hash.ToHex();
  if (result_.size != size_) {
    return InternalError(name_ + ": CAS upload reports " + std::to_string(result_.size) +
                         " bytes, " + std::to_string(size_) + " were written");
  }
  if (on_close_) MEGA_RETURN_IF_ERROR(on_close_(entry_, result_));
  return Status::OK();
}

Result<std::unique_ptr<RandomAccessFile>> OpenCasContent(cas::CasStore& cas, const FileEntry& entry,
                                                         std::string name) {
  if (entry.size == 0) return std::unique_ptr<RandomAccessFile>(new EmptyFile(std::move(name)));
  MEGA_ASSIGN_OR_RETURN(auto hash, cas::MerkleHash::FromHex(entry.xet_hash));
  auto file = cas.OpenFile(hash);
  if (!file.ok()) return file.status().WithContext(name);
  if ((*file)->size() != entry.size) {
    return DataLossError(name + ": content " + entry.xet_hash + " has " +
                         std::to_string((*file)->size()) + " bytes, the entry says " +
                         std::to_string(entry.size));
  }
  return std::unique_ptr<RandomAccessFile>(new NamedFile(*std::move(file), std::move(name)));
}

// ---------------------------------------------------------------------------
// HubStore
// ---------------------------------------------------------------------------

namespace {

// A folder only the owner may enter (0700; parents as CreateDirectories
// makes them). An existing folder keeps its mode.
Status MakePrivateDir(const std::string& dir) {
  std::string parent = dir.substr(0, dir.find_last_of('/'));
  if (!parent.empty() && parent != dir) MEGA_RETURN_IF_ERROR(CreateDirectories(parent));
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus("creating hub folder " + dir, errno);
  }
  return Status::OK();
}

// The database file, created 0600 before SQLite opens it (SQLite gives its
// -wal and -shm files the database file's mode). An existing database
// readable by others is tightened to 0600: it holds token hashes and the key
// that signs CAS tokens.
Status MakePrivateFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoToStatus("creating " + path, errno);
  struct stat st;
  Status s;
  if (::fstat(fd, &st) != 0) {
    s = ErrnoToStatus("stat " + path, errno);
  } else if ((st.st_mode & 077) != 0 && ::fchmod(fd, 0600) != 0) {
    s = ErrnoToStatus("chmod 0600 " + path, errno);
  }
  ::close(fd);
  return s;
}

}  // namespace

HubStore::~HubStore() = default;

Result<std::unique_ptr<HubStore>> HubStore::Open(const std::string& root,
                                                 const HubStoreOptions& options) {
  MEGA_RETURN_IF_ERROR(MakePrivateDir(root));
  MEGA_RETURN_IF_ERROR(MakePrivateDir(root + "/uploads"));
  MEGA_RETURN_IF_ERROR(MakePrivateDir(root + "/cas"));
  MEGA_RETURN_IF_ERROR(MakePrivateFile(root + "/hub.db"));
  std::unique_ptr<HubStore> store(new HubStore());
  store->root_ = root;
  store->impl_ = std::make_unique<Impl>();
  cas::LocalBackendOptions local;
  local.sync = options.sync;
  auto cas = cas::CasStore::OpenLocal(root + "/cas", options.cas, local);
  if (!cas.ok()) return cas.status().WithContext("hub root " + root);
  store->cas_ = *std::move(cas);
  auto pool = SqlitePool::Open(root + "/hub.db", options.db_connections);
  if (!pool.ok()) return pool.status().WithContext("hub root " + root);
  store->impl_->pool = *std::move(pool);

  MEGA_ASSIGN_OR_RETURN(auto db, store->impl_->pool->Acquire());
  Status s = WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_RETURN_IF_ERROR(db->Exec(kSchema));
    MEGA_ASSIGN_OR_RETURN(auto get,
                          db->Prepare("SELECT value FROM meta WHERE key='schema_version'"));
    MEGA_ASSIGN_OR_RETURN(bool has, get.Step());
    if (has) {
      std::string v = get.Text(0);
      if (v != std::to_string(kSchemaVersion)) {
        return FailedPreconditionError("hub root " + root + ": schema version " + v +
                                       " is not supported (expected " +
                                       std::to_string(kSchemaVersion) + ")");
      }
    } else {
      MEGA_ASSIGN_OR_RETURN(auto ins, db->Prepare("INSERT INTO meta(key, value) VALUES(?, ?)"));
      MEGA_RETURN_IF_ERROR(
          ins.Bind(1, "schema_version").Bind(2, std::to_string(kSchemaVersion)).Run());
      MEGA_ASSIGN_OR_RETURN(auto ins2, db->Prepare("INSERT INTO meta(key, value) VALUES(?, ?)"));
      MEGA_RETURN_IF_ERROR(ins2.Bind(1, "secret").Bind(2, RandomHex(32)).Run());
    }
    return Status::OK();
  });
  if (!s.ok()) return s.WithContext("hub root " + root);
  return store;
}

}  // namespace megackpt::hub
