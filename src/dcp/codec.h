// Encodings of the DCP objects that travel between ranks (plans, write results)
// and the JSON helpers shared with the Metadata codec. Internal to the dcp layer.
#ifndef MEGACKPT_SRC_DCP_CODEC_H_
#define MEGACKPT_SRC_DCP_CODEC_H_

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/planner.h"

namespace megackpt::dcp::internal {

std::string EncodeSavePlan(const SavePlan& plan);
Result<SavePlan> DecodeSavePlan(std::string_view encoded);

std::string EncodeLoadPlan(const LoadPlan& plan);
Result<LoadPlan> DecodeLoadPlan(std::string_view encoded);

std::string EncodeWriteResults(const std::vector<WriteResult>& results);
Result<std::vector<WriteResult>> DecodeWriteResults(std::string_view encoded);

// {fqn: [key or index, ...]}: the one JSON form of object paths (the planner
// data's "object_paths"; a MEGA shard's tensorplay.dcp.object_paths).
nlohmann::json ObjectPathsJson(const std::map<std::string, ObjectPath>& paths);

// A blob exchanged in a collective: either a status (error) or a payload.
std::string EncodeEnvelope(const Status& status, std::string_view payload);
// Returns the payload, or the carried error status (DataLoss if malformed).
Result<std::string> DecodeEnvelope(std::string_view blob);

}  // namespace megackpt::dcp::internal

#endif  // MEGACKPT_SRC_DCP_CODEC_H_
