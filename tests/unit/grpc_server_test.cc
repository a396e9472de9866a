// GrpcServer::Shutdown on loopback: it waits for a call in flight (up to
// its deadline) but not for an idle client connection, which would
// otherwise hold the stop until that client next polls (seconds; until the
// deadline for a client that never reads).

#include "common/rpc/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc_client.h"
#include "tandem/v1/rollout.grpc.pb.h"

namespace tandem {
namespace {

// Answers GetStatus at once; parks Drain until the test releases it.
class ParkingService : public tandem::v1::RolloutWorker::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetStatus(
      grpc::CallbackServerContext* context,
      const tandem::v1::GetRolloutStatusRequest*,
      tandem::v1::RolloutStatus*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const tandem::v1::DrainRequest*,
                                  tandem::v1::RolloutStatus*) override {
    absl::MutexLock lock(&mu_);
    parked_ = context->DefaultReactor();
    return parked_;
  }
  // Finishes the parked Drain, if any.
  void Release() {
    absl::MutexLock lock(&mu_);
    if (parked_ != nullptr) parked_->Finish(grpc::Status::OK);
    parked_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  grpc::ServerUnaryReactor* parked_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// An HTTP/2 client that says hello and then never reads: like an idle gRPC
// client in another process, which sees the server's GOAWAY only when it
// next polls. Returns the socket (the caller closes it).
int ConnectSilentHttp2Client(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port =
      htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  // Connection preface, then an empty SETTINGS frame.
  static constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  static constexpr unsigned char kSettings[] = {0, 0, 0, 4, 0, 0, 0, 0, 0};
  REQUIRE(write(fd, kPreface, sizeof(kPreface) - 1) ==
          static_cast<ssize_t>(sizeof(kPreface) - 1));
  REQUIRE(write(fd, kSettings, sizeof(kSettings)) ==
          static_cast<ssize_t>(sizeof(kSettings)));
  return fd;
}

TEST_CASE("GrpcServer::Shutdown does not wait for an idle client connection") {
  ParkingService service;
  auto server = rpc::GrpcServer::Start("127.0.0.1:0", {&service});
  REQUIRE(server.ok());
  // A client that made a call and stays connected.
  auto channel = rpc::MakeChannel((*server)->bound_address(), {});
  auto stub = tandem::v1::RolloutWorker::NewStub(channel);
  grpc::ClientContext context;
  tandem::v1::RolloutStatus status;
  REQUIRE(stub->GetStatus(&context, {}, &status).ok());
  // And one that never reads the server's GOAWAY.
  const int silent = ConnectSilentHttp2Client((*server)->bound_address());
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  (*server)->Shutdown(absl::Seconds(5));
  CHECK(absl::Now() - start < absl::Seconds(1));
  close(silent);
}

// A Drain call parked in a ParkingService, then the server shut down with
// `shutdown_deadline` while the service releases the call after
// `release_after` (a reactor must still Finish after cancellation, as a
// daemon's own stop would make it).
struct ParkedShutdown {
  grpc::Status drain_status;
  absl::Duration took;
  int calls_in_flight_after = -1;
};

ParkedShutdown ShutdownWithParkedCall(absl::Duration release_after,
                                      absl::Duration shutdown_deadline) {
  ParkingService service;
  auto server = rpc::GrpcServer::Start("127.0.0.1:0", {&service});
  REQUIRE(server.ok());
  auto stub = tandem::v1::RolloutWorker::NewStub(
      rpc::MakeChannel((*server)->bound_address(), {}));
  ParkedShutdown result;
  std::thread caller([&] {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    tandem::v1::RolloutStatus status;
    result.drain_status = stub->Drain(&context, {}, &status);
  });
  while ((*server)->calls_in_flight() == 0) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  std::thread releaser([&] {
    absl::SleepFor(release_after);
    service.Release();
  });
  const absl::Time start = absl::Now();
  (*server)->Shutdown(shutdown_deadline);
  result.took = absl::Now() - start;
  releaser.join();
  caller.join();
  result.calls_in_flight_after = (*server)->calls_in_flight();
  return result;
}

TEST_CASE("GrpcServer::Shutdown waits for a call in flight, then returns") {
  const ParkedShutdown r =
      ShutdownWithParkedCall(absl::Milliseconds(500), absl::Seconds(10));
  CHECK(r.drain_status.ok());
  CHECK(r.took >= absl::Milliseconds(450));
  CHECK(r.took < absl::Seconds(3));
  CHECK(r.calls_in_flight_after == 0);
}

TEST_CASE(
    "GrpcServer::Shutdown cancels a call still in flight at its deadline") {
  const ParkedShutdown r =
      ShutdownWithParkedCall(absl::Milliseconds(600), absl::Milliseconds(200));
  CHECK_FALSE(r.drain_status.ok());
  CHECK(r.took < absl::Seconds(3));
}

}  // namespace
}  // namespace tandem
