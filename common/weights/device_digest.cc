#include "common/weights/device_digest.h"

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <array>
#include <exception>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/weights/weight_digest.h"

namespace tandem::weights {
namespace {

absl::Span<const uint8_t> HostBytes(const at::Tensor& t, int64_t offset,
                                    int64_t length) {
  return {static_cast<const uint8_t*>(t.data_ptr()) + offset,
          static_cast<size_t>(length)};
}

// Hashes a device tensor's bytes through two pinned pieces, the copy of
// the next piece in flight while the host hashes this one. The pieces come
// from LibTorch's caching host allocator (at::empty with pinned_memory):
// freed, they go back to its free list and the next version's are taken
// from there, so only the first version pays for cudaHostAlloc
// (gpu_device_test checks this with the allocator's statistics).
absl::Status HashDeviceBytes(const at::Tensor& flat, int64_t piece_bytes,
                             Sha256Hasher* hasher) {
  const int64_t total = flat.numel();
  const int64_t piece = std::min(piece_bytes, total);
  const at::TensorOptions pinned_options =
      at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  std::array<at::Tensor, 2> pinned = {at::empty({piece}, pinned_options),
                                      at::empty({piece}, pinned_options)};
  c10::impl::VirtualGuardImpl guard(flat.device().type());
  const c10::Stream stream = guard.getStream(flat.device());
  std::array<std::optional<c10::Event>, 2> copied;
  auto start_copy = [&](int64_t index) {
    const int64_t offset = index * piece;
    const int64_t length = std::min(piece, total - offset);
    const int slot = static_cast<int>(index % 2);
    pinned[slot].narrow(0, 0, length).copy_(flat.narrow(0, offset, length),
                                            /*non_blocking=*/true);
    copied[slot].emplace(flat.device().type());
    copied[slot]->record(stream);
  };
  const int64_t pieces = (total + piece - 1) / piece;
  start_copy(0);
  for (int64_t i = 0; i < pieces; ++i) {
    // The host is done with slot (i + 1) % 2 (it hashed piece i - 1).
    if (i + 1 < pieces) start_copy(i + 1);
    const int slot = static_cast<int>(i % 2);
    copied[slot]->synchronize();
    const int64_t length = std::min(piece, total - i * piece);
    hasher->Update(HostBytes(pinned[slot], 0, length));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> TensorSha256(const at::Tensor& bytes,
                                         int64_t piece_bytes) {
  if (!bytes.defined() || !bytes.is_contiguous()) {
    return absl::InvalidArgumentError(
        "TensorSha256: the weight bytes must be a defined, contiguous "
        "tensor");
  }
  if (piece_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TensorSha256: piece_bytes ", piece_bytes, " < 1"));
  }
  Sha256Hasher hasher;
  const int64_t total = bytes.numel() * bytes.element_size();
  if (total > 0) {
    // Bytes in memory order, whatever the dtype and shape.
    const at::Tensor flat =
        at::from_blob(bytes.data_ptr(), {total},
                      bytes.options().dtype(at::kByte));
    if (flat.is_cpu()) {
      for (int64_t offset = 0; offset < total; offset += piece_bytes) {
        hasher.Update(
            HostBytes(flat, offset, std::min(piece_bytes, total - offset)));
      }
    } else {
      try {
        absl::Status hashed = HashDeviceBytes(flat, piece_bytes, &hasher);
        if (!hashed.ok()) return hashed;
      } catch (const std::exception& e) {
        return absl::InternalError(absl::StrCat(
            "TensorSha256: copying ", total, " weight bytes from ",
            flat.device().str(), " failed: ", e.what()));
      }
    }
  }
  return hasher.Finish();
}

absl::Status VerifyTensorWeightSha256(uint64_t version,
                                      const std::string& expected,
                                      const at::Tensor& bytes,
                                      int64_t piece_bytes) {
  if (expected.size() != kWeightSha256Bytes) {
    return CheckWeightSha256(version, expected, "", 0);
  }
  absl::StatusOr<std::string> actual = TensorSha256(bytes, piece_bytes);
  if (!actual.ok()) return actual.status();
  return CheckWeightSha256(version, expected, *actual,
                           bytes.numel() * bytes.element_size());
}

}  // namespace tandem::weights
