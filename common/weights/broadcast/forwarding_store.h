#pragma once

// ForwardingStore: a c10d::Store that passes every call to an inner store.
// A store that changes one behaviour (the rendezvous store's deadline, a
// test's store that dies after a write) derives from it and overrides only
// that. Only LibTorch files include this header.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::weights {

class ForwardingStore : public c10d::Store {
 public:
  explicit ForwardingStore(c10::intrusive_ptr<c10d::Store> inner)
      : c10d::Store(inner->getTimeout()), inner_(std::move(inner)) {}

  c10::intrusive_ptr<c10d::Store> clone() override { return inner_->clone(); }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(
      const std::string& key, const std::vector<uint8_t>& expected,
      const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    return inner_->check(keys);
  }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { inner_->wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  void append(const std::string& key,
              const std::vector<uint8_t>& value) override {
    inner_->append(key, value);
  }
  std::vector<std::vector<uint8_t>> multiGet(
      const std::vector<std::string>& keys) override {
    return inner_->multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::vector<uint8_t>>& values) override {
    inner_->multiSet(keys, values);
  }
  bool hasExtendedApi() const override { return inner_->hasExtendedApi(); }

 protected:
  const c10::intrusive_ptr<c10d::Store>& inner() const { return inner_; }

 private:
  const c10::intrusive_ptr<c10d::Store> inner_;
};

}  // namespace tandem::weights
