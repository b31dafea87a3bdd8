// Inspecting and verifying checkpoints: the library behind `megackpt inspect`
// and `megackpt verify` (and the Python `megackpt.inspect` / `megackpt.verify`).
//
// A PATH is anything ResolveCheckpointPath accepts (convert.h): a .mega or
// .safetensors file, a *.mega.index.json / *.safetensors.index.json index, or a
// folder holding one index (or one model file).
#ifndef MEGACKPT_FORMAT_INSPECT_H_
#define MEGACKPT_FORMAT_INSPECT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/format/convert.h"

namespace megackpt::format {

// The metadata of an opened checkpoint as a JSON object text: an index's
// "metadata" members (plus total_size), else the single file's safetensors
// `__metadata__` or MEGA metadata entries (values as JSON where they parse).
std::string CheckpointMetadataJson(const OpenedCheckpoint& model);

// The `megackpt inspect --json` document (docs/format/index-json.md, "CLI"):
// {"format": "mega"|"safetensors"|"mega-index"|"safetensors-index", "path",
//  "metadata": {...}, "tensors": [{"name", "dtype", "shape", "nbytes", "file",
//  ...}], "files": [{"name", "format", "size"}], "total_nbytes"}.
// `indent` < 0 prints it on one line.
std::string InspectJson(const OpenedCheckpoint& model, int indent = 2);

// Resolves and opens `path` (headers only, no checksum verification) and
// returns InspectJson of it. Errors of ResolveCheckpointPath / OpenCheckpoint
// (NotFound, InvalidArgument for a path that is not a checkpoint, DataLoss for a
// malformed header), naming the path.
Result<std::string> InspectCheckpoint(const std::string& path, int indent = 2);

struct VerifyReport {
  CheckpointPath input;
  // One entry per problem found ("DataLoss: <file>: tensor 'w' ..."); every
  // failing tensor of every file is listed. Empty means the checkpoint is good.
  std::vector<std::string> problems;
  // Harmless inconsistencies (e.g. a wrong metadata.total_size).
  std::vector<std::string> warnings;
  uint64_t files = 0;     // model files examined
  uint64_t files_ok = 0;  // of which without problems
  uint64_t tensors = 0;   // tensors checked
  uint64_t bytes = 0;     // tensor bytes covered
  bool ok() const { return problems.empty(); }
};

// Checks every structure rule and every checksum of the checkpoint at `path`:
// MEGA header/directory validation and each tensor's CRC32/SHA-256;
// safetensors full header validation (it has no checksums); for an index, that
// every shard exists and verifies, every weight_map entry is in its shard and
// every shard tensor is listed (weight_map, or the chunk lists of sharded DCP
// entries under "tensorplay.dcp.sharded"). Problems with the data are reported
// in the VerifyReport; the Result is an error only when `path` cannot be
// resolved (NotFound, or InvalidArgument for something that is not a
// checkpoint). Reads use `ThreadPool::Default()`.
Result<VerifyReport> VerifyCheckpoint(const std::string& path);

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_INSPECT_H_
