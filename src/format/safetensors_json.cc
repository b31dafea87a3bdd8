#include "format/safetensors_json.h"

#include <string>
#include <unordered_set>
#include <vector>

namespace megackpt {
namespace {

// JSON nesting beyond this is rejected: our documents nest at most a few levels,
// and a bound keeps hostile input from building huge parse stacks.
constexpr int kMaxJsonDepth = 128;

struct JsonRejected {
  std::string message;
};

}  // namespace

Result<nlohmann::json> ParseJsonRejectingDuplicates(std::string_view file_name,
                                                    std::string_view text,
                                                    std::string_view what) {
  using nlohmann::json;
  // One set of keys per open object; arrays push an empty marker so the stack
  // follows the nesting exactly.
  std::vector<std::unordered_set<std::string>> open;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (open.size() >= static_cast<size_t>(kMaxJsonDepth)) {
          throw JsonRejected{"nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels"};
        }
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open.empty() && parsed.is_string()) {
          const auto& key = parsed.get_ref<const std::string&>();
          if (!open.back().insert(key).second) {
            throw JsonRejected{"duplicate key '" + key + "'"};
          }
        }
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const JsonRejected& e) {
    return DataLossError(std::string(file_name) + ": " + std::string(what) + ": " + e.message);
  } catch (const json::exception& e) {
    return DataLossError(std::string(file_name) + ": " + std::string(what) +
                         " is not valid JSON: " + e.what());
  }
}

}  // namespace megackpt
