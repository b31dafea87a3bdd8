// The umbrella header: everything a program needs to save and load
// checkpoints, read and write MEGA / safetensors files, and (when the hub layer
// is built) use mega:// paths. Smaller programs include the layer headers they
// use instead (megackpt/<layer>/...). Link megackpt::megackpt (CMake:
// find_package(megackpt)) or `pkg-config --libs megackpt`.
//
// A minimal save and load (local folder or mega://org/model@main/ckpt/step-1):
//   megackpt::dcp::StateDict sd;
//   sd.Set("w", *megackpt::Tensor::Empty(megackpt::DType::kF32, {4, 4}));
//   megackpt::Status s = megackpt::dcp::Save(sd, "/tmp/ckpt");   // MEGA storage
//   s = megackpt::dcp::Load("/tmp/ckpt", sd);                     // in place
#ifndef MEGACKPT_MEGACKPT_H_
#define MEGACKPT_MEGACKPT_H_

#include "megackpt/config.h"
#include "megackpt/core/dtype.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/index_io.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/planner.h"
#include "megackpt/dcp/state_dict.h"
#include "megackpt/dcp/storage.h"
#include "megackpt/dcp/storage_factory.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/format/convert.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/mega_encoder.h"
#include "megackpt/format/safetensors.h"
#include "megackpt/fs/filesystem.h"

#if MEGACKPT_WITH_HUB
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/transaction.h"
#endif

#endif  // MEGACKPT_MEGACKPT_H_
