#pragma once

// Replies shared by the coordinator's RPC handlers (coordinator.cc,
// coordinator_publish.cc).

#include <grpcpp/grpcpp.h>

#include <string>

namespace tandem::coordinator::internal {

// Answers a unary call at once with `status`.
inline grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                        const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

inline grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

inline grpc::Status Draining() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "coordinator is shutting down");
}

}  // namespace tandem::coordinator::internal
