#include "common/config/config_schema.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"

namespace tandem::config {
namespace {

absl::Status ParseInt(const std::string& text, int64_t* out) {
  std::string trimmed(absl::StripAsciiWhitespace(text));
  if (!absl::SimpleAtoi(trimmed, out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected an integer, got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::Status ParseDouble(const std::string& text, double* out) {
  std::string trimmed(absl::StripAsciiWhitespace(text));
  if (!absl::SimpleAtod(trimmed, out) || !std::isfinite(*out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a number, got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::Status ParseBool(const std::string& text, bool* out) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (lower == "true" || lower == "yes" || lower == "on" || lower == "1") {
    *out = true;
  } else if (lower == "false" || lower == "no" || lower == "off" ||
             lower == "0") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("expected true or false, got '", text, "'"));
  }
  return absl::OkStatus();
}

std::string QuoteYaml(const std::string& s) {
  YAML::Emitter out;
  out << YAML::DoubleQuoted << s;
  return out.c_str();
}

std::string NodeLocation(const std::string& source, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  if (mark.is_null()) return source;
  return absl::StrCat(source, ":", mark.line + 1);
}

std::string ScalarText(const YAML::Node& node) {
  if (node.IsScalar()) return node.Scalar();
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "null";
}

}  // namespace

void ConfigSchema::AddField(Field field) {
  by_path_[field.path] = fields_.size();
  fields_.push_back(std::move(field));
}

void ConfigSchema::AddString(const std::string& path, std::string* field,
                             const std::string& help) {
  Field f{path, help, "string"};
  f.set = [field](const std::string& text) {
    *field = text;
    return absl::OkStatus();
  };
  f.to_yaml = [field] { return QuoteYaml(*field); };
  AddField(std::move(f));
}

void ConfigSchema::AddEnum(const std::string& path, std::string* field,
                           std::vector<std::string> choices,
                           const std::string& help) {
  Field f{path,
          absl::StrCat(help, " One of: ", absl::StrJoin(choices, ", "), "."),
          "string"};
  f.set = [field, choices](const std::string& text) {
    for (const auto& c : choices) {
      if (c == text) {
        *field = text;
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "must be one of ", absl::StrJoin(choices, ", "), "; got '", text, "'"));
  };
  f.to_yaml = [field] { return QuoteYaml(*field); };
  AddField(std::move(f));
}

void ConfigSchema::AddInt(const std::string& path, int64_t* field, int64_t min,
                          int64_t max, const std::string& help) {
  Field f{path, help, "integer"};
  f.set = [field, min, max](const std::string& text) {
    int64_t value = 0;
    if (absl::Status s = ParseInt(text, &value); !s.ok()) return s;
    if (value < min || value > max) {
      return absl::OutOfRangeError(
          absl::StrCat("must be in [", min, ", ", max, "], got ", value));
    }
    *field = value;
    return absl::OkStatus();
  };
  f.to_yaml = [field] { return absl::StrCat(*field); };
  AddField(std::move(f));
}

void ConfigSchema::AddDouble(const std::string& path, double* field, double min,
                             double max, const std::string& help) {
  Field f{path, help, "number"};
  f.set = [field, min, max](const std::string& text) {
    double value = 0;
    if (absl::Status s = ParseDouble(text, &value); !s.ok()) return s;
    if (value < min || value > max) {
      return absl::OutOfRangeError(
          absl::StrCat("must be in [", min, ", ", max, "], got ", value));
    }
    *field = value;
    return absl::OkStatus();
  };
  f.to_yaml = [field] {
    // The shortest text that reads back as the same double (0.9, not
    // 0.90000000000000002).
    char buffer[64];
    const std::to_chars_result end =
        std::to_chars(buffer, buffer + sizeof(buffer), *field,
                      std::chars_format::general);
    std::string s(buffer, end.ptr);
    if (s.find_first_of(".eE") == std::string::npos) s += ".0";
    return s;
  };
  AddField(std::move(f));
}

void ConfigSchema::AddBool(const std::string& path, bool* field,
                           const std::string& help) {
  Field f{path, help, "boolean"};
  f.set = [field](const std::string& text) { return ParseBool(text, field); };
  f.to_yaml = [field] { return std::string(*field ? "true" : "false"); };
  AddField(std::move(f));
}

void ConfigSchema::AddStringList(const std::string& path,
                                 std::vector<std::string>* field,
                                 const std::string& help) {
  Field f{path, help, "list of strings"};
  // From text (environment, --set): comma-separated.
  f.set = [field](const std::string& text) {
    field->clear();
    for (absl::string_view part :
         absl::StrSplit(text, ',', absl::SkipEmpty())) {
      field->emplace_back(absl::StripAsciiWhitespace(part));
    }
    return absl::OkStatus();
  };
  f.set_node = [field](const YAML::Node& node) {
    if (!node.IsSequence()) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected a list of strings, got ", ScalarText(node)));
    }
    std::vector<std::string> values;
    for (const auto& item : node) {
      if (!item.IsScalar()) {
        return absl::InvalidArgumentError(
            "expected a list of strings, found a nested list or mapping");
      }
      values.push_back(item.Scalar());
    }
    *field = std::move(values);
    return absl::OkStatus();
  };
  f.to_yaml = [field] {
    std::vector<std::string> quoted;
    for (const auto& v : *field) quoted.push_back(QuoteYaml(v));
    return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
  };
  AddField(std::move(f));
}

bool ConfigSchema::IsPrefix(const std::string& prefix) const {
  const std::string with_dot = prefix + ".";
  auto it = by_path_.lower_bound(with_dot);
  return it != by_path_.end() && it->first.rfind(with_dot, 0) == 0;
}

absl::Status ConfigSchema::ApplyNode(const YAML::Node& node,
                                     const std::string& prefix,
                                     const std::string& source) {
  // Key -> its first node in this mapping: a key given twice is an error
  // (YAML says keys are unique; yaml-cpp would keep both, the last winning).
  std::map<std::string, YAML::Node> seen;
  for (const auto& entry : node) {
    const YAML::Node& key_node = entry.first;
    const YAML::Node& value = entry.second;
    if (!key_node.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(
          NodeLocation(source, key_node), ": keys must be plain strings"));
    }
    auto [first, inserted] = seen.emplace(key_node.Scalar(), key_node);
    if (!inserted) {
      const YAML::Mark mark = first->second.Mark();
      return absl::InvalidArgumentError(absl::StrCat(
          NodeLocation(source, key_node), ": duplicate key '",
          prefix.empty() ? key_node.Scalar()
                         : absl::StrCat(prefix, ".", key_node.Scalar()),
          "' (first at line ",
          mark.is_null() ? std::string("?") : absl::StrCat(mark.line + 1),
          ")"));
    }
    const std::string path = prefix.empty()
                                 ? key_node.Scalar()
                                 : absl::StrCat(prefix, ".", key_node.Scalar());
    auto it = by_path_.find(path);
    if (it == by_path_.end()) {
      if (IsPrefix(path)) {
        if (value.IsNull()) continue;  // an empty section keeps defaults
        if (!value.IsMap()) {
          return absl::InvalidArgumentError(absl::StrCat(
              NodeLocation(source, value), ": ", path,
              " must be a mapping, got '", ScalarText(value), "'"));
        }
        RETURN_IF_ERROR(ApplyNode(value, path, source));
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          NodeLocation(source, key_node), ": unknown key '", path, "'"));
    }
    const Field& field = fields_[it->second];
    absl::Status status;
    if (field.set_node) {
      status = field.set_node(value);
    } else if (!value.IsScalar()) {
      status = absl::InvalidArgumentError(absl::StrCat(
          "expected a ", field.type_name, ", got ", ScalarText(value)));
    } else {
      status = field.set(value.Scalar());
    }
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(NodeLocation(source, value), ": ", path,
                                       " ", status.message()));
    }
    origins_[path] = NodeLocation(source, value);
  }
  return absl::OkStatus();
}

