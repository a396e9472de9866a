#include "kernels/bf16_delta.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/bf16_change.h"
#include "kernels/bit_stream.h"

namespace tandem::kernels {
namespace {

using internal::BitReader;
using internal::BitWriter;
using internal::RiceCost;

constexpr uint32_t kMagic = 0x544C4454u;  // "TDLT" little-endian
constexpr uint8_t kFormat = 1;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kBlockEntryBytes = 24;
constexpr uint8_t kValuesRaw = 0;
constexpr uint8_t kValuesRelative = 1;
constexpr int kMaxValueK = 15;

struct BlockEntry {
  uint64_t first_index = 0;
  uint32_t count = 0;
  uint32_t payload_bytes = 0;
  uint8_t gap_k = 0;
  uint8_t value_coding = kValuesRaw;
  uint8_t value_k = 0;
};

template <typename T>
void PutLe(std::vector<uint8_t>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

template <typename T>
T GetLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline uint16_t ZigZag(uint16_t diff) {
  const auto d = static_cast<int16_t>(diff);
  return static_cast<uint16_t>((static_cast<uint16_t>(d) << 1) ^
                               static_cast<uint16_t>(d >> 15));
}

inline uint16_t UnZigZag(uint16_t z) {
  return static_cast<uint16_t>((z >> 1) ^ static_cast<uint16_t>(-(z & 1)));
}

// Collects one block of changes and appends its encoding.
class BlockEncoder {
 public:
  BlockEncoder(const DeltaEncodeOptions& options, std::vector<uint8_t>* payload,
               std::vector<BlockEntry>* blocks)
      : options_(options), payload_(payload), blocks_(blocks) {
    indices_.resize(options.block_elements);
    new_.resize(options.block_elements);
    old_.resize(options.block_elements);
    gaps_.resize(options.block_elements);
    zig_.resize(options.block_elements);
  }

  void Add(uint64_t index, uint16_t new_value, uint16_t old_value,
           bool has_old) {
    indices_[n_] = index;
    new_[n_] = new_value;
    old_[n_] = old_value;
    ++n_;
    has_old_ = has_old;
    if (n_ == options_.block_elements) Flush();
  }

  void Flush() {
    if (n_ == 0) return;
    const size_t n = n_;
    BlockEntry entry;
    entry.first_index = indices_[0];
    entry.count = static_cast<uint32_t>(n);

    // Gap parameter: the exact cost of a few k around log2(mean gap), all
    // candidates costed in one pass.
    uint64_t gap_sum = 0;
    for (size_t i = 1; i < n; ++i) {
      gaps_[i - 1] = indices_[i] - indices_[i - 1] - 1;
      gap_sum += gaps_[i - 1];
    }
    const uint64_t mean = n > 1 ? gap_sum / (n - 1) : 0;
    const int k_lo = std::max(0, static_cast<int>(std::bit_width(mean)) - 3);
    constexpr int kGapCandidates = 5;
    uint64_t gap_cost[kGapCandidates] = {};
    for (size_t i = 0; i + 1 < n; ++i) {
      for (int c = 0; c < kGapCandidates; ++c) {
        gap_cost[c] += RiceCost(gaps_[i], std::min(63, k_lo + c), 0);
      }
    }
    const int best_gap = static_cast<int>(
        std::min_element(gap_cost, gap_cost + kGapCandidates) - gap_cost);
    entry.gap_k = static_cast<uint8_t>(std::min(63, k_lo + best_gap));

    // Value coding: raw unless base-relative Rice codes are smaller.
    entry.value_coding = kValuesRaw;
    if (has_old_ && options_.value_coding == DeltaValueCoding::kAuto) {
      constexpr int kValueCandidates = 7;  // k = 0..6
      uint64_t value_cost[kValueCandidates] = {};
      for (size_t i = 0; i < n; ++i) {
        zig_[i] = ZigZag(static_cast<uint16_t>(new_[i] - old_[i]));
        for (int k = 0; k < kValueCandidates; ++k) {
          value_cost[k] += RiceCost(zig_[i], k, 16);
        }
      }
      const int best_k = static_cast<int>(
          std::min_element(value_cost, value_cost + kValueCandidates) -
          value_cost);
      if (value_cost[best_k] < 16 * static_cast<uint64_t>(n)) {
        entry.value_coding = kValuesRelative;
        entry.value_k = static_cast<uint8_t>(best_k);
      }
    }

    const size_t start = payload_->size();
    if (entry.value_coding == kValuesRaw) {
      payload_->resize(start + 2 * n);
      std::memcpy(payload_->data() + start, new_.data(), 2 * n);
    }
    BitWriter writer(payload_);
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) writer.PutRice(gaps_[i - 1], entry.gap_k, 0);
      if (entry.value_coding == kValuesRelative) {
        writer.PutRice(zig_[i], entry.value_k, 16);
      }
    }
    writer.Finish();
    entry.payload_bytes = static_cast<uint32_t>(payload_->size() - start);
    blocks_->push_back(entry);
    n_ = 0;
  }

