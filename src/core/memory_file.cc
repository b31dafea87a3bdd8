#include "megackpt/core/memory_file.h"

#include <cstring>

namespace megackpt::inline core {
namespace {

class MemoryRandomAccessFile final : public RandomAccessFile {
 public:
  MemoryRandomAccessFile(std::string name, std::string bytes, bool mapped)
      : name_(std::move(name)), bytes_(std::move(bytes)), mapped_(mapped) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_.size(); }
  const std::byte* mapped_data() const override {
    return mapped_ && !bytes_.empty() ? reinterpret_cast<const std::byte*>(bytes_.data()) : nullptr;
  }
  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset >= bytes_.size()) return size_t{0};
    size_t n = std::min<uint64_t>(dst.size(), bytes_.size() - offset);
    if (n > 0) std::memcpy(dst.data(), bytes_.data() + offset, n);
    return n;
  }

 private:
  std::string name_;
  std::string bytes_;
  bool mapped_;
};

}  // namespace

std::unique_ptr<RandomAccessFile> NewMemoryFile(std::string name, std::string bytes, bool mapped) {
  return std::make_unique<MemoryRandomAccessFile>(std::move(name), std::move(bytes), mapped);
}

MemoryWritableFile::MemoryWritableFile(std::string name, bool supports_write_at)
    : name_(std::move(name)), supports_write_at_(supports_write_at) {}

Status MemoryWritableFile::Append(std::span<const std::byte> data) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return FailedPreconditionError(name_ + ": write after close");
  data_.append(reinterpret_cast<const char*>(data.data()), data.size());
  ++write_calls_;
  return Status::OK();
}

Status MemoryWritableFile::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  if (!supports_write_at_) {
    return UnimplementedError(name_ + ": positioned writes are not supported");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return FailedPreconditionError(name_ + ": write after close");
  if (offset + data.size() > data_.size()) data_.resize(offset + data.size(), '\0');
  if (!data.empty()) std::memcpy(data_.data() + offset, data.data(), data.size());
  ++write_calls_;
  return Status::OK();
}

uint64_t MemoryWritableFile::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

Status MemoryWritableFile::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  return Status::OK();
}

}  // namespace megackpt::inline core