absl::Status ConfigSchema::ApplyYamlText(const std::string& text,
                                         const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    const std::string where =
        e.mark.is_null() ? source : absl::StrCat(source, ":", e.mark.line + 1);
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": malformed YAML: ", e.msg));
  }
  if (root.IsNull()) return absl::OkStatus();  // empty file
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        NodeLocation(source, root), ": the top level must be a mapping"));
  }
  try {
    return ApplyNode(root, "", source);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": malformed YAML: ", e.msg));
  }
}

absl::Status ConfigSchema::ApplyYamlFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read config file ", path,
                                            ": ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ApplyYamlText(buffer.str(), path);
}

std::string ConfigSchema::EnvName(const std::string& path) {
  std::string name = "TANDEM_";
  for (char c : path) {
    name += c == '.' ? '_' : absl::ascii_toupper(static_cast<unsigned char>(c));
  }
  return name;
}

absl::Status ConfigSchema::ApplyEnvironment(char** environ) {
  if (environ == nullptr) return absl::OkStatus();
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view entry(*e);
    size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)),
                std::string(entry.substr(eq + 1)));
  }
  for (const Field& field : fields_) {
    auto it = env.find(EnvName(field.path));
    if (it == env.end()) continue;
    RETURN_IF_ERROR(SetFromText(field.path, it->second,
                                absl::StrCat("environment ", it->first)));
  }
  return absl::OkStatus();
}

