#include "common/safetensors/safetensors_writer.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/safetensors/atomic_file.h"
#include "nlohmann/json.hpp"

namespace tandem::safetensors {
namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";

}  // namespace

absl::StatusOr<std::string> SafetensorsHeader(
    absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    const std::string where = absl::StrCat("tensor '", tensor.name, "'");
    if (tensor.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is reserved for metadata"));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name '", tensor.name, "'"));
    }
    auto needed = CheckedNumBytes(tensor.shape, DTypeSize(tensor.dtype));
    if (!needed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", needed.status().message()));
    }
    if (*needed != tensor.bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": dtype ", DTypeName(tensor.dtype), " shape ",
                       ShapeToString(tensor.shape), " needs ", *needed,
                       " bytes, got ", tensor.bytes.size()));
    }
    header[tensor.name] = {
        {"dtype", std::string(DTypeName(tensor.dtype))},
        {"shape", tensor.shape},
        {"data_offsets", {offset, offset + tensor.bytes.size()}}};
    offset += tensor.bytes.size();
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tensor name or metadata string is not valid UTF-8: ", e.what()));
  }
  // The format allows trailing spaces in the header; pad so the data
  // buffer is 8-byte aligned, which lets readers view it in place.
  const size_t padded = (8 + text.size() + 7) / 8 * 8 - 8;
  text.resize(padded, ' ');
  std::string out(8, '\0');
  uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(length & 0xff);
    length >>= 8;
  }
  out += text;
  return out;
}

absl::Status WriteSafetensors(
    const std::string& path, absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata) {
  auto header = SafetensorsHeader(tensors, metadata);
  if (!header.ok()) {
    return absl::Status(header.status().code(),
                        absl::StrCat(path, ": ", header.status().message()));
  }
  std::vector<absl::Span<const uint8_t>> pieces;
  pieces.reserve(tensors.size() + 1);
  pieces.emplace_back(reinterpret_cast<const uint8_t*>(header->data()),
                      header->size());
  for (const TensorToWrite& tensor : tensors) pieces.push_back(tensor.bytes);
  return WriteFileAtomically(path, pieces);
}

absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::string out, SafetensorsHeader(tensors, metadata));
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.bytes.empty()) continue;
    out.append(reinterpret_cast<const char*>(tensor.bytes.data()),
               tensor.bytes.size());
  }
  return out;
}

}  // namespace tandem::safetensors