 private:
  const DeltaEncodeOptions& options_;
  std::vector<uint8_t>* payload_;
  std::vector<BlockEntry>* blocks_;
  std::vector<uint64_t> indices_;
  std::vector<uint16_t> new_;
  std::vector<uint16_t> old_;
  std::vector<uint64_t> gaps_;
  std::vector<uint16_t> zig_;
  size_t n_ = 0;
  bool has_old_ = false;
};

absl::Status CheckOptions(const DeltaEncodeOptions& options) {
  if (options.block_elements == 0 ||
      options.block_elements > kMaxDeltaBlockElements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta block_elements must be in [1, ", kMaxDeltaBlockElements,
        "], got ", options.block_elements));
  }
  return absl::OkStatus();
}

std::vector<uint8_t> Assemble(uint64_t num_words, uint64_t num_changed,
                              const std::vector<BlockEntry>& blocks,
                              const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + kBlockEntryBytes * blocks.size() + payload.size());
  PutLe<uint32_t>(&out, kMagic);
  PutLe<uint32_t>(&out, kFormat);  // format byte + three zero bytes
  PutLe<uint64_t>(&out, num_words);
  PutLe<uint64_t>(&out, num_changed);
  PutLe<uint32_t>(&out, static_cast<uint32_t>(blocks.size()));
  PutLe<uint32_t>(&out, 0);
  for (const BlockEntry& b : blocks) {
    PutLe<uint64_t>(&out, b.first_index);
    PutLe<uint32_t>(&out, b.count);
    PutLe<uint32_t>(&out, b.payload_bytes);
    out.push_back(b.gap_k);
    out.push_back(b.value_coding);
    out.push_back(b.value_k);
    for (int i = 0; i < 5; ++i) out.push_back(0);
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// A parsed delta: header fields, block table, and where each payload starts.
struct ParsedDelta {
  DeltaInfo info;
  std::vector<BlockEntry> blocks;
  std::vector<size_t> payload_offsets;
};

absl::StatusOr<ParsedDelta> Parse(absl::Span<const uint8_t> delta) {
  if (delta.size() < kHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta is ", delta.size(), " bytes, shorter than its 32-byte header"));
  }
  const uint8_t* p = delta.data();
  if (GetLe<uint32_t>(p) != kMagic) {
    return absl::InvalidArgumentError("delta has a bad magic (want \"TDLT\")");
  }
  if (p[4] != kFormat || p[5] != 0 || p[6] != 0 || p[7] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta format ", p[4], " is not supported (want 1)"));
  }
  ParsedDelta parsed;
  parsed.info.num_words = GetLe<uint64_t>(p + 8);
  parsed.info.num_changed = GetLe<uint64_t>(p + 16);
  parsed.info.num_blocks = GetLe<uint32_t>(p + 24);
  const uint64_t table_end =
      kHeaderBytes + kBlockEntryBytes * uint64_t{parsed.info.num_blocks};
  if (table_end > delta.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta block table of ", parsed.info.num_blocks,
                     " blocks runs past its ", delta.size(), " bytes"));
  }
  parsed.blocks.resize(parsed.info.num_blocks);
  parsed.payload_offsets.resize(parsed.info.num_blocks);
  uint64_t offset = table_end;
  uint64_t changed = 0;
  uint64_t next_min_index = 0;
  for (uint32_t i = 0; i < parsed.info.num_blocks; ++i) {
    const uint8_t* e = p + kHeaderBytes + kBlockEntryBytes * i;
    BlockEntry& b = parsed.blocks[i];
    b.first_index = GetLe<uint64_t>(e);
    b.count = GetLe<uint32_t>(e + 8);
    b.payload_bytes = GetLe<uint32_t>(e + 12);
    b.gap_k = e[16];
    b.value_coding = e[17];
    b.value_k = e[18];
    const std::string where = absl::StrCat("delta block ", i, ": ");
    if (b.count == 0 || b.count > kMaxDeltaBlockElements) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "count ", b.count, " out of range"));
    }
    if (b.gap_k > 63 || b.value_coding > kValuesRelative ||
        b.value_k > kMaxValueK) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "bad coding parameters gap_k=", b.gap_k,
          " value_coding=", b.value_coding, " value_k=", b.value_k));
    }
    if (b.first_index < next_min_index ||
        b.first_index >= parsed.info.num_words) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "first index ", b.first_index,
          " is out of order or >= num_words ", parsed.info.num_words));
    }
    if (b.value_coding == kValuesRaw && b.payload_bytes < 2ull * b.count) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "payload too small for ", b.count, " values"));
    }
    parsed.payload_offsets[i] = offset;
    offset += b.payload_bytes;
    changed += b.count;
    // Indices in the block are at least count-1 past the first.
    next_min_index = b.first_index + b.count;
    if (offset > delta.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "payload runs past the end of the delta"));
    }
    if (b.value_coding == kValuesRaw) {
      ++parsed.info.raw_value_blocks;
    } else {
      ++parsed.info.relative_value_blocks;
    }
  }
  if (offset != delta.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta has ", delta.size() - offset,
                     " trailing bytes after its blocks"));
  }
  if (changed != parsed.info.num_changed) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta header says ", parsed.info.num_changed,
                     " changed words, blocks hold ", changed));
  }
  return parsed;
}

