#pragma once

// Size limits on the string, repeated and map fields of a request, checked
// at an RPC boundary before anything else looks at the request. gRPC's own
// cap (64 MiB per message, grpc_server.cc) bounds a request as a whole;
// these bound each field, so that one caller cannot make a daemon store,
// log, repeat or work on tens of megabytes on its behalf. Each service
// keeps its table of limits by field (the coordinator's in
// services/coordinator/request_limits.cc, the verifier's in
// services/verifier/request_limits.cc), with a unit test that the table
// lists every such field reachable from every request of the service.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace tandem::rpc {

// The limit of one field: bytes for a string or bytes field (of each element
// when repeated), entries for a repeated or map field. A map field's key and
// value are the fields "key" and "value" of its entry message (e.g.
// "tandem.v1.RegisterRequest.CapabilitiesEntry.value").
struct FieldLimits {
  // Repeated and map fields: most entries.
  std::optional<size_t> max_entries;
  // String and bytes fields: most bytes per value.
  std::optional<size_t> max_bytes;
};

inline FieldLimits MaxBytes(size_t n) { return {std::nullopt, n}; }
inline FieldLimits MaxEntries(size_t n) { return {n, std::nullopt}; }
inline FieldLimits MaxEntriesOfBytes(size_t entries, size_t bytes) {
  return {entries, bytes};
}

// Limits by a field's full name (e.g. "tandem.v1.RegisterRequest.hostname").
struct FieldLimitsTable {
  absl::flat_hash_map<std::string_view, FieldLimits> fields;
  // What a field the table does not list gets (a field added to the proto
  // since; the service's unit test asks for an explicit entry).
  size_t default_max_bytes = 4096;
  size_t default_max_entries = 4096;

  // Nullopt when the table does not list the field.
  std::optional<FieldLimits> Find(
      const google::protobuf::FieldDescriptor& field) const;
};

// Checks every set field of `request`, recursively, against `table`.
// InvalidArgument names the path, e.g. "RegisterRequest.hostname is
// 41943040 bytes; the limit is 255", or "SubmitSamplesRequest.samples[3].
// completion_token_ids has 200000 entries; the limit is 131072".
absl::Status CheckFieldLimits(const google::protobuf::Message& request,
                              const FieldLimitsTable& table);

// Every string, repeated and map field reachable from the requests of
// `service` (a full name, e.g. "tandem.v1.Verifier") that `table` does not
// give the limit its kind needs, as "<full name> (entries)" or "(bytes)";
// the services' completeness tests expect none. Empty with `*methods` = 0
// when the service is unknown.
std::vector<std::string> FieldsWithoutLimits(std::string_view service,
                                             const FieldLimitsTable& table,
                                             int* methods);

}  // namespace tandem::rpc
