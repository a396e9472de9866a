#include "common/model/kv_cache.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_config.h"
#include "common/model/torch_status.h"

namespace tandem::model {

absl::StatusOr<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::Create(
    const ModelConfig& config, at::ScalarType dtype, at::Device device,
    int64_t max_tokens, int64_t initial_capacity) {
  if (max_tokens <= 0 || initial_capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ContiguousKvCache: max_tokens must be > 0 and "
                     "initial_capacity >= 0, got ",
                     max_tokens, " and ", initial_capacity));
  }
  std::unique_ptr<ContiguousKvCache> cache(new ContiguousKvCache());
  cache->num_layers_ = config.num_hidden_layers;
  cache->num_kv_heads_ = config.num_key_value_heads;
  cache->head_dim_ = config.head_dim;
  cache->max_tokens_ = max_tokens;
  cache->dtype_ = dtype;
  cache->device_ = device;
  cache->keys_.resize(cache->num_layers_);
  cache->values_.resize(cache->num_layers_);
  RETURN_IF_ERROR(cache->Grow(
      std::max<int64_t>(1, std::min(initial_capacity, max_tokens))));
  return cache;
}

absl::Status ContiguousKvCache::Grow(int64_t min_capacity) {
  const int64_t new_capacity =
      std::min(max_tokens_, std::max(min_capacity, 2 * capacity_));
  try {
    c10::NoGradGuard no_grad;
    const auto options = at::TensorOptions().dtype(dtype_).device(device_);
    for (int64_t layer = 0; layer < num_layers_; ++layer) {
      for (auto* store : {&keys_, &values_}) {
        at::Tensor grown =
            at::empty({num_kv_heads_, new_capacity, head_dim_}, options);
        if (num_tokens_ > 0) {
          grown.narrow(1, 0, num_tokens_)
              .copy_((*store)[layer].narrow(1, 0, num_tokens_));
        }
        (*store)[layer] = std::move(grown);
      }
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(
        absl::StrCat("growing the KV cache to ", new_capacity, " tokens"), e);
  }
  capacity_ = new_capacity;
  return absl::OkStatus();
}

absl::Status ContiguousKvCache::Reserve(int64_t n) {
  const int64_t needed = num_tokens_ + n;
  if (needed > max_tokens_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", num_tokens_, " tokens + ", n,
                     " new exceed max_tokens ", max_tokens_));
  }
  if (needed <= capacity_) return absl::OkStatus();
  return Grow(needed);
}

void ContiguousKvCache::Store(int64_t layer, const at::Tensor& k,
                              const at::Tensor& v) {
  const int64_t n = k.size(0);
  keys_[layer].narrow(1, num_tokens_, n).copy_(k.transpose(0, 1));
  values_[layer].narrow(1, num_tokens_, n).copy_(v.transpose(0, 1));
}

std::pair<at::Tensor, at::Tensor> ContiguousKvCache::Read(int64_t layer,
                                                          int64_t length) {
  return {keys_[layer].narrow(1, 0, length),
          values_[layer].narrow(1, 0, length)};
}

absl::StatusOr<std::unique_ptr<ContiguousKvCache>> ContiguousKvCache::Fork()
    const {
  std::unique_ptr<ContiguousKvCache> copy(new ContiguousKvCache());
  copy->num_layers_ = num_layers_;
  copy->num_kv_heads_ = num_kv_heads_;
  copy->head_dim_ = head_dim_;
  copy->max_tokens_ = max_tokens_;
  copy->capacity_ = capacity_;
  copy->num_tokens_ = num_tokens_;
  copy->dtype_ = dtype_;
  copy->device_ = device_;
  try {
    c10::NoGradGuard no_grad;
    for (int64_t layer = 0; layer < num_layers_; ++layer) {
      copy->keys_.push_back(keys_[layer].clone());
      copy->values_.push_back(values_[layer].clone());
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus("forking the KV cache", e);
  }
  return copy;
}

int64_t ContiguousKvCache::allocated_bytes() const {
  return 2 * num_layers_ * num_kv_heads_ * capacity_ * head_dim_ *
         static_cast<int64_t>(c10::elementSize(dtype_));
}

}  // namespace tandem::model
