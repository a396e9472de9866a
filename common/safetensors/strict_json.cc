#include "common/safetensors/strict_json.h"

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::safetensors::internal {
namespace {

// One JSON object still open during parsing.
struct OpenObject {
  std::set<std::string> keys;
  std::string last_key;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonRejectingDuplicateKeys(
    absl::string_view text, absl::string_view source, absl::string_view what,
    const DuplicateKeyMessage& duplicate_message) {
  // nlohmann's lexer takes a NUL byte for the end of the input and would
  // silently ignore whatever follows; raw NUL is never valid JSON.
  if (const size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", what, " is not valid JSON: NUL byte at offset ", nul));
  }
  using Event = nlohmann::json::parse_event_t;
  std::vector<OpenObject> open;
  // Key path from the root to the innermost open object or array.
  std::vector<std::string> path;
  // Kinds of the open containers, to know what an array_end/object_end pops.
  std::vector<bool> container_is_object;
  bool after_key = false;
  std::string duplicate_error;
  std::string nesting_error;

  auto callback = [&](int /*depth*/, Event event,
                      nlohmann::json& parsed) -> bool {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (container_is_object.size() >= kMaxNestingDepth &&
            nesting_error.empty()) {
          nesting_error =
              absl::StrCat("nesting deeper than ", kMaxNestingDepth, " levels");
        }
        if (!container_is_object.empty()) {
          path.push_back(after_key ? open.back().last_key : "[]");
        }
        container_is_object.push_back(event == Event::object_start);
        if (event == Event::object_start) open.emplace_back();
        after_key = false;
        break;
      case Event::object_end:
      case Event::array_end:
        if (!container_is_object.empty()) {
          if (container_is_object.back() && !open.empty()) open.pop_back();
          container_is_object.pop_back();
          if (!path.empty()) path.pop_back();
        }
        after_key = false;
        break;
      case Event::key: {
        if (open.empty() || !parsed.is_string()) break;
        OpenObject& object = open.back();
        std::string key = parsed.get<std::string>();
        if (!object.keys.insert(key).second && duplicate_error.empty()) {
          duplicate_error = duplicate_message(path, key);
        }
        object.last_key = std::move(key);
        after_key = true;
        break;
      }
      case Event::value:
        after_key = false;
        break;
    }
    return true;
  };

  nlohmann::json result;
  try {
    result = nlohmann::json::parse(text.data(), text.data() + text.size(),
                                   callback, /*allow_exceptions=*/true,
                                   /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", what, " is not valid JSON: ", e.what()));
  }
  if (!nesting_error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", what, " has ", nesting_error));
  }
  if (!duplicate_error.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", duplicate_error));
  }
  return result;
}

}  // namespace tandem::safetensors::internal
