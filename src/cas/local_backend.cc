// The local-directory CAS backend (layout: docs/cas.md, "Local store").
//
// Concurrency design: every object (xorb, file) is written to tmp/, fsynced,
// then link(2)ed to its content-addressed name — link fails with EEXIST when
// another writer got there first, so exactly one copy exists and readers never
// see a partial object. The dedup index is an append-only file of fixed-size,
// CRC-protected records; appends hold flock(LOCK_EX) on it and repair a torn
// tail first; readers need no lock (they stop at the first record whose CRC
// fails and retry later). A GC rewrites the index by rename; appenders detect
// the replaced inode after locking and retry on the new file.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "cas/bytes.h"
#include "megackpt/cas/shard.h"
#include "megackpt/cas/store.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"
#include "megackpt/core/text.h"

namespace megackpt::cas {

// ---- CasBackend defaults ---------------------------------------------------

namespace {
class NoopLock final : public StoreLock {};
}  // namespace

Result<std::unique_ptr<StoreLock>> CasBackend::Lock(StoreLockKind) {
  return std::unique_ptr<StoreLock>(std::make_unique<NoopLock>());
}

Result<double> CasBackend::XorbAgeSeconds(const MerkleHash&) { return 1e30; }

Status CasBackend::ReadXorbRange(const MerkleHash& xorb_hash, uint64_t offset,
                                 std::span<std::byte> dst) {
  MEGA_ASSIGN_OR_RETURN(std::string bytes, GetXorbRange(xorb_hash, offset, dst.size()));
  if (bytes.size() != dst.size()) {
    return DataLossError("xorb " + xorb_hash.ToHex() + ": range read returned " +
                         std::to_string(bytes.size()) + " bytes, asked for " +
                         std::to_string(dst.size()));
  }
  std::memcpy(dst.data(), bytes.data(), bytes.size());
  return Status::OK();
}

namespace {

constexpr char kMarkerName[] = "CAS_STORE";
constexpr char kMarkerText[] = "megackpt-cas 1\n";
constexpr size_t kIndexRecordSize = 72;  // chunk hash, xorb hash, u32 index, u32 crc
constexpr size_t kMaxFileRecordBytes = 1u << 30;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
    return *this;
  }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

class FlockLock final : public StoreLock {
 public:
  explicit FlockLock(Fd fd) : fd_(std::move(fd)) {}
  ~FlockLock() override { ::flock(fd_.get(), LOCK_UN); }

 private:
  Fd fd_;
};

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus("write " + path, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// Direct I/O for large synced xorb writes (on unless MEGACKPT_CAS_DIRECT_IO=0):
// core's WritableFile::UseDirectIo. On this VM a buffered write into *new*
// page-cache pages costs 2-3.5 s of kernel time per GiB
// (copy_folio_from_iter_atomic: first touch of guest pages), more than the
// rest of an upload; O_DIRECT skips the page cache. The price: reads right
// after the save come from the device, not the cache (measured in docs/hub.md
// §10: no loss on this VM's disk). Only for xorbs whose body starts on a 4 KiB
// boundary (builders' and the server's buffers do), so the body goes to the
// device straight from that memory in one call.
constexpr size_t kDirectAlign = 4096;
constexpr size_t kDirectMinBytes = 1u << 20;

Status PreadAll(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  MEGA_ASSIGN_OR_RETURN(size_t done, PreadFull(fd, data, n, offset, path));
  if (done < n) {
    return DataLossError(path + ": truncated (wanted " + std::to_string(n) + " bytes at " +
                         std::to_string(offset) + ")");
  }
  return Status::OK();
}

std::string RandomSuffix() { return std::to_string(::getpid()) + "-" + RandomHex(8); }

bool IsHashName(const char* name) { return IsHex(name, 64); }

Result<std::vector<std::string>> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    if (errno == ENOENT) return names;
    return ErrnoToStatus("opendir " + dir, errno);
  }
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

// Appends the hashes named by the entries of `dir` (64 hex digits; other
// names are skipped). A missing folder holds none.
Status AppendHashNames(const std::string& dir, std::vector<MerkleHash>* out) {
  MEGA_ASSIGN_OR_RETURN(auto names, ListDir(dir));
  for (const std::string& n : names) {
    if (!IsHashName(n.c_str())) continue;
    auto h = MerkleHash::FromHex(n);
    if (h.ok()) out->push_back(*h);
  }
  return Status::OK();
}

class LocalBackend final : public CasBackend {
 public:
  LocalBackend(std::string dir, LocalBackendOptions options)
      : dir_(std::move(dir)), options_(options) {}

