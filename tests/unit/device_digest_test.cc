// TensorSha256 / VerifyTensorWeightSha256 (common/weights/device_digest.h):
// the digest of a tensor's bytes, hashed in pieces, equals the SHA-256 of
// the same bytes in one go (weight_digest.h), at and around every piece
// boundary, for any dtype; a changed byte is refused with the version named.
// The CUDA path (pinned double buffering) is checked by gpu_device_test.

#include <ATen/ATen.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/weights/device_digest.h"
#include "common/weights/weight_digest.h"

// Last: glog (through LibTorch) defines a CHECK macro of its own.
#include <catch2/catch.hpp>

namespace tandem::weights {
namespace {

std::string Sha256Of(const at::Tensor& t) {
  auto digest = WeightSha256(
      {static_cast<const uint8_t*>(t.data_ptr()),
       static_cast<size_t>(t.numel() * t.element_size())});
  REQUIRE(digest.ok());
  return *digest;
}

TEST_CASE("the pieced digest equals the one-go SHA-256 around piece edges",
          "[weights][digest]") {
  at::manual_seed(3);
  const int64_t piece = 64;
  for (int64_t size : {0, 1, 63, 64, 65, 127, 128, 129, 1000}) {
    const at::Tensor bytes =
        at::randint(0, 256, {size}, at::TensorOptions().dtype(at::kByte));
    auto digest = TensorSha256(bytes, piece);
    REQUIRE(digest.ok());
    CHECK(*digest == Sha256Of(bytes));
    // A different piece size gives the same digest.
    auto other = TensorSha256(bytes, 7);
    REQUIRE(other.ok());
    CHECK(*other == *digest);
  }
}

TEST_CASE("a tensor's bytes are hashed in memory order, whatever its dtype",
          "[weights][digest]") {
  at::manual_seed(4);
  const at::Tensor weights = at::randn({3, 37}).to(at::kBFloat16);
  auto digest = TensorSha256(weights, 50);
  REQUIRE(digest.ok());
  CHECK(*digest == Sha256Of(weights));
  REQUIRE(VerifyTensorWeightSha256(9, *digest, weights, 50).ok());

  // One changed bit is refused, with the version and the digests named.
  at::Tensor changed = weights.clone();
  static_cast<uint8_t*>(changed.data_ptr())[17] ^= 1;
  absl::Status refused = VerifyTensorWeightSha256(9, *digest, changed, 50);
  CHECK(IsDigestMismatch(refused));
  CHECK(std::string(refused.message()).find("weights v9 refused") !=
        std::string::npos);
}

TEST_CASE("bad arguments are refused, not hashed", "[weights][digest]") {
  const at::Tensor matrix = at::zeros({4, 6}, at::kByte);
  CHECK(TensorSha256(matrix.t()).status().code() ==
        absl::StatusCode::kInvalidArgument);  // not contiguous
  CHECK(TensorSha256(at::Tensor()).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(TensorSha256(matrix, 0).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(VerifyTensorWeightSha256(2, "short", matrix).code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::weights
