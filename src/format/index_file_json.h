// Strict JSON parsing for index files (and any small JSON document megackpt reads).
#ifndef MEGACKPT_FORMAT_INDEX_FILE_JSON_H_
#define MEGACKPT_FORMAT_INDEX_FILE_JSON_H_

#include <nlohmann/json.hpp>
#include <string_view>

#include "megackpt/core/status.h"

namespace megackpt::format {

// Parses `text` as one JSON value (surrounding whitespace allowed). Unlike plain
// nlohmann::json::parse, a key repeated inside one object is an error instead of
// silently keeping the last value. Never throws: malformed JSON, invalid UTF-8
// and duplicate keys are DataLoss "<file_name>: <what>: ..." naming the position
// or the duplicated key.
Result<nlohmann::json> ParseJsonRejectingDuplicates(std::string_view file_name,
                                                    std::string_view text,
                                                    std::string_view what = "JSON");

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_INDEX_FILE_JSON_H_