  Status Init() {
    struct stat st;
    const std::string marker = dir_ + "/" + kMarkerName;
    if (::stat(dir_.c_str(), &st) != 0) {
      if (errno != ENOENT) return ErrnoToStatus("stat " + dir_, errno);
      if (!options_.create) return NotFoundError("CAS store " + dir_ + " does not exist");
    } else if (!S_ISDIR(st.st_mode)) {
      return FailedPreconditionError(dir_ + " is not a folder");
    }
    Result<std::string> text = ReadLocalFile(marker, 4096);
    if (text.ok()) {
      if (*text != kMarkerText) {
        return FailedPreconditionError(marker + ": unknown store version '" + *text + "'");
      }
    } else {
      if (text.status().code() != StatusCode::kNotFound) return text.status();
      if (!options_.create)
        return FailedPreconditionError(dir_ + " is not a CAS store (no " + kMarkerName + ")");
      MEGA_ASSIGN_OR_RETURN(auto entries, ListDir(dir_));
      if (!entries.empty()) {
        bool ours = true;  // a concurrent initialiser may have made the subfolders
        for (const auto& e : entries) {
          if (e != "xorbs" && e != "files" && e != "index" && e != "locks" && e != "tmp" &&
              e.rfind(kMarkerName, 0) != 0) {
            ours = false;
          }
        }
        if (!ours) {
          return FailedPreconditionError(dir_ + " is not empty and is not a CAS store");
        }
      }
    }
    for (const char* sub : {"xorbs", "files", "index", "locks", "tmp"}) {
      MEGA_RETURN_IF_ERROR(CreateDirectories(dir_ + "/" + sub));
    }
    if (!text.ok()) {
      MEGA_RETURN_IF_ERROR(WriteLocalFileAtomically(marker, kMarkerText, options_.sync));
    }
    return Status::OK();
  }

  std::string Describe() const override { return "local CAS store " + dir_; }

  // ---- paths ----
  std::string XorbDir(const MerkleHash& h) const {
    return dir_ + "/xorbs/" + h.ToHex().substr(0, 2);
  }
  std::string XorbPath(const MerkleHash& h) const {
    std::string hex = h.ToHex();
    return dir_ + "/xorbs/" + hex.substr(0, 2) + "/" + hex;
  }
  std::string FilePath(const MerkleHash& h) const { return dir_ + "/files/" + h.ToHex(); }
  std::string IndexPath() const { return dir_ + "/index/chunks.idx"; }

  // Writes `parts` to a new temp file (fdatasync'ed when syncing) and returns
  // its path.
  Result<std::string> WriteTemp(std::initializer_list<std::span<const std::byte>> parts) {
    std::string tmp = dir_ + "/tmp/" + RandomSuffix() + ".tmp";
    const std::span<const std::byte> first =
        parts.size() > 0 ? *parts.begin() : std::span<const std::byte>();
    const bool direct = options_.sync && LocalXorbWritesUseDirectIo() &&
                        first.size() >= kDirectMinBytes &&
                        reinterpret_cast<uintptr_t>(first.data()) % kDirectAlign == 0;
    MEGA_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, CreateLocalFile(tmp));
    if (direct) file->UseDirectIo();  // a hint: refused (tmpfs...), the file is written buffered
    Status s;
    for (auto part : parts) {
      if (!s.ok()) break;
      s = file->Append(part);
    }
    if (s.ok() && options_.sync) s = file->Sync();
    Status closed = file->Close();
    if (s.ok()) s = closed;
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
    return tmp;
  }

  // Writes `parts` to a new temp file and links it at `path`. Returns true when
  // this call created `path`, false when it already existed.
  Result<bool> PublishObject(const std::string& path, const std::string& parent,
                             std::initializer_list<std::span<const std::byte>> parts) {
    MEGA_ASSIGN_OR_RETURN(std::string tmp, WriteTemp(parts));
    return LinkTemp(tmp, path, parent);
  }

