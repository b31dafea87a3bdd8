// HubStore: resumable multipart uploads (/api/uploads): part files and completion.
#include <filesystem>
#include <functional>
#include <map>

#include "hub/store_internal.h"
#include "hub/util.h"
#include "megackpt/core/checksum.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {

using namespace store_internal;

Result<HubStore::MultipartUpload> HubStore::CreateMultipartUpload(MultipartUpload spec) {
  if (spec.part_size == 0) return InvalidArgumentError("multipart upload: part size 0");
  if (!IsSha256Hex(ToLower(spec.sha256))) {
    return InvalidArgumentError("multipart upload: bad sha256 " + Quote(spec.sha256));
  }
  spec.sha256 = ToLower(spec.sha256);
  spec.id = RandomHex(16);
  MEGA_RETURN_IF_ERROR(CreateDirectories(root_ + "/uploads/" + spec.id));
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_RETURN_IF_ERROR(WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("INSERT INTO uploads(id, repo, path, revision, "
                                               "size, sha256, part_size, stage_only, created_ms) "
                                               "VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    return st.Bind(1, spec.id)
        .Bind(2, spec.repo)
        .Bind(3, spec.path)
        .Bind(4, spec.revision)
        .Bind(5, static_cast<int64_t>(spec.size))
        .Bind(6, spec.sha256)
        .Bind(7, static_cast<int64_t>(spec.part_size))
        .Bind(8, int64_t{spec.stage_only})
        .Bind(9, NowMs())
        .Run();
  }));
  return spec;
}

Result<HubStore::MultipartUpload> HubStore::GetMultipartUpload(std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("SELECT repo, path, revision, size, sha256, "
                                             "part_size, stage_only FROM uploads WHERE id = ?"));
  st.Bind(1, id);
  MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
  if (!has) return NotFoundError("upload " + Quote(id) + " not found");
  MultipartUpload u;
  u.id = std::string(id);
  u.repo = st.Text(0);
  u.path = st.Text(1);
  u.revision = st.Text(2);
  u.size = static_cast<uint64_t>(st.Int(3));
  u.sha256 = st.Text(4);
  u.part_size = static_cast<uint64_t>(st.Int(5));
  u.stage_only = st.Int(6) != 0;
  return u;
}

Result<std::vector<std::pair<int, std::string>>> HubStore::ListUploadParts(std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_ASSIGN_OR_RETURN(
      auto st,
      db->Prepare(
          "SELECT part_number, etag FROM upload_parts WHERE upload_id = ? ORDER BY part_number"));
  st.Bind(1, id);
  std::vector<std::pair<int, std::string>> out;
  while (true) {
    MEGA_ASSIGN_OR_RETURN(bool has, st.Step());
    if (!has) break;
    out.emplace_back(static_cast<int>(st.Int(0)), st.Text(1));
  }
  return out;
}

namespace {

std::string PartPath(const std::string& root, std::string_view id, int part_number) {
  return root + "/uploads/" + std::string(id) + "/" + std::to_string(part_number);
}

// Writes a part to a temp file next to its final name, hashing it; Finish
// renames it into place and records it.
class PartFileWriter final : public HubStore::PartWriter {
 public:
  PartFileWriter(std::string path, std::unique_ptr<WritableFile> file, uint64_t expected,
                 std::function<Status(const std::string& etag, uint64_t size)> record)
      : path_(std::move(path)),
        tmp_(file->name()),
        file_(std::move(file)),
        expected_(expected),
        record_(std::move(record)) {}
  ~PartFileWriter() override {
    if (!done_) {
      if (file_) (void)file_->Close();
      std::error_code ec;
      std::filesystem::remove(tmp_, ec);
    }
  }
  Status Append(std::span<const std::byte> data) override {
    got_ += data.size();
    if (got_ > expected_) return Status::OK();  // too long: refused by Finish
    sha_.Update(data);
    return file_->Append(data);
  }
  Result<std::string> Finish() override {
    MEGA_RETURN_IF_ERROR(file_->Close());
    file_.reset();
    if (got_ != expected_) {
      return InvalidArgumentError("part " + path_.substr(path_.rfind('/') + 1) + " has " +
                                  std::to_string(got_) + " bytes, expected " +
                                  std::to_string(expected_));
    }
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) return IOError("storing upload part " + path_ + ": " + ec.message());
    done_ = true;
    std::string etag = ToHex(sha_.Finish()).substr(0, 32);
    MEGA_RETURN_IF_ERROR(record_(etag, got_));
    return etag;
  }

 private:
  std::string path_, tmp_;
  std::unique_ptr<WritableFile> file_;
  uint64_t expected_, got_ = 0;
  Sha256 sha_;
  bool done_ = false;
  std::function<Status(const std::string&, uint64_t)> record_;
};

}  // namespace

