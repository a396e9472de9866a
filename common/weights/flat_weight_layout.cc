#include "common/weights/flat_weight_layout.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/weights/weight_digest.h"
#include "kernels/crc32c.h"

namespace tandem::weights {
namespace {

bool IsPowerOfTwo(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

uint64_t RoundUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) & ~(alignment - 1);
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// numel * element size, or an error naming the tensor.
absl::Status CheckTensor(const TensorInfo& t) {
  if (t.name.empty()) return absl::InvalidArgumentError("tensor with no name");
  const uint64_t element = DTypeSize(t.dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": unsupported dtype ", v1::DType_Name(t.dtype)));
  }
  uint64_t bytes = element;
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": negative dimension in shape ",
                       ShapeString(t.shape)));
    }
    if (d != 0 && bytes > std::numeric_limits<uint64_t>::max() /
                              static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": shape ", ShapeString(t.shape),
                       " overflows 64 bits"));
    }
    bytes *= static_cast<uint64_t>(d);
  }
  if (bytes != t.byte_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", t.name, ": byte_size ", t.byte_size,
                     " but shape ", ShapeString(t.shape), " of ",
                     v1::DType_Name(t.dtype), " needs ", bytes));
  }
  return absl::OkStatus();
}

std::vector<BucketRange> CutBuckets(uint64_t total, uint64_t bucket_bytes) {
  std::vector<BucketRange> buckets;
  for (uint64_t off = 0; off < total; off += bucket_bytes) {
    buckets.push_back({static_cast<uint32_t>(buckets.size()), off,
                       std::min(bucket_bytes, total - off)});
  }
  return buckets;
}

}  // namespace

uint64_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_BOOL:
    case v1::DTYPE_U8:
    case v1::DTYPE_I8:
    case v1::DTYPE_F8_E4M3:
    case v1::DTYPE_F8_E5M2:
      return 1;
    case v1::DTYPE_I16:
    case v1::DTYPE_U16:
    case v1::DTYPE_F16:
    case v1::DTYPE_BF16:
      return 2;
    case v1::DTYPE_I32:
    case v1::DTYPE_U32:
    case v1::DTYPE_F32:
      return 4;
    case v1::DTYPE_F64:
    case v1::DTYPE_I64:
    case v1::DTYPE_U64:
      return 8;
    default:
      return 0;
  }
}

std::optional<kernels::FloatFormat> FloatFormatOf(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return kernels::FloatFormat::kF32;
    case v1::DTYPE_BF16:
      return kernels::FloatFormat::kBF16;
    case v1::DTYPE_F16:
      return kernels::FloatFormat::kF16;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<FlatWeightLayout> FlatWeightLayout::Create(
    std::vector<TensorInfo> tensors, const LayoutOptions& options) {
  if (!IsPowerOfTwo(options.alignment) || options.alignment < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout alignment must be a power of two >= 4, got ",
                     options.alignment));
  }
  if (options.bucket_bytes == 0 ||
      options.bucket_bytes % options.alignment != 0 ||
      options.bucket_bytes > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout bucket_bytes must be a positive multiple of alignment ",
        options.alignment, " below 4 GiB, got ", options.bucket_bytes));
  }
  FlatWeightLayout layout;
  layout.bucket_bytes_ = options.bucket_bytes;
  uint64_t offset = 0;
  for (TensorInfo& t : tensors) {
    if (absl::Status s = CheckTensor(t); !s.ok()) return s;
    TensorPlacement p;
    p.offset = RoundUp(offset, options.alignment);
    if (p.offset < offset || p.offset + t.byte_size < p.offset) {
      return absl::InvalidArgumentError("layout exceeds 64-bit size");
    }
    p.bucket = static_cast<uint32_t>(p.offset / options.bucket_bytes);
    p.offset_in_bucket = p.offset % options.bucket_bytes;
    offset = p.offset + t.byte_size;
    p.info = std::move(t);
    layout.tensors_.push_back(std::move(p));
  }
  layout.total_bytes_ = RoundUp(offset, options.alignment);
  layout.buckets_ = CutBuckets(layout.total_bytes_, options.bucket_bytes);
  if (absl::Status s = layout.Index(); !s.ok()) return s;
  return layout;
}