absl::Status ConfigSchema::SetFromText(const std::string& path,
                                       const std::string& value,
                                       const std::string& source) {
  auto it = by_path_.find(path);
  if (it == by_path_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unknown key '", path, "'"));
  }
  absl::Status status = fields_[it->second].set(value);
  if (!status.ok()) {
    return absl::Status(
        status.code(), absl::StrCat(source, ": ", path, " ", status.message()));
  }
  origins_[path] = source;
  return absl::OkStatus();
}

void ConfigSchema::AddCheck(const std::string& path,
                            std::function<absl::Status()> check) {
  checks_.emplace_back(path, std::move(check));
}

absl::Status ConfigSchema::Check() const {
  for (const auto& [path, check] : checks_) {
    absl::Status status = check();
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(Origin(path), ": ", path,
                                                      " ", status.message()));
    }
  }
  return absl::OkStatus();
}

std::string ConfigSchema::Origin(const std::string& path) const {
  auto it = origins_.find(path);
  return it == origins_.end() ? "default" : it->second;
}

absl::Status ConfigSchema::ApplyOverride(const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set ", assignment, ": expected key=value"));
  }
  return SetFromText(assignment.substr(0, eq), assignment.substr(eq + 1),
                     absl::StrCat("--set ", assignment));
}

std::string ConfigSchema::ToYaml() const {
  // Fields are grouped under their parent sections in registration order.
  std::string out;
  std::vector<std::string> open;  // currently open section path components
  for (const Field& field : fields_) {
    std::vector<std::string> parts = absl::StrSplit(field.path, '.');
    std::vector<std::string> sections(parts.begin(), parts.end() - 1);
    size_t common = 0;
    while (common < open.size() && common < sections.size() &&
           open[common] == sections[common]) {
      ++common;
    }
    open.resize(common);
    for (size_t i = common; i < sections.size(); ++i) {
      absl::StrAppend(&out, std::string(2 * i, ' '), sections[i], ":\n");
      open.push_back(sections[i]);
    }
    const std::string indent(2 * sections.size(), ' ');
    absl::StrAppend(&out, indent, "# ", field.help, "\n", indent, parts.back(),
                    ": ", field.to_yaml(), "\n");
  }
  return out;
}

}  // namespace tandem::config