  // Links the synced temp file `tmp` at `path` (first link wins), removes the
  // temp name and syncs the folder. Returns true when this call created `path`.
  Result<bool> LinkTemp(const std::string& tmp, const std::string& path,
                        const std::string& parent) {
    Status s;
    bool created = true;
    if (::link(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      if (err == ENOENT) {  // the fan-out folder is missing
        s = CreateDirectories(parent);
        if (s.ok() && ::link(tmp.c_str(), path.c_str()) != 0)
          err = errno;
        else
          err = s.ok() ? 0 : EIO;
      }
      if (err == EEXIST) {
        created = false;
      } else if (err != 0) {
        ::unlink(tmp.c_str());
        return s.ok() ? ErrnoToStatus("link " + tmp + " -> " + path, err) : s;
      }
    }
    ::unlink(tmp.c_str());
    if (created && options_.sync) MEGA_RETURN_IF_ERROR(SyncDirectory(parent));
    return created;
  }

  // ---- xorbs ----
  Status CheckXorbArgs(std::string_view serialized, const XorbLayout& layout) {
    if (layout.serialized_bytes != serialized.size()) {
      return InvalidArgumentError("xorb " + layout.xorb_hash.ToHex() + ": layout says " +
                                  std::to_string(layout.serialized_bytes) + " bytes, got " +
                                  std::to_string(serialized.size()));
    }
    Status valid = layout.Validate();
    if (!valid.ok()) return InvalidArgumentError(valid.message());
    return Status::OK();
  }

  // A xorb written and synced under tmp/, not yet linked.
  class LocalStagedXorb final : public StagedXorb {
   public:
    LocalStagedXorb(const LocalBackend* owner, std::string tmp)
        : owner(owner), tmp(std::move(tmp)) {}
    ~LocalStagedXorb() override {
      if (!tmp.empty()) ::unlink(tmp.c_str());
    }
    const LocalBackend* owner;
    std::string tmp;  // "" once consumed
  };

  Result<std::unique_ptr<StagedXorb>> StageXorb(std::string_view serialized,
                                                const XorbLayout& layout) override {
    MEGA_RETURN_IF_ERROR(CheckXorbArgs(serialized, layout));
    if (::access(XorbPath(layout.xorb_hash).c_str(), F_OK) == 0) {
      return std::unique_ptr<StagedXorb>();  // stored already: PublishStagedXorb → PutXorb → false
    }
    std::string footer = EncodeXorbFooter(layout);
    MEGA_ASSIGN_OR_RETURN(std::string tmp, WriteTemp({std::as_bytes(std::span(serialized)),
                                                      std::as_bytes(std::span(footer))}));
    return std::unique_ptr<StagedXorb>(std::make_unique<LocalStagedXorb>(this, std::move(tmp)));
  }

  Result<bool> PublishStagedXorb(std::unique_ptr<StagedXorb> staged, std::string_view serialized,
                                 const XorbLayout& layout) override {
    auto* local = dynamic_cast<LocalStagedXorb*>(staged.get());
    if (!local || local->owner != this || local->tmp.empty()) return PutXorb(serialized, layout);
    MEGA_RETURN_IF_ERROR(CheckXorbArgs(serialized, layout));
    const std::string tmp = std::exchange(local->tmp, std::string());
    MEGA_ASSIGN_OR_RETURN(bool created,
                          LinkTemp(tmp, XorbPath(layout.xorb_hash), XorbDir(layout.xorb_hash)));
    if (created) {
      MEGA_RETURN_IF_ERROR(AppendIndex(layout));
      CacheLayout(std::make_shared<const XorbLayout>(layout));
    }
    return created;
  }

  Result<bool> PutXorb(std::string_view serialized, const XorbLayout& layout) override {
    MEGA_RETURN_IF_ERROR(CheckXorbArgs(serialized, layout));
    const std::string path = XorbPath(layout.xorb_hash);
    if (::access(path.c_str(), F_OK) == 0) return false;
    std::string footer = EncodeXorbFooter(layout);
    MEGA_ASSIGN_OR_RETURN(bool created, PublishObject(path, XorbDir(layout.xorb_hash),
                                                      {std::as_bytes(std::span(serialized)),
                                                       std::as_bytes(std::span(footer))}));
    if (created) {
      MEGA_RETURN_IF_ERROR(AppendIndex(layout));
      CacheLayout(std::make_shared<const XorbLayout>(layout));
    }
    return created;
  }

  Result<bool> HasXorb(const MerkleHash& h) override {
    return ::access(XorbPath(h).c_str(), F_OK) == 0;
  }

  Result<std::shared_ptr<const XorbLayout>> LayoutOf(const MerkleHash& h) {
    {
      std::lock_guard<std::mutex> lock(layout_mu_);
      auto it = layouts_.find(h);
      if (it != layouts_.end()) return it->second;
    }
    const std::string path = XorbPath(h);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return NotFoundError("xorb " + h.ToHex() + " is not in " + Describe());
      return ErrnoToStatus("open " + path, errno);
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus("fstat " + path, errno);
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < kXorbFooterTrailerSize) {
      return DataLossError(path + ": " + std::to_string(size) +
                           " bytes is too small for a stored xorb");
    }
    std::byte trailer[kXorbFooterTrailerSize];
    MEGA_RETURN_IF_ERROR(
        PreadAll(fd.get(), trailer, sizeof(trailer), size - sizeof(trailer), path));
    auto t = ParseXorbFooterTrailer(trailer);
    if (!t.ok()) return t.status().WithContext(path);
    uint64_t footer = uint64_t{t->first} * kXorbFooterEntrySize + kXorbFooterTrailerSize;
    if (uint64_t{t->second} + footer != size) {
      return DataLossError(path + ": file is " + std::to_string(size) +
                           " bytes, its footer implies " +
                           std::to_string(uint64_t{t->second} + footer));
    }
    std::string buf(footer, '\0');
    MEGA_RETURN_IF_ERROR(PreadAll(fd.get(), buf.data(), footer, t->second, path));
    MEGA_ASSIGN_OR_RETURN(XorbLayout layout, ParseXorbFooter(AsBytes(buf), h));
    auto shared = std::make_shared<const XorbLayout>(std::move(layout));
    CacheLayout(shared);
    return shared;
  }

