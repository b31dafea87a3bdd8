// Reading stored pieces whole through a StorageReader, into given
// destinations (internal to the dcp layer): what verification
// (checkpoint_folder.cc) and consolidation of fs checkpoints use, so they read
// through the storage's own verified load path.
#ifndef MEGACKPT_SRC_DCP_WHOLE_PIECES_H_
#define MEGACKPT_SRC_DCP_WHOLE_PIECES_H_

#include <string>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/storage.h"

namespace megackpt::dcp::internal {

struct WholePieceRead {
  MetadataIndex index;  // a storage entry of the reader's metadata
  bool is_bytes = false;
  Tensor dest;                   // tensors: shape = the stored chunk's sizes, any strides
  std::string* bytes = nullptr;  // bytes: receives the value (may be null)
};

// One ReadData call for all `reads`. REQUIRES: reader.SetUpStorageReader done.
// Errors: the reader's (DataLoss naming file and entry on a checksum mismatch).
Status ReadWholePieces(StorageReader& reader, const std::vector<WholePieceRead>& reads);

}  // namespace megackpt::dcp::internal

#endif  // MEGACKPT_SRC_DCP_WHOLE_PIECES_H_
