#pragma once

// IoPoster posts callbacks into an io_context from other threads (the
// engine thread's way into the OpenAI server's io thread), until its owner
// detaches it: a callback posted after that is dropped, so the poster may
// outlive the io_context. Thread-safe.

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <functional>
#include <utility>

#include "absl/synchronization/mutex.h"

namespace tandem::rollout {

class IoPoster {
 public:
  explicit IoPoster(boost::asio::io_context* io) : io_(io) {}
  void Post(std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    if (io_ != nullptr) boost::asio::post(*io_, std::move(f));
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    io_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  boost::asio::io_context* io_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::rollout
