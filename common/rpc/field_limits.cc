#include "common/rpc/field_limits.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::rpc {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A field's place in the request, for messages: "samples[3].lease_id".
std::string Path(const std::string& parent, const FieldDescriptor& field,
                 int index = -1) {
  std::string out =
      parent.empty() ? field.name() : absl::StrCat(parent, ".", field.name());
  if (index >= 0) absl::StrAppend(&out, "[", index, "]");
  return out;
}

absl::Status TooManyEntries(const std::string& path, size_t size,
                            size_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, " has ", size, " entries; the limit is ", limit));
}

absl::Status TooManyBytes(const std::string& path, size_t size, size_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, " is ", size, " bytes; the limit is ", limit));
}

absl::Status Check(const Message& message, const std::string& path,
                   const FieldLimitsTable& table) {
  const Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const bool is_string = field->cpp_type() == FieldDescriptor::CPPTYPE_STRING;
    const bool is_message =
        field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (!field->is_repeated() && !is_string && !is_message) continue;
    const std::optional<FieldLimits> listed = table.Find(*field);
    const size_t max_entries = listed && listed->max_entries
                                   ? *listed->max_entries
                                   : table.default_max_entries;
    const size_t max_bytes = listed && listed->max_bytes
                                 ? *listed->max_bytes
                                 : table.default_max_bytes;
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      if (static_cast<size_t>(n) > max_entries) {
        return TooManyEntries(Path(path, *field), static_cast<size_t>(n),
                              max_entries);
      }
      if (is_string) {
        std::string scratch;
        for (int i = 0; i < n; ++i) {
          const std::string& value = reflection->GetRepeatedStringReference(
              message, field, i, &scratch);
          if (value.size() > max_bytes) {
            return TooManyBytes(Path(path, *field, i), value.size(), max_bytes);
          }
        }
      } else if (is_message) {
        for (int i = 0; i < n; ++i) {
          const Message& element =
              reflection->GetRepeatedMessage(message, field, i);
          absl::Status status = Check(
              element,
              field->is_map() ? Path(path, *field) : Path(path, *field, i),
              table);
          if (!status.ok()) return status;
        }
      }
    } else if (is_string) {
      std::string scratch;
      const std::string& value =
          reflection->GetStringReference(message, field, &scratch);
      if (value.size() > max_bytes) {
        return TooManyBytes(Path(path, *field), value.size(), max_bytes);
      }
    } else {
      absl::Status status = Check(reflection->GetMessage(message, field),
                                  Path(path, *field), table);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

void CollectUnlimited(const Descriptor& type, const FieldLimitsTable& table,
                      std::set<std::string>* seen,
                      std::vector<std::string>* missing) {
  if (!seen->insert(type.full_name()).second) return;
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor& field = *type.field(i);
    const std::optional<FieldLimits> limits = table.Find(field);
    const bool is_string = field.cpp_type() == FieldDescriptor::CPPTYPE_STRING;
    if (field.is_repeated() && !(limits && limits->max_entries)) {
      missing->push_back(field.full_name() + " (entries)");
    }
    if (is_string && !(limits && limits->max_bytes)) {
      missing->push_back(field.full_name() + " (bytes)");
    }
    if (field.message_type() != nullptr) {
      CollectUnlimited(*field.message_type(), table, seen, missing);
    }
  }
}

}  // namespace

std::optional<FieldLimits> FieldLimitsTable::Find(
    const FieldDescriptor& field) const {
  auto it = fields.find(field.full_name());
  if (it == fields.end()) return std::nullopt;
  return it->second;
}

absl::Status CheckFieldLimits(const Message& request,
                              const FieldLimitsTable& table) {
  return Check(request, request.GetDescriptor()->name(), table);
}

std::vector<std::string> FieldsWithoutLimits(std::string_view service,
                                             const FieldLimitsTable& table,
                                             int* methods) {
  *methods = 0;
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(service));
  if (descriptor == nullptr) return {};
  *methods = descriptor->method_count();
  std::set<std::string> seen;
  std::vector<std::string> missing;
  for (int i = 0; i < descriptor->method_count(); ++i) {
    CollectUnlimited(*descriptor->method(i)->input_type(), table, &seen,
                     &missing);
  }
  return missing;
}

}  // namespace tandem::rpc