Result<std::unique_ptr<HubStore::PartWriter>> HubStore::BeginUploadPart(std::string_view id,
                                                                        int part_number,
                                                                        uint64_t expected_size) {
  std::string path = PartPath(root_, id, part_number);
  MEGA_ASSIGN_OR_RETURN(auto file, CreateLocalFile(path + ".tmp-" + RandomHex(4)));
  std::string upload_id(id);
  return std::unique_ptr<PartWriter>(new PartFileWriter(
      std::move(path), std::move(file), expected_size,
      [this, upload_id, part_number](const std::string& etag, uint64_t size) -> Status {
        MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
        return WithWriteTxn(db.db(), [&]() -> Status {
          MEGA_ASSIGN_OR_RETURN(auto st,
                                db->Prepare("INSERT OR REPLACE INTO upload_parts(upload_id, "
                                            "part_number, etag, size) VALUES(?, ?, ?, ?)"));
          return st.Bind(1, upload_id)
              .Bind(2, int64_t{part_number})
              .Bind(3, etag)
              .Bind(4, static_cast<int64_t>(size))
              .Run();
        });
      }));
}

Result<FileEntry> HubStore::CompleteMultipartUpload(
    std::string_view id, const std::vector<std::pair<int, std::string>>& parts,
    std::optional<std::string> grant_ns) {
  MEGA_ASSIGN_OR_RETURN(auto upload, GetMultipartUpload(id));
  MEGA_ASSIGN_OR_RETURN(auto stored, ListUploadParts(id));
  uint64_t expected_parts = (upload.size + upload.part_size - 1) / upload.part_size;
  if (parts.size() != expected_parts) {
    return InvalidArgumentError("upload " + std::string(id) + ": " + std::to_string(parts.size()) +
                                " parts listed, " + std::to_string(expected_parts) + " expected");
  }
  std::map<int, std::string> have(stored.begin(), stored.end());
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].first != static_cast<int>(i + 1)) {
      return InvalidArgumentError("upload " + std::string(id) + ": part list out of order at " +
                                  std::to_string(i));
    }
    auto it = have.find(parts[i].first);
    if (it == have.end()) {
      return FailedPreconditionError("upload " + std::string(id) + ": part " +
                                     std::to_string(parts[i].first) + " was not uploaded");
    }
    if (it->second != parts[i].second) {
      return InvalidArgumentError("upload " + std::string(id) + ": part " +
                                  std::to_string(parts[i].first) + " etag mismatch");
    }
  }
  MEGA_ASSIGN_OR_RETURN(auto sink, BeginUpload(upload.path));
  std::string buf(std::min<uint64_t>(upload.part_size, 8u << 20), '\0');
  for (const auto& [n, etag] : parts) {
    MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(PartPath(root_, id, n)));
    for (uint64_t off = 0; off < file->size();) {
      size_t len = static_cast<size_t>(std::min<uint64_t>(buf.size(), file->size() - off));
      auto dst = std::as_writable_bytes(std::span<char>(buf.data(), len));
      MEGA_RETURN_IF_ERROR(file->ReadExactlyAt(off, dst));
      MEGA_RETURN_IF_ERROR(sink->Append(dst));
      off += len;
    }
  }
  if (sink->size() != upload.size) {
    return DataLossError("upload " + std::string(id) + ": received " +
                         std::to_string(sink->size()) + " bytes, declared " +
                         std::to_string(upload.size));
  }
  // Close() records the content as verified; check the hash first so a bad
  // upload is not registered under a sha256 it does not have.
  sink->set_on_close(nullptr);
  MEGA_RETURN_IF_ERROR(sink->Close());
  FileEntry entry = sink->entry();
  if (entry.sha256 != upload.sha256) {
    return DataLossError("upload " + std::string(id) + ": content sha256 " + entry.sha256 +
                         " does not match the declared " + upload.sha256);
  }
  MEGA_RETURN_IF_ERROR(RecordContent(entry, /*sha256_verified=*/true, grant_ns));
  MEGA_RETURN_IF_ERROR(DeleteMultipartUpload(id));
  entry.path = upload.path;
  return entry;
}

Status HubStore::DeleteMultipartUpload(std::string_view id) {
  MEGA_ASSIGN_OR_RETURN(auto db, impl_->pool->Acquire());
  MEGA_RETURN_IF_ERROR(WithWriteTxn(db.db(), [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(auto st, db->Prepare("DELETE FROM uploads WHERE id = ?"));
    return st.Bind(1, id).Run();
  }));
  std::error_code ec;
  std::filesystem::remove_all(root_ + "/uploads/" + std::string(id), ec);
  return Status::OK();
}

}  // namespace megackpt::hub
