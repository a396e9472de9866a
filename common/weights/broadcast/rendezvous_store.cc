#include "common/weights/broadcast/rendezvous_store.h"

#include <c10/util/Exception.h>

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::weights {
namespace {

std::string Text(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> Bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

template <typename T>
T OrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) C10_THROW_ERROR(DistStoreError, result.status().ToString());
  return *std::move(result);
}

}  // namespace

KeyspaceStore::KeyspaceStore(std::shared_ptr<RendezvousKeyspace> keyspace,
                             std::string scope,
                             std::chrono::milliseconds timeout)
    : c10d::Store(timeout),
      keyspace_(std::move(keyspace)),
      scope_(std::move(scope)) {}

c10::intrusive_ptr<c10d::Store> KeyspaceStore::clone() {
  return c10::make_intrusive<KeyspaceStore>(keyspace_, scope_, timeout_);
}

void KeyspaceStore::set(const std::string& key,
                        const std::vector<uint8_t>& value) {
  absl::Status status = keyspace_->Set(scope_, key, Text(value));
  if (!status.ok()) C10_THROW_ERROR(DistStoreError, status.ToString());
}

std::vector<uint8_t> KeyspaceStore::compareSet(
    const std::string& key, const std::vector<uint8_t>& expected,
    const std::vector<uint8_t>& desired) {
  return Bytes(OrThrow(
      keyspace_->CompareSet(scope_, key, Text(expected), Text(desired))));
}

std::vector<uint8_t> KeyspaceStore::get(const std::string& key) {
  wait({key});
  return Bytes(OrThrow(keyspace_->Get(scope_, key)));
}

int64_t KeyspaceStore::add(const std::string& key, int64_t value) {
  return OrThrow(keyspace_->Add(scope_, key, value));
}

bool KeyspaceStore::deleteKey(const std::string& key) {
  return OrThrow(keyspace_->DeleteKey(scope_, key));
}

bool KeyspaceStore::check(const std::vector<std::string>& keys) {
  return OrThrow(keyspace_->Wait(scope_, keys, absl::ZeroDuration()));
}

int64_t KeyspaceStore::getNumKeys() {
  return OrThrow(keyspace_->NumKeys(scope_));
}

void KeyspaceStore::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void KeyspaceStore::wait(const std::vector<std::string>& keys,
                         const std::chrono::milliseconds& timeout) {
  if (!OrThrow(
          keyspace_->Wait(scope_, keys, absl::Milliseconds(timeout.count())))) {
    throw RendezvousWaitTimeout(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        absl::StrCat("rendezvous scope '", scope_, "': keys ",
                     keys.empty() ? std::string() : keys.front(),
                     keys.size() > 1 ? " and others" : "", " not set within ",
                     timeout.count(), " ms"));
  }
}

}  // namespace tandem::weights
