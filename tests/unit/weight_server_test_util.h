#pragma once

// A WeightServerService over `store` on a port-0 gRPC server on loopback,
// and a channel to it: the trainer's side of pull tests.

#include <grpcpp/grpcpp.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/weights/pull/weight_server.h"
#include "common/weights/weight_store.h"

namespace tandem::weights::testing {

class WeightServerLoopback {
 public:
  // `store` must outlive the server.
  explicit WeightServerLoopback(WeightStore* store,
                                WeightServerOptions options = {})
      : service_(store, options) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) throw std::runtime_error("weight server failed");
    port_ = port;
    address_ = absl::StrCat("127.0.0.1:", port);
    channel_ =
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  }
  // The service answers held long polls first: the server's Shutdown
  // waits for calls in flight.
  ~WeightServerLoopback() {
    service_.Shutdown();
    server_->Shutdown();
  }

  WeightServerService& service() { return service_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  WeightServerService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
};

}  // namespace tandem::weights::testing
