// In-memory RandomAccessFile and WritableFile: for parsers fed from a buffer
// (fuzzers, network bodies) and for tests of sequential sinks.
#ifndef MEGACKPT_CORE_MEMORY_FILE_H_
#define MEGACKPT_CORE_MEMORY_FILE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "megackpt/core/file.h"

namespace megackpt::inline core {

// A read-only file over `bytes` (taken by value; no further copies).
// mapped_data() points at the bytes (so mmap-only paths work too) unless
// `mapped` is false.
std::unique_ptr<RandomAccessFile> NewMemoryFile(std::string name, std::string bytes,
                                                bool mapped = true);

// A writable file that collects bytes in memory. With `supports_write_at`
// false it behaves like a sequential upload stream (WriteAt is Unimplemented).
// The contents are readable at any time through contents().
class MemoryWritableFile final : public WritableFile {
 public:
  explicit MemoryWritableFile(std::string name, bool supports_write_at = true);
  const std::string& name() const override { return name_; }
  Status Append(std::span<const std::byte> data) override;
  bool supports_write_at() const override { return supports_write_at_; }
  // Thread-safe for disjoint ranges.
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  uint64_t size() const override;
  Status Sync() override { return Status::OK(); }
  Status Close() override;

  // REQUIRES: no concurrent writes.
  const std::string& contents() const { return data_; }
  // Number of Append/WriteAt calls so far (tests check write sizes).
  uint64_t write_calls() const { return write_calls_; }

 private:
  std::string name_;
  bool supports_write_at_;
  bool closed_ = false;
  std::string data_;
  uint64_t write_calls_ = 0;
  mutable std::mutex mu_;
};

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_MEMORY_FILE_H_