absl::Status FlatWeightLayout::Index() {
  by_name_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (!by_name_.emplace(tensors_[i].info.name, i).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name ", tensors_[i].info.name));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<FlatWeightLayout> FlatWeightLayout::FromManifest(
    const v1::WeightManifest& m) {
  const std::string where =
      absl::StrCat("manifest of version ", m.policy_version(), ": ");
  if (m.bucket_bytes() == 0 || m.bucket_bytes() % 4 != 0 ||
      m.total_bytes() % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "bucket_bytes ", m.bucket_bytes(), " and total_bytes ",
        m.total_bytes(), " must be multiples of 4 and bucket_bytes > 0"));
  }
  FlatWeightLayout layout;
  layout.bucket_bytes_ = m.bucket_bytes();
  layout.total_bytes_ = m.total_bytes();
  layout.buckets_ = CutBuckets(m.total_bytes(), m.bucket_bytes());
  if (static_cast<size_t>(m.buckets_size()) != layout.buckets_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, m.buckets_size(), " buckets, but total_bytes ",
                     m.total_bytes(), " / bucket_bytes ", m.bucket_bytes(),
                     " needs ", layout.buckets_.size()));
  }
  for (int i = 0; i < m.buckets_size(); ++i) {
    const v1::BucketSpec& b = m.buckets(i);
    const BucketRange& want = layout.buckets_[i];
    if (b.index() != want.index || b.byte_offset() != want.offset ||
        b.byte_size() != want.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "bucket ", i, " is (index ", b.index(), ", offset ",
          b.byte_offset(), ", size ", b.byte_size(), "), want (", want.index,
          ", ", want.offset, ", ", want.size, ")"));
    }
  }
  uint64_t end_of_previous = 0;
  for (const v1::TensorSpec& spec : m.tensors()) {
    TensorPlacement p;
    p.info.name = spec.name();
    p.info.dtype = spec.dtype();
    p.info.shape.assign(spec.shape().begin(), spec.shape().end());
    p.info.byte_size = spec.byte_size();
    if (absl::Status s = CheckTensor(p.info); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
    }
    p.bucket = spec.bucket();
    p.offset_in_bucket = spec.offset_in_bucket();
    if (p.bucket >= layout.buckets_.size() ||
        p.offset_in_bucket >= layout.buckets_[p.bucket].size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "tensor ", p.info.name, " starts at bucket ", p.bucket,
          " offset ", p.offset_in_bucket, ", outside the buffer"));
    }
    p.offset = layout.buckets_[p.bucket].offset + p.offset_in_bucket;
    if (p.offset < end_of_previous ||
        p.info.byte_size > m.total_bytes() - p.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "tensor ", p.info.name, " at offset ", p.offset,
                       " overlaps its predecessor or runs past total_bytes"));
    }
    end_of_previous = p.offset + p.info.byte_size;
    layout.tensors_.push_back(std::move(p));
  }
  if (absl::Status s = layout.Index(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, s.message()));
  }
  return layout;
}

const TensorPlacement* FlatWeightLayout::Find(absl::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<absl::Span<uint8_t>> FlatWeightLayout::TensorBytes(
    absl::Span<uint8_t> flat, absl::string_view name) const {
  if (flat.size() != total_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flat buffer is ", flat.size(), " bytes, layout needs ", total_bytes_));
  }
  const TensorPlacement* p = Find(name);
  if (p == nullptr) {
    return absl::NotFoundError(absl::StrCat("no tensor named ", name));
  }
  return flat.subspan(p->offset, p->info.byte_size);
}

std::vector<uint32_t> FlatWeightLayout::BucketCrcs(
    absl::Span<const uint8_t> flat) const {
  std::vector<uint32_t> crcs;
  crcs.reserve(buckets_.size());
  for (const BucketRange& b : buckets_) {
    crcs.push_back(kernels::Crc32c(flat.data() + b.offset, b.size));
  }
  return crcs;
}

absl::StatusOr<v1::WeightManifest> FlatWeightLayout::BuildManifest(
    absl::Span<const uint8_t> flat, uint64_t policy_version,
    bool with_sha256) const {
  if (flat.size() != total_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flat buffer is ", flat.size(), " bytes, layout needs ", total_bytes_));
  }
  v1::WeightManifest m;
  m.set_policy_version(policy_version);
  m.set_total_bytes(total_bytes_);
  m.set_bucket_bytes(bucket_bytes_);
  m.set_kind(v1::WEIGHT_PAYLOAD_KIND_FULL);
  m.set_anchor_version(policy_version);
  for (const TensorPlacement& p : tensors_) {
    v1::TensorSpec* spec = m.add_tensors();
    spec->set_name(p.info.name);
    spec->set_dtype(p.info.dtype);
    for (int64_t d : p.info.shape) spec->add_shape(d);
    spec->set_bucket(p.bucket);
    spec->set_offset_in_bucket(p.offset_in_bucket);
    spec->set_byte_size(p.info.byte_size);
  }
  const std::vector<uint32_t> crcs = BucketCrcs(flat);
  for (const BucketRange& b : buckets_) {
    v1::BucketSpec* spec = m.add_buckets();
    spec->set_index(b.index);
    spec->set_byte_offset(b.offset);
    spec->set_byte_size(b.size);
    spec->set_crc32c(crcs[b.index]);
  }
  if (!with_sha256) return m;
  absl::StatusOr<std::string> sha256 = WeightSha256(flat);
  if (!sha256.ok()) return sha256.status();
  m.set_sha256(*std::move(sha256));
  return m;
}

absl::Status FlatWeightLayout::CheckSameLayout(
    const v1::WeightManifest& m) const {
  const std::string where =
      absl::StrCat("manifest of version ", m.policy_version(), ": ");
  if (m.total_bytes() != total_bytes_ || m.bucket_bytes() != bucket_bytes_ ||
      static_cast<size_t>(m.buckets_size()) != buckets_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, "total_bytes/bucket_bytes/buckets ", m.total_bytes(), "/",
        m.bucket_bytes(), "/", m.buckets_size(), " differ from the layout's ",
        total_bytes_, "/", bucket_bytes_, "/", buckets_.size()));
  }
  if (static_cast<size_t>(m.tensors_size()) != tensors_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, m.tensors_size(), " tensors, layout has ", tensors_.size()));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const v1::TensorSpec& s = m.tensors(static_cast<int>(i));
    const TensorPlacement& p = tensors_[i];
    if (s.name() != p.info.name || s.dtype() != p.info.dtype ||
        s.byte_size() != p.info.byte_size || s.bucket() != p.bucket ||
        s.offset_in_bucket() != p.offset_in_bucket ||
        !std::equal(s.shape().begin(), s.shape().end(), p.info.shape.begin(),
                    p.info.shape.end())) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, "tensor ", i, " (", s.name(),
                       ") differs from the layout's ", p.info.name));
    }
  }
  for (const BucketRange& b : buckets_) {
    const v1::BucketSpec& s = m.buckets(static_cast<int>(b.index));
    if (s.index() != b.index || s.byte_offset() != b.offset ||
        s.byte_size() != b.size) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, "bucket ", b.index, " differs from the layout"));
    }
  }
  return absl::OkStatus();
}

