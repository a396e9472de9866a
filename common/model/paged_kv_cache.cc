#include "common/model/paged_kv_cache.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_config.h"
#include "common/model/torch_status.h"

namespace tandem::model {

absl::StatusOr<std::shared_ptr<KvBlockPool>> KvBlockPool::Create(
    const ModelConfig& config, at::ScalarType dtype, at::Device device,
    int64_t num_blocks, int64_t block_size, PagedAttention attention) {
  if (num_blocks <= 0 || block_size <= 0 ||
      num_blocks * block_size > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockPool: num_blocks and block_size must be > 0 "
                     "(and their product at most 2^40), got ",
                     num_blocks, " and ", block_size));
  }
  std::shared_ptr<KvBlockPool> pool(new KvBlockPool());
  pool->num_blocks_ = num_blocks;
  pool->block_size_ = block_size;
  pool->dtype_ = dtype;
  pool->device_ = device;
  pool->attention_ = attention;
  try {
    c10::NoGradGuard no_grad;
    const auto options = at::TensorOptions().dtype(dtype).device(device);
    for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      for (auto* store : {&pool->keys_, &pool->values_}) {
        store->push_back(
            at::zeros({num_blocks * block_size, config.num_key_value_heads,
                       config.head_dim},
                      options));
      }
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus(
        absl::StrCat("allocating a KV block pool of ", num_blocks,
                     " blocks of ", block_size, " tokens (",
                     2 * config.num_hidden_layers * num_blocks * block_size *
                         config.num_key_value_heads * config.head_dim *
                         static_cast<int64_t>(c10::elementSize(dtype)),
                     " bytes) on ", device.str()),
        e);
  }
  // Lowest numbers first (popped from the back), so a fresh pool fills
  // from the start.
  pool->free_.resize(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) {
    pool->free_[i] = static_cast<int32_t>(num_blocks - 1 - i);
  }
  return pool;
}

int64_t KvBlockPool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

int64_t KvBlockPool::allocated_bytes() const {
  int64_t bytes = 0;
  for (const auto* store : {&keys_, &values_}) {
    for (const at::Tensor& t : *store) bytes += t.nbytes();
  }
  return bytes;
}

bool KvBlockPool::Allocate(int64_t n, std::vector<int32_t>* blocks) {
  absl::MutexLock lock(&mu_);
  if (n > static_cast<int64_t>(free_.size())) return false;
  for (int64_t i = 0; i < n; ++i) {
    blocks->push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvBlockPool::Free(std::vector<int32_t>* blocks, size_t from) {
  if (from >= blocks->size()) return;
  absl::MutexLock lock(&mu_);
  // Reverse order: the lowest-numbered freed block is reused first.
  for (size_t i = blocks->size(); i > from; --i) {
    free_.push_back((*blocks)[i - 1]);
  }
  blocks->resize(from);
}

absl::StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Create(
    const ModelConfig& config, std::shared_ptr<KvBlockPool> pool,
    int64_t max_tokens) {
  if (pool == nullptr || max_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedKvCache: need a pool and max_tokens > 0, got max_tokens ",
        max_tokens));
  }
  if (pool->num_layers() != config.num_hidden_layers ||
      pool->keys(0).size(1) != config.num_key_value_heads ||
      pool->keys(0).size(2) != config.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedKvCache: the pool holds ", pool->num_layers(), " layers of [",
        pool->keys(0).size(1), " kv heads, ", pool->keys(0).size(2),
        " dims], the model has ", config.num_hidden_layers, " layers of [",
        config.num_key_value_heads, ", ", config.head_dim, "]"));
  }
  std::unique_ptr<PagedKvCache> cache(new PagedKvCache());
  cache->pool_ = std::move(pool);
  cache->max_tokens_ = max_tokens;
  return cache;
}

PagedKvCache::~PagedKvCache() { pool_->Free(&blocks_); }

absl::Status PagedKvCache::Reserve(int64_t n) {
  const int64_t needed = num_tokens_ + n;
  if (needed > max_tokens_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", num_tokens_, " tokens + ", n,
                     " new exceed max_tokens ", max_tokens_));
  }
  const int64_t bs = pool_->block_size();
  const int64_t missing =
      (needed + bs - 1) / bs - static_cast<int64_t>(blocks_.size());
  if (missing <= 0) return absl::OkStatus();
  if (!pool_->Allocate(missing, &blocks_)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV block pool: ", num_tokens_, " tokens + ", n,
                     " new need ", missing, " more blocks of ", bs, ", ",
                     pool_->num_free(), " of ", pool_->num_blocks(), " free"));
  }
  BlocksChanged();
  return absl::OkStatus();
}

