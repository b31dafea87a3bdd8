// Shard index files: `<base>.mega.index.json` and `model.safetensors.index.json`.
//
// Both share one schema (docs/format/index-json.md):
//
//   {"metadata": {"total_size": 123, ...},
//    "weight_map": {"tensor.name": "model-00001-of-00002.mega", ...},
//    ...}
//
// total_size is the sum of the tensors' data bytes (not file sizes). Shard names
// are relative to the index's folder. Unknown members of "metadata" and of the
// top-level object are kept (as JSON text) so a read-modify-write preserves them.
#ifndef MEGACKPT_FORMAT_INDEX_FILE_H_
#define MEGACKPT_FORMAT_INDEX_FILE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::format {

inline constexpr std::string_view kMegaIndexSuffix = ".mega.index.json";
inline constexpr std::string_view kSafetensorsIndexSuffix = ".safetensors.index.json";
// Index documents larger than this are refused (ResourceExhausted).
inline constexpr uint64_t kMaxIndexFileBytes = 256ull << 20;
// megatensors writes metadata.format = this, and a top-level "shards" table.
inline constexpr std::string_view kMegaShardedIndexFormat = "mega-sharded-index-v1";

enum class IndexKind { kMega, kSafetensors };

// kMega for "*.mega.index.json", kSafetensors for "*.safetensors.index.json",
// nullopt otherwise (decided by the file name only).
std::optional<IndexKind> IndexKindFromPath(std::string_view path);

struct ShardIndex {
  // metadata.total_size; nullopt when the document has none.
  std::optional<uint64_t> total_size;
  // Tensor name -> shard file name (relative to the index's folder).
  std::map<std::string, std::string> weight_map;
  // Other members of "metadata", key -> JSON text of the value.
  std::map<std::string, std::string> extra_metadata;
  // Other top-level members (e.g. megatensors' "shards"), key -> JSON text.
  std::map<std::string, std::string> extra_fields;

  // The distinct shard names of weight_map, sorted.
  std::vector<std::string> ShardFiles() const;
  // Tensor names mapped to `shard`, sorted.
  std::vector<std::string> TensorsInShard(std::string_view shard) const;
};

// OK when `name` may be used as a shard reference: non-empty, relative (no
// leading '/'), no ".." component, no NUL or backslash. InvalidArgument otherwise.
Status ValidateShardFileName(std::string_view name);

// Parses and validates an index document. DataLoss naming `index_name` and the
// key for: invalid JSON, duplicate keys, a non-object root/"metadata"/
// "weight_map", a missing "weight_map", a non-string or unsafe shard name
// (ValidateShardFileName), a total_size that is not a non-negative integer.
Result<ShardIndex> ParseShardIndex(std::string_view index_name, std::string_view json_text);

// The document text: 2-space indented JSON, keys sorted (as transformers'
// save_pretrained writes it), newline-terminated. InvalidArgument when a shard
// name is unsafe or an extra member holds invalid JSON text.
Result<std::string> SerializeShardIndex(const ShardIndex& index);

// Sets what megatensors' reader needs to resolve a `.mega.index.json`:
// metadata.format = "mega-sharded-index-v1" and "shards" = {name: name} for
// every shard of weight_map (relative names, resolved against the index folder).
void AddMegatensorsFields(ShardIndex* index);

// Local files. Read: NotFound when missing; ResourceExhausted above
// kMaxIndexFileBytes; parse errors as ParseShardIndex. Write: atomically (temp
// file in the same folder, fsync when `sync`, rename, folder fsync).
Result<ShardIndex> ReadShardIndexFile(const std::string& path);
Status WriteShardIndexFile(const std::string& path, const ShardIndex& index, bool sync = true);

// Through the filesystem seam (local or mega://): megackpt/dcp/index_io.h.

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_INDEX_FILE_H_