absl::Status VerifyBucket(const v1::WeightManifest& manifest, uint32_t bucket,
                          absl::Span<const uint8_t> data, uint64_t prefix_bytes,
                          uint32_t prefix_crc) {
  if (bucket >= static_cast<uint32_t>(manifest.buckets_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights v", manifest.policy_version(), ": bucket ", bucket,
        " out of range (", manifest.buckets_size(), " buckets)"));
  }
  const v1::BucketSpec& spec = manifest.buckets(static_cast<int>(bucket));
  if (data.size() != spec.byte_size()) {
    return absl::DataLossError(
        absl::StrCat("weights v", manifest.policy_version(), " bucket ", bucket,
                     ": ", data.size(), " bytes, expected ", spec.byte_size()));
  }
  if (prefix_bytes > data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights v", manifest.policy_version(), " bucket ", bucket,
                     ": ", prefix_bytes, " bytes checksummed of ", data.size()));
  }
  const uint32_t actual =
      kernels::Crc32cExtend(prefix_crc, data.data() + prefix_bytes,
                            data.size() - prefix_bytes);
  if (actual != spec.crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "weights v%d bucket %d (bytes [%d, %d)): crc32c mismatch: expected "
        "0x%08x, got 0x%08x",
        manifest.policy_version(), bucket, spec.byte_offset(),
        spec.byte_offset() + spec.byte_size(), spec.crc32c(), actual));
  }
  return absl::OkStatus();
}

absl::Status VerifyWeights(const v1::WeightManifest& manifest,
                           absl::Span<const uint8_t> flat) {
  if (flat.size() != manifest.total_bytes()) {
    return absl::DataLossError(absl::StrCat(
        "weights v", manifest.policy_version(), ": buffer is ", flat.size(),
        " bytes, manifest says ", manifest.total_bytes()));
  }
  for (int i = 0; i < manifest.buckets_size(); ++i) {
    const v1::BucketSpec& b = manifest.buckets(i);
    if (b.byte_offset() > flat.size() ||
        b.byte_size() > flat.size() - b.byte_offset()) {
      return absl::DataLossError(
          absl::StrCat("weights v", manifest.policy_version(), " bucket ", i,
                       " lies outside the buffer"));
    }
    if (absl::Status s =
            VerifyBucket(manifest, static_cast<uint32_t>(i),
                         flat.subspan(b.byte_offset(), b.byte_size()));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::string WeightsDigest(absl::Span<const uint32_t> bucket_crcs) {
  uint32_t crc = 0;
  for (uint32_t c : bucket_crcs) {
    const unsigned char le[4] = {
        static_cast<unsigned char>(c), static_cast<unsigned char>(c >> 8),
        static_cast<unsigned char>(c >> 16),
        static_cast<unsigned char>(c >> 24)};
    crc = kernels::Crc32cExtend(crc, le, sizeof(le));
  }
  return absl::StrFormat("%08x", crc);
}

std::string ManifestDigest(const v1::WeightManifest& manifest) {
  if (manifest.buckets_size() == 0) return "";
  std::vector<uint32_t> crcs;
  crcs.reserve(manifest.buckets_size());
  for (const v1::BucketSpec& b : manifest.buckets()) crcs.push_back(b.crc32c());
  return WeightsDigest(crcs);
}

}  // namespace tandem::weights
