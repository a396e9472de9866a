#include "common/weights/tree_digest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/weights/weight_digest.h"

namespace tandem::weights {
namespace {

namespace sha = kernels::sha256;

// Leaves hashed per round of threads: 32 MiB of weights, 256 KiB of
// digests, whatever the piece's size.
constexpr uint64_t kLeavesPerRound = 8192;

using MdPtr = std::unique_ptr<EVP_MD, decltype(&EVP_MD_free)>;
using CtxPtr = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

// SHA-256 of one message and its domain byte through a context reused for
// every message of one thread: OpenSSL 3 looks the algorithm up once
// (EVP_MD_fetch), not on every 4 KiB leaf.
class MessageHasher {
 public:
  MessageHasher()
      : md_(EVP_MD_fetch(nullptr, "SHA256", nullptr), EVP_MD_free),
        ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {}

  // False when OpenSSL failed.
  bool Hash(const uint8_t* data, uint64_t n, uint8_t suffix, uint8_t* out) {
    unsigned int len = 0;
    return md_ != nullptr && ctx_ != nullptr &&
           EVP_DigestInit_ex(ctx_.get(), md_.get(), nullptr) == 1 &&
           (n == 0 || EVP_DigestUpdate(ctx_.get(), data, n) == 1) &&
           EVP_DigestUpdate(ctx_.get(), &suffix, 1) == 1 &&
           EVP_DigestFinal_ex(ctx_.get(), out, &len) == 1 &&
           len == sha::kDigestBytes;
  }

