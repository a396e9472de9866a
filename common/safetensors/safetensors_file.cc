#include "common/safetensors/safetensors_file.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/safetensors/strict_json.h"
#include "nlohmann/json.hpp"

namespace tandem::safetensors {
namespace {

using nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";

uint64_t ReadLittleEndianU64(const uint8_t* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

// Words a repeated key for the header's strict JSON parse (see
// strict_json.h for `path`).
std::string DuplicateKeyMessage(const std::vector<std::string>& path,
                                const std::string& key) {
  if (path.empty()) return absl::StrCat("duplicate tensor name '", key, "'");
  std::string where;
  if (path[0] == kMetadataKey) {
    where = absl::StrCat("'", absl::StrJoin(path, "."), "'");
  } else {
    where = absl::StrCat("tensor '", path[0], "'");
    if (path.size() > 1) {
      absl::StrAppend(&where, " field '",
                      absl::StrJoin(path.begin() + 1, path.end(), "."), "'");
    }
  }
  return absl::StrCat(where, ": duplicate key '", key, "'");
}

// Says what a bad "data_offsets" value is without echoing all of it.
std::string DescribeOffsets(const json& value) {
  if (!value.is_array()) return absl::StrCat("a JSON ", value.type_name());
  if (value.size() != 2) {
    return absl::StrCat("an array of ", value.size(), " elements");
  }
  auto describe = [](const json& element) -> std::string {
    if (element.is_number_unsigned()) {
      return absl::StrCat(element.get<uint64_t>());
    }
    if (element.is_number_integer()) {
      return absl::StrCat(element.get<int64_t>());
    }
    return absl::StrCat("a JSON ", element.type_name());
  };
  return absl::StrCat("[", describe(value[0]), ", ", describe(value[1]), "]");
}

// A validated entry before its data pointer is known.
struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// Validates one tensor entry of the header. `data_size` is the length of
// the data buffer. Errors are prefixed by the caller with the source.
absl::StatusOr<Entry> ParseEntry(const std::string& name, const json& value,
                                 uint64_t data_size) {
  const std::string where = absl::StrCat("tensor '", name, "'");
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": entry is a JSON ", value.type_name(), ", not an object"));
  }
  Entry entry;
  entry.name = name;

  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing 'dtype'"));
  }
  if (!dtype_it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'dtype' is a JSON ", dtype_it->type_name(),
                     ", not a string"));
  }
  auto dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", dtype.status().message()));
  }
  entry.dtype = *dtype;

  auto shape_it = value.find("shape");
  if (shape_it == value.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing 'shape'"));
  }
  if (!shape_it->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": 'shape' is a JSON ", shape_it->type_name(),
                     ", not an array"));
  }
  entry.shape.reserve(shape_it->size());
  for (size_t i = 0; i < shape_it->size(); ++i) {
    const json& dim = (*shape_it)[i];
    if (dim.is_number_unsigned()) {
      const uint64_t d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": shape[", i, "] = ", d, " does not fit in int64"));
      }
      entry.shape.push_back(static_cast<int64_t>(d));
    } else if (dim.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape[", i, "] = ", dim.get<int64_t>(),
                       " is a negative dimension"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape[", i, "] is a JSON ", dim.type_name(),
                       ", not a non-negative integer"));
    }
  }

  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": missing 'data_offsets'"));
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() ||
      !(*offsets_it)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": 'data_offsets' must be an array of two "
                     "non-negative integers, got ",
                     DescribeOffsets(*offsets_it)));
  }
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  const std::string offsets =
      absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "]");
  if (entry.begin > entry.end) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", offsets, " has begin > end"));
  }
  if (entry.end > data_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", offsets, " ends past the data buffer of ",
                     data_size, " bytes"));
  }

  auto needed = CheckedNumBytes(entry.shape, DTypeSize(entry.dtype));
  if (!needed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dtype ",
                                                   DTypeName(entry.dtype), " ",
                                                   needed.status().message()));
  }
  if (entry.end - entry.begin != *needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", offsets, " but dtype ", DTypeName(entry.dtype), " shape ",
        ShapeToString(entry.shape), " needs ", *needed, " bytes"));
  }
  return entry;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(
    const json& value) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", kMetadataKey, "' is a JSON ", value.type_name(),
                     ", not an object"));
  }
  std::map<std::string, std::string> metadata;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", kMetadataKey, "': value of '", it.key(), "' is a JSON ",
          it.value().type_name(), ", not a string"));
    }
    metadata.emplace(it.key(), it.value().get<std::string>());
  }
  return metadata;
}