void PagedKvCache::AppendSlots(int64_t begin, int64_t end,
                               std::vector<int64_t>* slots) const {
  const int64_t bs = pool_->block_size();
  for (int64_t t = begin; t < end; ++t) {
    slots->push_back(static_cast<int64_t>(blocks_[t / bs]) * bs + t % bs);
  }
}

const at::Tensor& PagedKvCache::SlotIndex(int64_t begin, int64_t end) {
  for (const CachedIndex& c : index_cache_) {
    if (c.begin == begin && c.end == end) return c.index;
  }
  std::vector<int64_t> slots;
  slots.reserve(end - begin);
  AppendSlots(begin, end, &slots);
  // Replace the older entry; a step alternates between two ranges.
  index_cache_[1] = std::move(index_cache_[0]);
  index_cache_[0] = {begin, end,
                     at::tensor(slots, at::TensorOptions().dtype(at::kLong))
                         .to(pool_->device())};
  return index_cache_[0].index;
}

void PagedKvCache::BlocksChanged() {
  for (CachedIndex& c : index_cache_) c = CachedIndex();
  consecutive_ = true;
  for (size_t i = 1; i < blocks_.size() && consecutive_; ++i) {
    consecutive_ = blocks_[i] == blocks_[0] + static_cast<int32_t>(i);
  }
}

void PagedKvCache::Store(int64_t layer, const at::Tensor& k,
                         const at::Tensor& v) {
  const int64_t n = k.size(0);
  if (consecutive_) {
    const int64_t first = blocks_[0] * pool_->block_size() + num_tokens_;
    pool_->keys(layer).narrow(0, first, n).copy_(k);
    pool_->values(layer).narrow(0, first, n).copy_(v);
    return;
  }
  const at::Tensor& index = SlotIndex(num_tokens_, num_tokens_ + n);
  pool_->keys(layer).index_copy_(0, index, k);
  pool_->values(layer).index_copy_(0, index, v);
}

std::pair<at::Tensor, at::Tensor> PagedKvCache::Read(int64_t layer,
                                                     int64_t length) {
  if (consecutive_) {
    const int64_t first = blocks_[0] * pool_->block_size();
    return {pool_->keys(layer).narrow(0, first, length).transpose(0, 1),
            pool_->values(layer).narrow(0, first, length).transpose(0, 1)};
  }
  const at::Tensor& index = SlotIndex(0, length);
  return {pool_->keys(layer).index_select(0, index).transpose(0, 1),
          pool_->values(layer).index_select(0, index).transpose(0, 1)};
}

void PagedKvCache::Truncate(int64_t length) {
  num_tokens_ = length;
  const int64_t bs = pool_->block_size();
  const size_t keep = static_cast<size_t>((length + bs - 1) / bs);
  if (keep < blocks_.size()) {
    pool_->Free(&blocks_, keep);
    BlocksChanged();
  }
}

absl::StatusOr<std::unique_ptr<PagedKvCache>> PagedKvCache::Fork(
    int64_t length) const {
  std::unique_ptr<PagedKvCache> copy(new PagedKvCache());
  copy->pool_ = pool_;
  copy->max_tokens_ = max_tokens_;
  const int64_t bs = pool_->block_size();
  const int64_t n = (length + bs - 1) / bs;
  if (!pool_->Allocate(n, &copy->blocks_)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV block pool: forking ", length, " tokens needs ", n, " blocks, ",
        pool_->num_free(), " of ", pool_->num_blocks(), " free"));
  }
  copy->num_tokens_ = length;
  copy->BlocksChanged();
  if (length == 0) return copy;
  try {
    c10::NoGradGuard no_grad;
    // Whole blocks: the tail of the last one is garbage either way.
    std::vector<int64_t> from, to;
    copy->AppendSlots(0, n * bs, &to);
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t i = 0; i < bs; ++i) from.push_back(blocks_[b] * bs + i);
    }
    const auto options = at::TensorOptions().dtype(at::kLong);
    const at::Tensor src = at::tensor(from, options).to(pool_->device());
    const at::Tensor dst = at::tensor(to, options).to(pool_->device());
    for (int64_t layer = 0; layer < pool_->num_layers(); ++layer) {
      for (const at::Tensor* t : {&pool_->keys(layer), &pool_->values(layer)}) {
        t->index_copy_(0, dst, t->index_select(0, src));
      }
    }
  } catch (const std::exception& e) {
    return internal::TorchErrorToStatus("forking a paged KV cache", e);
  }
  return copy;
}

