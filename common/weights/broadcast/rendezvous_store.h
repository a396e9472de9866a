#pragma once

// KeyspaceStore: a c10d::Store over one scope of a rendezvous keyspace
// (rendezvous_keys.h): the trainer's in-process RendezvousKeys for its own
// member of a group, a RendezvousClient (the trainer's gRPC Rendezvous
// service) for the others. This is how Gloo and NCCL groups rendezvous
// when the cluster runs mTLS: no TCPStore, no store port.
//
// Like every c10d::Store it throws (c10::DistStoreError) on failure, with
// the keyspace's message (which names the key, the limit, the code). get
// and wait block until the keys are set or the store's timeout passes.
// Only LibTorch files include this header.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "common/weights/broadcast/rendezvous_keys.h"

namespace tandem::weights {

// What KeyspaceStore::wait throws when its time is up and the keys are
// not all set (any other failure is a plain c10::DistStoreError): a
// caller that waits in slices (the Gloo group's rendezvous store) tells
// the two apart.
class RendezvousWaitTimeout : public c10::DistStoreError {
 public:
  using c10::DistStoreError::DistStoreError;
};

class KeyspaceStore : public c10d::Store {
 public:
  KeyspaceStore(std::shared_ptr<RendezvousKeyspace> keyspace, std::string scope,
                std::chrono::milliseconds timeout);

  c10::intrusive_ptr<c10d::Store> clone() override;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key,
                                  const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  const std::shared_ptr<RendezvousKeyspace> keyspace_;
  const std::string scope_;
};

}  // namespace tandem::weights
