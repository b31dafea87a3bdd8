#include "megackpt/dcp/metadata.h"

#include <functional>
#include <limits>

namespace megackpt::dcp {

bool operator<(const MetadataIndex& a, const MetadataIndex& b) {
  if (a.fqn != b.fqn) return a.fqn < b.fqn;
  if (a.offset.has_value() != b.offset.has_value()) return !a.offset.has_value();
  if (!a.offset) return false;
  return *a.offset < *b.offset;
}

std::string ToString(const MetadataIndex& index) {
  if (!index.offset) return "'" + index.fqn + "'";
  return "'" + index.fqn + "'" + ShapeToString(*index.offset);
}

size_t MetadataIndexHash::operator()(const MetadataIndex& index) const {
  size_t h = std::hash<std::string>()(index.fqn);
  if (index.offset) {
    h ^= 0x9E3779B97F4A7C15ull;
    for (int64_t v : *index.offset) h = h * 1099511628211ull ^ std::hash<int64_t>()(v);
  }
  return h;
}

uint64_t BlockCount(const StorageInfo& info) {
  if (info.block_size == 0 || info.length == 0) return 0;
  return (info.length - 1) / info.block_size + 1;
}

Result<uint64_t> ChunkNbytes(DType dtype, const Shape& sizes) {
  return LogicalNbytes(dtype, sizes);
}

Status ValidateMetadata(const Metadata& md) {
  for (const auto& [fqn, value] : md.state_dict_metadata) {
    const auto* t = std::get_if<TensorStorageMetadata>(&value);
    if (!t) continue;
    auto total = LogicalNbytes(t->properties.dtype, t->size);
    if (!total.ok()) {
      return InvalidArgumentError("metadata: tensor '" + fqn + "' has invalid shape " +
                                  ShapeToString(t->size) + ": " + total.status().message());
    }
    for (size_t c = 0; c < t->chunks.size(); ++c) {
      const auto& chunk = t->chunks[c];
      const std::string where = "metadata: tensor '" + fqn + "' chunk " + std::to_string(c);
      if (chunk.offsets.size() != t->size.size() || chunk.sizes.size() != t->size.size()) {
        return InvalidArgumentError(where + ": has " + std::to_string(chunk.offsets.size()) + "/" +
                                    std::to_string(chunk.sizes.size()) + " dims, tensor has " +
                                    std::to_string(t->size.size()));
      }
      for (size_t d = 0; d < t->size.size(); ++d) {
        if (chunk.offsets[d] < 0 || chunk.sizes[d] < 0 || chunk.offsets[d] > t->size[d] ||
            chunk.sizes[d] > t->size[d] - chunk.offsets[d]) {
          return InvalidArgumentError(where + ": offsets " + ShapeToString(chunk.offsets) +
                                      " sizes " + ShapeToString(chunk.sizes) +
                                      " exceed global shape " + ShapeToString(t->size));
        }
      }
    }
  }
  for (const auto& [idx, info] : md.storage_data) {
    auto it = md.state_dict_metadata.find(idx.fqn);
    if (it == md.state_dict_metadata.end()) {
      return InvalidArgumentError("metadata: storage entry " + ToString(idx) +
                                  " names an fqn that is not in state_dict_metadata");
    }
    if (const auto* t = std::get_if<TensorStorageMetadata>(&it->second)) {
      bool found = false;
      if (idx.offset) {
        for (const auto& c : t->chunks) {
          if (c.offsets == *idx.offset) {
            found = true;
            break;
          }
        }
      }
      if (!found) {
        return InvalidArgumentError("metadata: storage entry " + ToString(idx) +
                                    " matches no chunk of the tensor");
      }
    } else if (idx.offset) {
      return InvalidArgumentError("metadata: storage entry " + ToString(idx) +
                                  " has an offset but the entry is bytes");
    }
    const std::string where = "metadata: storage entry " + ToString(idx);
    const uint64_t blocks = BlockCount(info);
    if (info.block_size == 0 && (info.block_table_offset || !info.block_crc32.empty())) {
      return InvalidArgumentError(where + " has a block CRC table but block_size 0");
    }
    if (info.block_table_offset) {
      if (!info.block_crc32.empty()) {
        return InvalidArgumentError(where +
                                    " has both an inline block CRC table and block_table_offset");
      }
      if (blocks > (std::numeric_limits<uint64_t>::max() - *info.block_table_offset) / 4) {
        return InvalidArgumentError(where + ": block_table_offset " +
                                    std::to_string(*info.block_table_offset) + " out of range");
      }
    } else if (info.block_crc32.size() != blocks) {
      return InvalidArgumentError(where + " has " + std::to_string(info.block_crc32.size()) +
                                  " block CRCs, expected " + std::to_string(blocks));
    }
  }
  return Status::OK();
}

}  // namespace megackpt::dcp
