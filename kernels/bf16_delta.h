#pragma once

// Sparse delta codec for flat bf16 weight buffers (issue 5, "delta sync").
//
// A delta turns version v-1 of a buffer of 16-bit words into version v. It
// lists the changed word indices and their new values; applying it to an
// exact copy of v-1 reproduces v bit for bit (indices are found by comparing
// raw words, see bf16_change.h). The encoded form is a self-describing byte
// string, safe to receive from the network: decoding validates every field
// and never writes outside the target buffer.
//
// Format (all integers little-endian):
//   header (32 bytes): u32 magic "TDLT", u8 format (1), u8[3] zero,
//     u64 num_words, u64 num_changed, u32 num_blocks, u32 zero
//   block table (24 bytes per block): u64 first_index, u32 count,
//     u32 payload_bytes, u8 gap_k, u8 value_coding, u8 value_k, u8[5] zero
//   block payloads, back to back in block order.
// A block holds up to `block_elements` consecutive changed words. Its payload
// is, for value_coding 0 (raw), `count` u16 new values followed by a bit
// stream; for value_coding 1 (base-relative) only a bit stream. The bit
// stream (LSB first, zero-padded to a byte) holds, per element, the gap
// (index - previous index - 1, absent for the block's first element) as a
// Rice code with parameter gap_k, then for base-relative blocks the
// zigzagged difference (new - old) mod 2^16 as a Rice code with parameter
// value_k. Rice codes escape to raw bits after 24 quotient ones.
//
// Why Rice-coded gaps rather than LEB128: at 1% density a gap costs ~8.6
// bits instead of ~10.2 (and ~5 instead of 8 at 10%). Why base-relative
// values: between RL steps a changed bf16 word usually moves by one or two
// ULPs, so (new - old) takes 2-4 bits instead of 16. Each block picks the
// cheaper of raw and base-relative values; DeltaValueCoding::kRaw forces raw
// values, which a receiver can apply without reading the base word.
//
// All functions are thread-safe (no shared state).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem::kernels {

enum class DeltaValueCoding {
  kAuto,  // per block, whichever of raw and base-relative is smaller
  kRaw,   // always the raw 16-bit new value
};

struct DeltaEncodeOptions {
  DeltaValueCoding value_coding = DeltaValueCoding::kAuto;
  // Changed words per block, in [1, kMaxDeltaBlockElements]. Blocks decode
  // independently (parallel or on a GPU); larger blocks amortise the
  // 24-byte table entry.
  uint32_t block_elements = 16384;
};

inline constexpr uint32_t kMaxDeltaBlockElements = 1u << 20;

// Summary of an encoded delta, read from its header and block table.
struct DeltaInfo {
  uint64_t num_words = 0;
  uint64_t num_changed = 0;
  uint32_t num_blocks = 0;
  uint32_t raw_value_blocks = 0;
  uint32_t relative_value_blocks = 0;
};

// Encodes the words where `prev` and `next` differ. Returns InvalidArgument
// when the sizes differ or the options are out of range. An identical pair
// yields a valid, header-only delta.
absl::StatusOr<std::vector<uint8_t>> EncodeBf16Delta(
    absl::Span<const uint16_t> prev, absl::Span<const uint16_t> next,
    const DeltaEncodeOptions& options = {});

// Encodes an already compacted change list (e.g. from the CUDA kernels):
// `indices` strictly increasing and < num_words, `new_values` the same
// length. `old_values` is either empty (raw values only) or the same length
// and holds the base words, enabling base-relative blocks.
absl::StatusOr<std::vector<uint8_t>> EncodeSparseDelta(
    uint64_t num_words, absl::Span<const uint64_t> indices,
    absl::Span<const uint16_t> new_values,
    absl::Span<const uint16_t> old_values,
    const DeltaEncodeOptions& options = {});

// Parses the header and block table (not the payloads). Returns
// InvalidArgument/DataLoss naming the field for malformed input.
absl::StatusOr<DeltaInfo> InspectDelta(absl::Span<const uint8_t> delta);

// Decodes every block without writing anything: OK iff ApplyBf16Delta would
// succeed on a buffer of `num_words` words.
absl::Status ValidateDelta(absl::Span<const uint8_t> delta, uint64_t num_words);

// Patches `words` (an exact copy of the delta's base version) in place.
// With `validate_first` (the default) the whole delta is validated before
// the first write, so on error `words` is untouched; without it a malformed
// delta may leave `words` partially patched (about twice as fast; use it when
// the result is verified by checksum before use anyway).
absl::Status ApplyBf16Delta(absl::Span<const uint8_t> delta,
                            absl::Span<uint16_t> words,
                            bool validate_first = true);

// The decoded change list of a delta against `base` (the base version, used
// for base-relative blocks): indices strictly increasing, values the new
// words. For uploading a patch to a device, see kernels/cuda/.
absl::Status DecodeBf16Delta(absl::Span<const uint8_t> delta,
                             absl::Span<const uint16_t> base,
                             std::vector<uint64_t>* indices,
                             std::vector<uint16_t>* values);

// The patch operations of a delta without reading any base: words to set
// (raw blocks) and differences to add mod 2^16 (base-relative blocks), each
// list in increasing index order and disjoint from the other. For applying
// a delta where the base lives elsewhere, e.g. on a GPU
// (kernels/cuda/bf16_delta_cuda.h).
struct DeltaOps {
  std::vector<uint64_t> set_index;
  std::vector<uint16_t> set_value;
  std::vector<uint64_t> add_index;
  std::vector<uint16_t> add_value;
};
absl::Status DecodeBf16DeltaOps(absl::Span<const uint8_t> delta,
                                uint64_t num_words, DeltaOps* ops);

}  // namespace tandem::kernels