  void CacheLayout(std::shared_ptr<const XorbLayout> layout) {
    std::lock_guard<std::mutex> lock(layout_mu_);
    if (layouts_.size() >= 4096) layouts_.clear();  // bounded; cheap to reload
    layouts_[layout->xorb_hash] = std::move(layout);
  }

  Result<XorbLayout> GetXorbLayout(const MerkleHash& h) override {
    MEGA_ASSIGN_OR_RETURN(auto layout, LayoutOf(h));
    return *layout;
  }

  Result<uint64_t> XorbSize(const MerkleHash& h) override {
    MEGA_ASSIGN_OR_RETURN(auto layout, LayoutOf(h));
    return uint64_t{layout->serialized_bytes};
  }

  Status ReadXorbRange(const MerkleHash& h, uint64_t offset, std::span<std::byte> dst) override {
    MEGA_ASSIGN_OR_RETURN(auto layout, LayoutOf(h));
    if (offset > layout->serialized_bytes || dst.size() > layout->serialized_bytes - offset) {
      return OutOfRangeError("xorb " + h.ToHex() + ": range [" + std::to_string(offset) + ", " +
                             std::to_string(offset + dst.size()) + ") passes its end (" +
                             std::to_string(layout->serialized_bytes) + " bytes)");
    }
    const std::string path = XorbPath(h);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) return NotFoundError("xorb " + h.ToHex() + " is not in " + Describe());
      return ErrnoToStatus("open " + path, errno);
    }
    return PreadAll(fd.get(), dst.data(), dst.size(), offset, path);
  }

  Result<std::string> GetXorbRange(const MerkleHash& h, uint64_t offset, uint64_t length) override {
    MEGA_ASSIGN_OR_RETURN(auto layout, LayoutOf(h));
    if (offset > layout->serialized_bytes || length > layout->serialized_bytes - offset) {
      return OutOfRangeError("xorb " + h.ToHex() + ": range [" + std::to_string(offset) + ", " +
                             std::to_string(offset + length) + ") passes its end (" +
                             std::to_string(layout->serialized_bytes) + " bytes)");
    }
    std::string out(length, '\0');
    MEGA_RETURN_IF_ERROR(ReadXorbRange(h, offset, std::as_writable_bytes(std::span(out))));
    return out;
  }

  Result<std::string> GetXorb(const MerkleHash& h) override {
    MEGA_ASSIGN_OR_RETURN(auto layout, LayoutOf(h));
    return GetXorbRange(h, 0, layout->serialized_bytes);
  }

  Result<std::vector<MerkleHash>> ListXorbs() override {
    std::vector<MerkleHash> out;
    MEGA_ASSIGN_OR_RETURN(auto fanout, ListDir(dir_ + "/xorbs"));
    for (const std::string& sub : fanout) {
      MEGA_RETURN_IF_ERROR(AppendHashNames(dir_ + "/xorbs/" + sub, &out));
    }
    return out;
  }

  Status DeleteXorbs(std::span<const MerkleHash> hashes) override {
    std::unordered_set<std::string> dirs;
    for (const MerkleHash& h : hashes) {
      const std::string path = XorbPath(h);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        return ErrnoToStatus("unlink " + path, errno);
      dirs.insert(XorbDir(h));
    }
    {
      std::lock_guard<std::mutex> lock(layout_mu_);
      for (const MerkleHash& h : hashes) layouts_.erase(h);
    }
    if (options_.sync) {
      for (const auto& d : dirs) {
        Status s = SyncDirectory(d);
        if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
      }
    }
    return RebuildIndex();
  }

  Result<double> XorbAgeSeconds(const MerkleHash& h) override {
    struct stat st;
    const std::string path = XorbPath(h);
    if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus("stat " + path, errno);
    double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    return now - (st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9);
  }

  // ---- files ----
  Status PutFile(const FileReconstruction& recon) override {
    Status valid = recon.Validate();
    if (!valid.ok()) return InvalidArgumentError(valid.message());
    std::unordered_set<MerkleHash> checked;
    for (const ReconstructionTerm& t : recon.terms) {
      if (!checked.insert(t.xorb_hash).second) continue;
      if (::access(XorbPath(t.xorb_hash).c_str(), F_OK) != 0) {
        return FailedPreconditionError("file " + recon.file_hash.ToHex() + " references xorb " +
                                       t.xorb_hash.ToHex() + " which is not stored in " +
                                       Describe());
      }
    }
    Shard shard;
    shard.files.push_back({recon, std::nullopt});
    std::string bytes = SerializeShard(shard);
    return PublishObject(FilePath(recon.file_hash), dir_ + "/files", {AsBytes(bytes)}).status();
  }

  Result<FileReconstruction> GetFile(const MerkleHash& h) override {
    const std::string path = FilePath(h);
    Result<std::string> bytes = ReadLocalFile(path, kMaxFileRecordBytes);
    if (!bytes.ok()) {
      if (bytes.status().code() == StatusCode::kNotFound) {
        return NotFoundError("file " + h.ToHex() + " is not in " + Describe());
      }
      return bytes.status();
    }
    Result<Shard> shard = ParseShard(AsBytes(*bytes));
    if (!shard.ok()) return shard.status().WithContext(path);
    if (shard->files.size() != 1 || shard->files[0].reconstruction.file_hash != h) {
      return DataLossError(path + ": does not hold exactly the reconstruction of " + h.ToHex());
    }
    FileReconstruction rec = std::move(shard->files[0].reconstruction);
    Status valid = rec.Validate();
    if (!valid.ok()) return DataLossError(path + ": " + valid.message());
    return rec;
  }

  Result<bool> HasFile(const MerkleHash& h) override {
    return ::access(FilePath(h).c_str(), F_OK) == 0;
  }

  Result<std::vector<MerkleHash>> ListFiles() override {
    std::vector<MerkleHash> out;
    MEGA_RETURN_IF_ERROR(AppendHashNames(dir_ + "/files", &out));
    return out;
  }

  Status DeleteFiles(std::span<const MerkleHash> hashes) override {
    for (const MerkleHash& h : hashes) {
      const std::string path = FilePath(h);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        return ErrnoToStatus("unlink " + path, errno);
    }
    if (options_.sync && !hashes.empty()) return SyncDirectory(dir_ + "/files");
    return Status::OK();
  }

  // ---- dedup index ----
  static void EncodeIndexRecord(const MerkleHash& chunk, const MerkleHash& xorb, uint32_t index,
                                uint8_t* out) {
    std::memcpy(out, chunk.bytes.data(), 32);
    std::memcpy(out + 32, xorb.bytes.data(), 32);
    std::memcpy(out + 64, &index, 4);
    uint32_t crc = Crc32(std::as_bytes(std::span(out, 68)));
    std::memcpy(out + 68, &crc, 4);
  }

  std::string IndexRecords(const XorbLayout& layout) {
    std::string recs(layout.chunks.size() * kIndexRecordSize, '\0');
    for (size_t i = 0; i < layout.chunks.size(); ++i) {
      EncodeIndexRecord(layout.chunks[i].hash, layout.xorb_hash, static_cast<uint32_t>(i),
                        reinterpret_cast<uint8_t*>(recs.data()) + i * kIndexRecordSize);
    }
    return recs;
  }

  // Opens the index for appending and locks it exclusively, making sure the
  // locked inode is the one at the path (a GC may have replaced it).
  Result<Fd> LockIndexForWrite() {
    const std::string path = IndexPath();
    for (int attempt = 0; attempt < 100; ++attempt) {
      Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
      if (fd.get() < 0) return ErrnoToStatus("open " + path, errno);
      while (::flock(fd.get(), LOCK_EX) != 0) {
        if (errno != EINTR) return ErrnoToStatus("flock " + path, errno);
      }
      struct stat a, b;
      if (::fstat(fd.get(), &a) != 0) return ErrnoToStatus("fstat " + path, errno);
      if (::stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
        return fd;
      }
    }
    return AbortedError(path + ": replaced repeatedly while trying to lock it");
  }

  Status AppendIndex(const XorbLayout& layout) {
    std::string recs = IndexRecords(layout);
    MEGA_ASSIGN_OR_RETURN(Fd fd, LockIndexForWrite());
    const std::string path = IndexPath();
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus("fstat " + path, errno);
    if (st.st_size % kIndexRecordSize != 0) {
      // A writer died mid-record: drop the torn tail before appending.
      off_t good = st.st_size - st.st_size % kIndexRecordSize;
      if (::ftruncate(fd.get(), good) != 0) return ErrnoToStatus("ftruncate " + path, errno);
    }
    // No fsync: the index is a cache of the xorb footers. Its records are
    // appended after the xorb's data and folder entry are durable, so a record
    // that survives a crash never names a missing xorb; a record lost to a
    // crash costs only dedup until the next GC rebuilds the index.
    MEGA_RETURN_IF_ERROR(WriteAll(fd.get(), recs.data(), recs.size(), path));
    return Status::OK();  // unlocked when fd closes
  }

  // Rebuilds the index from the footers of the stored xorbs (drops entries of
  // deleted xorbs, restores entries lost to a crash between a xorb's link and
  // its index append).
  Status RebuildIndex() {
    MEGA_RETURN_IF_ERROR(CleanTemp());
    MEGA_ASSIGN_OR_RETURN(Fd lock_fd, LockIndexForWrite());
    MEGA_ASSIGN_OR_RETURN(std::vector<MerkleHash> xorbs, ListXorbs());
    std::string all;
    for (const MerkleHash& h : xorbs) {
      Result<std::shared_ptr<const XorbLayout>> layout = LayoutOf(h);
      if (!layout.ok()) {
        if (layout.status().code() == StatusCode::kNotFound) continue;
        return layout.status();
      }
      all += IndexRecords(**layout);
    }
    // Replaces the index whole (core/file.h; syncs the file and index/ when sync).
    MEGA_RETURN_IF_ERROR(WriteLocalFileAtomically(IndexPath(), all, options_.sync));
    std::lock_guard<std::mutex> lock(index_mu_);
    index_.clear();
    index_offset_ = 0;
    index_inode_ = 0;
    return Status::OK();
  }

  // Reads index records appended since the last refresh. REQUIRES: index_mu_.
  Status RefreshIndexLocked() {
    const std::string path = IndexPath();
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) {
        index_.clear();
        index_offset_ = 0;
        index_inode_ = 0;
        return Status::OK();
      }
      return ErrnoToStatus("open " + path, errno);
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus("fstat " + path, errno);
    if (st.st_ino != index_inode_) {
      index_.clear();
      index_offset_ = 0;
      index_inode_ = st.st_ino;
    }
    uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size <= index_offset_) return Status::OK();
    uint64_t n = (size - index_offset_) / kIndexRecordSize;
    if (n == 0) return Status::OK();
    std::string buf(n * kIndexRecordSize, '\0');
    MEGA_RETURN_IF_ERROR(PreadAll(fd.get(), buf.data(), buf.size(), index_offset_, path));
    const uint8_t* p = internal::U8(buf.data());
    for (uint64_t i = 0; i < n; ++i, p += kIndexRecordSize) {
      uint32_t crc;
      std::memcpy(&crc, p + 68, 4);
      if (Crc32(std::as_bytes(std::span(p, 68))) != crc) break;  // torn/in-flight: retry later
      MerkleHash chunk, xorb;
      std::memcpy(chunk.bytes.data(), p, 32);
      std::memcpy(xorb.bytes.data(), p + 32, 32);
      uint32_t index;
      std::memcpy(&index, p + 64, 4);
      index_.try_emplace(chunk, ChunkLocation{xorb, index});
      index_offset_ += kIndexRecordSize;
    }
    return Status::OK();
  }

  Result<std::vector<std::optional<ChunkLocation>>> LookupChunks(
      std::span<const MerkleHash> chunk_hashes) override {
    std::lock_guard<std::mutex> lock(index_mu_);
    MEGA_RETURN_IF_ERROR(RefreshIndexLocked());
    std::vector<std::optional<ChunkLocation>> out(chunk_hashes.size());
    for (size_t i = 0; i < chunk_hashes.size(); ++i) {
      auto it = index_.find(chunk_hashes[i]);
      if (it != index_.end()) out[i] = it->second;
    }
    return out;
  }

  // ---- locks ----
  Result<std::unique_ptr<StoreLock>> Lock(StoreLockKind kind) override {
    const char* name = kind == StoreLockKind::kCommit ? "commit.lock" : "gc.lock";
    const int op = kind == StoreLockKind::kUpload ? LOCK_SH : LOCK_EX;
    const std::string path = dir_ + "/locks/" + name;
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) return ErrnoToStatus("open " + path, errno);
    while (::flock(fd.get(), op) != 0) {
      if (errno != EINTR) return ErrnoToStatus("flock " + path, errno);
    }
    return std::unique_ptr<StoreLock>(std::make_unique<FlockLock>(std::move(fd)));
  }

  // Removes temp files older than an hour (left by crashed writers).
  Status CleanTemp() {
    MEGA_ASSIGN_OR_RETURN(auto names, ListDir(dir_ + "/tmp"));
    time_t now = ::time(nullptr);
    for (const auto& n : names) {
      std::string p = dir_ + "/tmp/" + n;
      struct stat st;
      if (::stat(p.c_str(), &st) == 0 && now - st.st_mtime > 3600) ::unlink(p.c_str());
    }
    return Status::OK();
  }

 private:
  const std::string dir_;
  const LocalBackendOptions options_;

  std::mutex layout_mu_;
  std::unordered_map<MerkleHash, std::shared_ptr<const XorbLayout>> layouts_;

  std::mutex index_mu_;
  std::unordered_map<MerkleHash, ChunkLocation> index_;
  uint64_t index_offset_ = 0;
  ino_t index_inode_ = 0;
};

}  // namespace

bool LocalXorbWritesUseDirectIo() {
  const char* v = std::getenv("MEGACKPT_CAS_DIRECT_IO");  // per write: once per xorb
  return v == nullptr || v[0] != '0';
}

Result<std::shared_ptr<CasBackend>> OpenLocalBackend(const std::string& dir,
                                                     const LocalBackendOptions& options) {
  if (dir.empty()) return InvalidArgumentError("CAS store path is empty");
  auto backend = std::make_shared<LocalBackend>(dir, options);
  MEGA_RETURN_IF_ERROR(backend->Init());
  return std::shared_ptr<CasBackend>(std::move(backend));
}

}  // namespace megackpt::cas
