#pragma once

// FlatWeightLayout: where every tensor of a published policy lives in one
// flat byte buffer, and how that buffer is cut into fixed-size buckets (the
// unit of transfer and of checksumming).
//
// Layout rules (the same on trainer and workers, so a manifest is enough to
// rebuild it):
//   - Tensors are placed in the order given, each at the next offset that is
//     a multiple of `alignment` (a power of two >= 4, default 64). Padding
//     bytes are zero and covered by the checksums.
//   - The total size is rounded up to `alignment`, so the buffer is always a
//     whole number of 16-bit words (delta sync) and of 32-bit floats (Gloo
//     broadcasts bytes viewed as float32).
//   - Buckets are consecutive slices of exactly `bucket_bytes` (a multiple
//     of `alignment`), the last one possibly shorter. Tensors do NOT align to
//     buckets: a tensor may span bucket boundaries. This keeps every bucket
//     (and thus staging and transfer memory) bounded by bucket_bytes, wastes
//     no padding on large tensors, and lets one tensor bigger than a bucket
//     exist at all. TensorSpec.bucket/offset_in_bucket locate a tensor's
//     first byte; its bytes run contiguously for byte_size in the flat
//     buffer.
//
// Thread-safety: immutable after creation; safe to share.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/finite_scan.h"
#include "tandem/v1/common.pb.h"

namespace tandem::weights {

// Size in bytes of one element of `dtype`; 0 for DTYPE_UNSPECIFIED or an
// unknown value.
uint64_t DTypeSize(v1::DType dtype);

// The floating-point format of `dtype` that the finite check scans
// (finite_weights.h): F32, BF16 and F16; nullopt for any other dtype.
std::optional<kernels::FloatFormat> FloatFormatOf(v1::DType dtype);

// One tensor to place.
struct TensorInfo {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  // numel * DTypeSize(dtype); checked by Create().
  uint64_t byte_size = 0;
};

struct LayoutOptions {
  uint64_t bucket_bytes = uint64_t{256} << 20;
  uint64_t alignment = 64;
};

// Where a tensor sits in the flat buffer.
struct TensorPlacement {
  TensorInfo info;
  uint64_t offset = 0;  // in the flat buffer
  uint32_t bucket = 0;  // bucket holding the first byte
  uint64_t offset_in_bucket = 0;
};

struct BucketRange {
  uint32_t index = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

class FlatWeightLayout {
 public:
  // Places `tensors`. InvalidArgument (naming the tensor or option) for an
  // empty or duplicate name, an unspecified dtype, a negative dimension, a
  // byte_size that disagrees with shape and dtype, or bad options.
  static absl::StatusOr<FlatWeightLayout> Create(
      std::vector<TensorInfo> tensors, const LayoutOptions& options);

  // Rebuilds the layout a manifest describes and checks that it is
  // self-consistent (bucket geometry, tensor placement, sizes).
  // InvalidArgument naming the offending field otherwise.
  static absl::StatusOr<FlatWeightLayout> FromManifest(
      const v1::WeightManifest& manifest);

  uint64_t total_bytes() const { return total_bytes_; }
  uint64_t bucket_bytes() const { return bucket_bytes_; }
  uint32_t num_buckets() const {
    return static_cast<uint32_t>(buckets_.size());
  }
  const std::vector<BucketRange>& buckets() const { return buckets_; }
  const std::vector<TensorPlacement>& tensors() const { return tensors_; }

  // The placement of `name`, or nullptr.
  const TensorPlacement* Find(absl::string_view name) const;

  // The bytes of tensor `name` inside `flat` (which must be total_bytes()
  // long). NotFound / InvalidArgument otherwise.
  absl::StatusOr<absl::Span<uint8_t>> TensorBytes(absl::Span<uint8_t> flat,
                                                  absl::string_view name) const;

  // CRC-32C of every bucket of `flat`. REQUIRES: flat.size() == total_bytes().
  std::vector<uint32_t> BucketCrcs(absl::Span<const uint8_t> flat) const;

  // A FULL manifest for version `policy_version` of `flat`, with checksums
  // (per-bucket CRC-32C and, unless `with_sha256` is false, the SHA-256 of
  // the whole buffer).
  // InvalidArgument when flat has the wrong size. The caller sets kind,
  // base_version, anchor_version and published_unix_ms as needed.
  absl::StatusOr<v1::WeightManifest> BuildManifest(
      absl::Span<const uint8_t> flat, uint64_t policy_version,
      bool with_sha256 = true) const;

  // OK when `manifest` describes exactly this layout (same tensors in the
  // same places, same buckets); FailedPrecondition naming the first
  // difference otherwise. Checksums and versions are not compared.
  absl::Status CheckSameLayout(const v1::WeightManifest& manifest) const;

 private:
  FlatWeightLayout() = default;
  absl::Status Index();

  uint64_t total_bytes_ = 0;
  uint64_t bucket_bytes_ = 0;
  std::vector<TensorPlacement> tensors_;
  std::vector<BucketRange> buckets_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

// Checks bucket `bucket` of `manifest` against `data` (that bucket's bytes).
// DataLoss "weights v7 bucket 3: crc32c mismatch: expected 0x..., got 0x..."
// (or a size mismatch); InvalidArgument for a bucket index out of range.
// `prefix_crc` is the CRC-32C the caller already computed over the first
// `prefix_bytes` of `data` (as they arrived); only the rest is read here.
absl::Status VerifyBucket(const v1::WeightManifest& manifest, uint32_t bucket,
                          absl::Span<const uint8_t> data,
                          uint64_t prefix_bytes = 0, uint32_t prefix_crc = 0);

// Checks every bucket of `flat` against `manifest`; reports the first bad
// bucket as VerifyBucket does.
absl::Status VerifyWeights(const v1::WeightManifest& manifest,
                           absl::Span<const uint8_t> flat);

// A short fingerprint of a whole weight buffer: the CRC-32C (8 hex digits)
// over its bucket CRC-32Cs as little-endian u32s, in bucket order. Equal
// digests of the same layout mean equal bytes, up to CRC collisions; used to
// compare a worker's received weights with the trainer's in status output.
std::string WeightsDigest(absl::Span<const uint32_t> bucket_crcs);

// WeightsDigest of the buckets `manifest` describes ("" without buckets).
std::string ManifestDigest(const v1::WeightManifest& manifest);

}  // namespace tandem::weights