// Checks that the entries, sorted by offset, tile [0, data_size) exactly.
absl::Status CheckCoverage(const std::vector<Entry>& sorted,
                           uint64_t data_size) {
  uint64_t covered_to = 0;
  const Entry* last = nullptr;  // The entry that ends at covered_to.
  for (const Entry& entry : sorted) {
    if (entry.begin < covered_to) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", entry.name, "' data_offsets [", entry.begin,
                       ", ", entry.end, "] overlaps tensor '", last->name,
                       "' data_offsets [", last->begin, ", ", last->end, "]"));
    }
    if (entry.begin > covered_to) {
      return absl::InvalidArgumentError(
          absl::StrCat("data buffer bytes [", covered_to, ", ", entry.begin,
                       ") before tensor '", entry.name,
                       "' belong to no tensor (hole in the data buffer)"));
    }
    covered_to = entry.end;
    last = &entry;
  }
  if (covered_to != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data buffer bytes [", covered_to, ", ", data_size,
        ") after the last tensor belong to no tensor (the data buffer is ",
        data_size, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t TensorView::numel() const {
  uint64_t count = 1;
  for (int64_t dim : shape) count *= static_cast<uint64_t>(dim);
  return count;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_ = path;
  const absl::Span<const uint8_t> bytes(mapping->data(), mapping->size());
  file->mapping_ = std::move(mapping);
  RETURN_IF_ERROR(file->Parse(bytes));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    absl::Span<const uint8_t> bytes, absl::string_view source) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->source_ = std::string(source);
  RETURN_IF_ERROR(file->Parse(bytes));
  return file;
}

absl::Status SafetensorsFile::Parse(absl::Span<const uint8_t> bytes) {
  auto error = [this](absl::string_view message) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
  };
  if (bytes.size() < 8) {
    return error(absl::StrCat("file is ", bytes.size(),
                              " bytes, shorter than the 8-byte header length"));
  }
  const uint64_t header_size = ReadLittleEndianU64(bytes.data());
  const uint64_t after_prefix = bytes.size() - 8;
  if (header_size == 0) return error("header length is 0");
  if (header_size > kMaxHeaderBytes) {
    return error(absl::StrCat("header length ", header_size,
                              " exceeds the limit of ", kMaxHeaderBytes,
                              " bytes"));
  }
  if (header_size > after_prefix) {
    return error(absl::StrCat("header length ", header_size,
                              " exceeds the file: only ", after_prefix,
                              " bytes follow the 8-byte length"));
  }
  header_size_ = header_size;
  const absl::string_view header_text(
      reinterpret_cast<const char*>(bytes.data() + 8), header_size);
  const uint8_t* data_base = bytes.data() + 8 + header_size;
  const uint64_t data_size = after_prefix - header_size;

  ASSIGN_OR_RETURN(json header,
                   internal::ParseJsonRejectingDuplicateKeys(
                       header_text, source_, "header", DuplicateKeyMessage));
  if (!header.is_object()) {
    return error(absl::StrCat("header is a JSON ", header.type_name(),
                              ", not an object"));
  }

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      auto metadata = ParseMetadata(it.value());
      if (!metadata.ok()) return error(metadata.status().message());
      metadata_ = *std::move(metadata);
      continue;
    }
    auto entry = ParseEntry(it.key(), it.value(), data_size);
    if (!entry.ok()) return error(entry.status().message());
    entries.push_back(*std::move(entry));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  if (absl::Status coverage = CheckCoverage(entries, data_size);
      !coverage.ok()) {
    return error(coverage.message());
  }

  tensors_.reserve(entries.size());
  for (Entry& entry : entries) {
    index_by_name_.emplace(entry.name, tensors_.size());
    tensors_.push_back(TensorView{
        std::move(entry.name), entry.dtype, std::move(entry.shape),
        data_base + entry.begin, static_cast<size_t>(entry.end - entry.begin)});
  }
  return absl::OkStatus();
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = index_by_name_.find(std::string(name));
  return it == index_by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<const TensorView*> SafetensorsFile::Get(
    absl::string_view name) const {
  const TensorView* tensor = Find(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(source_, ": no tensor named '", name, "'"));
  }
  return tensor;
}

}  // namespace tandem::safetensors
