#pragma once

// ConfigSchema binds the fields of a plain config struct to dotted YAML key
// paths and layers values onto it in the documented order:
//
//   embedded defaults (the struct's initializers)
//   -> YAML file            ApplyYamlFile / ApplyYamlText
//   -> TANDEM_* environment ApplyEnvironment
//   -> --set key=value      ApplyOverride
//
// Every error names where the value came from (file and line, environment
// variable, or flag), the key path, and the offending value. Unknown keys are
// errors. The schema keeps raw pointers into the struct: the struct must
// outlive the schema. Not thread-safe; use from main() before daemons start.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace tandem::config {

class ConfigSchema {
 public:
  ConfigSchema() = default;
  ConfigSchema(const ConfigSchema&) = delete;
  ConfigSchema& operator=(const ConfigSchema&) = delete;

  // Registers a field. `path` is a dotted key ("log.level"); `help` is one
  // sentence shown by --print-config. Numeric fields take an inclusive range.
  void AddString(const std::string& path, std::string* field,
                 const std::string& help);
  // A string restricted to `choices`.
  void AddEnum(const std::string& path, std::string* field,
               std::vector<std::string> choices, const std::string& help);
  void AddInt(const std::string& path, int64_t* field, int64_t min, int64_t max,
              const std::string& help);
  void AddDouble(const std::string& path, double* field, double min, double max,
                 const std::string& help);
  void AddBool(const std::string& path, bool* field, const std::string& help);
  void AddStringList(const std::string& path, std::vector<std::string>* field,
                     const std::string& help);

  // Reads YAML from a file; the file name appears in every error.
  absl::Status ApplyYamlFile(const std::string& path);
  // Parses YAML text; `source` names it in errors (e.g. "<embedded>").
  absl::Status ApplyYamlText(const std::string& text,
                             const std::string& source);
  // Applies TANDEM_<PATH> variables (dots become underscores, upper case),
  // e.g. TANDEM_COORDINATOR_ADDRESS for "coordinator_address". Variables
  // that match no field are ignored, since one environment may serve
  // several daemons. `environ` is the process environment (envp-style).
  absl::Status ApplyEnvironment(char** environ);
  // Applies one "key=value" override (the --set flag).
  absl::Status ApplyOverride(const std::string& assignment);
  // Sets one key from text; `source` describes where it came from.
  absl::Status SetFromText(const std::string& path, const std::string& value,
                           const std::string& source);

  // Registers a check of the final value of `path` (and of fields it
  // depends on), run by Check() once every layer is applied. `check`
  // returns an error message without location or key; Check() prefixes
  // where the value of `path` came from and the key, like every other
  // config error.
  void AddCheck(const std::string& path, std::function<absl::Status()> check);
  // Runs the checks in registration order; returns the first error.
  absl::Status Check() const;

  // Where the current value of `path` came from: "file.yaml:12",
  // "environment TANDEM_X", "--set x=1", "flag for x", or "default".
  std::string Origin(const std::string& path) const;

  // The effective configuration as YAML, with each field's help as a
  // comment. Parsing the output with ApplyYamlText reproduces the values.
  std::string ToYaml() const;

  // Environment variable name for a key path.
  static std::string EnvName(const std::string& path);

 private:
  struct Field {
    std::string path;
    std::string help;
    std::string type_name;  // for error messages: "integer", "string", ...
    // Parses a scalar and stores it; returns an error message without the
    // location prefix.
    std::function<absl::Status(const std::string& text)> set;
    std::function<absl::Status(const YAML::Node& node)> set_node;
    std::function<std::string()> to_yaml;
  };

  void AddField(Field field);
  absl::Status ApplyNode(const YAML::Node& node, const std::string& prefix,
                         const std::string& source);
  bool IsPrefix(const std::string& prefix) const;

  std::vector<Field> fields_;                   // in registration order
  std::map<std::string, size_t> by_path_;       // path -> index in fields_
  std::map<std::string, std::string> origins_;  // path -> where it was set
  std::vector<std::pair<std::string, std::function<absl::Status()>>> checks_;
};

}  // namespace tandem::config