bool PagedBatch::SharesOnePool(absl::Span<KvCache* const> caches) {
  const KvBlockPool* pool = nullptr;
  for (KvCache* cache : caches) {
    const auto* p = dynamic_cast<const PagedKvCache*>(cache);
    if (p == nullptr || (pool != nullptr && &p->pool() != pool)) return false;
    pool = &p->pool();
  }
  return pool != nullptr;
}

bool PagedBatch::UsesKernel(absl::Span<KvCache* const> caches,
                            const std::vector<int64_t>& n) {
  if (caches.empty()) return false;
  const auto* first = static_cast<const PagedKvCache*>(caches[0]);
  return first->pool().decode_kernel() &&
         std::all_of(n.begin(), n.end(), [](int64_t x) { return x == 1; });
}

std::unique_ptr<PagedBatch> PagedBatch::Plan(absl::Span<KvCache* const> caches,
                                             const std::vector<int64_t>& n) {
  if (!SharesOnePool(caches)) return nullptr;
  std::vector<const PagedKvCache*> paged;
  paged.reserve(caches.size());
  for (KvCache* cache : caches) {
    paged.push_back(static_cast<const PagedKvCache*>(cache));
  }
  std::unique_ptr<PagedBatch> plan(new PagedBatch());
  plan->pool_ = &paged[0]->pool();
  const int64_t batch = static_cast<int64_t>(paged.size());
  plan->batch_ = batch;
  std::vector<int64_t> offset(batch), length(batch);
  for (int64_t b = 0; b < batch; ++b) {
    offset[b] = paged[b]->num_tokens();
    length[b] = offset[b] + n[b];
    plan->max_n_ = std::max(plan->max_n_, n[b]);
    plan->max_length_ = std::max(plan->max_length_, length[b]);
  }
  plan->kernel_ = UsesKernel(caches, n);
  const int64_t bs = plan->pool_->block_size();
  const int64_t width = (plan->max_length_ + bs - 1) / bs;
  // `read` holds the gather's slots, or the kernel's block tables
  // [B, width] (padded with block 0, never read past a length).
  std::vector<int64_t> write, read, rows;
  read.reserve(plan->kernel_ ? batch * width : batch * plan->max_length_);
  bool dense = true;
  for (int64_t b = 0; b < batch; ++b) {
    paged[b]->AppendSlots(offset[b], length[b], &write);
    if (plan->kernel_) {
      const std::vector<int32_t>& blocks = paged[b]->blocks();
      const int64_t used = (length[b] + bs - 1) / bs;
      read.insert(read.end(), blocks.begin(), blocks.begin() + used);
      read.resize((b + 1) * width, 0);
    } else {
      paged[b]->AppendSlots(0, length[b], &read);
      read.resize((b + 1) * plan->max_length_, 0);
    }
    for (int64_t i = 0; i < n[b]; ++i) rows.push_back(b * plan->max_n_ + i);
    dense = dense && n[b] == plan->max_n_;
  }
  // All of the step's indices cross to the device in one copy (on a GPU
  // from pinned memory, asynchronously; the caching host allocator keeps
  // the buffer until the copy is done).
  const at::Device device = plan->pool_->device();
  const bool to_gpu = device.is_cuda();
  const std::vector<int64_t>* parts[] = {&write, &read, &rows, &offset,
                                         &length};
  int64_t total = 0;
  for (const auto* part : parts) total += static_cast<int64_t>(part->size());
  at::Tensor host = at::empty(
      {total}, at::TensorOptions().dtype(at::kLong).pinned_memory(to_gpu));
  int64_t* data = host.data_ptr<int64_t>();
  for (const auto* part : parts) {
    data = std::copy(part->begin(), part->end(), data);
  }
  const at::Tensor all = host.to(device, /*non_blocking=*/to_gpu);
  at::Tensor views[5];
  int64_t start = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t size = static_cast<int64_t>(parts[i]->size());
    views[i] = all.narrow(0, start, size);
    start += size;
  }
  plan->write_slots_ = views[0];
  if (plan->kernel_) {
    plan->tables_ = views[1].view({batch, width});
    plan->lengths_ = views[4];
    return plan;
  }
  plan->read_slots_ = views[1];
  if (!dense) plan->query_rows_ = views[2];
  // Key j is visible to query i of sequence b iff j <= offset_b + i and
  // j < length_b; padded query rows (i >= n_b) thus see every real key,
  // and no row of the softmax is empty.
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor key_pos =
      at::arange(plan->max_length_, long_options).view({1, 1, -1});
  const at::Tensor query_idx =
      at::arange(plan->max_n_, long_options).view({1, -1, 1});
  const at::Tensor offsets = views[3].view({-1, 1, 1});
  const at::Tensor lengths = views[4].view({-1, 1, 1});
  plan->visible_ = (key_pos <= offsets + query_idx)
                       .logical_and(key_pos < lengths)
                       .unsqueeze(1);
  return plan;
}

