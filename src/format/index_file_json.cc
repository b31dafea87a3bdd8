#include "format/index_file_json.h"

#include <string>
#include <vector>

namespace megackpt::format {
namespace {

using nlohmann::json;

// JSON nesting beyond this is rejected: our documents nest at most a few levels,
// and a bound keeps hostile input from building huge parse stacks.
constexpr size_t kMaxJsonDepth = 128;

// Builds the DOM like nlohmann's own SAX DOM parser, but stops at a key repeated
// within one object and at excessive nesting. (nlohmann's callback parser could
// do the duplicate check too, but it rescans the parent object after every
// child object, which is quadratic: 10,000 tensors took 0.4 s.)
class StrictDomBuilder final : public nlohmann::json_sax<json> {
 public:
  json& root() { return root_; }
  const std::string& error() const { return error_; }

  bool null() override { return Put(nullptr) != nullptr; }
  bool boolean(bool v) override { return Put(v) != nullptr; }
  bool number_integer(number_integer_t v) override { return Put(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return Put(v) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return Put(v) != nullptr; }
  bool string(string_t& v) override { return Put(std::move(v)) != nullptr; }
  bool binary(binary_t& v) override { return Put(json::binary(std::move(v))) != nullptr; }

  bool start_object(std::size_t) override { return Open(json::object()); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(json::array()); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    json& object = *stack_.back();
    if (object.contains(k)) {
      error_ = "duplicate key '" + k + "'";
      return false;
    }
    slot_ = &object[k];
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = std::string("not valid JSON: ") + e.what();
    return false;
  }

 private:
  json* Put(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }
  bool Open(json v) {
    if (stack_.size() >= kMaxJsonDepth) {
      error_ = "nesting deeper than " + std::to_string(kMaxJsonDepth) + " levels";
      return false;
    }
    json* p = Put(std::move(v));
    stack_.push_back(p);
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> stack_;  // open containers, innermost last
  json* slot_ = nullptr;      // value slot of the last key
  std::string error_;
};

}  // namespace

Result<nlohmann::json> ParseJsonRejectingDuplicates(std::string_view file_name,
                                                    std::string_view text, std::string_view what) {
  StrictDomBuilder builder;
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json,
                         /*strict=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    return DataLossError(std::string(file_name) + ": " + std::string(what) +
                         " is not valid JSON: " + e.what());
  }
  if (!ok) {
    std::string why = builder.error().empty() ? "not valid JSON" : builder.error();
    if (why.rfind("not valid JSON", 0) == 0) {
      return DataLossError(std::string(file_name) + ": " + std::string(what) + " is " + why);
    }
    return DataLossError(std::string(file_name) + ": " + std::string(what) + ": " + why);
  }
  return std::move(builder.root());
}

}  // namespace megackpt::format