 private:
  MdPtr md_;
  CtxPtr ctx_;
};

// Leaves [first, last) of the whole leaves at `data` into `digests`.
bool HashLeafRange(const uint8_t* data, uint64_t first, uint64_t last,
                   uint8_t* digests) {
  MessageHasher hasher;
  for (uint64_t i = first; i < last; ++i) {
    if (!hasher.Hash(data + i * kTreeLeafBytes, kTreeLeafBytes,
                     sha::kTreeLeafDomain, digests + i * sha::kDigestBytes)) {
      return false;
    }
  }
  return true;
}

}  // namespace

TreeSha256Hasher::TreeSha256Hasher(int threads)
    : threads_(std::max(1, threads)) {
  partial_leaf_.reserve(kTreeLeafBytes);
}

void TreeSha256Hasher::Update(absl::Span<const uint8_t> piece) {
  bytes_ += piece.size();
  if (failed_) return;
  const uint8_t* p = piece.data();
  uint64_t n = piece.size();
  if (!partial_leaf_.empty()) {
    const uint64_t take =
        std::min<uint64_t>(kTreeLeafBytes - partial_leaf_.size(), n);
    partial_leaf_.insert(partial_leaf_.end(), p, p + take);
    p += take;
    n -= take;
    if (partial_leaf_.size() < kTreeLeafBytes) return;
    HashLeaves(partial_leaf_.data(), 1);
    partial_leaf_.clear();
  }
  const uint64_t whole = n / kTreeLeafBytes;
  for (uint64_t done = 0; done < whole && !failed_;) {
    const uint64_t round = std::min(kLeavesPerRound, whole - done);
    HashLeaves(p + done * kTreeLeafBytes, round);
    done += round;
  }
  p += whole * kTreeLeafBytes;
  n -= whole * kTreeLeafBytes;
  partial_leaf_.insert(partial_leaf_.end(), p, p + n);
}

void TreeSha256Hasher::HashLeaves(const uint8_t* data, uint64_t leaves) {
  leaf_digests_.resize(leaves * sha::kDigestBytes);
  const uint64_t workers =
      std::min<uint64_t>(static_cast<uint64_t>(threads_), leaves);
  // Worker w hashes leaves [w * leaves / workers, (w + 1) * leaves /
  // workers); worker 0 is this thread.
  std::vector<std::thread> pool;
  std::vector<char> ok(workers, 0);
  for (uint64_t w = 1; w < workers; ++w) {
    pool.emplace_back([&, w] {
      ok[w] = HashLeafRange(data, w * leaves / workers,
                            (w + 1) * leaves / workers, leaf_digests_.data());
    });
  }
  ok[0] = HashLeafRange(data, 0, leaves / workers, leaf_digests_.data());
  for (std::thread& t : pool) t.join();
  if (std::find(ok.begin(), ok.end(), 0) != ok.end()) {
    failed_ = true;
    return;
  }
  AddLeafDigests(leaf_digests_.data(), leaves);
}

void TreeSha256Hasher::AddLeafDigests(const uint8_t* digests, uint64_t count) {
  for (uint64_t i = 0; i < count; ++i) {
    Push(0, digests + i * sha::kDigestBytes);
  }
}

void TreeSha256Hasher::Push(size_t level, const uint8_t* digest) {
  if (pending_.size() <= level) {
    pending_.emplace_back();
    pending_.back().reserve(kTreeFanout * sha::kDigestBytes + 1);
    grouped_.push_back(0);
  }
  std::vector<uint8_t>& group = pending_[level];
  group.insert(group.end(), digest, digest + sha::kDigestBytes);
  if (group.size() < kTreeFanout * sha::kDigestBytes) return;
  uint8_t node[sha::kDigestBytes];
  MessageHasher hasher;
  if (!hasher.Hash(group.data(), group.size(), sha::kTreeNodeDomain, node)) {
    failed_ = true;
  }
  group.clear();
  ++grouped_[level];
  Push(level + 1, node);  // may reallocate pending_: `group` is not used
}

absl::StatusOr<std::string> TreeSha256Hasher::Finish() {
  auto failure = [&] {
    failed_ = true;
    return absl::InternalError(absl::StrCat("tree SHA-256 of ", bytes_,
                                            " weight bytes failed in OpenSSL"));
  };
  if (failed_) return failure();
  // The last, shorter leaf; or the one empty leaf of an empty buffer.
  if (!partial_leaf_.empty() || bytes_ == 0) {
    uint8_t leaf[sha::kDigestBytes];
    MessageHasher hasher;
    if (!hasher.Hash(partial_leaf_.data(), partial_leaf_.size(),
                     sha::kTreeLeafDomain, leaf)) {
      return failure();
    }
    partial_leaf_.clear();
    AddLeafDigests(leaf, 1);
  }
  // Close each level's last, shorter group, bottom up, until a level has
  // one digest and never passed a group up: the top.
  uint8_t top[sha::kDigestBytes];
  for (size_t level = 0;; ++level) {
    std::vector<uint8_t>& group = pending_[level];
    if (grouped_[level] == 0 && group.size() == sha::kDigestBytes) {
      std::copy(group.begin(), group.end(), top);
      break;
    }
    if (group.empty()) continue;
    uint8_t node[sha::kDigestBytes];
    MessageHasher hasher;
    if (!hasher.Hash(group.data(), group.size(), sha::kTreeNodeDomain, node)) {
      return failure();
    }
    group.clear();
    ++grouped_[level];
    Push(level + 1, node);
  }
  if (failed_) return failure();
  uint8_t root[sha::kDigestBytes];
  uint8_t message[sha::kDigestBytes + 16];
  std::copy(top, top + sha::kDigestBytes, message);
  for (int i = 0; i < 8; ++i) {
    message[sha::kDigestBytes + i] = static_cast<uint8_t>(bytes_ >> (8 * i));
  }
  for (int i = 0; i < 4; ++i) {
    message[sha::kDigestBytes + 8 + i] =
        static_cast<uint8_t>(kTreeLeafBytes >> (8 * i));
    message[sha::kDigestBytes + 12 + i] =
        static_cast<uint8_t>(kTreeFanout >> (8 * i));
  }
  MessageHasher hasher;
  if (!hasher.Hash(message, sizeof(message), sha::kTreeRootDomain, root)) {
    return failure();
  }
  return std::string(reinterpret_cast<const char*>(root), sizeof(root));
}

absl::StatusOr<std::string> WeightTreeSha256(absl::Span<const uint8_t> bytes,
                                             int threads) {
  TreeSha256Hasher hasher(threads);
  hasher.Update(bytes);
  return hasher.Finish();
}

absl::Status CheckWeightTreeSha256(uint64_t version,
                                   const std::string& expected,
                                   const std::string& actual, uint64_t size) {
  if (expected.size() != kWeightSha256Bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights v", version, ": manifest tree_sha256 is ",
                     expected.size(), " bytes, expected ", kWeightSha256Bytes));
  }
  if (actual != expected) {
    // "sha256 mismatch" in the message: IsDigestMismatch holds for it.
    return absl::DataLossError(absl::StrCat(
        "weights v", version, " refused: tree sha256 mismatch over ", size,
        " bytes: expected ", DigestPrefixHex(expected), "…, got ",
        DigestPrefixHex(actual), "…"));
  }
  return absl::OkStatus();
}

}  // namespace tandem::weights