std::unique_ptr<PagedBatch> PagedBatch::ForDecode(const KvBlockPool* pool,
                                                  at::Tensor write_slots,
                                                  at::Tensor read_slots,
                                                  const at::Tensor& lengths,
                                                  int64_t max_length) {
  std::unique_ptr<PagedBatch> plan(new PagedBatch());
  plan->pool_ = pool;
  plan->batch_ = write_slots.size(0);
  plan->max_n_ = 1;
  plan->max_length_ = max_length;
  plan->write_slots_ = std::move(write_slots);
  plan->kernel_ = pool->decode_kernel();
  if (plan->kernel_) {
    // Slot j * block_size of sequence b's row is the start of its block j
    // (for j past its length, whatever the row holds: never read).
    const int64_t bs = pool->block_size();
    plan->tables_ =
        at::div(read_slots.view({plan->batch_, max_length})
                    .slice(/*dim=*/1, 0, max_length, bs),
                bs, /*rounding_mode=*/"floor");
    plan->lengths_ = lengths;
    return plan;
  }
  plan->read_slots_ = std::move(read_slots);
  // The one query of sequence b sees keys [0, length_b).
  const at::Tensor key_pos =
      at::arange(max_length, lengths.options()).view({1, 1, -1});
  plan->visible_ = (key_pos < lengths.view({-1, 1, 1})).unsqueeze(1);
  return plan;
}

at::Tensor PagedBatch::Attend(int64_t layer, const at::Tensor& q,
                              const at::Tensor& k, const at::Tensor& v,
                              double scale) const {
  const at::Tensor& key_pool = pool_->keys(layer);
  const at::Tensor& value_pool = pool_->values(layer);
  key_pool.index_copy_(0, write_slots_, k);
  value_pool.index_copy_(0, write_slots_, v);
  const int64_t heads = q.size(1);
  const int64_t dim = q.size(2);
  if (kernel_) {
    return PagedDecodeAttention(q, key_pool, value_pool, tables_, lengths_,
                                pool_->block_size(), scale)
        .view({batch_, heads * dim});
  }
  const int64_t kv_heads = k.size(1);
  // [B, kv_heads, max_length, dim] views of the gathered copies.
  const at::Tensor keys = key_pool.index_select(0, read_slots_)
                              .view({batch_, max_length_, kv_heads, dim})
                              .transpose(1, 2);
  const at::Tensor values = value_pool.index_select(0, read_slots_)
                                .view({batch_, max_length_, kv_heads, dim})
                                .transpose(1, 2);
  at::Tensor query = q;
  if (query_rows_.defined()) {
    query = at::zeros({batch_ * max_n_, heads, dim}, q.options())
                .index_copy_(0, query_rows_, q);
  }
  const at::Tensor out = at::scaled_dot_product_attention(
      query.view({batch_, max_n_, heads, dim}).transpose(1, 2), keys, values,
      visible_, /*dropout_p=*/0.0, /*is_causal=*/false, scale,
      /*enable_gqa=*/true);  // [B, heads, max_n, dim]
  const at::Tensor rows =
      out.transpose(1, 2).reshape({batch_ * max_n_, heads * dim});
  return query_rows_.defined() ? rows.index_select(0, query_rows_) : rows;
}

}  // namespace tandem::model