// Decodes block `i`, calling sink(index, value, relative) per element where
// `value` is the new word (raw) or the difference to add (relative).
template <typename Sink>
absl::Status DecodeBlock(const ParsedDelta& parsed,
                         absl::Span<const uint8_t> delta, uint32_t i,
                         Sink&& sink) {
  const BlockEntry& b = parsed.blocks[i];
  const uint8_t* payload = delta.data() + parsed.payload_offsets[i];
  const bool raw = b.value_coding == kValuesRaw;
  const size_t raw_bytes = raw ? 2 * size_t{b.count} : 0;
  const size_t bit_bytes = b.payload_bytes - raw_bytes;
  BitReader reader(payload + raw_bytes, bit_bytes);
  const uint64_t num_words = parsed.info.num_words;
  uint64_t index = b.first_index;
  for (uint32_t j = 0; j < b.count; ++j) {
    if (j > 0) {
      const uint64_t gap = reader.GetRice(b.gap_k, 0);
      // index + gap + 1 < num_words, without overflow.
      if (gap >= num_words - index - 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("delta block ", i, ": element ", j,
                         " index past num_words ", num_words));
      }
      index += gap + 1;
    }
    uint16_t value;
    if (raw) {
      value = GetLe<uint16_t>(payload + 2 * size_t{j});
    } else {
      value = UnZigZag(static_cast<uint16_t>(reader.GetRice(b.value_k, 16)));
    }
    if (reader.overrun()) break;
    sink(index, value, !raw);
  }
  if (reader.overrun() || (reader.consumed_bits() + 7) / 8 != bit_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta block ", i, ": bit stream length does not match its contents"));
  }
  if (i + 1 < parsed.info.num_blocks &&
      parsed.blocks[i + 1].first_index <= index) {
    return absl::InvalidArgumentError(absl::StrCat(
        "delta block ", i + 1, ": first index overlaps the previous block"));
  }
  return absl::OkStatus();
}

absl::Status CheckWords(const ParsedDelta& parsed, uint64_t num_words) {
  if (parsed.info.num_words != num_words) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta is for ", parsed.info.num_words,
                     " words, buffer has ", num_words));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> EncodeBf16Delta(
    absl::Span<const uint16_t> prev, absl::Span<const uint16_t> next,
    const DeltaEncodeOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (prev.size() != next.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("delta between buffers of different sizes: ", prev.size(),
                     " vs ", next.size(), " words"));
  }
  std::vector<uint8_t> payload;
  std::vector<BlockEntry> blocks;
  uint64_t changed = 0;
  {
    BlockEncoder encoder(options, &payload, &blocks);
    ForEachChangedWord(prev, next, [&](size_t i) {
      encoder.Add(i, next[i], prev[i], /*has_old=*/true);
      ++changed;
    });
    encoder.Flush();
  }
  return Assemble(next.size(), changed, blocks, payload);
}

absl::StatusOr<std::vector<uint8_t>> EncodeSparseDelta(
    uint64_t num_words, absl::Span<const uint64_t> indices,
    absl::Span<const uint16_t> new_values,
    absl::Span<const uint16_t> old_values, const DeltaEncodeOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (new_values.size() != indices.size() ||
      (!old_values.empty() && old_values.size() != indices.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse delta: ", indices.size(), " indices but ", new_values.size(),
        " new and ", old_values.size(), " old values"));
  }
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] >= num_words || (i > 0 && indices[i] <= indices[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse delta: index ", i, " (", indices[i],
                       ") is not increasing or >= num_words ", num_words));
    }
  }
  std::vector<uint8_t> payload;
  std::vector<BlockEntry> blocks;
  {
    BlockEncoder encoder(options, &payload, &blocks);
    const bool has_old = !old_values.empty();
    for (size_t i = 0; i < indices.size(); ++i) {
      encoder.Add(indices[i], new_values[i], has_old ? old_values[i] : 0,
                  has_old);
    }
    encoder.Flush();
  }
  return Assemble(num_words, indices.size(), blocks, payload);
}

absl::StatusOr<DeltaInfo> InspectDelta(absl::Span<const uint8_t> delta) {
  absl::StatusOr<ParsedDelta> parsed = Parse(delta);
  if (!parsed.ok()) return parsed.status();
  return parsed->info;
}

absl::Status ValidateDelta(absl::Span<const uint8_t> delta,
                           uint64_t num_words) {
  absl::StatusOr<ParsedDelta> parsed = Parse(delta);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckWords(*parsed, num_words); !s.ok()) return s;
  for (uint32_t i = 0; i < parsed->info.num_blocks; ++i) {
    absl::Status s =
        DecodeBlock(*parsed, delta, i, [](uint64_t, uint16_t, bool) {});
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ApplyBf16Delta(absl::Span<const uint8_t> delta,
                            absl::Span<uint16_t> words, bool validate_first) {
  absl::StatusOr<ParsedDelta> parsed = Parse(delta);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckWords(*parsed, words.size()); !s.ok()) return s;
  if (validate_first) {
    for (uint32_t i = 0; i < parsed->info.num_blocks; ++i) {
      absl::Status s =
          DecodeBlock(*parsed, delta, i, [](uint64_t, uint16_t, bool) {});
      if (!s.ok()) return s;
    }
  }
  // Each block is decoded into a small list first and then applied with
  // prefetching: sparse changes touch a new cache line almost every time,
  // and issuing those misses ahead of the writes is what makes patching
  // memory-parallel rather than latency-bound.
  uint16_t* w = words.data();
  std::vector<uint64_t> index;
  std::vector<uint16_t> value;
  constexpr size_t kPrefetchDistance = 16;
  for (uint32_t i = 0; i < parsed->info.num_blocks; ++i) {
    index.clear();
    value.clear();
    bool relative = false;
    absl::Status s =
        DecodeBlock(*parsed, delta, i, [&](uint64_t at, uint16_t v, bool rel) {
          index.push_back(at);
          value.push_back(v);
          relative = rel;
        });
    if (!s.ok()) return s;
    const size_t n = index.size();
    for (size_t j = 0; j < n; ++j) {
      if (j + kPrefetchDistance < n) {
        __builtin_prefetch(w + index[j + kPrefetchDistance], 1);
      }
      w[index[j]] =
          relative ? static_cast<uint16_t>(w[index[j]] + value[j]) : value[j];
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeBf16Delta(absl::Span<const uint8_t> delta,
                             absl::Span<const uint16_t> base,
                             std::vector<uint64_t>* indices,
                             std::vector<uint16_t>* values) {
  absl::StatusOr<ParsedDelta> parsed = Parse(delta);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckWords(*parsed, base.size()); !s.ok()) return s;
  indices->clear();
  values->clear();
  indices->reserve(parsed->info.num_changed);
  values->reserve(parsed->info.num_changed);
  for (uint32_t i = 0; i < parsed->info.num_blocks; ++i) {
    absl::Status s = DecodeBlock(
        *parsed, delta, i, [&](uint64_t index, uint16_t value, bool relative) {
          indices->push_back(index);
          values->push_back(
              relative ? static_cast<uint16_t>(base[index] + value) : value);
        });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DecodeBf16DeltaOps(absl::Span<const uint8_t> delta,
                                uint64_t num_words, DeltaOps* ops) {
  absl::StatusOr<ParsedDelta> parsed = Parse(delta);
  if (!parsed.ok()) return parsed.status();
  if (absl::Status s = CheckWords(*parsed, num_words); !s.ok()) return s;
  *ops = DeltaOps();
  for (uint32_t i = 0; i < parsed->info.num_blocks; ++i) {
    absl::Status s =
        DecodeBlock(*parsed, delta, i,
                    [ops](uint64_t index, uint16_t value, bool relative) {
                      if (relative) {
                        ops->add_index.push_back(index);
                        ops->add_value.push_back(value);
                      } else {
                        ops->set_index.push_back(index);
                        ops->set_value.push_back(value);
                      }
                    });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels
